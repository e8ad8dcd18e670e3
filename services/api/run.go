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
	"jetflow.dev/services/api/api"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-api", getenv)
	natsURL := f.String("nats", "JETFLOW_NATS_URL", svc.DefaultNATSURL, "NATS server URL")
	replicas := f.Int("replicas", "JETFLOW_REPLICAS", 1, "replicas of streams and buckets (3 in a cluster)")
	level := f.String("log-level", "JETFLOW_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	addr := f.String("http", "JETFLOW_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	startWait := f.Duration("start-wait", "JETFLOW_START_WAIT", 5*time.Second, "how long a start request waits for the dispatcher")
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
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Str("service", "api").Logger()
	nc, js, err := bus.Open(ctx, *natsURL, "jetflow-api", bus.Config{Replicas: *replicas,
		OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }})
	if err != nil {
		return err
	}
	defer nc.Drain()
	return api.Serve(ctx, api.Config{Addr: *addr, StartWait: *startWait}, nc, js, log)
}
