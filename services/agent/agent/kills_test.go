package agent

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestKillsCancelRunningAndRefuseLater(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

	ctxA, doneA, ok := k.start(t.Context(), "x1")
	require.True(t, ok)
	ctxB, doneB, ok := k.start(t.Context(), "x2")
	require.True(t, ok)
	defer doneB()

	require.Equal(t, 1, k.kill("x1", 1, now))
	require.ErrorIs(t, context.Cause(ctxA), ErrKilled, "the running operation's context is cancelled with ErrKilled")
	require.NoError(t, ctxB.Err(), "another execution's operation goes on")
	doneA()

	_, _, ok = k.start(t.Context(), "x1")
	require.False(t, ok, "a later task of a killed execution is refused")

	t.Log("a resume lifts the kill: the execution's new tasks run")
	k.lift("x1")
	_, doneLifted, ok := k.start(t.Context(), "x1")
	require.True(t, ok)
	doneLifted()
	k.kill("x1", 1, now)

	t.Log("a notice older than a day is forgotten when the next one arrives")
	k.kill("x3", 2, now.Add(26*time.Hour))
	ctx, done, ok := k.start(t.Context(), "x1")
	require.True(t, ok)
	done()
	require.ErrorIs(t, context.Cause(ctx), context.Canceled, "an operation that ended normally was not killed")
	require.Empty(t, k.running["x1"])
}

// TestKillsStartLifted: a kill lifted in the stream before the agent read
// the lift does not refuse an operation, unless the agent has since read
// a later kill.
func TestKillsStartLifted(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	k.kill("x1", 5, now)
	_, _, ok := k.start(t.Context(), "x1")
	require.False(t, ok)

	ctx, done, ok := k.startLifted(t.Context(), "x1", 6)
	require.True(t, ok, "the kill at 5 was lifted at 6")
	require.Equal(t, 1, k.kill("x1", 7, now), "a kill after the lift terminates the operation")
	require.ErrorIs(t, context.Cause(ctx), ErrKilled)
	done()

	_, _, ok = k.startLifted(t.Context(), "x1", 6)
	require.False(t, ok, "the kill at 7 came after the lift at 6")
}
