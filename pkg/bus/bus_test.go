package bus_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

func TestEnsureIdempotent(t *testing.T) {
	t.Parallel()

	// natstest.Connect has run Ensure once already.
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()

	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))

	var names []string
	for name := range js.StreamNames(ctx).Name() {
		names = append(names, name)
	}
	var want []string
	for _, sc := range bus.Streams(bus.Config{}) {
		want = append(want, sc.Name)
	}
	for _, kc := range bus.Buckets(bus.Config{}) {
		want = append(want, "KV_"+kc.Bucket)
	}
	slices.Sort(names)
	slices.Sort(want)
	require.Equal(t, want, names)

	stream, err := js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, info.Config.Duplicates, "history appends are fenced by sequence: a short window")
	require.True(t, info.Config.DenyDelete)

	t.Log("a changed config updates the streams in place")
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{HistoryDuplicates: 5 * time.Minute}))
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, 5*time.Minute, info.Config.Duplicates)

	windows := map[string]time.Duration{}
	for _, sc := range bus.Streams(bus.Config{}) {
		windows[sc.Name] = sc.Duplicates
	}
	require.Equal(t, 10*time.Minute, windows[bus.StreamCommands])
	require.Equal(t, 2*time.Minute, windows[bus.StreamTasks])
	require.Equal(t, 2*time.Minute, windows[bus.StreamResults])
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()

	for _, sc := range bus.Streams(bus.Config{}) {
		require.Equal(t, 1, sc.Replicas, sc.Name)
	}
	for _, kc := range bus.Buckets(bus.Config{Replicas: 3}) {
		require.Equal(t, 3, kc.Replicas, kc.Bucket)
	}
	streams := bus.Streams(bus.Config{Replicas: -1, Duplicates: time.Minute, CommandsMaxAge: time.Hour})
	idx := slices.IndexFunc(streams, func(sc jetstream.StreamConfig) bool { return sc.Name == bus.StreamCommands })
	require.GreaterOrEqual(t, idx, 0)
	require.Equal(t, 1, streams[idx].Replicas)
	require.Equal(t, time.Minute, streams[idx].Duplicates)
	require.Equal(t, time.Hour, streams[idx].MaxAge)
}

func TestIsConflict(t *testing.T) {
	t.Parallel()

	apiErr := func(code jetstream.ErrorCode) error {
		return &jetstream.APIError{Code: 400, ErrorCode: code, Description: "test"}
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"WrongLastSequence", apiErr(jetstream.JSErrCodeStreamWrongLastSequence), true},
		{"WrongLastSequenceConstant", apiErr(jetstream.JSErrCodeStreamWrongLastSequenceConstant), true},
		{"Code10071", apiErr(10071), true},
		{"Code10164", apiErr(10164), true},
		{"WrappedAPIError", fmt.Errorf("append: %w", apiErr(10164)), true},
		{"ErrConflict", bus.ErrConflict, true},
		{"WrappedErrConflict", fmt.Errorf("append: %w", bus.ErrConflict), true},
		{"OtherAPIError", apiErr(jetstream.JSErrCodeStreamNotFound), false},
		{"BadRequest", apiErr(jetstream.JSErrCodeBadRequest), false},
		{"KeyExists", jetstream.ErrKeyExists, true},
		{"PlainError", errors.New("wrong last sequence"), false},
		{"Nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, bus.IsConflict(tt.err))
		})
	}
}

func TestIsConflictFromServer(t *testing.T) {
	t.Parallel()

	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	subj := bus.ExecutionSubject("wf", "x1")

	_, err := js.Publish(ctx, subj, []byte("1"), jetstream.WithExpectLastSequencePerSubject(0))
	require.NoError(t, err)
	_, err = js.Publish(ctx, subj, []byte("2"), jetstream.WithExpectLastSequencePerSubject(0))
	require.Error(t, err)
	require.True(t, bus.IsConflict(err))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)

	_, err = js.Publish(ctx, "jf.nowhere", []byte("x"))
	require.Error(t, err)
	require.False(t, bus.IsConflict(err))
}

func TestDial(t *testing.T) {
	t.Parallel()

	s := natstest.RunJetStream(t)
	conn, err := bus.Dial(t.Context(), s.ClientURL(), "bus-test")
	require.NoError(t, err)
	t.Cleanup(conn.NC.Close)

	_, err = conn.JS.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	_, err = conn.JS.KeyValue(t.Context(), bus.BucketDefinitions)
	require.NoError(t, err)
}

// TestEnsureNeverLowersReplicas runs on a 3-node cluster: a service that
// ensures the topology with the default (1 replica) must leave R3 streams
// and buckets at 3.
func TestEnsureNeverLowersReplicas(t *testing.T) {
	t.Parallel()
	servers := natstest.RunCluster(t)
	nc, err := nats.Connect(servers[0].ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.Eventually(t, func() bool { return bus.Ensure(ctx, js, bus.Config{Replicas: 3}) == nil }, 45*time.Second, 500*time.Millisecond)
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))
	for _, sc := range bus.Streams(bus.Config{}) {
		s, err := js.Stream(ctx, sc.Name)
		require.NoError(t, err)
		require.Equal(t, 3, s.CachedInfo().Config.Replicas, sc.Name)
	}
	for _, kc := range bus.Buckets(bus.Config{}) {
		kv, err := js.KeyValue(ctx, kc.Bucket)
		require.NoError(t, err)
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, st.Config().Replicas, kc.Bucket)
	}
}

// Every service runs Ensure at start; in a cluster each update is a
// proposal to the meta leader, so a topology that is already right must
// only be read (streams, buckets, the partition count, the results
// transform).
func TestEnsureOnARightTopologyUpdatesNothing(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, s)
	spy, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(spy.Close)
	var updates atomic.Int32
	sub, err := spy.Subscribe("$JS.API.STREAM.UPDATE.>", func(m *nats.Msg) { updates.Add(1); t.Log("update of", m.Subject) })
	require.NoError(t, err)
	require.NoError(t, spy.Flush())
	require.NoError(t, bus.Ensure(t.Context(), js, bus.Config{}))
	require.NoError(t, nc.Flush())
	require.NoError(t, spy.Flush())
	require.NoError(t, sub.Unsubscribe())
	require.Zero(t, updates.Load())

	n, err := bus.Partitions(t.Context(), js)
	require.NoError(t, err)
	require.Equal(t, partition.DefaultCount, n)
	require.ErrorContains(t, bus.Ensure(t.Context(), js, bus.Config{Partitions: 4}), "cannot be changed to 4")
}

// TestEnsureKeepsALaterReleasesMarkerTTL: a later release may give a
// bucket per-message TTLs (its LimitMarkerTTL: the execution ids'
// claims ending a set time after their execution, docs/adr/0022), which
// JetStream cannot turn off. Ensure by this release, during a rolling
// upgrade or a rollback, keeps it rather than failing every service's
// start; nor does it lower the dispatchers' bucket's.
func TestEnsureKeepsALaterReleasesMarkerTTL(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))
	later := map[string]time.Duration{bus.BucketExecutionIDs: time.Minute, bus.BucketDispatchers: 10 * time.Minute}
	for _, kc := range bus.Buckets(bus.Config{}) {
		if d, ok := later[kc.Bucket]; ok {
			kc.LimitMarkerTTL = d
			_, err := js.CreateOrUpdateKeyValue(ctx, kc)
			require.NoError(t, err, kc.Bucket)
		}
	}
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))
	for name, d := range later {
		kv, err := js.KeyValue(ctx, name)
		require.NoError(t, err)
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, d, st.Config().LimitMarkerTTL, name)
	}
}
