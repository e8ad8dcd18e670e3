package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/tools/internal/devstack"
)

func TestRetentionFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-retention", "-1"},
		{"-retention", "5", "-retention-keep", "6"},
		{"-retention-keep", "1"}, // keeps more than the run has
		{"-executions", "-1"},
	} {
		err := run(t.Context(), args, new(bytes.Buffer))
		require.Error(t, err, "%v", args)
	}
}

// TestRetentionRun runs the retention mode on a small scale, on the whole
// system with its embedded server, and checks that it counts right and
// that its check catches a wrong result.
func TestRetentionRun(t *testing.T) {
	ctx := t.Context()
	info, stop, err := startStack(ctx, devstack.Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), JanitorInterval: quietJanitor, JanitorCatchUpEvery: -1, NoDirectReports: true})
	require.NoError(t, err)
	defer stop()
	conn, err := info.Dial(ctx, auth.RoleAdmin, "jetflow-bench-test")
	require.NoError(t, err)
	defer conn.NC.Close()
	store, err := catalog.Open(ctx, conn.JS)
	require.NoError(t, err)

	var out bytes.Buffer
	require.NoError(t, runRetention(ctx, &out, conn, store, info, 12, 5, 4))
	t.Log(out.String())
	require.Contains(t, out.String(), "first sweep      12 finished read, 7 expiries asked in ")
	require.Contains(t, out.String(), "expiries         7 recorded by the dispatcher ")
	require.Contains(t, out.String(), "second sweep     12 finished read, 7 deleted in ")
	require.Contains(t, out.String(), "third sweep      5 finished read, nothing to do, in ")
	require.Contains(t, out.String(), "checked          the 7 that finished first")

	// The check itself: told that the 7 deleted executions are the most
	// recent, it must find wrong the 5 of them it then expects kept, and
	// the 5 kept that it then expects deleted.
	ids, err := claim.Open(ctx, conn.JS)
	require.NoError(t, err)
	var runs []endedExecution
	deleted := 0
	require.NoError(t, ids.Each(ctx, func(id string, c claim.Record) error {
		if !strings.HasPrefix(id, "retention-") {
			return nil
		}
		at := time.Unix(0, 0)
		if c.Expired() {
			at = time.Unix(1, 0) // the deleted ones, said to be the most recent
			deleted++
		}
		runs = append(runs, endedExecution{id: id, endedAt: at.Add(time.Duration(len(runs)))})
		return nil
	}))
	require.Len(t, runs, 12)
	require.Equal(t, 7, deleted)
	kv, err := conn.JS.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	wrong, err := checkRetained(ctx, conn.JS, kv, runs, 5)
	require.NoError(t, err)
	wrongIDs := map[string]bool{}
	for _, w := range wrong {
		wrongIDs[strings.Fields(w)[0]] = true
	}
	require.Len(t, wrongIDs, 10, "%v", wrong)
	require.Len(t, wrong, 10*4, "history, results, read model and expired mark of each: %v", wrong)
	// Ranked right (kept ones most recent), nothing is wrong.
	for i := range runs {
		runs[i].endedAt = time.Unix(2, 0).Add(-runs[i].endedAt.Sub(time.Unix(0, 0)))
	}
	wrong, err = checkRetained(ctx, conn.JS, kv, runs, 5)
	require.NoError(t, err)
	require.Empty(t, wrong)

	// A second run with the same workflow: the first run's 5 are older
	// members of its group, so the janitor deletes them too, and the run
	// must say its result is wrong rather than report it.
	err = runRetention(ctx, new(bytes.Buffer), conn, store, info, 12, 5, 4)
	require.ErrorContains(t, err, "wrong result")
	require.ErrorContains(t, err, "first sweep read 17 finished executions, asked for 12 expiries, deleted 0, with 0 errors; want 17, 7, 0 and 0")
	// What the later sweeps delete depends on how many of the first
	// run's 5 expiries were projected by then (the run waits for its own
	// 7 only; on a loaded machine the second sweep found 11 of 12): that
	// the first sweep's is called wrong does not.
}
