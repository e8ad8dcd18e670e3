// Package svcrun is what the four service programs share in their run
// function: the common flags, the logger and the NATS connection, so that
// each run.go holds only its own service's settings.
package svcrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
)

// Logger builds the service's logger from the common flags.
func Logger(stderr io.Writer, c *svc.Common, service string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(*c.LogLevel)
	if err != nil || lvl == zerolog.NoLevel {
		return zerolog.Nop(), fmt.Errorf("-log-level %q: use debug, info, warn or error", *c.LogLevel)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	w := stderr
	if !*c.LogJSON {
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000", NoColor: true}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("service", service).Logger(), nil
}

// Namespace is one namespace a service serves: its connection, and a
// logger that names it.
type Namespace struct {
	Name string
	NC   *nats.Conn
	JS   jetstream.JetStream
	Log  zerolog.Logger
}

// Serve connects the service, as role, to every namespace it serves, and
// runs fn for each at once until ctx ends or one fails; then it drains the
// connections. Each namespace is a NATS account with its own topology, so
// a service runs one instance of itself per namespace.
func Serve(ctx context.Context, c *svc.Common, role auth.Role, log zerolog.Logger, fn func(context.Context, Namespace) error) error {
	names, err := c.ServedNamespaces()
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, ns := range names {
		g.Go(func() error {
			l := log
			if len(names) > 1 || ns != auth.DefaultNamespace {
				l = log.With().Str("namespace", ns).Logger()
			}
			nc, js, err := c.Open(gctx, ns, role, "jetflow-"+string(role),
				func(err error) { l.Warn().Err(err).Msg("waiting for jetstream") },
				func(err error) {
					if errors.Is(err, nats.ErrPermissionViolation) {
						l.Error().Err(err).Msg("nats permission violation: this identity may not do that")
						return
					}
					l.Warn().Err(err).Msg("nats")
				})
			if err != nil {
				if gctx.Err() != nil {
					return nil // stopped while starting: not an error
				}
				return fmt.Errorf("namespace %s: %w", ns, err)
			}
			defer nc.Drain()
			if err := fn(gctx, Namespace{Name: ns, NC: nc, JS: js, Log: l}); err != nil {
				return fmt.Errorf("namespace %s: %w", ns, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// OpenAll connects the service, as role, to every namespace it serves, for
// a service that serves them all from one place (the api); close drains
// the connections. The default namespace, when served, comes first.
func OpenAll(ctx context.Context, c *svc.Common, role auth.Role, log zerolog.Logger) (nss []Namespace, closeAll func(), err error) {
	names, err := c.ServedNamespaces()
	if err != nil {
		return nil, nil, err
	}
	closeAll = func() {
		for _, ns := range nss {
			_ = ns.NC.Drain()
		}
	}
	for _, name := range names {
		l := log
		if len(names) > 1 || name != auth.DefaultNamespace {
			l = log.With().Str("namespace", name).Logger()
		}
		nc, js, err := c.Open(ctx, name, role, "jetflow-"+string(role),
			func(err error) { l.Warn().Err(err).Msg("waiting for jetstream") },
			func(err error) { l.Warn().Err(err).Msg("nats") })
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("namespace %s: %w", name, err)
		}
		nss = append(nss, Namespace{Name: name, NC: nc, JS: js, Log: l})
	}
	return nss, closeAll, nil
}
