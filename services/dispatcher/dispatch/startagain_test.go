package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestAStartThatComesAgainFindsItsHistory: a start is loaded by asking
// the stream's leader for the history's last event first (most histories
// are empty then); the same command coming again (published anew, past
// the commands stream's dedupe) finds its claim and the history it
// started, and starts nothing twice.
func TestAStartThatComesAgainFindsItsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "greet", "hello", "bye")
	ev := events.New("test-client", "", "", time.Now(), &events.StartExecution{
		Workflow: "greet", ExecutionID: "x2", Input: json.RawMessage(`{"who":"test"}`)})
	publish := func(msgID string) {
		msg, err := bus.Encode(bus.SubjectStart, ev)
		require.NoError(t, err)
		_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(msgID))
		require.NoError(t, err)
	}
	publish("first")
	waitHistory(t, b.js, "greet", "x2", "hello sent", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	publish("second")
	waitCommandsHandled(t, b.js)
	evs := readHistory(t, b.js, "greet", "x2")
	require.Equal(t, []events.Type{events.TypeExecutionStarted}, typesOf(evs), "one start, with hello's dispatch")
	require.Equal(t, 1, dispatches(evs))
}
