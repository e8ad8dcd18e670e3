package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// Replay from a step given by its id goes from "the step's latest run"
// (docs): after a goto, that is mark~1, not round 0's mark.
func TestReplayCaseReplayFromStepLatestRound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: loop
steps:
  - {id: init, kind: let, vars: {i: 0}}
  - {id: mark, kind: replayable, replayable: from here}
  - {id: inc, kind: let, vars: {i: "${vars.i + 1}"}}
  - {id: work, kind: call, operation: op, input: {i: "${vars.i}"}}
  - {id: back, kind: goto, target: mark, condition: "${vars.i < 2}"}
`)
	b.start(t, "loop", "l1")
	w1 := b.nextTask(t)
	require.Equal(t, "work", w1.task.StepID)
	b.report(t, &events.OperationSucceeded{TaskRef: w1.task.Ref("test-agent", 1)})
	w2 := b.nextTask(t)
	require.Equal(t, "work~1", w2.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: w2.task.Ref("test-agent", 1), Error: "boom"})
	waitStatus(t, b.js, "loop", "l1", projections.StatusFailed)

	b.replay(t, "l1", "mark", false)
	w3 := b.nextTask(t)
	require.Equal(t, "work~1", w3.task.StepID, "replayed from mark~1, the latest run of mark; got %s (input %s)", w3.task.StepID, specInput(t, w3))
}
