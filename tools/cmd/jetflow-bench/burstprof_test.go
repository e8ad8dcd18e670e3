package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProfileWindow: the burst's profile is written once its window has
// passed, as a CPU profile (gzipped protobuf); a window cancelled before
// it begins writes nothing and says so.
func TestProfileWindow(t *testing.T) {
	// Not parallel: a process runs one CPU profile at a time.
	path := filepath.Join(t.TempDir(), "burst.prof")
	began := time.Now()
	wait := profileWindow(t.Context(), path, began.Add(50*time.Millisecond), 100*time.Millisecond)
	require.NoError(t, wait())
	require.GreaterOrEqual(t, time.Since(began), 150*time.Millisecond, "waits for the whole window")
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err, "a CPU profile is gzipped")
	require.NoError(t, zr.Close())

	ctx, cancel := context.WithCancel(t.Context())
	late := filepath.Join(t.TempDir(), "late.prof")
	wait = profileWindow(ctx, late, time.Now().Add(time.Hour), time.Second)
	cancel()
	require.ErrorIs(t, wait(), context.Canceled)
	_, err = os.Stat(late)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written before its window")
}

// TestBurstProfileFlags: -timers-cpuprofile needs the timer run and a
// window, and refuses a second CPU profile.
func TestBurstProfileFlags(t *testing.T) {
	t.Parallel()
	want := "-timers-cpuprofile profiles the timer run's burst: give -timers, a positive -timers-cpuprofile-for, and no -cpuprofile (one CPU profile at a time)"
	for _, args := range [][]string{
		{"-timers-cpuprofile", "x.prof"},
		{"-timers", "10", "-timers-cpuprofile", "x.prof", "-cpuprofile", "y.prof"},
		{"-timers", "10", "-timers-cpuprofile", "x.prof", "-timers-cpuprofile-for", "0s"},
	} {
		require.EqualError(t, run(t.Context(), args, new(bytes.Buffer)), want, "%v", args)
	}
}
