package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// A retry step with replay and next: end in a step's on-error should
// replay resuming at the failed (idempotent) step: its next attempt runs.
func TestReplayCaseRetryReplayNextEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: rend
steps:
  - id: work
    kind: call
    operation: op
    idempotent: yes
    on-error:
      - {id: again, kind: retry, replay: true, next: end, retry: {limit: 3}}
`)
	b.start(t, "rend", "e1")
	w1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: w1.task.Ref("test-agent", 1), Error: "flaky"})
	w2 := b.nextTask(t)
	require.Equal(t, "work", w2.task.StepID)
	require.Equal(t, 2, w2.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: w2.task.Ref("test-agent", 1)})
	waitStatus(t, b.js, "rend", "e1", projections.StatusSucceeded)
}
