package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSubjectsProbe: a short probe reports the heap per key after each
// quarter of its keys and once more after the caches went cold, a
// figure that grew with the keys (the server keeps something for each).
func TestSubjectsProbe(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runSubjectsProbe(t.Context(), &out, 20000, 100*time.Millisecond))
	rows := regexp.MustCompile(`(?m)^ +(\d+) keys  live heap \+ *([\d.-]+) MiB +(-?\d+) B a key(?: \(-?\d+ since \d+\))?; in use +-?\d+ B a key(, .* later)?$`).FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, 5, "%s", out.String())
	for i, row := range rows {
		keys, err := strconv.Atoi(row[1])
		require.NoError(t, err)
		require.Equal(t, min(i+1, 4)*5000, keys, "%s", row[0])
		_, err = strconv.Atoi(row[3])
		require.NoError(t, err)
		if i >= 1 && i <= 3 {
			require.Contains(t, row[0], " since ", "each quarter after the first: its own keys' cost")
		}
	}
	require.NotEmpty(t, rows[4][4], "the last measure is after the caches went cold: %s", out.String())
	per, err := strconv.Atoi(rows[4][3])
	require.NoError(t, err)
	require.Positive(t, per, "the server keeps something for each subject: %s", rows[4][0])
}

// TestSubjectsProbeFlag: a negative count, or too few keys to measure,
// is refused with the flag named.
func TestSubjectsProbeFlag(t *testing.T) {
	for _, n := range []string{"-1", "3"} {
		err := run(t.Context(), []string{"-subjects-probe", n}, &bytes.Buffer{})
		require.ErrorContains(t, err, "-subjects-probe "+n+": give how many keys to put, at least 10000")
	}
	err := run(t.Context(), []string{"-subjects-probe", "20000", "-subjects-probe-cold", "-1s"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "-subjects-probe-cold -1s")
}

// TestProbeIDs: the probe's ids are as long as a UUID and all differ.
func TestProbeIDs(t *testing.T) {
	seen := map[string]bool{}
	for i := range 5000 {
		id := probeID(i)
		require.Len(t, id, 36, id)
		require.False(t, seen[id], "id %d repeats %s", i, id)
		seen[id] = true
	}
}
