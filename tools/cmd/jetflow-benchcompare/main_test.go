package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Bad flags are refused with what to fix; a run of a build with figures
// ends with the table and where the runs' output is.
func TestRun(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, run(t.Context(), []string{"-new", "x"}, &bytes.Buffer{}), "-old and -new must name")
	require.ErrorContains(t, run(t.Context(), []string{"-pairs", "x"}, &bytes.Buffer{}), "invalid value")

	dir := t.TempDir()
	bin := filepath.Join(dir, "bench")
	require.NoError(t, os.WriteFile(bin, []byte(`#!/bin/sh
case "$1" in -h) echo "  -figures string"; exit 2;; esac
while [ $# -gt 0 ]; do [ "$1" = -figures ] && f="$2"; shift; done
echo '{"steps_per_sec": 4000, "cpu_per_step_ms": 0.5}' > "$f"
`), 0o755))
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"-old", bin, "-new", bin, "-pairs", "2", "-log", filepath.Join(dir, "runs"), "--", "-local"}, &out))
	require.Contains(t, out.String(), "2 pairs of jetflow-bench [-local]")
	require.Contains(t, out.String(), "0 of 2 pairs: not told from noise")
	require.Contains(t, out.String(), "each run's output and figures: "+filepath.Join(dir, "runs"))
}
