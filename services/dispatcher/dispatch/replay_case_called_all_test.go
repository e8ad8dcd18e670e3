package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// idempotent: all covers the steps of the workflow and of its explicit
// blocks, "but not sub-workflows which are references" (seed). A called
// workflow's external step is not idempotent because its caller says all:
// a replay resuming must not run it again without force.
func TestReplayCaseIdempotentAllNotIntoCalledWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: inner\nsteps:\n  - {id: charge, kind: call, operation: charge}\n")
	b.applyYAML(t, "name: outer\nidempotent: all\nsteps:\n  - {id: call, kind: workflow, workflow: inner}\n")
	b.start(t, "outer", "o1")
	c := b.nextTask(t)
	require.Equal(t, "call/charge", c.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: c.task.Ref("test-agent", 1), Error: "timeout talking to the bank"})
	waitStatus(t, b.js, "outer", "o1", projections.StatusFailed)

	rej, rp := replayOutcome(t, b, "outer", "o1", b.replay(t, "o1", events.ReplayResume, false))
	if rp != nil {
		t.Fatalf("replay resuming accepted: mode %s resume %v: the called workflow's charge runs again", rp.Mode, rp.Resume)
	}
	require.Contains(t, rej.Reason, "not idempotent")
}
