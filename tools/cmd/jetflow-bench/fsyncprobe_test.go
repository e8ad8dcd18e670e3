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
}

// TestFsyncProbeFlag: a negative duration is refused with the flag named.
func TestFsyncProbeFlag(t *testing.T) {
	err := run(t.Context(), []string{"-fsync-probe", "-1s"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "-fsync-probe -1s")
}
