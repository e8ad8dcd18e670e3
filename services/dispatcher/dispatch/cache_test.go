package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
)

// TestEndedExecutionsLeaveTheCache: an execution that ended is not kept
// in the dispatcher's cache of states (a soak found them held until
// 10,000 newer ones pushed them out); one still running is.
func TestEndedExecutionsLeaveTheCache(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	defs, err := catalog.Open(ctx, js)
	require.NoError(t, err)
	for _, src := range []string{
		"name: quick\nsteps:\n  - {id: a, kind: let, vars: {x: 1}}\n",
		"name: waits\nsteps:\n  - {id: w, kind: wait, signal: go}\n",
	} {
		def, err := workflow.Parse([]byte(src))
		require.NoError(t, err)
		_, _, err = defs.Apply(ctx, def)
		require.NoError(t, err)
	}
	d, err := New(ctx, Config{}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)

	start := func(wf, id string) {
		ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: wf, ExecutionID: id, Input: json.RawMessage(`{}`)})
		msg, err := bus.Encode(bus.SubjectStart, ev)
		require.NoError(t, err)
		_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID))
		require.NoError(t, err)
	}
	last := func(wf, id string) events.Type {
		stream, err := js.Stream(ctx, bus.StreamEvents)
		if err != nil {
			return ""
		}
		m, err := stream.GetLastMsgForSubject(ctx, bus.ExecutionSubject(wf, id))
		if err != nil {
			return ""
		}
		return events.Type(m.Header.Get("ce-type"))
	}
	cached := func(id string) bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.cache.get(id)
		return ok
	}
	start("quick", "q1")
	start("waits", "w1")
	natstest.Eventually(t, 30*time.Second, func() bool { return last("quick", "q1") == events.TypeExecutionSucceeded }, "q1 ends")
	natstest.Eventually(t, 30*time.Second, func() bool { return last("waits", "w1") == events.TypeStepWaiting }, "w1 waits")
	natstest.Eventually(t, 10*time.Second, func() bool { return !cached("q1") }, "the ended execution leaves the cache")
	// Cached once its handling is over, which comes a moment after its
	// last event is in the stream (a plain check failed 1 run in 30).
	natstest.Eventually(t, 10*time.Second, func() bool { return cached("w1") }, "one that waits stays")
}
