package dispatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
)

// TestLatenessCountsFromTheLaterOfDueAndResume: a timer's lateness counts
// from its due time, unless its execution was resumed after it (the wait
// until the resume was the operator's); never below zero.
func TestLatenessCountsFromTheLaterOfDueAndResume(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		due     time.Time
		resumed time.Time // zero: never resumed
		fired   time.Time
		want    float64
	}{
		{"never resumed", t0, time.Time{}, t0.Add(300 * time.Millisecond), 0.3},
		{"armed after a resume", t0, t0.Add(-time.Hour), t0.Add(200 * time.Millisecond), 0.2},
		{"due while cancelled, resumed later", t0, t0.Add(time.Hour), t0.Add(time.Hour + 50*time.Millisecond), 0.05},
		{"fired before its due time (a clock behind)", t0, time.Time{}, t0.Add(-time.Second), 0},
	} {
		s := &projections.Execution{ResumedAt: tc.resumed}
		require.InDelta(t, tc.want, lateness(projections.Timer{Due: tc.due}, s, tc.fired), 1e-9, tc.name)
	}
}
