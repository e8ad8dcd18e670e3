package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFsyncProbe: a short probe reports a rate for each number of
// streams, every one of them messages that were published and taken.
func TestFsyncProbe(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, runFsyncProbe(t.Context(), &out, 200*time.Millisecond, 8))
	rows := regexp.MustCompile(`(?m)^  (\d+) work-queue stream\(s\) +(\d+) messages/s$`).FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, len(fsyncProbeStreams), "%s", out.String())
	for i, row := range rows {
		require.Equal(t, strconv.Itoa(fsyncProbeStreams[i]), row[1])
		rate, err := strconv.Atoi(row[2])
		require.NoError(t, err)
		require.Positive(t, rate, "%s", row[0])
	}
	// The appends' half: both ways append, each append naming the
	// sequence its worker got for the one before (a wrong one, from a
	// batch's acknowledgement misread, fails the batch and the probe);
	// gathered, the workers' appends share writes.
	rows = regexp.MustCompile(`(?m)^  (one by one|gathered, atomic batch) +(\d+) appends/s, +([\d.]+) a write, CPU `).FindAllStringSubmatch(out.String(), -1)
	require.Len(t, rows, 2, "%s", out.String())
	for i, row := range rows {
		rate, err := strconv.Atoi(row[2])
		require.NoError(t, err)
		require.Positive(t, rate, "%s", row[0])
		per, err := strconv.ParseFloat(row[3], 64)
		require.NoError(t, err)
		if i == 0 {
			require.Equal(t, "one by one", row[1])
		} else {
			require.Greater(t, per, 1.0, "8 workers waiting while a batch is written: %s", row[0])
		}
	}
}

// TestFsyncProbeFlag: a negative duration is refused with the flag named.
func TestFsyncProbeFlag(t *testing.T) {
	err := run(t.Context(), []string{"-fsync-probe", "-1s"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "-fsync-probe -1s")
}
