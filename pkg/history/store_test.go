package history_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
)

// TestStoreAsksForTheStreamOnce: a store opened once appends, reads the
// last sequence of a subject and the first event without another
// stream-info request (each would be a round trip to the stream's leader
// for nothing), and gives the same answers as the package functions.
func TestStoreAsksForTheStreamOnce(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	// A channel subscription: the client's reader puts each request in
	// the channel before it reads the PONG that ends a Flush, so after a
	// Flush the channel holds every request made before it (a callback
	// might not have run yet on a loaded machine).
	infos := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("$JS.API.STREAM.INFO."+bus.StreamEvents, infos)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	store, err := history.Open(ctx, js)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	opened := len(infos)
	require.Positive(t, opened, "the subscription sees the stream-info request of Open")

	subj := bus.ExecutionSubject("wf", "x1")
	last, err := store.LastSeq(ctx, subj)
	require.NoError(t, err)
	require.Zero(t, last, "an empty history")
	for i := range 20 {
		ev := newEvent("x1", &events.ExecutionStarted{Workflow: "wf"})
		if i > 0 {
			ev = newEvent("x1", &events.StepSending{StepID: "a", Attempt: i})
		}
		seq, err := store.Append(ctx, subj, last, ev)
		require.NoError(t, err)
		got, err := store.LastSeq(ctx, subj)
		require.NoError(t, err)
		require.Equal(t, seq, got)
		last = seq
	}
	first, err := store.First(ctx, bus.ExecutionFilter("x1"))
	require.NoError(t, err)
	require.Equal(t, events.TypeExecutionStarted, first.Type)
	evs, err := store.Read(ctx, subj, 0)
	require.NoError(t, err)
	require.Len(t, evs, 20)
	require.Equal(t, last, evs[19].Seq)

	require.NoError(t, nc.Flush())
	require.Equal(t, opened, len(infos), "no stream-info request after Open")

	_, err = store.Append(ctx, subj, 1, newEvent("x1", &events.StepSending{StepID: "b", Attempt: 1}))
	require.ErrorIs(t, err, bus.ErrConflict, "the fence holds through the store")
}

// TestOpenRefusesAnEventsStreamWithoutDirectGets: an events stream made
// by an earlier release (no direct gets, with which histories are read)
// is refused at Open, saying to run the bootstrap, instead of every read
// failing later with "no responders".
func TestOpenRefusesAnEventsStreamWithoutDirectGets(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	natstest.ChangeStream(t, js, bus.StreamEvents, func(cfg *jetstream.StreamConfig) {
		require.True(t, cfg.AllowDirect, "made by this release")
		cfg.AllowDirect = false
	})

	_, err := history.Open(ctx, js)
	require.ErrorIs(t, err, history.ErrNoDirectGets)
	require.ErrorContains(t, err, "run jetflow bootstrap")

	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}), "the bootstrap of this release")
	_, err = history.Open(ctx, js)
	require.NoError(t, err)
}

// TestAppendBatch: each append of a batch is fenced by its own expected
// sequence and succeeds or fails alone: a stale one conflicts and stores
// nothing, the others are stored after the sequences they expected.
func TestAppendBatch(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	store, err := history.Open(ctx, js)
	require.NoError(t, err)
	subj := func(id string) string { return bus.ExecutionSubject("wf", id) }
	first, err := store.Append(ctx, subj("x1"), 0, newEvent("x1", &events.VariablesSet{StepID: "a"}))
	require.NoError(t, err)
	_, err = store.Append(ctx, subj("x2"), 0, newEvent("x2", &events.VariablesSet{StepID: "a"}))
	require.NoError(t, err)

	out := store.AppendBatch(ctx, []history.Pending{
		{Subject: subj("x1"), LastSeq: first, Event: newEvent("x1", &events.VariablesSet{StepID: "b"})},
		{Subject: subj("x2"), LastSeq: 0, Event: newEvent("x2", &events.VariablesSet{StepID: "b"})}, // stale
		{Subject: subj("x3"), LastSeq: 0, Event: newEvent("x3", &events.VariablesSet{StepID: "a"})},
	})
	require.Len(t, out, 3)
	require.NoError(t, out[0].Err)
	require.ErrorIs(t, out[1].Err, bus.ErrConflict)
	require.NoError(t, out[2].Err)
	for _, c := range []struct {
		id   string
		n    int
		last uint64 // 0: not appended by the batch
	}{{"x1", 2, out[0].Seq}, {"x2", 1, 0}, {"x3", 1, out[2].Seq}} {
		evs, err := store.Read(ctx, subj(c.id), 0)
		require.NoError(t, err)
		require.Len(t, evs, c.n, c.id)
		if c.last != 0 {
			require.Equal(t, c.last, evs[len(evs)-1].Seq, c.id)
		}
	}
	require.Greater(t, out[0].Seq, first)
}
