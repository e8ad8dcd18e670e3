package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestResumeRunsTheFailedStepAgain: a failed step runs again with its
// recorded input under a new attempt and a new token; the steps that
// succeeded do not.
func TestResumeRunsTheFailedStepAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build", "ship")
	b.start(t, "deploy", "r1")
	build := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: build.task.Ref("test-agent", 1)})
	ship := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: ship.task.Ref("test-agent", 1), Error: "registry down"})
	failed, _ := waitStatus(t, b.js, "deploy", "r1", projections.StatusFailed)

	key := b.act(t, "r1", events.ActionResume, "registry is back")
	again := b.nextTask(t)
	require.Equal(t, "ship", again.task.StepID)
	require.Equal(t, 2, again.task.Attempt)
	require.Equal(t, events.TaskID("r1", "ship", 2), again.task.TaskID)
	require.JSONEq(t, string(ship.task.Spec), string(again.task.Spec), "the recorded input is sent again")
	require.NotEqual(t, failed.Token, again.task.Token, "a resume issues a new token")

	t.Log("a late result of the failed attempt is stale")
	b.report(t, &events.OperationSucceeded{TaskRef: ship.task.Ref("test-agent", 1)})
	waitResultsHandled(t, b.js)
	s := foldOf(t, b.js, "deploy", "r1")
	require.Equal(t, projections.StatusStarted, s.Status)
	require.Equal(t, projections.OpSending, s.Steps[1].Status)

	b.report(t, &events.OperationSucceeded{TaskRef: again.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "deploy", "r1", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)
	require.Equal(t, 1, countType(evs, events.TypeExecutionResumed))
	resumed := evs[indexOfType(evs, events.TypeExecutionResumed)].Data.(*events.ExecutionResumed)
	require.Equal(t, []string{"ship"}, resumed.Reset)
	require.Equal(t, "registry is back", resumed.Reason)
	require.Equal(t, 1, s.Steps[0].Attempt, "build did not run again")
	require.Equal(t, 2, s.Steps[1].Attempt)
	require.Equal(t, []projections.ActionCommand{{Command: key, Action: events.ActionResume, Actor: natsClient}}, s.Actions)
	require.Equal(t, 1, s.Resumes)

	t.Log("a succeeded execution cannot be resumed")
	rej := readRejection(t, b.js, b.act(t, "r1", events.ActionResume, ""))
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Contains(t, rej.Reason, "only started, failed, suspended and cancelled executions can be resumed")
}

// TestResumeWaitsForARunningOperation: a plain resume never sends again an
// operation that is with an agent; its result, with the token of its
// task, still counts. A force-resume sends it again.
func TestResumeWaitsForARunningOperation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build")
	b.start(t, "deploy", "r2")
	first := b.nextTask(t)
	b.report(t, &events.OperationStarted{TaskRef: first.task.Ref("test-agent", 1)})
	waitHistory(t, b.js, "deploy", "r2", "build started", func(evs []events.Event) bool { return countType(evs, events.TypeStepStarted) == 1 })

	b.act(t, "r2", events.ActionResume, "")
	waitHistory(t, b.js, "deploy", "r2", "resumed", func(evs []events.Event) bool { return countType(evs, events.TypeExecutionResumed) == 1 })
	waitCommandsHandled(t, b.js)
	s := foldOf(t, b.js, "deploy", "r2")
	require.Equal(t, projections.OpStarted, s.Steps[0].Status, "not sent again")
	require.Equal(t, 1, s.Steps[0].Attempt)

	t.Log("force-resume: the operation whose agent died is sent again")
	b.act(t, "r2", events.ActionForceResume, "agent host died")
	again := b.nextTask(t)
	require.Equal(t, 2, again.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: again.task.Ref("test-agent", 1), Output: json.RawMessage(`"ok"`)})
	s, _ = waitStatus(t, b.js, "deploy", "r2", projections.StatusSucceeded)
	require.Equal(t, 2, s.Resumes)
}

