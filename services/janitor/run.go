package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/internal/metrics"
	"jetflow.dev/services/internal/svcrun"
	"jetflow.dev/services/janitor/janitor"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	p := svcrun.New(auth.RoleJanitor, getenv, stderr)
	interval := p.DurationIn("interval", "JETFLOW_JANITOR_INTERVAL", 30*time.Second, janitor.Ranges.Interval, "time between sweeps")
	idle := p.DurationIn("idle-after", "JETFLOW_IDLE_AFTER", 2*time.Minute, janitor.Ranges.IdleAfter,
		"inactivity before an execution is checked")
	keep := p.String("retention-default", "JETFLOW_RETENTION_DEFAULT", janitor.DefaultRetention,
		"system retention rule for executions whose workflow sets none (e.g. 3, 7d, max(10, 24h), forever)")
	catchUp := p.Duration("catch-up-every", "JETFLOW_JANITOR_CATCH_UP_EVERY", janitor.DefaultCatchUpEvery,
		"between sweeps, how often to read the executions' read models that settled since the last read: 0 (never), or 100ms to 1h; only with an -interval at least twice it")
	metricsAddr := p.String("metrics-addr", "JETFLOW_JANITOR_METRICS_ADDR", "",
		"host:port of the Prometheus /metrics endpoint, e.g. 127.0.0.1:9464 (empty: off)")
	if err := p.Parse(args); err != nil {
		return err
	}
	if *catchUp != 0 && !janitor.Ranges.CatchUpEvery.Contains(*catchUp) {
		return fmt.Errorf("-catch-up-every (JETFLOW_JANITOR_CATCH_UP_EVERY) %s: out of range, use 0 (never) or %s", svc.ShortDuration(*catchUp), janitor.Ranges.CatchUpEvery)
	}
	cfg := janitor.Config{Interval: *interval, IdleAfter: *idle, RetentionDefault: *keep, BindOnly: p.Common.Restricted(),
		CatchUpEvery: svc.NeverIfZero(*catchUp)}
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	reg := metrics.Registry()
	if *metricsAddr != "" {
		stop, err := metrics.Serve("-metrics-addr", *metricsAddr, reg, p.Log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return p.Serve(ctx, func(ctx context.Context, ns svcrun.Namespace) error {
		cfg := cfg
		cfg.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"namespace": ns.Name}, reg)
		j, err := janitor.New(cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		ns.Ready(j.Ready)
		return j.Run(ctx)
	})
}
