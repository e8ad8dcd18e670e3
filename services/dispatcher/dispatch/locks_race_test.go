package dispatch_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestClearLockWhileTheExecutionIsHandled: a clear-lock command names
// executions, not one, so it is not routed to the worker that handles the
// execution it clears: it was handled on another worker at the same time
// as the execution's own messages, and both changed the same cached state
// (a data race that -race reports, and decisions taken from a state
// changed underneath). Clear-lock commands for a stale entry of a running
// holder come here among reconciles of it; the history must stay linear
// and the execution finish.
func TestClearLockWhileTheExecutionIsHandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 8})
	b.applyYAML(t, "name: busy\nlock: held\nsteps:\n  - id: work\n    kind: noop\n")
	b.start(t, "busy", "h1")
	task := b.nextTask(t)
	lockStatus(t, b.js, "busy", "h1", "", projections.LockHeld)
	for range 40 {
		clear := events.New("test-operator", "", "", time.Now(), &events.ClearLock{Lock: "held", Reason: "stale",
			Entries: []events.LockEntry{{ExecutionID: "h1", Workflow: "busy", Request: 99}}})
		publishClear(t, b.js, clear)
		rc := events.New("test", "h1", "busy", time.Now(), &events.ReconcileExecution{ExecutionID: "h1", Workflow: "busy"})
		publishPayload(t, b.js, bus.SubjectReconcile, rc)
	}
	waitCommandsHandled(t, b.js)
	b.finishTask(t, task)
	_, evs := waitStatus(t, b.js, "busy", "h1", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)
	require.Zero(t, countType(evs, events.TypeLockCleared), "the entry named was never the holder's")
	eventuallyFree(t, b.js, "held")
}
