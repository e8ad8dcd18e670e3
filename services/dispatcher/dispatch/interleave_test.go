package dispatch_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

// These tests run dispatchers one after another on the same consumers, to
// force the interleavings that several dispatcher processes can produce.

func foldOf(t *testing.T, js jetstream.JetStream, wf, id string) projections.Execution {
	t.Helper()
	evs, err := history.Read(t.Context(), js, bus.ExecutionSubject(wf, id), 0)
	require.NoError(t, err)
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	return s
}

// stepIs reports whether step i of x1 is in status st.
func stepIs(t *testing.T, js jetstream.JetStream, i int, st projections.OpStatus) bool {
	s := foldOf(t, js, "wf", "x1")
	return i < len(s.Steps) && s.Steps[i].Status == st
}

// stepSent reports whether step i of x1 is sending (or sent) and its task
// is stored in its queue: a dispatcher records the sending before it
// publishes the task, and the publish with the step's next event
// (docs/adr/0007).
func stepSent(t *testing.T, js jetstream.JetStream, i int) bool {
	s := foldOf(t, js, "wf", "x1")
	if i >= len(s.Steps) || (s.Steps[i].Status != projections.OpSending && s.Steps[i].Status != projections.OpSent) {
		return false
	}
	return taskStored(t, js, s.Steps[i].TaskID)
}

