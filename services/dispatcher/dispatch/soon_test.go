package dispatch

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSoonTimersComeDueInOrder: timers kept in memory come due by their
// due time, whatever the order they were armed in; one past the horizon
// is not kept; and the heap says how long until the next.
func TestSoonTimersComeDueInOrder(t *testing.T) {
	s := newSoonTimers(0, 0)
	now := time.Now()
	require.True(t, s.add(now, now.Add(time.Hour/60), "wf", "x3", "t3", 0))
	require.True(t, s.add(now, now.Add(-time.Second), "wf", "x1", "t1", 0)) // overdue: at once
	require.True(t, s.add(now, now.Add(time.Millisecond), "wf", "x2", "t2", 0))
	require.False(t, s.add(now, now.Add(soonHorizon+time.Second), "wf", "x4", "t4", 0), "past the horizon: its schedule only")

	ready, next := s.due(time.Now().Add(10 * time.Millisecond))
	require.Len(t, ready, 2)
	require.Equal(t, []string{"t1", "t2"}, []string{ready[0].id, ready[1].id})
	require.Equal(t, "x1", ready[0].exec)
	require.Equal(t, "wf", ready[0].workflow)
	require.Greater(t, next, 50*time.Second, "t3 is a minute away")
	require.LessOrEqual(t, next, time.Minute)

	ready, next = s.due(time.Now().Add(2 * time.Minute))
	require.Len(t, ready, 1)
	require.Equal(t, "t3", ready[0].id)
	require.Zero(t, next, "none left")

	var nilSoon *soonTimers // NoTimersFromMemory
	require.False(t, nilSoon.add(now, now, "wf", "x", "t", 0))
	require.Equal(t, notFiredHere, nilSoon.stand("x", "t"))
}

// TestSoonTimersAreBounded: past soonMax timers, a timer is left to its
// schedule.
func TestSoonTimersAreBounded(t *testing.T) {
	s := newSoonTimers(0, 0)
	now := time.Now()
	for i := range soonMax {
		require.True(t, s.add(now, now.Add(time.Minute), "wf", "x", fmt.Sprint(i), 0))
	}
	require.False(t, s.add(now, now, "wf", "x", "one-more", 0))
	ready, _ := s.due(time.Now())
	require.Empty(t, ready)
}

// TestSoonTimerStands: a schedule's message finds its timer not fired
// here, fired and in hand (asked again later), or handled (acknowledged,
// once); a firing dropped (Nak, Term) leaves the message to be handled.
func TestSoonTimerStands(t *testing.T) {
	s := newSoonTimers(0, 0)
	require.Equal(t, notFiredHere, s.stand("x1", "t1"))

	require.True(t, s.fire(settledKey("x1", "t1")))
	require.Equal(t, firedHere, s.stand("x1", "t1"))
	require.Equal(t, notFiredHere, s.stand("x2", "t1"), "another execution's timer of the same id")
	m := &soonMsg{soon: s, key: settledKey("x1", "t1")}
	require.NoError(t, m.Ack())
	require.Equal(t, handledHere, s.stand("x1", "t1"))
	require.Equal(t, notFiredHere, s.stand("x1", "t1"), "told once")

	for _, drop := range []func(*soonMsg) error{
		(*soonMsg).Nak,
		(*soonMsg).Term,
		func(m *soonMsg) error { return m.NakWithDelay(time.Second) },
		func(m *soonMsg) error { return m.TermWithReason("why") },
	} {
		require.True(t, s.fire(settledKey("x3", "t3")))
		require.NoError(t, drop(&soonMsg{soon: s, key: settledKey("x3", "t3")}))
		require.Equal(t, notFiredHere, s.stand("x3", "t3"))
	}

	_, err := m.Metadata()
	require.ErrorIs(t, err, errFiredHere, "stored nowhere")
}

