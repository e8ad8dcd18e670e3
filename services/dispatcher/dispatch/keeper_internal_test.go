package dispatch

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestKeepersStopOnAStreamWithoutTTLs: a tasks stream made by an older
// bootstrap does not allow per-message TTLs; the first keeper is refused,
// and the dispatcher publishes none after it (its tasks are published as
// before).
func TestKeepersStopOnAStreamWithoutTTLs(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	tasks, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: bus.StreamTasks, Subjects: []string{bus.TasksPrefix + ".>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	require.NoError(t, err)

	k := newKeeper(js, zerolog.New(zerolog.NewTestWriter(t)))
	now := time.Now()
	k.beforeTask(now)
	natstest.Eventually(t, 15*time.Second, func() bool { return k.offUntil.Load() > 0 }, "keepers are turned off")
	require.True(t, k.warned.Load(), "said once")
	sent := nc.Stats().OutMsgs
	k.beforeTask(now.Add(keeperEvery)) // due, but off
	require.Equal(t, sent, nc.Stats().OutMsgs, "nothing published while off")

	t.Log("tried again after keeperRetry: the stream may have been bootstrapped since")
	k.beforeTask(now.Add(keeperRetry))
	require.Equal(t, sent+1, nc.Stats().OutMsgs)
	natstest.Eventually(t, 15*time.Second, func() bool { return k.offUntil.Load() >= now.Add(2*keeperRetry).UnixNano() },
		"refused again, off again")
	info, err := tasks.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "no keeper was stored")
}

// TestAKeeperIsDueEverySecondOrEveryKeeperPerTasks: one keeper for the
// first task, then one a second or one per keeperPer tasks, whichever
// comes first.
func TestAKeeperIsDueEverySecondOrEveryKeeperPerTasks(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	tasks, err := js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	k := newKeeper(js, zerolog.New(zerolog.NewTestWriter(t)))
	now := time.Now()
	for range 2*keeperPer - 1 { // at one instant: the first, then one per keeperPer
		k.beforeTask(now)
	}
	k.beforeTask(now.Add(keeperEvery)) // a second later: due by time alone (keeperPer-1 since)
	k.beforeTask(now.Add(keeperEvery)) // not again
	// Published after them on the same connection, a task is stored after
	// them: once it is, they all are.
	_, err = js.Publish(t.Context(), bus.TaskSubject("q"), nil)
	require.NoError(t, err)
	info, err := tasks.Info(t.Context(), jetstream.WithSubjectFilter(bus.TasksPrefix+".>"))
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{bus.TasksKeeperSubject: 3, bus.TaskSubject("q"): 1}, info.State.Subjects)
	require.Zero(t, k.offUntil.Load(), "keepers are on")
}