// runUntil runs d until cond holds, then stops it; it fails the test if
// cond does not hold within waitFor.
func runUntil(t *testing.T, d *dispatch.Dispatcher, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop := func() error {
		stopped = true
		cancel()
		return <-done
	}
	defer func() { // also when cond fails the test
		if !stopped {
			_ = stop()
		}
	}()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			require.NoError(t, stop())
			t.Fatalf("runUntil: the condition did not hold within %s", waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let it finish what it took (not a condition: it may take nothing)
	require.NoError(t, stop())
}

func publishPayload(t *testing.T, js jetstream.JetStream, subject string, ev events.Event) {
	t.Helper()
	msg, err := bus.Encode(subject, ev)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
}

func succeeded(t *testing.T, js jetstream.JetStream, token, step string) {
	t.Helper()
	ref := events.TaskRef{TaskID: events.TaskID("x1", step, 1), ExecutionID: "x1", Workflow: "wf", StepID: step, Attempt: 1, Token: token, Queue: "default"}
	publishPayload(t, js, bus.ResultSubject("default", "x1"), events.New("test-agent", "x1", "wf", time.Now(), &events.OperationSucceeded{TaskRef: ref}))
}

func interleaveSetup(t *testing.T, steps ...string) (jetstream.JetStream, func(source string) *dispatch.Dispatcher) {
	t.Helper()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	d := workflow.Definition{Name: "wf"}
	for _, s := range steps {
		d.Steps = append(d.Steps, workflow.Step{ID: s, Kind: workflow.KindNoop})
	}
	_, _, err = defs.Apply(t.Context(), d)
	require.NoError(t, err)
	log := zerolog.New(zerolog.NewTestWriter(t))
	newDispatcher := func(source string) *dispatch.Dispatcher {
		_, js := natstest.Connect(t, srv) // its own connection, as another process would have
		dd, err := dispatch.New(t.Context(), dispatch.Config{Source: source}, js, log.With().Str("dispatcher", source).Logger())
		require.NoError(t, err)
		return dd
	}
	start := events.New("client", "", "", time.Now(), &events.StartExecution{Workflow: "wf", ExecutionID: "x1", Input: json.RawMessage(`{}`)})
	publishPayload(t, js, bus.SubjectStart, start)
	return js, newDispatcher
}

// TestStaleCacheNeverDropsAResult: dispatcher A starts an execution, B
// applies step 1's result and sends step 2, then step 2's result goes to A,
// whose cached state still has step 2 unsent. A must notice its cache is
// behind rather than ack the result as stale.
func TestStaleCacheNeverDropsAResult(t *testing.T) {
	t.Parallel()
	js, newDispatcher := interleaveSetup(t, "s1", "s2")
	a, b := newDispatcher("A"), newDispatcher("B")
	runUntil(t, a, func() bool { return stepSent(t, js, 0) })
	token := foldOf(t, js, "wf", "x1").Token

	succeeded(t, js, token, "s1")
	runUntil(t, b, func() bool { return stepSent(t, js, 1) })
	succeeded(t, js, token, "s2")
	runUntil(t, a, func() bool { return foldOf(t, js, "wf", "x1").Status == projections.StatusSucceeded })
	require.Equal(t, projections.StatusSucceeded, foldOf(t, js, "wf", "x1").Status, "step 2's success must be recorded")
}

// TestReconcileNamingAnotherWorkflowChangesNothing: a reconcile command
// with the wrong workflow (bad input) must not poison the dispatcher's
// view of the execution, and the real result must still be applied.
func TestReconcileNamingAnotherWorkflowChangesNothing(t *testing.T) {
	t.Parallel()
	js, newDispatcher := interleaveSetup(t, "s1")
	runUntil(t, newDispatcher("A"), func() bool { return stepSent(t, js, 0) })
	token := foldOf(t, js, "wf", "x1").Token

	rc := events.New("someone", "x1", "nope", time.Now(), &events.ReconcileExecution{ExecutionID: "x1", Workflow: "nope"})
	publishPayload(t, js, bus.SubjectReconcile, rc)
	cold := newDispatcher("A2")
	succeeded(t, js, token, "s1")
	runUntil(t, cold, func() bool { return foldOf(t, js, "wf", "x1").Status == projections.StatusSucceeded })
	require.Equal(t, projections.StatusSucceeded, foldOf(t, js, "wf", "x1").Status)
	other, err := history.Read(t.Context(), js, bus.ExecutionSubject("nope", "x1"), 0)
	require.NoError(t, err)
	require.Empty(t, other, "nothing is written under the wrong workflow")
}

// TestTimerFiredBeforeACrashIsActedOn: a dispatcher records TimerFired and
// stops before acting on it; the fire command is redelivered to another
// dispatcher, which must go on from the recorded firing rather than ack it
// as a duplicate and leave the execution asleep forever.
func TestTimerFiredBeforeACrashIsActedOn(t *testing.T) {
	t.Parallel()
	js, newDispatcher := napAndNoop(t)
	start := events.New("client", "", "", time.Now(), &events.StartExecution{Workflow: "wf", ExecutionID: "x1", Input: json.RawMessage(`{}`)})
	publishPayload(t, js, bus.SubjectStart, start)
	runUntil(t, newDispatcher("A"), func() bool { return stepIs(t, js, 0, projections.OpWaiting) })

	// A's last act before it died: the firing is in the history, nothing after it.
	s := foldOf(t, js, "wf", "x1")
	require.Len(t, s.Timers, 1)
	for id := range s.Timers {
		fired := events.New("A", "x1", "wf", time.Now(), &events.TimerFired{TimerID: id})
		fired.PrevSeq = s.LastSeq
		_, err := history.Append(t.Context(), js, bus.ExecutionSubject("wf", "x1"), s.LastSeq, fired)
		require.NoError(t, err)
	}

	runUntil(t, newDispatcher("B"), func() bool { return stepSent(t, js, 1) })
	s = foldOf(t, js, "wf", "x1")
	require.Len(t, s.Steps, 2)
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status, "the recorded firing ends the sleep")
	require.Equal(t, projections.OpSending, s.Steps[1].Status, "and the next step is sent (recorded with its next event)")
}

// napAndNoop runs a JetStream server with the workflow wf (a 1 s sleep,
// then a noop) and returns a connection and a maker of dispatchers, each
// on its own connection, named by source, for tests that hand one
// execution from one dispatcher to another.
func napAndNoop(t *testing.T) (jetstream.JetStream, func(source string) *dispatch.Dispatcher) {
	t.Helper()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "nap", Kind: workflow.KindSleep, Duration: "1s"},
		{ID: "after", Kind: workflow.KindNoop},
	}})
	require.NoError(t, err)
	log := zerolog.New(zerolog.NewTestWriter(t))
	newDispatcher := func(source string) *dispatch.Dispatcher {
		_, js := natstest.Connect(t, srv)
		dd, err := dispatch.New(t.Context(), dispatch.Config{Source: source}, js, log.With().Str("dispatcher", source).Logger())
		require.NoError(t, err)
		return dd
	}
	return js, newDispatcher
}
