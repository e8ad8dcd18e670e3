package catalog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestThePointerIsReadDirectlyOnlyFromALoneReplica: a start reads the
// latest pointer by a direct get only while the definitions bucket has
// one replica (its own leader); a bucket of three is read from its
// leader, since a replica behind it would answer a direct get with the
// version before an apply. A bucket scaled either way is seen within
// loneCheckEvery.
func TestThePointerIsReadDirectlyOnlyFromALoneReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	ctx := t.Context()

	_, single := natstest.Connect(t, natstest.RunJetStream(t))
	s, err := Open(ctx, single)
	require.NoError(t, err)
	require.True(t, s.alone(ctx), "one server: one replica")

	js := natstest.ConnectCluster(t, natstest.RunCluster(t))[1]
	c, err := Open(ctx, js)
	require.NoError(t, err)
	require.False(t, c.alone(ctx), "three replicas")

	scale := func(replicas int) {
		stream, err := js.Stream(ctx, bus.BucketStream(bus.BucketDefinitions))
		require.NoError(t, err)
		cfg := stream.CachedInfo().Config
		cfg.Replicas = replicas
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	scale(1)
	natstest.Eventually(t, 30*time.Second, func() bool { return c.alone(ctx) }, "scaled to one replica")
	scale(3)
	require.Eventually(t, func() bool { return !c.alone(ctx) }, loneCheckEvery+15*time.Second, 10*time.Millisecond,
		"scaled back to three replicas: read from the leader within %s", loneCheckEvery)
}
