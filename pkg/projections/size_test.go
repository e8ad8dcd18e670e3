package projections_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
)

// TestSizeEstimate: the estimate counts what a state points to, so it
// grows by at least the bytes added to its input, its steps' outputs, its
// variables and its signals, and by at least a step's record per step.
func TestSizeEstimate(t *testing.T) {
	t.Parallel()
	s := projections.Execution{ID: "e1", Workflow: "w", Status: projections.StatusStarted}
	base := projections.SizeEstimate(&s)
	require.Positive(t, base)

	s.Input = json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)
	withInput := projections.SizeEstimate(&s)
	require.GreaterOrEqual(t, withInput-base, 1000)

	s.Steps = make([]projections.Step, 10)
	for i := range s.Steps {
		s.Steps[i] = projections.Step{ID: "s", Kind: "let", Output: json.RawMessage(`"` + strings.Repeat("y", 100) + `"`)}
	}
	withSteps := projections.SizeEstimate(&s)
	require.GreaterOrEqual(t, withSteps-withInput, 10*(100+200), "ten steps of 100-byte outputs, each step's record over 200 bytes")

	s.Vars = map[string]json.RawMessage{"v": json.RawMessage(strings.Repeat("1", 500))}
	s.Signals = []projections.Signal{{ID: "g", Name: "go", Data: json.RawMessage(strings.Repeat("2", 500))}}
	require.GreaterOrEqual(t, projections.SizeEstimate(&s)-withSteps, 1000)
}

// TestDormant: an execution is dormant when it runs and all it waits for
// is a timer due at least the given time after its last event; not when
// the timer is due sooner, a wait has no timeout, an operation is
// pending or with an agent, or it does not run.
func TestDormant(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	state := func(steps ...projections.Step) *projections.Execution {
		return &projections.Execution{Status: projections.StatusStarted, UpdatedAt: at, Steps: steps}
	}
	sleeping := projections.Step{ID: "nap", Status: projections.OpWaiting, WaitUntil: at.Add(time.Hour)}
	done := projections.Step{ID: "a", Status: projections.OpSucceeded}
	later := projections.Step{ID: "b"}
	require.True(t, projections.Dormant(state(done, sleeping, later), time.Minute), "a sleep of an hour")
	require.True(t, projections.Dormant(state(projections.Step{ID: "r", Status: projections.OpRescheduled, WaitUntil: at.Add(2 * time.Minute)}), time.Minute),
		"a retry's backoff of two minutes")
	require.False(t, projections.Dormant(state(done, later), time.Minute), "waits for nothing")
	require.False(t, projections.Dormant(state(projections.Step{ID: "nap", Status: projections.OpWaiting, WaitUntil: at.Add(time.Second)}), time.Minute),
		"a sleep of a second")
	require.False(t, projections.Dormant(state(projections.Step{ID: "w", Status: projections.OpWaiting}), time.Minute), "a wait for a signal with no timeout")
	for _, st := range []projections.OpStatus{projections.OpPending, projections.OpSending, projections.OpSent, projections.OpStarted} {
		require.False(t, projections.Dormant(state(sleeping, projections.Step{ID: "op", Status: st}), time.Minute), "an operation %s beside the sleep", st)
	}
	suspended := state(sleeping)
	suspended.Status = projections.StatusSuspended
	require.False(t, projections.Dormant(suspended, time.Minute), "not running")
	fresh := state(sleeping)
	fresh.UpdatedAt = time.Time{}
	require.False(t, projections.Dormant(fresh, time.Minute), "no event time to measure from")
}
