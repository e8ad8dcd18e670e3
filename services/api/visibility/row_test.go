package visibility_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/visibility"
)

func TestAttrValues(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`"acme"`: "acme", `"a \"b\""`: `a "b"`, `120`: "120", `1.5`: "1.5", `-3`: "-3", `true`: "true", `false`: "false",
		`""`: "", ` "spaced" `: "spaced",
	} {
		v, ok := visibility.AttrValue(json.RawMessage(raw))
		require.True(t, ok, raw)
		require.Equal(t, want, v, raw)
	}
	long, _ := json.Marshal(strings.Repeat("x", visibility.MaxAttrValue+1))
	for _, raw := range []string{``, `null`, `{"a": 1}`, `[1]`, `{"omitted": true, "bytes": 5000}`, string(long), `"\x"`} {
		_, ok := visibility.AttrValue(json.RawMessage(raw))
		require.False(t, ok, raw)
	}
}

// TestRowOfAReadModel: the list's summary of an execution, counting the
// steps a truncated read model left out, with its attributes' values.
func TestRowOfAReadModel(t *testing.T) {
	t.Parallel()
	x := projections.Execution{ID: "x", Workflow: "w", Version: 2, Status: projections.StatusStarted,
		Input:     json.RawMessage(`{"customer": "acme", "order": {"id": 7}}`),
		Vars:      map[string]json.RawMessage{"tier": json.RawMessage(`"gold"`), "n": json.RawMessage(`3`)},
		Steps:     []projections.Step{{Status: projections.OpSucceeded}, {Status: projections.OpSkipped}, {Status: projections.OpStarted}},
		Truncated: &projections.Truncation{Steps: 4}}
	attrs := []workflow.SearchAttribute{{Name: "customer", From: workflow.SearchFromInput}, {Name: "order", From: workflow.SearchFromInput},
		{Name: "tier", From: workflow.SearchFromVars}, {Name: "n", From: workflow.SearchFromVars}, {Name: "unset", From: workflow.SearchFromVars}}
	r := visibility.RowOf(x, attrs)
	require.Equal(t, 7, r.Steps)
	require.Equal(t, 6, r.Done, "the succeeded and the skipped step, and the four finished ones left out")
	require.Equal(t, map[string]string{"customer": "acme", "tier": "gold", "n": "3"}, r.Attrs, "an object is not indexed, nor a variable not set")
	x.Truncated.Retired = 5
	r = visibility.RowOf(x, nil)
	require.Equal(t, []int{7, 6}, []int{r.Steps, r.Done}, "retired instances left out count in neither, as when they are kept")
	x.Truncated.Summary = true
	require.Equal(t, 2, visibility.RowOf(x, nil).Done, "a summary left out steps that may not be done")
	require.Nil(t, visibility.RowOf(x, nil).Attrs)
}
