package partition_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// TestLapsedLeaseIsTakenBack: a dispatcher whose process is starved of
// CPU past the lease's TTL renews too late, and its lease expires under
// it (a MaxAge marker). Nobody holds it, so it takes it back at once:
// nothing is released and its executions pause no longer than the stall,
// but it is a new holding (a new epoch, told to Retook), as another
// member may have held the partition in the stall. That is so whether it
// learns of the expiry from its refused renewal or from the watch.
// Another member that took the lease meanwhile keeps it.
func TestLapsedLeaseIsTakenBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, hooks := memberWithHooks(t, 4)
	released := hooks.released
	// a holds every partition; a watch shows what the bucket does to them.
	w := watchAll(t, kv)
	epochs := map[int]uint64{}
	for p := range 4 {
		tbl.AcquireNow(ctx, p)
		e, ok := tbl.Holds(p)
		require.True(t, ok)
		epochs[p] = e
	}

	// The stall: no renewal for longer than the TTL. Each lease expires on
	// the server, which writes a marker; the watch shows each as a purge.
	markers := map[int]jetstream.KeyValueEntry{}
	deadline := time.After(30 * time.Second)
	for len(markers) < 4 {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePurge {
				continue
			}
			for p := range 4 {
				if e.Key() == partition.LeaseKey(p) {
					markers[p] = e
				}
			}
		case <-deadline:
			t.Fatalf("the leases did not expire within 30 s: %d markers", len(markers))
		}
	}
	for p := range 4 {
		_, ok := tbl.Holds(p)
		require.False(t, ok, "partition %d: not handled while its lease has lapsed", p)
	}

	// 0: the first renewal after the stall is refused (the marker came
	// after the revision it expects); the lease is absent: taken back.
	tbl.RenewNow(ctx, 0)
	// 1: the watch's marker comes first; the next reconcile takes it back.
	tbl.ObserveNow(markers[1])
	// 2: another member took the lease in the stall: lost, as before.
	_, err := kv.Create(ctx, partition.LeaseKey(2), []byte("b"))
	require.NoError(t, err)
	tbl.RenewNow(ctx, 2)
	// 3: the marker is seen, then another member takes the lease before
	// this one takes it back: lost too.
	tbl.ObserveNow(markers[3])
	_, err = kv.Create(ctx, partition.LeaseKey(3), []byte("b"))
	require.NoError(t, err)
	tbl.ReconcileNow(ctx)

	for _, p := range []int{0, 1} {
		// (Epoch, not Holds: without the table's loop nothing renews the
		// 1 s lease, and a loaded machine may take longer to get here.)
		e, ok := tbl.Epoch(p)
		require.True(t, ok, "partition %d taken back", p)
		require.Greater(t, e, epochs[p], "partition %d: a new holding", p)
		require.Contains(t, hooks.retook(), retake{p, epochs[p], e}, "partition %d: Retook told", p)
		now, ok := tbl.Current(p, epochs[p])
		require.True(t, ok, "partition %d: the old holding's jobs go on in the new", p)
		require.Equal(t, e, now)
		requireLeaseRevision(t, kv, p, tbl.LeaseRevision(p), "renews from the lease it made")
	}
	require.EqualValues(t, 2, tbl.Retaken())
	require.Len(t, hooks.retook(), 2, "only 0 and 1 were taken back")
	for _, p := range []int{2, 3} {
		_, ok := tbl.Holds(p)
		require.False(t, ok, "partition %d: another member holds it", p)
		require.False(t, tbl.Await(ctx, p, epochs[p], time.Minute), "partition %d: lost, not waited for", p)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return slices.Equal(released(), []int{2, 3}) },
		"2 and 3 released, 0 and 1 not")

	// Taken back for good: the next renewals go on from the new revision.
	tbl.RenewNow(ctx, 0)
	_, ok := tbl.Holds(0)
	require.True(t, ok)
	_, err = kv.Get(ctx, partition.LeaseKey(3))
	require.False(t, errors.Is(err, jetstream.ErrKeyNotFound), "b's lease is untouched")
}

// TestAwaitWaitsForALateRenewalOnly: a holding whose lease lapsed is
// waited for until it is valid again (renewed, or taken back); one lost
// is not waited for at all.
func TestAwaitWaitsForALateRenewalOnly(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: 2,
		Acquire: func(context.Context, int, uint64) error { return nil }, Release: func(int, uint64) bool { return true }})
	require.NoError(t, err)
	defer tbl.WaitStarts()
	for p := range 2 {
		tbl.AcquireNow(ctx, p)
	}
	e0, ok := tbl.Holds(0)
	require.True(t, ok)
	require.True(t, tbl.Await(ctx, 0, e0, 0), "a valid holding needs no wait")
	require.False(t, tbl.Await(ctx, 0, e0+1000, time.Minute), "another holding's epoch: not waited for")
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, ok := tbl.Holds(0)
		return !ok
	}, "the holding lapses without renewals")

	done := make(chan bool, 1)
	go func() { done <- tbl.Await(ctx, 0, e0, time.Minute) }()
	select {
	case <-done:
		t.Fatal("Await returned before the lease was valid again")
	case <-time.After(100 * time.Millisecond):
	}
	tbl.RenewNow(ctx, 0) // renewed, or taken back if it expired meanwhile
	select {
	case got := <-done:
		require.True(t, got)
	case <-time.After(10 * time.Second):
		t.Fatal("Await did not see the renewal")
	}

	// 1 is lost to another member: Await says so at once.
	e1, _ := tbl.Epoch(1)
	_, err = kv.Put(ctx, partition.LeaseKey(1), []byte("b"))
	require.NoError(t, err)
	tbl.RenewNow(ctx, 1)
	began := time.Now()
	require.False(t, tbl.Await(ctx, 1, e1, time.Minute))
	require.Less(t, time.Since(began), 5*time.Second)
}
