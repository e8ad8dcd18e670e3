package janitor_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
)

// TestRetentionRecordedExpiryNoLongerCounts: an execution whose expiry is
// already recorded (deleted at this sweep) takes no place in its group's
// count, or a count rule would expire one execution too many.
func TestRetentionRecordedExpiryNoLongerCounts(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "2")
	b.store(t, run{wf: "wf", id: "old-b", status: projections.StatusSucceeded, ended: now.Add(-3 * time.Hour)})
	b.store(t, run{wf: "wf", id: "old-a", status: projections.StatusSucceeded, ended: now.Add(-2 * time.Hour)})
	n := b.store(t, run{wf: "wf", id: "newest", status: projections.StatusSucceeded, ended: now.Add(-time.Hour)})
	// newest's expiry was recorded earlier (say the two that outranked it
	// then were resumed since, and run again).
	ev := events.New("d", "newest", "wf", now, &events.ExecutionExpired{Rule: "2", Group: "wf"})
	ev.PrevSeq = n.LastSeq
	seq, err := history.Append(t.Context(), b.js, bus.ExecutionSubject("wf", "newest"), n.LastSeq, ev)
	require.NoError(t, err)
	ev.Seq = seq
	n, err = projections.Apply(n, ev)
	require.NoError(t, err)
	v, _ := json.Marshal(n)
	_, err = b.kv.Put(t.Context(), "newest", v)
	require.NoError(t, err)

	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Expired)
	require.Zero(t, res.ExpiryRequested, "old-a and old-b are the two most recent finished executions left: both kept")
}
