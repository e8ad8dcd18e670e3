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
	k.beforeTask(time.Now())
	natstest.Eventually(t, 15*time.Second, k.off.Load, "keepers are turned off")
	k.beforeTask(time.Now().Add(time.Hour))                     // due, but off
	_, err = js.Publish(t.Context(), bus.TaskSubject("q"), nil) // flushes what beforeTask might have sent
	require.NoError(t, err)
	info, err := tasks.Info(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "the task only: no keeper was stored")
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
	for range 2 * keeperPer { // at one instant: the first, then one per keeperPer
		k.beforeTask(now)
	}
	k.beforeTask(now.Add(keeperEvery)) // a second later
	k.beforeTask(now.Add(keeperEvery)) // not again
	// Published after them on the same connection, a task is stored after
	// them: once it is, they all are.
	_, err = js.Publish(t.Context(), bus.TaskSubject("q"), nil)
	require.NoError(t, err)
	info, err := tasks.Info(t.Context(), jetstream.WithSubjectFilter(bus.TasksPrefix+".>"))
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{bus.TasksKeeperSubject: 3, bus.TaskSubject("q"): 1}, info.State.Subjects)
	require.False(t, k.off.Load())
}
