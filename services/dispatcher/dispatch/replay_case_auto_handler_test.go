package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// replayable: automatically, an idempotent step with on-error steps is
// lost: it should be replayed resuming at the step (a new attempt). The
// plan does not see the step as incomplete (its on-error steps are "being
// handled"), so each automatic replay runs nothing again.
func TestReplayCaseAutoReplayStepWithOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: autoh
replayable: automatically
steps:
  - id: probe
    kind: call
    operation: probe
    idempotent: yes
    on-error:
      - {id: note, kind: log, message: "probe failed"}
`)
	b.start(t, "autoh", "h1")
	t1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: t1.task.Ref("janitor", 1), Error: "task left its queue without a result", Lost: true})
	next := b.nextTask(t)
	evs := waitHistory(t, b.js, "autoh", "h1", "replayed", func(evs []events.Event) bool {
		return countType(evs, events.TypeExecutionReplayed) > 0
	})
	for _, ev := range evs {
		if p, ok := ev.Data.(*events.ExecutionReplayed); ok {
			t.Logf("replay: mode %s point %q resume %v reset %v reopen %v", p.Mode, p.Point, p.Resume, p.Reset, p.Reopen)
		}
	}
	require.Equal(t, "probe", next.task.StepID, "resumed at probe (attempt 2); got %s attempt %d", next.task.StepID, next.task.Attempt)
}

// A lost on-error step of a workflow replayable automatically: planning
// its replay used to run the handlers, which planned again (a stack
// overflow that killed every dispatcher). The lost step (cleanup, a call:
// not idempotent) is replayed automatically from the last replay point,
// when there is one: the start, in a workflow replayable automatically
// from start; with none the failure stands (docs/operations.md,
// "replayable: automatically").
func TestReplayCaseAutoReplayLostHandlerStep(t *testing.T) {
	t.Parallel()
	const steps = `
steps:
  - id: work
    kind: call
    operation: work
    on-error:
      - {id: cleanup, kind: call, operation: cleanup}
`
	// run starts the workflow, fails work, and reports cleanup (its
	// on-error step) lost, as the janitor does.
	run := func(t *testing.T, replayable string) (*testBundle, fetchedTask) {
		b := setup(t)
		runDispatcher(t, b.js, dispatch.Config{Workers: 2})
		b.applyYAML(t, "name: autol\nreplayable: "+replayable+steps)
		b.start(t, "autol", "l1")
		w := b.nextTask(t)
		require.Equal(t, "work", w.task.StepID)
		b.report(t, &events.OperationFailed{TaskRef: w.task.Ref("test-agent", 1), Error: "boom"})
		c := b.nextTask(t)
		require.Equal(t, "work/on-error1/cleanup", c.task.StepID)
		b.report(t, &events.OperationFailed{TaskRef: c.task.Ref("janitor", 1), Error: "lost", Lost: true})
		return b, c
	}

	t.Run("FromStart", func(t *testing.T) {
		t.Parallel()
		b, _ := run(t, "automatically from start")
		again := b.nextTask(t)
		require.Equal(t, "work", again.task.StepID, "the replay from the start runs work again")
		require.Equal(t, 2, again.task.Attempt)
		evs := waitHistory(t, b.js, "autol", "l1", "replayed", func(evs []events.Event) bool {
			return countType(evs, events.TypeExecutionReplayed) > 0
		})
		require.Equal(t, 1, countType(evs, events.TypeExecutionReplayed))
		var replayed *events.ExecutionReplayed
		for _, ev := range evs {
			if p, ok := ev.Data.(*events.ExecutionReplayed); ok {
				replayed = p
			}
		}
		require.NotNil(t, replayed)
		require.True(t, replayed.Automatic)
		require.Equal(t, "jetflow (replayable: automatically)", replayed.RequestedBy)
		require.Contains(t, replayed.Reason, "work/on-error1/cleanup")
		require.Contains(t, replayed.Reason, "lost")
		require.Equal(t, again.task.Token, replayed.Token, "the work sent again carries the replay's token")

		b.report(t, &events.OperationSucceeded{TaskRef: again.task.Ref("test-agent", 1)})
		s, evs := waitStatus(t, b.js, "autol", "l1", projections.StatusSucceeded)
		historytest.RequireLinear(t, evs)
		require.Equal(t, 2, stepNamed(s, "work").Attempt)
		require.Equal(t, projections.OpSucceeded, stepNamed(s, "work").Status)
		require.Len(t, s.Replays, 1)
	})

	t.Run("NoReplayPoint", func(t *testing.T) {
		t.Parallel()
		b, _ := run(t, "automatically")
		s, evs := waitStatus(t, b.js, "autol", "l1", projections.StatusFailed)
		historytest.RequireLinear(t, evs)
		waitResultsHandled(t, b.js)
		require.Zero(t, countType(readHistory(t, b.js, "autol", "l1"), events.TypeExecutionReplayed), "nothing to replay from")
		require.Contains(t, s.Error, "step work failed: boom")
		require.Contains(t, s.Error, "cleanup failed: lost")
		require.Equal(t, 1, stepNamed(s, "work").Attempt, "work did not run again")
		info, err := b.tasks.Info(t.Context())
		require.NoError(t, err)
		require.Zero(t, info.NumPending, "no task was sent after the loss")
	})
}
