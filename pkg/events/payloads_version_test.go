package events_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

// TestTargetVersionJSON: a version is a number from 1 or "latest"; anything
// else is refused saying what to give.
func TestTargetVersionJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]events.TargetVersion{`3`: 3, `"latest"`: events.LatestVersion} {
		var v events.TargetVersion
		require.NoError(t, json.Unmarshal([]byte(in), &v))
		require.Equal(t, want, v)
		out, err := json.Marshal(v)
		require.NoError(t, err)
		require.JSONEq(t, in, string(out))
	}
	var none events.TargetVersion
	require.NoError(t, json.Unmarshal([]byte(`null`), &none))
	require.Zero(t, none, "null is as if not given")
	for _, in := range []string{`0`, `-1`, `"newest"`, `1.5`, `"2"`, `true`} {
		err := events.DecodeStrictJSON([]byte(`{"action":"resume","version":`+in+`}`), &struct {
			Action  string               `json:"action"`
			Version events.TargetVersion `json:"version"`
		}{})
		require.Error(t, err, in)
		field, msg := events.ExplainJSON(err)
		require.Equal(t, "version", field, in)
		require.Equal(t, `must be a version number (1, 2, ...) or "latest", not `+in, msg)
	}
}

// TestMovedPath: an instance moved, the instances inside it and its later
// attempts move with it; others do not.
func TestMovedPath(t *testing.T) {
	t.Parallel()
	moved := map[string]string{"a": "blk/a", "par/x/b": "b"}
	for in, want := range map[string]string{"a": "blk/a", "a/c": "blk/a/c", "a@2/c": "blk/a@2/c", "par/x/b/d": "b/d"} {
		got, ok := events.MovedPath(in, moved)
		require.True(t, ok, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"ab", "a~1", "blk/a", "par/x"} {
		_, ok := events.MovedPath(in, moved)
		require.False(t, ok, in)
	}
}