// TestResumeAfterForceCancel: results that arrived while the execution was
// cancelled were not recorded; a resume takes them from the results
// stream instead of waiting forever.
func TestResumeAfterForceCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build", "ship")
	b.start(t, "deploy", "r3")
	build := b.nextTask(t)
	waitHistory(t, b.js, "deploy", "r3", "build sent", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	b.act(t, "r3", events.ActionForceCancel, "")
	waitStatus(t, b.js, "deploy", "r3", projections.StatusCancelled)
	b.report(t, &events.OperationSucceeded{TaskRef: build.task.Ref("test-agent", 1), Output: json.RawMessage(`"built"`)})
	waitResultsHandled(t, b.js)

	b.act(t, "r3", events.ActionResume, "")
	ship := b.nextTask(t)
	require.Equal(t, "ship", ship.task.StepID)
	b.report(t, &events.OperationSucceeded{TaskRef: ship.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "deploy", "r3", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)
	require.JSONEq(t, `"built"`, string(s.Steps[0].Output), "the stored result was applied")
	require.Nil(t, s.Cancellation)
}

func indexOfType(evs []events.Event, typ events.Type) int {
	for i, ev := range evs {
		if ev.Type == typ {
			return i
		}
	}
	return -1
}

// startWith publishes a start command with options.
func (b *testBundle) startWith(t *testing.T, cmd *events.StartExecution) {
	t.Helper()
	msg, err := bus.Encode(bus.SubjectStart, events.New("test-client", "", "", time.Now(), cmd))
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

func (b *testBundle) startWaitAfterFail(t *testing.T, wf, execID string) {
	t.Helper()
	b.startWith(t, &events.StartExecution{Workflow: wf, ExecutionID: execID, WaitAfterFail: true})
}

// TestWaitAfterFailSuspends: with wait_after_fail a failure suspends the
// execution; an operator resumes it (or cancels it).
func TestWaitAfterFailSuspends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build", "ship")

	b.startWaitAfterFail(t, "deploy", "w1")
	build := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: build.task.Ref("test-agent", 1), Error: "disk full"})
	s, evs := waitStatus(t, b.js, "deploy", "w1", projections.StatusSuspended)
	require.Equal(t, "step build failed: disk full", s.Error)
	require.Equal(t, events.TypeExecutionSuspended, evs[len(evs)-1].Type)
	require.Zero(t, countType(evs, events.TypeExecutionFailed))
	require.False(t, s.Status.Terminal())

	b.act(t, "w1", events.ActionResume, "freed space")
	again := b.nextTask(t)
	require.Equal(t, "build", again.task.StepID)
	require.Equal(t, 2, again.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: again.task.Ref("test-agent", 1)})
	ship := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: ship.task.Ref("test-agent", 1)})
	s, _ = waitStatus(t, b.js, "deploy", "w1", projections.StatusSucceeded)
	require.Empty(t, s.Error)

	t.Log("a suspended execution can be cancelled")
	b.startWaitAfterFail(t, "deploy", "w2")
	build = b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: build.task.Ref("test-agent", 1), Error: "disk full"})
	waitStatus(t, b.js, "deploy", "w2", projections.StatusSuspended)
	b.act(t, "w2", events.ActionCancel, "not worth it")
	s, _ = waitStatus(t, b.js, "deploy", "w2", projections.StatusCancelled)
	require.Equal(t, "not worth it", s.Cancellation.Reason)
}

// TestDryRunRunsNothing: a dry run walks the workflow, evaluating
// conditions and inputs, and records each operation as would-run with its
// resolved input; no task is published.
func TestDryRunRunsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: plan
steps:
  - {id: target, kind: let, vars: {host: "db-${input.n}"}}
  - {id: backup, kind: exec, command: pg_dump, args: ["${vars.host}"]}
  - {id: skipped, kind: log, message: never, condition: "${input.n > 5}"}
  - {id: nap, kind: sleep, duration: 1h}
  - {id: restart, kind: http, url: "https://${vars.host}.example/restart", method: POST}
