package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/internal/svcrun"
	"jetflow.dev/services/janitor/janitor"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-janitor", getenv)
	common := f.AddCommon()
	interval := f.Duration("interval", "JETFLOW_JANITOR_INTERVAL", 30*time.Second, "time between sweeps")
	idle := f.Duration("idle-after", "JETFLOW_IDLE_AFTER", 2*time.Minute, "inactivity before an execution is checked")
	keep := f.String("retention-default", "JETFLOW_RETENTION_DEFAULT", janitor.DefaultRetention,
		"system retention rule for executions whose workflow sets none (e.g. 3, 7d, max(10, 24h), forever)")
	metricsAddr := f.String("metrics-addr", "JETFLOW_JANITOR_METRICS_ADDR", "",
		"host:port of the Prometheus /metrics endpoint, e.g. 127.0.0.1:9464 (empty: off)")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := svcrun.Logger(stderr, common, "janitor")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if *metricsAddr != "" {
		stop, err := serveMetrics(*metricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return svcrun.Serve(ctx, common, auth.RoleJanitor, log, func(ctx context.Context, ns svcrun.Namespace) error {
		cfg := janitor.Config{Interval: *interval, IdleAfter: *idle, RetentionDefault: *keep, BindOnly: common.Restricted(),
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"namespace": ns.Name}, reg)}
		j, err := janitor.New(cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		return j.Run(ctx)
	})
}

// serveMetrics serves reg on http://addr/metrics until stop is called.
func serveMetrics(addr string, reg *prometheus.Registry, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-addr %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("metrics server")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("metrics listening")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
