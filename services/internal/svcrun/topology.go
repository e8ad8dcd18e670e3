package svcrun

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
)

// TopologyEvery is how often a service looks for the streams and buckets
// it uses.
const TopologyEvery = 15 * time.Second

// watchTopology watches the streams and buckets role may look up
// (bus.Topology), creating again what is missing unless restricted (the
// service has -creds, and may not), and logs what it finds.
func watchTopology(ctx context.Context, js jetstream.JetStream, c bus.Config, role auth.Role, restricted bool,
	period time.Duration, log zerolog.Logger) *bus.Topology {
	var mayLook func(string) bool
	if restricted {
		// An agent's rights to look streams up do not depend on its queues.
		perms, err := auth.PermissionsFor(role, []string{"any"}, "_INBOX")
		if err != nil {
			return nil
		}
		mayLook = perms.LooksUp
	}
	return bus.WatchTopology(ctx, js, c, mayLook, !restricted, period, TopologyLog(log))
}

// TopologyLog logs what a topology watch finds.
func TopologyLog(log zerolog.Logger) bus.TopologyEvents {
	return bus.TopologyEvents{
		Missing: func(name string, recreating bool) {
			if recreating {
				log.Error().Str("missing", name).Msg("a stream or bucket this service uses is missing: creating it again")
			} else {
				log.Error().Str("missing", name).Msg("a stream or bucket this service uses is missing: jetflow bootstrap creates it again")
			}
		},
		Back: func(name string, recreated bool) {
			log.Info().Str("stream_or_bucket", name).Bool("recreated", recreated).Msg("stream or bucket is there again")
		},
		Failed: func(err error) { log.Debug().Err(err).Msg("look for the streams and buckets") },
	}
}
