package janitor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/projections"
)

// TestSweepClearsLocksOfEndedExecutions: lock entries of an execution that
// ended, of one that is suspended and of one that does not exist are
// handed to the dispatcher to clear; a running holder, and one claimed but
// not projected yet, are left alone.
func TestSweepClearsLocksOfEndedExecutions(t *testing.T) {
	t.Parallel()

	b := setup(t)
	running := execution("x-running", time.Second)
	b.put(t, running)
	done := execution("x-done", time.Hour)
	done.Status = projections.StatusSucceeded
	b.put(t, done)
	suspended := execution("x-suspended", time.Second)
	suspended.Status = projections.StatusSuspended
	b.put(t, suspended)
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "x-young", claim.Record{CommandKey: "test#x-young", Workflow: "wf"}) // claimed, not yet projected
	require.NoError(t, err)

	tb, err := lock.Open(t.Context(), b.js, nil)
	require.NoError(t, err)
	for _, id := range []string{"x-done", "x-running", "x-young", "x-ghost", "x-suspended"} {
		_, err := tb.Enqueue(t.Context(), "db", 1, lock.Entry{ExecutionID: id, Workflow: "wf", Path: "blk", Request: 1})
		require.NoError(t, err)
	}

	res := b.runOnce(t)
	require.Equal(t, 3, res.LocksCleared)
	cmds, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.SubjectClearLock, 0, 0)
	require.NoError(t, err)
	require.Len(t, cmds, 1)
	clear, ok := cmds[0].Data.(*events.ClearLock)
	require.True(t, ok)
	require.Equal(t, "db", clear.Lock)
	require.True(t, clear.OnlyEnded, "the dispatcher leaves alone an execution resumed since")
	require.Equal(t, "jetflow/janitor", clear.RequestedBy)
	require.Equal(t, []events.LockEntry{
		{ExecutionID: "x-done", Workflow: "wf", Path: "blk", Request: 1},
		{ExecutionID: "x-ghost", Workflow: "wf", Path: "blk", Request: 1},
		{ExecutionID: "x-suspended", Workflow: "wf", Path: "blk", Request: 1},
	}, clear.Entries)

	t.Log("the same sweep again is the same command, deduplicated")
	b.runOnce(t)
	cmds, err = history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.SubjectClearLock, 0, 0)
	require.NoError(t, err)
	require.Len(t, cmds, 1)
}
