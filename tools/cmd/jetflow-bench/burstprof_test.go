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
	wait := profileWindow(t.Context(), path, began.Add(time.Second), 100*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	_, err := os.Stat(path)
	if time.Since(began) < 900*time.Millisecond { // else this machine slept through the check
		require.ErrorIs(t, err, os.ErrNotExist, "nothing profiled before its window")
	}
	require.NoError(t, wait())
	require.GreaterOrEqual(t, time.Since(began), 1100*time.Millisecond, "waits for the whole window")
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

// TestBurstProfileFinish: a run that failed ends its profile at once,
// before its window; one that did not waits for the window; finishing
// again only says it again; no profile finishes at once.
func TestBurstProfileFinish(t *testing.T) {
	// Not parallel: a process runs one CPU profile at a time.
	dir := t.TempDir()
	began := time.Now()
	failed := startBurstProfile(t.Context(), filepath.Join(dir, "failed.prof"), began.Add(8*time.Second), time.Second)
	require.ErrorIs(t, failed.finish(true), context.Canceled)
	require.Less(t, time.Since(began), 6*time.Second, "not waiting for its window, 8 s away")
	require.ErrorIs(t, failed.finish(false), context.Canceled, "said again")
	_, err := os.Stat(filepath.Join(dir, "failed.prof"))
	require.ErrorIs(t, err, os.ErrNotExist)

	began = time.Now()
	ok := startBurstProfile(t.Context(), filepath.Join(dir, "ok.prof"), began, 200*time.Millisecond)
	require.NoError(t, ok.finish(false))
	require.GreaterOrEqual(t, time.Since(began), 200*time.Millisecond, "the whole window")
	require.NoError(t, ok.finish(true), "finished: said again, not cut")
	info, err := os.Stat(filepath.Join(dir, "ok.prof"))
	require.NoError(t, err)
	require.Positive(t, info.Size())

	var none *burstProfile
	require.NoError(t, none.finish(false))
}

// TestTimerFigure: the figure is the p99 of when the firings were
// stored, its argument left as it was.
func TestTimerFigure(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	stored := ms(35, 12, 25)
	require.Equal(t, 35*time.Millisecond, timerFigure(stored))
	lat := make([]time.Duration, 0, 101) // 100 ms down to 0: not in order
	for x := 100; x >= 0; x-- {
		lat = append(lat, time.Duration(x)*time.Millisecond)
	}
	require.Equal(t, 99*time.Millisecond, timerFigure(lat), "the 100th of 101 in order")
	require.Zero(t, timerFigure(nil))
	require.Equal(t, ms(35, 12, 25), stored, "its argument left as it was")
}
