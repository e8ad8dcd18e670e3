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

// watchTopology watches the streams and buckets role uses (those its
// identity may look up: the same ones with or without -creds), and logs
// what it finds. It creates nothing: a stream or bucket created again
// with this service's settings could differ from the deployment's (its
// replicas, the partition count), so that is left to jetflow bootstrap.
func watchTopology(ctx context.Context, js jetstream.JetStream, c bus.Config, role auth.Role,
	period time.Duration, log zerolog.Logger) *bus.Topology {
	// An agent's rights to look streams up do not depend on its queues.
	perms, err := auth.PermissionsFor(role, []string{"any"}, "_INBOX")
	if err != nil {
		return nil
	}
	return bus.WatchTopology(ctx, js, c, perms.LooksUp, period, TopologyLog(log))
}

// TopologyLog logs what a topology watch finds.
func TopologyLog(log zerolog.Logger) bus.TopologyEvents {
	return bus.TopologyEvents{
		Missing: func(name string) {
			log.Error().Str("missing", name).Msg("a stream or bucket this service uses is missing: jetflow bootstrap creates it again")
		},
		Back:   func(name string) { log.Info().Str("stream_or_bucket", name).Msg("stream or bucket is there again") },
		Failed: func(err error) { log.Debug().Err(err).Msg("look for the streams and buckets") },
	}
}
