package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

// TestSeenTasksReadEachPlaceOnce: a look-up reads a queue lane once, then
// only what was stored since; a task taken from its queue since it was
// seen is still seen (it was stored); what was read is forgotten after
// seenFor; past seenMax nothing is kept and each look-up reads anew.
func TestSeenTasksReadEachPlaceOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	lane := bus.TaskSubject("seen")
	publish := func(id, token string) uint64 {
		t.Helper()
		ev := events.New("test", "x", "wf", time.Now(), &events.Task{TaskID: id, ExecutionID: "x", Workflow: "wf", StepID: "s", Attempt: 1, Token: token, Kind: "noop", Queue: "seen"})
		ev.ID = id
		msg, err := bus.Encode(lane, ev)
		require.NoError(t, err)
		ack, err := js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(id))
		require.NoError(t, err)
		return ack.Sequence
	}
	var c seenTasks
	reads := 0
	read := func(r placeReader) placeReader {
		return func(ctx context.Context, js jetstream.JetStream, from uint64, fn func(string, seenTask, uint64) bool) error {
			reads++
			return r(ctx, js, from, fn)
		}
	}(queueReader(bus.StreamTasks, lane))
	find := func(id, token string) (seenTask, bool) {
		t.Helper()
		got, ok, err := c.find(t.Context(), js, "lane", read, id, token)
		require.NoError(t, err)
		return got, ok
	}

	a := publish("x.a.1", "tok")
	got, ok := find("x.a.1", "tok")
	require.True(t, ok)
	require.Equal(t, a, got.seq)
	_, ok = find("x.a.1", "other")
	require.False(t, ok, "sent with another token: not this task")
	_, ok = find("x.b.1", "tok")
	require.False(t, ok)

	t.Log("a task stored since is read from where the last read stopped")
	p := c.places["lane"]
	require.Equal(t, a+1, p.next)
	b := publish("x.b.1", "tok")
	got, ok = find("x.b.1", "tok")
	require.True(t, ok)
	require.Equal(t, b, got.seq)
	require.Equal(t, b+1, p.next)

	t.Log("one taken from its queue since was stored: still seen, without a read")
	tasks, err := js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	require.NoError(t, tasks.DeleteMsg(t.Context(), a))
	before := reads
	_, ok = find("x.a.1", "tok")
	require.True(t, ok)
	require.Equal(t, before, reads)

	t.Log("forgotten after seenFor")
	p.read.Store(time.Now().Add(-2 * seenFor).UnixNano())
	_, ok = find("x.a.1", "tok")
	require.False(t, ok, "read anew: it left its queue")
	require.NotSame(t, p, c.places["lane"])

	t.Log("past seenMax nothing is kept: each look-up reads the whole place, and stops at what it looks for")
	q := c.places["lane"]
	q.full, q.ids = true, map[string]seenTask{}
	got, ok = find("x.b.1", "tok")
	require.True(t, ok)
	require.Equal(t, b, got.seq)
	require.Empty(t, q.ids)
}
