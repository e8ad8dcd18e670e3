package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
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

// A retry step with replay in on-error recursing from decide through
// resetFor: a lost on-error step of a workflow replayable automatically.
func TestReplayCaseAutoReplayLostHandlerStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: autol
replayable: automatically
steps:
  - id: work
    kind: call
    operation: work
    on-error:
      - {id: cleanup, kind: call, operation: cleanup}
`)
	b.start(t, "autol", "l1")
	w := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: w.task.Ref("test-agent", 1), Error: "boom"})
	c := b.nextTask(t)
	require.Equal(t, "work/on-error1/cleanup", c.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: c.task.Ref("janitor", 1), Error: "lost", Lost: true})
	waitStatus(t, b.js, "autol", "l1", projections.StatusFailed)
}