`)
	b.startWith(t, &events.StartExecution{Workflow: "plan", ExecutionID: "dr1",
		Input: json.RawMessage(`{"n":3}`), DryRun: true})

	s, evs := waitStatus(t, b.js, "plan", "dr1", projections.StatusSucceeded)
	require.True(t, s.DryRun)
	require.Zero(t, countType(evs, events.TypeStepSending), "no task was sent")
	require.Zero(t, dispatches(evs), "no task was sent")
	require.Zero(t, countType(evs, events.TypeTimerArmed), "nothing waits")
	byID := map[string]projections.Step{}
	for _, st := range s.Steps {
		byID[st.ID] = st
	}
	require.Equal(t, projections.OpSucceeded, byID["target"].Status)
	require.Equal(t, projections.OpSkipped, byID["backup"].Status)
	require.Contains(t, byID["backup"].Error, "dry run: would run exec")
	require.Contains(t, string(byID["backup"].Input), `"args":["db-3"]`, "the resolved input is recorded")
	require.Equal(t, "condition is false", byID["skipped"].Error)
	require.Equal(t, "dry run: would sleep", byID["nap"].Error)
	require.Contains(t, string(byID["restart"].Input), "https://db-3.example/restart")
	batch, err := b.tasks.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
	require.NoError(t, err)
	for range batch.Messages() {
		t.Fatal("a dry run published a task")
	}
}

// TestDryRunDoesNotRetry: an input that needs an operation's output fails
// in a dry run; an on-error retry does not arm a timer, the dry run ends.
func TestDryRunDoesNotRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: needs
steps:
  - {id: fetch, kind: exec, command: curl}
  - id: use
    kind: exec
    command: echo
    args: ["${steps.fetch.output.body}"]
    on-error:
      - {id: again, kind: retry, retry: {limit: 3, backoff: {initial: 1h}}}
`)
	b.startWith(t, &events.StartExecution{Workflow: "needs", ExecutionID: "dr2", DryRun: true})
	s, evs := waitStatus(t, b.js, "needs", "dr2", projections.StatusFailed)
	require.Contains(t, s.Error, "a dry run does not retry")
	require.Zero(t, countType(evs, events.TypeTimerArmed))
	require.Zero(t, countType(evs, events.TypeStepRescheduled))
}

// TestCancelSuspendedWaitsForRunningOperations: a suspended execution
// whose other operations still run is cancelling until they finish.
func TestCancelSuspendedWaitsForRunningOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: par
steps:
  - id: both
    kind: parallel
    branches:
      - {id: A, steps: [{id: a, kind: noop}]}
      - {id: B, steps: [{id: b, kind: noop}]}
`)
	b.startWaitAfterFail(t, "par", "sc1")
	t1, t2 := b.nextTask(t), b.nextTask(t)
	ta, tb := t1, t2
	if t1.task.StepID != "both/A/a" {
		ta, tb = t2, t1
	}
	b.report(t, &events.OperationStarted{TaskRef: tb.task.Ref("test-agent", 1)})
	b.report(t, &events.OperationFailed{TaskRef: ta.task.Ref("test-agent", 1), Error: "boom"})
	waitStatus(t, b.js, "par", "sc1", projections.StatusSuspended)
	b.act(t, "sc1", events.ActionCancel, "")
	waitStatus(t, b.js, "par", "sc1", projections.StatusCancelling)
	b.report(t, &events.OperationSucceeded{TaskRef: tb.task.Ref("test-agent", 1)})
	s, _ := waitStatus(t, b.js, "par", "sc1", projections.StatusCancelled)
	i := s.StepIndex("both/B/b")
	require.GreaterOrEqual(t, i, 0)
	require.Equal(t, projections.OpSucceeded, s.Steps[i].Status, "the running operation's result was recorded")
}
