package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

// TestThePointerIsReadDirectlyOnlyFromALoneStream: a start reads the
// latest pointer by a direct get only from a bucket that only its leader
// can answer: one replica on a server in no cluster. A clustered bucket
// is read from its leader, even scaled to one replica (its followers
// answer direct gets until they have left, after the configuration says
// one).
func TestThePointerIsReadDirectlyOnlyFromALoneStream(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	ctx := t.Context()

	_, single := natstest.Connect(t, natstest.RunJetStream(t))
	s, err := Open(ctx, single)
	require.NoError(t, err)
	require.True(t, s.alone(ctx), "one server: one replica, its own leader")

	js := natstest.ConnectCluster(t, natstest.RunCluster(t))[1]
	c, err := Open(ctx, js)
	require.NoError(t, err)
	require.False(t, c.alone(ctx), "three replicas")

	stream, err := js.Stream(ctx, bus.BucketStream(bus.BucketDefinitions))
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	cfg.Replicas = 1
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	stream, err = js.Stream(ctx, bus.BucketStream(bus.BucketDefinitions))
	require.NoError(t, err)
	require.Equal(t, 1, stream.CachedInfo().Config.Replicas)
	c.lone.checked = time.Time{} // ask again now
	require.False(t, c.alone(ctx), "one replica in a cluster: read from the leader")
}

// TestALoneFindingIsKeptForAWhile: a finding that the stream is alone
// counts for twice the check's period; a check that cannot tell (here a
// request cut short) says no, and reads go to the leader.
func TestALoneFindingIsKeptForAWhile(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	s, err := Open(t.Context(), js)
	require.NoError(t, err)
	now := time.Now()
	s.now = func() time.Time { return now }
	require.True(t, s.alone(t.Context()))

	cut, cancel := context.WithCancel(t.Context())
	cancel()
	now = now.Add(loneCheckEvery / 2)
	require.True(t, s.alone(cut), "not asked again within its period")
	now = now.Add(loneCheckEvery)
	require.False(t, s.alone(cut), "asked again, and the request failed")
	now = now.Add(loneCheckEvery / 2)
	require.False(t, s.alone(cut), "the failed check's answer is kept")
	now = now.Add(loneCheckEvery)
	require.True(t, s.alone(t.Context()), "asked again, and it is")
}

func TestLoneStream(t *testing.T) {
	t.Parallel()
	info := func(replicas int, cluster *jetstream.ClusterInfo) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Replicas: replicas}, Cluster: cluster}
	}
	for _, tc := range []struct {
		name string
		info *jetstream.StreamInfo
		want bool
	}{
		{"NoInfo", nil, false},
		{"SingleServer", info(1, &jetstream.ClusterInfo{Leader: "n1"}), true},
		{"SingleServerNoClusterInfo", info(0, nil), true},
		{"ThreeReplicas", info(3, &jetstream.ClusterInfo{Name: "jf", RaftGroup: "S-R3F", Replicas: []*jetstream.PeerInfo{{Name: "n2"}, {Name: "n3"}}}), false},
		{"ScaledDownFollowersLeft", info(1, &jetstream.ClusterInfo{Name: "jf", RaftGroup: "S-R1F"}), false},
		{"ScalingDown", info(1, &jetstream.ClusterInfo{Name: "jf", RaftGroup: "S-R3F", Replicas: []*jetstream.PeerInfo{{Name: "n2"}}}), false},
	} {
		require.Equal(t, tc.want, loneStream(tc.info), tc.name)
	}
}

// TestThePreparedCacheIsBounded: full, it forgets what it held and keeps
// the new one; a key kept is answered with the one kept first.
func TestThePreparedCacheIsBounded(t *testing.T) {
	c := versionCache[*startcheck.Definition]{size: (*startcheck.Definition).Size}
	first := &startcheck.Definition{Name: "w", Version: 1}
	require.Same(t, first, c.put("def.w.1", first))
	require.Same(t, first, c.put("def.w.1", &startcheck.Definition{Name: "w", Version: 1}), "the one kept first")
	for i := 2; i <= cacheEntries; i++ {
		c.put(fmt.Sprintf("def.w.%d", i), &startcheck.Definition{Name: "w", Version: i})
	}
	require.Len(t, c.kept, cacheEntries)
	c.put("def.x.1", &startcheck.Definition{Name: "x", Version: 1})
	require.Len(t, c.kept, 1, "forgot what it held")
	_, ok := c.get("def.w.1")
	require.False(t, ok)
}

// TestThePreparedCacheIsBoundedByBytes: a definition larger than a
// quarter of the bound is not kept; past the bound, the cache starts
// over.
func TestThePreparedCacheIsBoundedByBytes(t *testing.T) {
	prepared := func(t *testing.T, name string, bytes int) *startcheck.Definition {
		t.Helper()
		d, err := startcheck.Prepare(name, 1, workflow.Definition{Name: name, Description: strings.Repeat("x", bytes),
			Steps: []workflow.Step{{ID: "a", Kind: workflow.KindNoop}}})
		require.NoError(t, err)
		return d
	}
	c := versionCache[*startcheck.Definition]{size: (*startcheck.Definition).Size}
	huge := prepared(t, "huge", cacheBytes/4+1)
	require.Same(t, huge, c.put("def.huge.1", huge), "handed back")
	_, ok := c.get("def.huge.1")
	require.False(t, ok, "not kept")
	for i := range 3 {
		c.put(fmt.Sprintf("def.big.%d", i), prepared(t, "big", cacheBytes/4-100))
	}
	require.Len(t, c.kept, 3)
	c.put("def.more.1", prepared(t, "more", cacheBytes/4-100))
	require.Len(t, c.kept, 4, "at the bound")
	c.put("def.last.1", prepared(t, "last", 1000))
	require.Len(t, c.kept, 1, "past it: started over")
}
