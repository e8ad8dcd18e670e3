package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestKillsCancelRunningAndRefuseLater(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

	ctxA, doneA, refused := k.start(t.Context(), "x1", "x1.a.1", "tok")
	require.NoError(t, refused)
	ctxB, doneB, refused := k.start(t.Context(), "x2", "x2.a.1", "tok")
	require.NoError(t, refused)
	defer doneB()

	require.Equal(t, 1, k.kill("x1", 1, now))
	require.ErrorIs(t, context.Cause(ctxA), ErrKilled, "the running operation's context is cancelled with ErrKilled")
	require.NoError(t, ctxB.Err(), "another execution's operation goes on")
	doneA()

	_, _, refused = k.start(t.Context(), "x1", "x1.b.1", "tok")
	require.ErrorIs(t, refused, ErrKilled, "a later task of a killed execution is refused")

	t.Log("a resume lifts the kill: the execution's new tasks run")
	k.lift("x1")
	_, doneLifted, refused := k.start(t.Context(), "x1", "x1.b.2", "tok")
	require.NoError(t, refused)
	doneLifted()
	k.kill("x1", 1, now)

	t.Log("a notice older than a day is forgotten when the next one arrives")
	k.kill("x3", 2, now.Add(26*time.Hour))
	ctx, done, refused := k.start(t.Context(), "x1", "x1.b.3", "tok")
	require.NoError(t, refused)
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
	_, _, refused := k.start(t.Context(), "x1", "x1.a.1", "tok")
	require.ErrorIs(t, refused, ErrKilled)

	ctx, done, refused := k.startLifted(t.Context(), "x1", "x1.a.1", "tok", 6)
	require.NoError(t, refused, "the kill at 5 was lifted at 6")
	require.Equal(t, 1, k.kill("x1", 7, now), "a kill after the lift terminates the operation")
	require.ErrorIs(t, context.Cause(ctx), ErrKilled)
	done()

	_, _, refused = k.startLifted(t.Context(), "x1", "x1.a.1", "tok", 6)
	require.ErrorIs(t, refused, ErrKilled, "the kill at 7 came after the lift at 6")
}

// TestKillsEndedRefusesWithoutTerminating: the notice of an execution
// that ended refuses its tasks not yet started and lets the running ones
// finish; a resume's lift ends it.
func TestKillsEndedRefusesWithoutTerminating(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ctx, done, refused := k.start(t.Context(), "x1", "x1.a.1", "tok")
	require.NoError(t, refused)
	defer done()

	k.end("x1", []string{"tok"}, 3, now)
	require.NoError(t, ctx.Err(), "a running operation of an ended execution finishes")
	_, _, refused = k.start(t.Context(), "x1", "x1.b.1", "tok")
	require.ErrorIs(t, refused, ErrEnded)
	_, _, refused = k.startLifted(t.Context(), "x1", "x1.b.1", "tok", 2)
	require.ErrorIs(t, refused, ErrEnded, "a lift before the end does not undo it")
	ctxLifted, doneLifted, refused := k.startLifted(t.Context(), "x1", "x1.b.1", "tok", 4)
	require.NoError(t, refused, "the end at 3 was lifted at 4 (a resume)")
	doneLifted()
	require.ErrorIs(t, context.Cause(ctxLifted), context.Canceled)

	t.Log("a kill after the end terminates what runs")
	require.Equal(t, 1, k.kill("x1", 5, now))
	require.ErrorIs(t, context.Cause(ctx), ErrKilled)
}

// TestKillsOneTask: a task's notice terminates that attempt only, with
// its reason, and refuses its task later; the execution's other tasks
// run.
func TestKillsOneTask(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ctxA, doneA, refused := k.start(t.Context(), "x1", "x1.a.1", "tok")
	require.NoError(t, refused)
	defer doneA()
	ctxB, doneB, refused := k.start(t.Context(), "x1", "x1.b.1", "tok")
	require.NoError(t, refused)
	defer doneB()

	require.True(t, k.killTask("x1", "x1.a.1", "attempt 1 timed out after 1s", 1, now))
	cause := context.Cause(ctxA)
	require.ErrorIs(t, cause, ErrTerminated)
	require.ErrorContains(t, cause, "attempt 1 timed out after 1s")
	require.NoError(t, ctxB.Err(), "the execution's other operation goes on")

	_, _, refused = k.start(t.Context(), "x1", "x1.a.1", "tok")
	require.ErrorIs(t, refused, ErrTerminated, "the attempt's task, delivered again, is refused")
	_, doneNext, refused := k.start(t.Context(), "x1", "x1.a.2", "tok")
	require.NoError(t, refused, "the step's next attempt runs")
	doneNext()
	require.False(t, k.killTask("x1", "x1.z.1", "", 2, now), "a task not running here is only remembered")
	_, _, refused = k.start(t.Context(), "x1", "x1.z.1", "tok")
	require.ErrorIs(t, refused, ErrTerminated)
}

// TestKillsForgetsTheOldestTasks: the attempts remembered are bounded in
// number and in time.
func TestKillsForgetsTheOldestTasks(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for i := range maxNotices + 10 {
		k.killTask("x1", fmt.Sprintf("x1.s.%d", i), "", uint64(i), now)
	}
	require.Len(t, k.tasks.byKey, maxNotices)
	_, done, refused := k.start(t.Context(), "x1", "x1.s.0", "tok")
	require.NoError(t, refused, "the oldest was forgotten")
	done()
	_, _, refused = k.start(t.Context(), "x1", fmt.Sprintf("x1.s.%d", maxNotices+9), "tok")
	require.ErrorIs(t, refused, ErrTerminated)

	k.killTask("x2", "x2.s.1", "", 1, now.Add(killsForgotten+time.Minute))
	require.Len(t, k.tasks.byKey, 1, "a day later, the others are forgotten")
}

// TestKillsApplyToTheirRun: an ended execution's notice refuses the
// tasks that carry one of its tokens only: a resumed execution's new
// tasks (a new token) run, even if the notice outlived its lift (a stale
// dispatcher's, or one kept after the stream forgot it).
func TestKillsApplyToTheirRun(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	running, done, refused := k.start(t.Context(), "x1", "x1.a.1", "run1")
	require.NoError(t, refused)
	defer done()

	k.end("x1", []string{"run1", "run0"}, 2, now)
	require.NoError(t, running.Err(), "an ended execution's running operation finishes")
	for _, token := range []string{"run1", "run0"} {
		_, _, refused = k.start(t.Context(), "x1", "x1.d."+token, token)
		require.ErrorIs(t, refused, ErrEnded, token)
	}
	_, doneNext, refused := k.start(t.Context(), "x1", "x1.d.3", "run2")
	require.NoError(t, refused, "a task of the next run is not refused")
	doneNext()
}

// TestKillsForgetTheOldestExecutions: the executions remembered are
// bounded in number too.
func TestKillsForgetTheOldestExecutions(t *testing.T) {
	t.Parallel()
	k := newKills()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for i := range maxNotices + 5 {
		k.end(fmt.Sprintf("x%d", i), []string{"tok"}, uint64(i), now)
	}
	require.Len(t, k.killed.byKey, maxNotices)
	_, done, refused := k.start(t.Context(), "x0", "x0.a.1", "tok")
	require.NoError(t, refused, "the oldest was forgotten")
	done()
}
