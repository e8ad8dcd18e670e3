package dispatch_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestStaleCacheNeverRemovesALiveHolder: an expire command reaches a
// dispatcher whose cached state shows the execution ended with its lock
// still to release, while another dispatcher has resumed it (it runs on,
// holding the lock). Releasing from the cached state would hand the lock
// to the next waiter: two holders. The dispatcher checks its state is the
// whole history before any lock bucket write.
func TestStaleCacheNeverRemovesALiveHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, Source: "A"})
	// Every partition taken first: a partition taken later reconciles its
	// executions, which would release h1's lock on its own once its end
	// is appended below (seen on a loaded machine), before the test's
	// expire commands come.
	leases, err := b.js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool {
		for p := range 8 {
			if _, err := leases.Get(t.Context(), partition.LeaseKey(p)); err != nil {
				return false
			}
		}
		return true
	}, "the dispatcher holds its 8 partitions")
	b.applyYAML(t, "name: lk\nlock: db\nsteps:\n  - id: work\n    kind: noop\n")
	// The dispatcher's lock watcher wakes each holder once (a reconcile
	// on its inbox): h1's must be handled before h1's end is appended
	// below, or, come late on a loaded machine, it acts on that end and
	// releases the lock itself.
	n, err := bus.Partitions(t.Context(), b.js)
	require.NoError(t, err)
	wakes, err := b.js.Conn().SubscribeSync(bus.InboxSubject(partition.Of("h1", n), "h1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = wakes.Unsubscribe() })
	b.start(t, "lk", "h1")
	b.nextTask(t) // h1 holds db, its step is with the agents
	b.start(t, "lk", "h2")
	lockStatus(t, b.js, "lk", "h2", "", projections.LockWaiting)
	for {
		m, err := wakes.NextMsg(30 * time.Second)
		require.NoError(t, err, "h1 woken as the holder of db")
		if strings.Contains(string(m.Data), "holds lock db") {
			break
		}
	}
	waitCommandsHandled(t, b.js)

	// A dispatcher appended h1's end and died before releasing its lock.
	s := foldOf(t, b.js, "lk", "h1")
	ev := events.New("B", "h1", "lk", time.Now(), &events.ExecutionFailed{Error: "boom"})
	ev.PrevSeq = s.LastSeq
	_, err = history.Append(t.Context(), b.js, bus.ExecutionSubject("lk", "h1"), s.LastSeq, ev)
	require.NoError(t, err)
	// Dispatcher A comes to cache that state (an expire command naming an
	// old position: kept, nothing done, but the state is now cached).
	b.expireCommand(t, "lk", "h1", 1)
	waitCommandsHandled(t, b.js)
	failed := foldOf(t, b.js, "lk", "h1")
	require.Equal(t, projections.StatusFailed, failed.Status)
	l, _ := failed.LockAt("")
	require.Equal(t, projections.LockHeld, l.Status)

	// Dispatcher B resumes h1: it runs on, still holding db.
	ev = events.New("B", "h1", "lk", time.Now(), &events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2"})
	ev.PrevSeq = failed.LastSeq
	_, err = history.Append(t.Context(), b.js, bus.ExecutionSubject("lk", "h1"), failed.LastSeq, ev)
	require.NoError(t, err)

	// The janitor's expire command, from the read model it saw before the resume, reaches A.
	b.expireCommand(t, "lk", "h1", failed.LastSeq)
	waitCommandsHandled(t, b.js)
	time.Sleep(500 * time.Millisecond)

	h1 := foldOf(t, b.js, "lk", "h1")
	require.Equal(t, projections.StatusStarted, h1.Status)
	l, _ = h1.LockAt("")
	require.Equal(t, projections.LockHeld, l.Status, "h1's history: it holds db")
	r, _ := lockRecord(t, b.js, "db")
	t.Logf("bucket holders %v waiters %v", execIDs(r.Holders), execIDs(r.Waiters))
	h2 := foldOf(t, b.js, "lk", "h2")
	l2, _ := h2.LockAt("")
	t.Logf("h2's lock in its history: %s", l2.Status)
	require.Equal(t, []string{"h1"}, execIDs(r.Holders), "the bucket must still list the running holder")
}
