package api

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/services/api/projector"
)

// Serve runs the HTTP api and the read-model projector until ctx ends. It
// returns once the HTTP server is shut down and the projectors have
// stopped.
func Serve(ctx context.Context, cfg Config, nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger) error {
	srv, err := New(ctx, cfg, nc, js, log)
	if err != nil {
		return err
	}
	// One projector per namespace: each account has its own events stream
	// and read models.
	var projs []*projector.Projector
	for _, ns := range append([]Namespace{{Name: DefaultNamespace, NC: nc, JS: js}}, cfg.Namespaces...) {
		l := log.With().Str("component", "projector").Logger()
		if ns.Name != DefaultNamespace {
			l = l.With().Str("namespace", ns.Name).Logger()
		}
		proj, err := projector.New(ctx, ns.JS, l)
		if err != nil {
			return err
		}
		proj.BindOnly, proj.MaxModel, proj.MaxCache = cfg.BindOnly, cfg.MaxReadModel, cfg.ProjectorCache
		proj.Coalesce = cfg.ProjectorCoalesce
		srv.observe(ns.Name, proj)
		projs = append(projs, proj)
		srv.projectors[ns.Name] = proj
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(collector{srv}); err != nil {
			return fmt.Errorf("api metrics: %w", err)
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(ctx) })
	for _, proj := range projs {
		g.Go(func() error { return proj.Run(ctx) })
	}
	return g.Wait()
}
