package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// A retry step with replay in a parallel branch: the last replay point is
// in the other branch, so the replay does not run the failed step (nor
// the retry step) again: the retry step replays again at once, uselessly,
// until its limit.
func TestReplayCaseRetryReplayOtherBranch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: rpar
steps:
  - id: par
    kind: parallel
    branches:
      - id: a
        steps:
          - {id: wa, kind: call, operation: op}
          - {id: ma, kind: replayable, replayable: from here}
      - id: b
        steps:
          - {id: mb, kind: replayable, replayable: from here}
          - id: wb
            kind: call
            operation: op
            on-error:
              - {id: again, kind: retry, replay: true, retry: {limit: 3}}
`)
	b.start(t, "rpar", "p1")
	tasks := map[string]fetchedTask{}
	for range 2 {
		tk := b.nextTask(t)
		tasks[tk.task.StepID] = tk
	}
	b.report(t, &events.OperationSucceeded{TaskRef: tasks["par/a/wa"].task.Ref("test-agent", 1)})
	waitHistory(t, b.js, "rpar", "p1", "ma done", func(evs []events.Event) bool {
		for _, ev := range evs {
			if p, ok := ev.Data.(*events.StepSucceeded); ok && p.StepID == "par/a/ma" {
				return true
			}
		}
		return false
	})
	b.report(t, &events.OperationFailed{TaskRef: tasks["par/b/wb"].task.Ref("test-agent", 1), Error: "flaky"})
	w2 := b.nextTask(t) // the replay should run wb again
	require.Equal(t, "par/b/wb", w2.task.StepID)
	b.report(t, &events.OperationSucceeded{TaskRef: w2.task.Ref("test-agent", 1)})
	waitStatus(t, b.js, "rpar", "p1", projections.StatusSucceeded)
}
