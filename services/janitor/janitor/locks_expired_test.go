package janitor_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/lock"
)

// TestSweepClearsLockOfExpiredExecution: a lock entry left in the bucket
// by an execution that expired and was deleted (read model gone, claim
// kept with expired_at) is cleared, not taken for a young execution's.
func TestSweepClearsLockOfExpiredExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := b.js.KeyValue(t.Context(), bus.BucketExecutionIDs)
	require.NoError(t, err)
	_, err = ids.Put(t.Context(), "x-purged", []byte(`{"workflow":"wf","expired_at":"2026-03-14T11:00:00Z"}`))
	require.NoError(t, err)
	tb, err := lock.Open(t.Context(), b.js, nil)
	require.NoError(t, err)
	_, err = tb.Enqueue(t.Context(), "db", 1, lock.Entry{ExecutionID: "x-purged", Workflow: "wf", Path: "", Request: 1})
	require.NoError(t, err)
	res := b.runOnce(t)
	require.Equal(t, 1, res.LocksCleared, "the holder's execution expired and was deleted: its entry must be cleared")
}
