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

// Open connects the service to NATS with its identity, logging why it
// still waits and any asynchronous error (a permission violation says
// which subject the identity may not use).
func Open(ctx context.Context, c *svc.Common, name string, log zerolog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	return c.Open(ctx, name,
		func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") },
		func(err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				log.Error().Err(err).Msg("nats permission violation: this identity may not do that")
				return
			}
			log.Warn().Err(err).Msg("nats")
		})
}
