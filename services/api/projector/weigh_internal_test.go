package projector

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
)

// TestAModelIsWeighedByTheEventsItIsWrittenFor: the pace's bytes are each
// model written times the events it brings (what writing it at every
// event would take, gathered or not), not counting the events of a
// redelivery that the model held already.
func TestAModelIsWeighedByTheEventsItIsWrittenFor(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	p, err := New(ctx, js, zerolog.Nop())
	require.NoError(t, err)

	const id = "weighed"
	subject := bus.ExecutionSubject("wf", id)
	var evs []events.Event
	var last uint64
	for _, pl := range []events.Payload{
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: []events.StepRef{{ID: "s", Kind: "noop"}}, Token: "t"},
		&events.StepScheduled{StepID: "s", Attempt: 1},
		&events.StepSending{StepID: "s", Attempt: 1, TaskID: id + ".s.1", Queue: "default"},
	} {
		ev := events.New("test", id, "wf", time.Now(), pl)
		ev.PrevSeq = last
		last, err = history.Append(ctx, js, subject, last, ev)
		require.NoError(t, err)
		ev.Seq = last
		evs = append(evs, ev)
	}
	size := func() uint64 {
		e, err := kv.Get(ctx, id)
		require.NoError(t, err)
		return uint64(len(e.Value()))
	}

	require.NoError(t, p.project(ctx, &group{subject: subject, workflow: "wf", id: id, evs: evs[:2]}))
	require.Equal(t, 2*size(), p.weighed.Load(), "a model of two events")
	was := p.weighed.Load()
	// Redelivered with the next one: only the next one weighs.
	require.NoError(t, p.project(ctx, &group{subject: subject, workflow: "wf", id: id, evs: evs}))
	require.Equal(t, size(), p.weighed.Load()-was, "one event new")
	require.Equal(t, uint64(2), p.writes.Load())
}
