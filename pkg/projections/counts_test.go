package projections_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
)

// TestStoredHead: of a read model stored with its step counts before its
// step table, StoredHead returns the members before the table, which
// decode as the whole model does but for the table, and the counts; any
// other document is left to be decoded whole.
func TestStoredHead(t *testing.T) {
	t.Parallel()
	x := projections.Execution{ID: "x", Workflow: "w", Version: 3, Status: projections.StatusSucceeded, Retention: "1h",
		EndedAt: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), LastSeq: 9, Vars: map[string]json.RawMessage{"a": json.RawMessage(`{"steps":[1]}`)},
		Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}, {ID: "b", Status: projections.OpFailed}}}
	doc, err := projections.EncodeStored(x, nil)
	require.NoError(t, err)
	var whole projections.Execution
	require.NoError(t, json.Unmarshal(doc, &whole))
	require.Equal(t, x, whole, "decoded whole, a stored model is the execution")
	i, j := strings.Index(string(doc), `"step_counts":{"steps":2,"done":1}`), strings.LastIndex(string(doc), `"steps":[`)
	require.True(t, i > 0 && j > i && strings.HasSuffix(string(doc), "]}"), "the counts, then the table, last: %s", doc)
	head, counts, ok := projections.StoredHead(doc)
	require.True(t, ok, "%s", doc)
	require.Equal(t, projections.StepCounts{Steps: 2, Done: 1}, counts)
	var got projections.Execution
	require.NoError(t, json.Unmarshal(head, &got), "%s", head)
	want := x
	want.Steps = nil
	require.Equal(t, want, got, "a variable holding a steps member is a value, not the table")

	head, counts, ok = projections.StoredHead([]byte(" {\n \"id\" : \"y\" ,\n \"step_counts\" : {\"steps\":0,\"succeeded\":0} , \"steps\" : [] } "))
	require.True(t, ok)
	require.Equal(t, projections.StepCounts{}, counts)
	require.NoError(t, json.Unmarshal(head, &got), "%s", head)
	require.Equal(t, "y", got.ID)

	plain, err := json.Marshal(x)
	require.NoError(t, err)
	for name, doc := range map[string]string{
		"stored before the counts": string(plain),
		"counts after the table":   `{"id":"x","steps":[],"step_counts":{"steps":0,"done":0}}`,
		"the table first":          `{"steps":[],"step_counts":{"steps":0,"done":0}}`,
		"no table":                 `{"id":"x","step_counts":{"steps":0,"done":0}}`,
		"counts not counts":        `{"step_counts":"two","steps":[]}`,
		"broken":                   `{"id":"x","step_counts":{"steps":0,"done":0},"id"`,
		"not an object":            `[1]`,
		"empty":                    ``,
	} {
		_, _, ok := projections.StoredHead([]byte(doc))
		require.False(t, ok, name)
	}
}
