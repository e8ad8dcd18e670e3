package api

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/services/api/projector"
)

// Serve runs the HTTP api and the read-model projector until ctx ends.
func Serve(ctx context.Context, cfg Config, nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger) error {
	srv, err := New(ctx, cfg, nc, js, log)
	if err != nil {
		return err
	}
	proj, err := projector.New(ctx, js, log.With().Str("component", "projector").Logger())
	if err != nil {
		return err
	}
	proj.BindOnly = cfg.BindOnly
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(ctx) })
	g.Go(func() error { return proj.Run(ctx) })
	return g.Wait()
}
