package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVisibilityRun: a small visibility run fills the index, lists every
// kind of query with rows, and a second run on the same directory skips
// the fill.
func TestVisibilityRun(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, runVisibility(t.Context(), &out, 2000, dir, "", 20, 0))
	text := out.String()
	require.Contains(t, text, "fill: 2000 rows in")
	require.Contains(t, text, "database:")
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, " ms ") && !strings.Contains(line, "customer") { // 10,000 customers: a few thousand rows miss most

			require.NotRegexp(t, ` 0$`, strings.TrimSpace(line), "every list finds rows: %s", line)
		}
	}
	out.Reset()
	require.NoError(t, runVisibility(t.Context(), &out, 2000, dir, "", 20, 0))
	require.Contains(t, out.String(), "fill: skipped, the database holds 2000 rows already")
}
