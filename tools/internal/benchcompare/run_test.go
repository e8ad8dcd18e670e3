package benchcompare_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/tools/internal/benchcompare"
)

// fakeBench writes an executable that stands for a jetflow-bench build:
// it notes each run (name and args) in order, and writes figures with
// the CPU per step given, with -figures (newer) or as a goals table
// (older, which does not take -figures).
func fakeBench(t *testing.T, dir, name, cpu string, newer bool) string {
	t.Helper()
	order := filepath.Join(dir, "order")
	var body string
	if newer {
		body = `case "$1" in -h) echo "  -figures string"; exit 2;; esac
echo "` + name + ` $*" >> ` + order + `
while [ $# -gt 0 ]; do [ "$1" = -figures ] && f="$2"; shift; done
echo "throughput run: ..."
printf '{"steps_per_sec": 5000, "cpu_per_step_ms": ` + cpu + `}\n' > "$f"
`
	} else {
		body = `case "$1" in -h) echo "  -local"; exit 2;; -figures) echo "flag provided but not defined: -figures"; exit 2;; esac
echo "` + name + ` $*" >> ` + order + `
cat <<'TABLE'
goals (issue 14): figures of this run
  figure                                          measured  goal                  met
  steps/s, 10-step noop, 200 in flight               5,000  >= 10,000             no
  CPU per step (the whole process)                ` + cpu + ` ms  <= 0.2 ms             no
  1-step execution, start to end p50          not measured  <= 2 ms               -
TABLE
`
	}
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
	return path
}

// Run alternates the builds (old first in odd pairs, new first in even
// ones), passes the bench flags to both, reads a build older than
// -figures from its goals table, and keeps every run's output.
func TestRunAlternatesAndReadsBothKinds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := fakeBench(t, dir, "old", "0.400", false)
	nw := fakeBench(t, dir, "new", "0.300", true)
	logs := filepath.Join(dir, "runs")
	// Left by an earlier comparison in the same directory: not this one's.
	require.NoError(t, os.MkdirAll(logs, 0o755))
	for _, stale := range []string{"pair-1-old.json", "pair-1-new.json"} {
		require.NoError(t, os.WriteFile(filepath.Join(logs, stale), []byte(`{"steps_per_sec": 99999}`), 0o644))
	}
	var out bytes.Buffer
	pairs, err := benchcompare.Run(t.Context(), &out, benchcompare.Config{Old: old, New: nw, Pairs: 3, Args: []string{"-local", "-executions", "300"}, LogDir: logs})
	require.NoError(t, err)
	require.Len(t, pairs, 3)
	for _, p := range pairs {
		require.InDelta(t, 0.4, p.Old.CPUPerStepMs, 1e-9)
		require.InDelta(t, 0.3, p.New.CPUPerStepMs, 1e-9)
		require.InDelta(t, 5000, p.Old.StepsPerSec, 1e-9)
		require.Zero(t, p.Old.OneStepMs, "not measured")
	}
	order, err := os.ReadFile(filepath.Join(dir, "order"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(order)), "\n")
	require.Len(t, lines, 6)
	for i, want := range []string{"old", "new", "new", "old", "old", "new"} {
		require.True(t, strings.HasPrefix(lines[i], want+" -local -executions 300"), "run %d: %s", i+1, lines[i])
	}
	require.NotContains(t, lines[0], "-figures", "the older build is not given it")
	require.Contains(t, lines[1], "-figures "+filepath.Join(logs, "pair-1-new.json"))
	require.FileExists(t, filepath.Join(logs, "pair-2-old.log"))
	require.Contains(t, out.String(), "pair 2 new: steps/s 5000, CPU per step 0.300 ms")
	require.Contains(t, out.String(), "3 pairs: too few for any difference to be told from noise")

	rows := benchcompare.Compare(pairs)
	require.Equal(t, "CPU per step", rows[1].Figure)
	require.Equal(t, 3, rows[1].Better)
}

// A failing run stops the comparison, naming the pair, the build and the
// run's output.
func TestRunStopsAtAFailingRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := fakeBench(t, dir, "old", "0.400", true)
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("#!/bin/sh\n[ \"$1\" = -h ] && exit 2\necho 'jetflow-bench: the throughput run: 3 executions failed'\nexit 1\n"), 0o755))
	_, err := benchcompare.Run(t.Context(), &bytes.Buffer{}, benchcompare.Config{Old: old, New: bad, Pairs: 2, LogDir: filepath.Join(dir, "runs")})
	require.ErrorContains(t, err, "pair 1, new build")
	require.ErrorContains(t, err, "3 executions failed")
	require.ErrorContains(t, err, filepath.Join(dir, "runs", "pair-1-new.log"))
}

// A newer build that writes no figures is an error, even where an
// earlier comparison left a file under the same name.
func TestRunReadsOnlyThisRunsFigures(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := fakeBench(t, dir, "old", "0.400", true)
	silent := filepath.Join(dir, "silent")
	require.NoError(t, os.WriteFile(silent, []byte("#!/bin/sh\ncase \"$1\" in -h) echo '  -figures string'; exit 2;; esac\necho ran\n"), 0o755))
	logs := filepath.Join(dir, "runs")
	require.NoError(t, os.MkdirAll(logs, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(logs, "pair-1-new.json"), []byte(`{"steps_per_sec": 99999}`), 0o644))
	_, err := benchcompare.Run(t.Context(), &bytes.Buffer{}, benchcompare.Config{Old: old, New: silent, Pairs: 1, LogDir: logs})
	require.ErrorContains(t, err, "pair 1, new build: its figures (-figures)")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := fakeBench(t, dir, "b", "0.4", true)
	for _, tt := range []struct {
		c    benchcompare.Config
		want string
	}{
		{benchcompare.Config{New: bin, Pairs: 1, LogDir: dir}, "-old and -new must name"},
		{benchcompare.Config{Old: dir, New: bin, Pairs: 1, LogDir: dir}, dir + " is not an executable file"},
		{benchcompare.Config{Old: bin, New: bin, Pairs: 0, LogDir: dir}, "-pairs must be at least 1, not 0"},
		{benchcompare.Config{Old: bin, New: bin, Pairs: 1, LogDir: dir, Args: []string{"-figures=x"}}, "leave -figures out"},
		{benchcompare.Config{Old: bin, New: bin, Pairs: 1}, "(-log)"},
	} {
		require.ErrorContains(t, tt.c.Validate(), tt.want)
	}
	require.NoError(t, benchcompare.Config{Old: bin, New: bin, Pairs: 1, LogDir: dir}.Validate())
}
