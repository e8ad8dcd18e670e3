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

// TestTargetVersionErrorNamesItsMember: a bad version is refused naming
// the member it is in, wherever it is, with either implementation of
// encoding/json (the v2 one, Go 1.27's default, names an array's item
// by its index); at the document's root, none.
func TestTargetVersionErrorNamesItsMember(t *testing.T) {
	t.Parallel()
	type move struct {
		To events.TargetVersion `json:"to"`
	}
	type item struct {
		Version events.TargetVersion `json:"version"`
	}
	var doc struct {
		Move  move   `json:"move"`
		Items []item `json:"items"`
	}
	for _, c := range []struct {
		in, v1, v2 string
	}{
		{`{"move":{"to":0}}`, "move.to", "move.to"},
		{`{"items":[{"version":1},{"version":"newest"}]}`, "items.version", "items.1.version"},
	} {
		err := events.DecodeStrictJSON([]byte(c.in), &doc)
		require.Error(t, err, c.in)
		field, msg := events.ExplainJSON(err)
		want := c.v1
		if events.JSONv2 {
			want = c.v2
		}
		require.Equal(t, want, field, c.in)
		require.Contains(t, msg, `must be a version number (1, 2, ...) or "latest", not `, c.in)
	}
	var v events.TargetVersion
	field, msg := events.ExplainJSON(json.Unmarshal([]byte(`0`), &v))
	require.Empty(t, field, "the document itself")
	require.Equal(t, `must be a JSON version number (1, 2, ...) or "latest", not 0`, msg)
}
