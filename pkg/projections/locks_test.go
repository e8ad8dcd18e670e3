package projections_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

func at(sec int, p events.Payload) events.Event {
	return events.Event{ID: "e", Type: p.EventType(), Subject: "x1", Time: time.Date(2026, 1, 1, 0, 0, sec, 0, time.UTC), Data: p}
}

func TestFoldLocks(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{
		started("a"),
		at(1, &events.LockRequested{Lock: "db", Limit: 1}),
		at(2, &events.LockRequested{Lock: "db", Path: "blk", Limit: 2}),
	})
	require.NoError(t, err)
	require.Len(t, s.WaitingLocks(), 2)

	s, err = projections.Apply(s, at(3, &events.LockAcquired{Lock: "db"}))
	require.NoError(t, err)
	l, ok := s.LockAt("")
	require.True(t, ok)
	require.Equal(t, projections.LockHeld, l.Status)
	require.Equal(t, 3, l.AcquiredAt.Second())
	require.Len(t, s.WaitingLocks(), 1)

	s, err = projections.Apply(s, at(4, &events.LockCleared{ActionRecord: events.ActionRecord{Reason: "stuck", RequestedBy: "alice"}, Lock: "db", Path: "blk"}))
	require.NoError(t, err)
	l, _ = s.LockAt("blk")
	require.Equal(t, projections.LockCleared, l.Status)
	require.Equal(t, "alice", l.ClearedBy)

	// Asked again after the clear: a new request.
	s, err = projections.Apply(s, at(5, &events.LockRequested{Lock: "db", Path: "blk", Limit: 2}))
	require.NoError(t, err)
	l, _ = s.LockAt("blk")
	require.Equal(t, 2, l.Requests)
	require.Equal(t, projections.LockWaiting, l.Status)

	// Released after the execution ended (a force-cancel gives its locks up after its last event).
	s, err = projections.Apply(s, at(6, &events.ExecutionCancelled{}))
	require.NoError(t, err)
	for _, p := range []string{"", "blk"} {
		s, err = projections.Apply(s, at(7, &events.LockReleased{Lock: "db", Path: p, Reason: "the execution is cancelled"}))
		require.NoError(t, err)
	}
	require.Empty(t, s.WaitingLocks())
	_, err = projections.Apply(s, at(8, &events.LockRequested{Lock: "db", Limit: 1}))
	require.Error(t, err, "an ended execution asks for no lock")
}

func TestIllegalLockTransitions(t *testing.T) {
	t.Parallel()

	base, err := projections.Fold([]events.Event{started("a"), at(1, &events.LockRequested{Lock: "db", Limit: 1})})
	require.NoError(t, err)
	for name, p := range map[string]events.Payload{
		"AcquireAnotherLock":   &events.LockAcquired{Lock: "other"},
		"AcquireAnotherScope":  &events.LockAcquired{Lock: "db", Path: "blk"},
		"RequestTwice":         &events.LockRequested{Lock: "db", Limit: 1},
		"ReleaseUnknownScope":  &events.LockReleased{Lock: "db", Path: "x"},
		"ClearAnotherLockName": &events.LockCleared{Lock: "x"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := projections.Apply(base, at(2, p))
			var te *projections.TransitionError
			require.ErrorAs(t, err, &te)
		})
	}
	_, err = projections.Fold([]events.Event{at(0, &events.LockRequested{Lock: "db"})})
	require.Error(t, err, "a lock event cannot begin a history")
}
