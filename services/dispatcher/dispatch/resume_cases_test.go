package dispatch_test

// Resume cases found in review: calls, on-error handlers, containers.

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

func (b *testBundle) applyYAML(t *testing.T, y string) {
	t.Helper()
	d, err := workflow.Parse([]byte(y))
	require.NoError(t, err)
	_, _, err = b.defs.Apply(t.Context(), d)
	require.NoError(t, err)
}

func stepNamed(s projections.Execution, id string) projections.Step {
	for _, st := range s.Steps {
		if st.ID == id {
			return st
		}
	}
	return projections.Step{}
}

// A call to a workflow not registered yet: the operator registers it and resumes.
func TestResumeCallUnregistered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: outer\nsteps:\n  - {id: call, kind: workflow, workflow: inner}\n")
	b.start(t, "outer", "c1")
	s, _ := waitStatus(t, b.js, "outer", "c1", projections.StatusFailed)
	require.Contains(t, s.Error, "not registered")
	b.applyYAML(t, "name: inner\nsteps:\n  - {id: x, kind: noop}\n")
	b.act(t, "c1", events.ActionResume, "registered inner")
	task := b.nextTask(t)
	require.Equal(t, "call@2/x", task.task.StepID, "the call starts over (attempt 2), now that inner exists")
	b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
	s, _ = waitStatus(t, b.js, "outer", "c1", projections.StatusSucceeded)
	require.Equal(t, 1, s.Resumes)
}

// s fails, its on-error handler h fails too; after resume s succeeds:
// is h left pending?
func TestResumeHandlerOrphan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: w\nsteps:\n  - id: s\n    kind: noop\n    on-error:\n      - {id: h, kind: noop}\n")
	b.start(t, "w", "o1")
	s1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: s1.task.Ref("test-agent", 1), Error: "boom"})
	h1 := b.nextTask(t)
	require.Equal(t, "s/on-error1/h", h1.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: h1.task.Ref("test-agent", 1), Error: "cleanup failed"})
	waitStatus(t, b.js, "w", "o1", projections.StatusFailed)
	b.act(t, "o1", events.ActionResume, "")
	s2 := b.nextTask(t)
	require.Equal(t, "s", s2.task.StepID)
	require.Equal(t, 2, s2.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: s2.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "w", "o1", projections.StatusSucceeded)
	resumed := evs[indexOfType(evs, events.TypeExecutionResumed)].Data.(*events.ExecutionResumed)
	require.Equal(t, []string{"s"}, resumed.Reset, "the handler of the old attempt is not run again")
	require.Equal(t, projections.OpFailed, stepNamed(s, "s/on-error1/h").Status, "it stays as it ended")
}

// s fails; its on-error handler h (an operation) is running when the
// execution is force-cancelled; a plain resume: does s run again while h runs?
func TestResumeWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: w\nsteps:\n  - id: s\n    kind: noop\n    on-error:\n      - {id: rollback, kind: noop}\n  - {id: next, kind: noop}\n")
	b.start(t, "w", "hr1")
	s1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: s1.task.Ref("test-agent", 1), Error: "boom"})
	h1 := b.nextTask(t)
	require.Equal(t, "s/on-error1/rollback", h1.task.StepID)
	waitHistory(t, b.js, "w", "hr1", "rollback sent", func(evs []events.Event) bool { return dispatches(evs) == 2 })
	b.act(t, "hr1", events.ActionForceCancel, "")
	waitStatus(t, b.js, "w", "hr1", projections.StatusCancelled)
	b.act(t, "hr1", events.ActionResume, "")
	waitHistory(t, b.js, "w", "hr1", "resumed", func(evs []events.Event) bool { return countType(evs, events.TypeExecutionResumed) == 1 })
	waitCommandsHandled(t, b.js)
	s := foldOf(t, b.js, "w", "hr1")
	require.Equal(t, 1, stepNamed(s, "s").Attempt, "s does not run again while its on-error rollback runs")
	b.report(t, &events.OperationSucceeded{TaskRef: h1.task.Ref("test-agent", 1)})
	nt := b.nextTask(t)
	require.Equal(t, "next", nt.task.StepID, "the rollback recovered s")
}

// Two parallel branches; a fails and fails the execution while b runs; b
// then fails too (while the execution is over). The operator fixes the
// cause and resumes.
func TestResumeStoredFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: w\nsteps:\n  - id: par\n    kind: parallel\n    branches:\n      - {id: A, steps: [{id: a, kind: noop}]}\n      - {id: B, steps: [{id: b, kind: noop}]}\n")
	b.start(t, "w", "p1")
	t1, t2 := b.nextTask(t), b.nextTask(t)
	ta, tb := t1, t2
	if t1.task.StepID != "par/A/a" {
		ta, tb = t2, t1
	}
	b.report(t, &events.OperationFailed{TaskRef: ta.task.Ref("test-agent", 1), Error: "db down"})
	waitStatus(t, b.js, "w", "p1", projections.StatusFailed)
	b.report(t, &events.OperationFailed{TaskRef: tb.task.Ref("test-agent", 1), Error: "db down"})
	waitResultsHandled(t, b.js)
	b.act(t, "p1", events.ActionResume, "db is back")
	r1, r2 := b.nextTask(t), b.nextTask(t)
	require.ElementsMatch(t, []string{"par/A/a", "par/B/b"}, []string{r1.task.StepID, r2.task.StepID},
		"both branches run again, also the one whose failure arrived after the end")
	b.report(t, &events.OperationSucceeded{TaskRef: r1.task.Ref("test-agent", 1)})
	b.report(t, &events.OperationSucceeded{TaskRef: r2.task.Ref("test-agent", 1)})
	waitStatus(t, b.js, "w", "p1", projections.StatusSucceeded)
}