// TestSoonTimersForgetOldEntries: when the remembered firings fill up,
// those older than settledFor are forgotten to make room; one fired that
// long ago and never concluded no longer holds its schedule's message.
func TestSoonTimersForgetOldEntries(t *testing.T) {
	s := newSoonTimers(0, 0)
	old := time.Now().Add(-settledFor - time.Minute)
	for i := range soonMax {
		s.settled[fmt.Sprint(i)] = old
	}
	s.conclude(settledKey("x", "new"), true)
	require.Len(t, s.settled, 1)
	require.Equal(t, handledHere, s.stand("x", "new"))

	s.pending[settledKey("x", "lost")] = old
	require.Equal(t, notFiredHere, s.stand("x", "lost"))
}

// TestSoonTimerArmedAgainKeepsItsLatestArming: a timer armed again
// fires at its latest due time only; armed again beyond the horizon (or
// forgotten), it does not fire from memory at all; a requeued entry
// gives way to an arming that came meanwhile.
func TestSoonTimerArmedAgainKeepsItsLatestArming(t *testing.T) {
	s := newSoonTimers(0, 0)
	now := time.Now()
	require.True(t, s.add(now, now.Add(-time.Second), "wf", "x", "t", 0))
	require.True(t, s.add(now, now.Add(time.Hour/120), "wf", "x", "t", 0)) // 30 s
	ready, _ := s.due(time.Now())
	require.Empty(t, ready, "the first arming is stale")
	ready, _ = s.due(time.Now().Add(time.Minute))
	require.Len(t, ready, 1)
	require.WithinDuration(t, now.Add(30*time.Second), ready[0].due, 0)

	require.True(t, s.add(now, now, "wf", "y", "t", 0))
	require.False(t, s.add(now, now.Add(time.Hour), "wf", "y", "t", 0), "beyond the horizon")
	require.True(t, s.add(now, now, "wf", "z", "t", 0))
	s.forget("z", "t")
	ready, _ = s.due(time.Now().Add(time.Minute))
	require.Empty(t, ready, "neither fires from memory")

	require.True(t, s.add(now, now, "wf", "r", "t", 0))
	ready, _ = s.due(time.Now().Add(time.Minute))
	require.Len(t, ready, 1)
	s.requeue(ready[0], time.Now())
	again, _ := s.due(time.Now().Add(time.Minute))
	require.Len(t, again, 1, "requeued")
	require.True(t, s.add(now, now.Add(time.Second), "wf", "r", "t", 0)) // armed again
	s.requeue(again[0], time.Now())
	last, _ := s.due(time.Now().Add(time.Minute))
	require.Len(t, last, 1, "the new arming only")
	require.WithinDuration(t, now.Add(time.Second), last[0].due, 0)
}

// TestARequeuedTimerWakesTheFireLoop: the fire loop computes how long to
// sleep from the heap before it requeues a timer whose partition is not
// held (a lease renewed late), an hour when that timer was the last; the
// requeue must wake it, or the loop sleeps past every timer armed later
// (they are not first: the requeued one is) and all fire from their
// schedules, 2 s late, until the dispatcher starts again.
func TestARequeuedTimerWakesTheFireLoop(t *testing.T) {
	s := newSoonTimers(0, 0)
	now := time.Now()
	require.True(t, s.add(now, now, "wf", "x", "t", 0))
	select {
	case <-s.wake: // the add's
	default:
		t.Fatal("the first add did not wake the fire loop")
	}
	ready, next := s.due(time.Now())
	require.Len(t, ready, 1)
	require.Zero(t, next, "none left: the loop would sleep an hour")

	s.requeue(ready[0], time.Now().Add(notHeldAgain))
	select {
	case <-s.wake:
	default:
		t.Fatal("the requeue, now first, did not wake the fire loop")
	}
	_, next = s.due(time.Now())
	require.Positive(t, next)
	require.LessOrEqual(t, next, notHeldAgain, "the loop sleeps until the requeued timer, not an hour")

	require.True(t, s.add(now, now.Add(time.Minute), "wf", "y", "u", 0)) // later: not first
	select {
	case <-s.wake:
		t.Fatal("a timer after the head woke the loop")
	default:
	}
}
