package projections_test

import (
	"encoding/json"
	"strings"
	"testing"

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
