package janitor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/lock"
)

// TestSweepClearsLockOfExpiredExecution: a lock entry left in the bucket
// by an execution that expired and was deleted (read model gone, claim
// kept with expired_at) is cleared, not taken for a young execution's.
func TestSweepClearsLockOfExpiredExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "x-purged", claim.Record{CommandKey: "test#x-purged", Workflow: "wf"})
	require.NoError(t, err)
	require.NoError(t, ids.MarkExpired(t.Context(), "x-purged", time.Date(2026, 3, 14, 11, 0, 0, 0, time.UTC)))
	tb, err := lock.Open(t.Context(), b.js, nil)
	require.NoError(t, err)
	_, err = tb.Enqueue(t.Context(), "db", 1, lock.Entry{ExecutionID: "x-purged", Workflow: "wf", Path: "", Request: 1})
	require.NoError(t, err)
	res := b.runOnce(t)
	require.Equal(t, 1, res.LocksCleared, "the holder's execution expired and was deleted: its entry must be cleared")
}
