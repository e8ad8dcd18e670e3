package api

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/services/api/projector"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/pgstore"
	"jetflow.dev/services/api/visibility/sqlitestore"
)

// Serve runs the HTTP api, the read-model projector and the visibility
// index's feed until ctx ends. It returns once the HTTP server is shut
// down and the projectors and feeds have stopped.
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
		proj.Coalesce, proj.Gather = cfg.ProjectorCoalesce, cfg.ProjectorGather
		srv.observe(ns.Name, proj)
		projs = append(projs, proj)
		srv.projectors[ns.Name] = proj
		feed, err := openFeed(ctx, cfg, ns.Name, ns.JS, srv.tenants[ns.Name].defs, log)
		if err != nil {
			return err
		}
		defer feed.Store().Close()
		srv.feeds[ns.Name] = feed
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
	for _, feed := range srv.feeds {
		g.Go(func() error { return feed.Run(ctx) })
	}
	return g.Wait()
}

// openFeed opens the visibility index of namespace ns (in PostgreSQL, in
// the directory, or in memory) and its feed from the namespace's read
// models.
// openStore opens namespace ns's visibility index as cfg says, and
// returns l with where it is.
func openStore(ctx context.Context, cfg Config, ns string, l zerolog.Logger) (visibility.Store, zerolog.Logger, error) {
	if cfg.VisibilityPostgres != "" {
		schema := pgstore.SchemaFor(ns)
		s, err := pgstore.Open(ctx, cfg.VisibilityPostgres, schema)
		if err != nil {
			return nil, l, fmt.Errorf("namespace %s: %w", ns, err)
		}
		return s, l.With().Str("postgres_schema", schema).Logger(), nil // never the URL: it may hold a password
	}
	path := ""
	if cfg.VisibilityDir != "" {
		path = filepath.Join(cfg.VisibilityDir, ns+".db")
	}
	s, err := sqlitestore.OpenCache(path, cfg.VisibilityCache)
	if err != nil {
		return nil, l, fmt.Errorf("namespace %s: %w", ns, err)
	}
	return s, l.With().Str("path", path).Logger(), nil
}

func openFeed(ctx context.Context, cfg Config, ns string, js jetstream.JetStream, defs visibility.Definitions, log zerolog.Logger) (*visibility.Feed, error) {
	l := log.With().Str("component", "visibility").Str("namespace", ns).Logger()
	store, l, err := openStore(ctx, cfg, ns, l)
	if err != nil {
		return nil, err
	}
	feed, err := visibility.NewFeed(ctx, store, js, defs, l)
	if err != nil {
		store.Close()
		return nil, err
	}
	return feed, nil
}
