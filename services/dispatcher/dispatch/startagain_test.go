package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/workflow"
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

// TestAFreshClaimOverAnUnclaimedHistoryReadsIt: a start whose claim this
// dispatcher just made does not look for a history (none can have been
// recorded without the claim); one that is there all the same (written
// without a claim: by hand, or restored without the ids bucket) makes the
// start's append conflict, and the dispatcher reads it then and goes on
// from it, starting nothing twice.
func TestAFreshClaimOverAnUnclaimedHistoryReadsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def := b.register(t, "greet", "hello", "bye")
	started := events.New("elsewhere", "x3", "greet", time.Now(), &events.ExecutionStarted{Workflow: "greet", Version: 1,
		Input: json.RawMessage(`{}`), Steps: def.StepRefs(), Definition: json.RawMessage(`{"name":"greet","steps":[{"id":"hello","kind":"noop"},{"id":"bye","kind":"noop"}]}`),
		Token: "tok", CommandKey: "elsewhere#1"})
	_, err := history.Append(t.Context(), b.js, bus.ExecutionSubject("greet", "x3"), 0, started)
	require.NoError(t, err)

	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.start(t, "greet", "x3")
	task := b.nextTask(t)
	require.Equal(t, "hello", task.task.StepID)
	require.Equal(t, "tok", task.task.Token, "the history that was there goes on")
	evs := readHistory(t, b.js, "greet", "x3")
	require.Equal(t, 1, countType(evs, events.TypeExecutionStarted), "not started again")
	require.Equal(t, "elsewhere", evs[0].Source)
	require.Equal(t, 1, dispatches(evs))
}

// TestTheFirstInputSeesTheRecordedStartTime: the first operation's input
// is rendered when the start is decided, and carried by the start's
// event: ${workflow.started_at} in it is the time the history records
// for the start (a second rendering, after a crash or in a replay, gives
// the same), with the dispatcher's real clock.
func TestTheFirstInputSeesTheRecordedStartTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	d, err := workflow.Parse([]byte(`
name: when
steps:
  - id: first
    kind: log
    message: ${workflow.started_at}
  - id: second
    kind: log
    message: ${workflow.started_at}
`))
	require.NoError(t, err)
	_, _, err = b.defs.Apply(t.Context(), d)
	require.NoError(t, err)
	b.start(t, "when", "w1")
	first := b.nextTask(t)
	evs := readHistory(t, b.js, "when", "w1")
	require.Equal(t, 1, dispatches(evs), "the start carries the first dispatch")
	recorded := evs[0].Time.UTC().Format(time.RFC3339Nano)
	var spec workflow.Step
	require.NoError(t, json.Unmarshal(first.task.Spec, &spec))
	require.Equal(t, recorded, spec.Message, "the start time as the history records it")

	b.report(t, &events.OperationSucceeded{TaskRef: first.ref("test-agent", 1)})
	second := b.nextTask(t)
	require.NoError(t, json.Unmarshal(second.task.Spec, &spec))
	require.Equal(t, recorded, spec.Message, "the same in every step")
}
