package interp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
)

// TestOthersOnQueue: the operations in flight on the queue, not counting
// the one being sent, other queues' or those no longer in flight; only
// the latest othersScan instances are looked at, and counting stops at
// othersCap.
func TestOthersOnQueue(t *testing.T) {
	t.Parallel()
	steps := func(n int, st projections.OpStatus, queue string) []projections.Step {
		out := make([]projections.Step, n)
		for i := range out {
			out[i] = projections.Step{ID: fmt.Sprintf("%s-%s-%d", queue, st, i), Status: st, Queue: queue}
		}
		return out
	}
	var s projections.Execution
	s.Steps = append(s.Steps, steps(3, projections.OpSent, "q")...)
	s.Steps = append(s.Steps, steps(2, projections.OpStarted, "other")...)
	s.Steps = append(s.Steps, steps(4, projections.OpSucceeded, "q")...)
	s.Steps = append(s.Steps, projections.Step{ID: "me", Status: projections.OpSending, Queue: "q"})
	require.Equal(t, 3, othersOnQueue(s, "q", "me"))
	require.Equal(t, 4, othersOnQueue(s, "q", "someone-else"), "the instance being sent is in flight too")
	require.Equal(t, 2, othersOnQueue(s, "other", "me"))

	old := projections.Execution{Steps: append(steps(10, projections.OpSent, "q"), steps(othersScan, projections.OpSucceeded, "q")...)}
	require.Zero(t, othersOnQueue(old, "q", "me"), "in flight, but before the latest othersScan instances")
	many := projections.Execution{Steps: steps(othersScan, projections.OpStarted, "q")}
	require.Equal(t, othersCap, othersOnQueue(many, "q", "me"))
}
