package devstack

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
)

// TopologyEvery is how often the stack looks for its streams and buckets.
const TopologyEvery = 15 * time.Second

// watchTopology looks every cfg.TopologyEvery for the streams and buckets
// of namespace ns, as the admin identity, and makes a missing one again
// with the bootstrap's settings: the development stack is its own
// bootstrap. (A service bound to a durable consumer of a stream made
// again may need the stack restarted: the log says so.) stop ends the
// watch and closes its connection.
func watchTopology(ctx context.Context, info Info, ns string, cfg Config) (topo *bus.Topology, stop func(), err error) {
	opts, err := info.OptionsIn(ns, auth.RoleAdmin)
	if err != nil {
		return nil, nil, fmt.Errorf("topology watch: %w", err)
	}
	log := cfg.Log.With().Str("service", "bootstrap").Logger()
	if ns != auth.DefaultNamespace {
		log = log.With().Str("namespace", ns).Logger()
	}
	c := bus.Config{Replicas: cfg.Replicas, OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }}
	nc, js, err := bus.Open(ctx, info.NATSURL, "jetflow-bootstrap", c, append(opts, nats.MaxReconnects(-1))...)
	if err != nil {
		return nil, nil, fmt.Errorf("topology watch: %w", err)
	}
	var self atomic.Pointer[bus.Topology] // the watch, for its own events
	topo = bus.WatchTopology(ctx, js, c, nil, cmp.Or(cfg.TopologyEvery, TopologyEvery), bus.TopologyEvents{
		Missing: func(name string) {
			log.Error().Str("missing", name).Msg("a stream or bucket is missing: making it again")
		},
		Looked: func(missing []string) {
			if len(missing) > 0 && remake(ctx, log, func(ctx context.Context) error { // until a look finds them all
				return bus.Bootstrap(ctx, js, c, bus.Durables{TaskAckWait: cfg.TaskAckWait, MaxDeliver: cfg.MaxDeliver})
			}, missing) {
				self.Load().LookAgain() // so that /readyz says so at once
			}
		},
		Back:   func(name string) { log.Info().Str("stream_or_bucket", name).Msg("stream or bucket is there again") },
		Failed: func(err error) { log.Debug().Err(err).Msg("look for the streams and buckets") },
	})
	self.Store(topo)
	return topo, func() { topo.Stop(); nc.Close() }, nil
}

// remake runs the bootstrap for the missing streams and buckets and logs
// the outcome; the next look tries again if it failed.
func remake(ctx context.Context, log zerolog.Logger, bootstrap func(context.Context) error, missing []string) bool {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := bootstrap(ctx); err != nil {
		log.Error().Err(err).Strs("missing", missing).Msg("make a missing stream or bucket again, will try again")
		return false
	}
	log.Warn().Strs("made", missing).Msg("made a missing stream or bucket again (empty: what it held is lost); restart jetflow dev if a service stays stuck")
	return true
}
