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
	"jetflow.dev/services/dispatcher/dispatch"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-dispatcher", getenv)
	natsURL := f.String("nats", "JETFLOW_NATS_URL", svc.DefaultNATSURL, "NATS server URL")
	replicas := f.Int("replicas", "JETFLOW_REPLICAS", 1, "replicas of streams and buckets (3 in a cluster)")
	level := f.String("log-level", "JETFLOW_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	workers := f.Int("workers", "JETFLOW_WORKERS", 32, "goroutines handling executions")
	ackWait := f.Duration("ack-wait", "JETFLOW_DISPATCH_ACK_WAIT", 30*time.Second, "redelivery timeout of commands and results")
	apiURL := f.String("api-url", "JETFLOW_API_URL", "", "the api's base URL as workflows reach it (workflow.api_url in expressions)")
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
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Str("service", "dispatcher").Logger()
	nc, js, err := bus.Open(ctx, *natsURL, "jetflow-dispatcher", bus.Config{Replicas: *replicas,
		OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }})
	if err != nil {
		return err
	}
	defer nc.Drain()
	d, err := dispatch.New(ctx, dispatch.Config{Workers: *workers, AckWait: *ackWait, APIURL: *apiURL}, js, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}
