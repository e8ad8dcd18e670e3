package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/janitor/janitor"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-janitor", getenv)
	natsURL := f.String("nats", "JETFLOW_NATS_URL", svc.DefaultNATSURL, "NATS server URL")
	replicas := f.Int("replicas", "JETFLOW_REPLICAS", 1, "replicas of streams and buckets (3 in a cluster)")
	level := f.String("log-level", "JETFLOW_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	interval := f.Duration("interval", "JETFLOW_JANITOR_INTERVAL", 30*time.Second, "time between sweeps")
	idle := f.Duration("idle-after", "JETFLOW_IDLE_AFTER", 2*time.Minute, "inactivity before an execution is checked")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("-log-level %q: %w", *level, err)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Str("service", "janitor").Logger()
	nc, js, err := bus.Open(ctx, *natsURL, "jetflow-janitor", bus.Config{Replicas: *replicas,
		OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }})
	if err != nil {
		return err
	}
	defer nc.Drain()
	j, err := janitor.New(janitor.Config{Interval: *interval, IdleAfter: *idle}, js, log)
	if err != nil {
		return err
	}
	return j.Run(ctx)
}
