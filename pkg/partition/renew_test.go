package partition_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// TestRenewalStoredButUnacknowledgedKeepsTheLease: on a busy machine a
// renewal can time out and be stored all the same; the next renewal,
// expecting the older revision, is refused. The lease still holds this
// member's name, so the member keeps the partition (same holding, nothing
// released) instead of dropping it and taking it again. A lease another
// member holds is lost, as before.
func TestRenewalStoredButUnacknowledgedKeepsTheLease(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	tbl, released := memberA(t, js, kv, 2)

	// a holds partitions 0 and 1, as acquire leaves them.
	for p := range 2 {
		tbl.AcquireNow(ctx, p)
		_, ok := tbl.Holds(p)
		require.True(t, ok)
	}
	epoch0, _ := tbl.Holds(0)

	// A renewal of 0 stored without its acknowledgement reaching a.
	stored, err := js.Publish(ctx, "$KV."+kv.Bucket()+"."+partition.LeaseKey(0), []byte("a"),
		jetstream.WithMsgTTL(partition.DefaultTTL), jetstream.WithExpectLastSequencePerSubject(tbl.LeaseRevision(0)))
	require.NoError(t, err)
	tbl.RenewNow(ctx, 0)
	epoch, ok := tbl.Holds(0)
	require.True(t, ok, "still held")
	require.Equal(t, epoch0, epoch, "the same holding: nothing was reset")
	require.Greater(t, tbl.LeaseRevision(0), stored.Sequence, "renewed from the revision found")
	require.EqualValues(t, 1, tbl.Adopted())

	// Another member's name in the lease of 1: lost.
	_, err = kv.Put(ctx, partition.LeaseKey(1), []byte("b"))
	require.NoError(t, err)
	tbl.RenewNow(ctx, 1)
	_, ok = tbl.Holds(1)
	require.False(t, ok, "a lease another member holds is lost")
	require.Eventually(t, func() bool { return slices.Equal(released(), []int{1}) },
		10*time.Second, 10*time.Millisecond, "1 is released, 0 is not")
	tbl.WaitStarts()
}

// memberA is member "a"'s table of n partitions, which acquires without
// doing anything, and what it has released so far, sorted.
func memberA(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, n int) (*partition.Table, func() []int) {
	t.Helper()
	var mu sync.Mutex
	var released []int
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(p int, _ uint64) bool { mu.Lock(); released = append(released, p); mu.Unlock(); return true }})
	require.NoError(t, err)
	return tbl, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(slices.Values(released))
	}
}

// TestRenewalCutShortByStoppingIsNotAnError: a member that stops cancels
// the renewal under way, which fails with the context's cancellation:
// that is not reported (every dispatcher stopping logged a warning per
// partition). A renewal that fails for another reason still is.
func TestRenewalCutShortByStoppingIsNotAnError(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, s)
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	tbl, reports := reportingMember(t, js, kv, 1)
	tbl.AcquireNow(ctx, 0)
	_, ok := tbl.Holds(0)
	require.True(t, ok)

	stopped, cancel := context.WithCancel(ctx)
	cancel()
	tbl.RenewNow(stopped, 0)
	require.Empty(t, reports(), "a renewal cut short by stopping")

	nc.Close() // a renewal that fails otherwise is reported
	tbl.RenewNow(ctx, 0)
	reported := reports()
	require.Len(t, reported, 1)
	require.Contains(t, reported[0], "renew partition 0")
}

// reportingMember is member "a" of n partitions, acquiring and releasing
// at once, and what its OnError was told so far.
func reportingMember(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, n int) (*partition.Table, func() []string) {
	t.Helper()
	onError, reports := reporter()
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { return true },
		OnError: onError})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	return tbl, reports
}

// reporter is an OnError that keeps what it is told, and what it was
// told so far.
func reporter() (onError func(error, string), reports func() []string) {
	var mu sync.Mutex
	var reported []string
	return func(err error, what string) {
			mu.Lock()
			reported = append(reported, what+": "+err.Error())
			mu.Unlock()
		}, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(reported)
		}
}

// TestRenewalsOfManyPartitionsGoOutTogether: on a loaded server each
// renewal takes long to be answered. A member holding many partitions
// sends their renewals together: one renewal after the other, a tick of
// eight took eight round trips, longer than the leases live, and each
// lease expired under its holder (and was taken back) over and over.
func TestRenewalsOfManyPartitionsGoOutTogether(t *testing.T) {
	t.Parallel()
	const (
		n   = 8
		ttl = 3 * time.Second
		// A renewal's round trip: one after the other, a tick's eight
		// take 4 s, past the time to live; together, 0.5 s.
		slow = 500 * time.Millisecond
	)
	a, renewals := slowRenewals(t, n, ttl, slow, nil)
	// Three times the time to live, and at least a few renewals of each.
	noLapse(t, a, func() bool { return renewals.Load() >= 4*n }, 3*ttl)
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Len(t, a.events, n, "each partition taken once, none lost: %v", a.events)
}

// TestRenewalsRefusedAfterLostAnswersGoOutTogether: each lease holds an
// earlier renewal of this member, stored but its answer lost (its time
// ran out), which the watch has not shown yet. The tick's renewals are
// all refused for their older revision; each lease, found to hold this
// member's name, is renewed again from the revision found: together
// too, or the last of eight would come after the leases expired.
func TestRenewalsRefusedAfterLostAnswersGoOutTogether(t *testing.T) {
	t.Parallel()
	const (
		n    = 8
		ttl  = 3 * time.Second
		slow = 500 * time.Millisecond // eight after the other: 4 s
	)
	var earlier atomic.Int64
	a, _ := slowRenewals(t, n, ttl, slow, func(write partition.LeaseWrite) partition.LeaseWrite {
		return func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			if earlier.Add(-1) >= 0 {
				if _, err := write(ctx, m, opts...); err != nil { // the earlier renewal, unanswered
					return nil, err
				}
			}
			return write(ctx, m, opts...)
		}
	})
	earlier.Store(n)
	noLapse(t, a, func() bool { return earlier.Load() < 0 }, 2*ttl)
	require.EqualValues(t, n, a.table.Adopted(), "each lease found holding the renewal whose answer was lost")
}

// slowRenewals starts member "a" of n partitions with a time to live of
// ttl, each renewal's write answered slow late (and written through
// wrap, if not nil), once it holds every partition; and the renewals
// written.
func slowRenewals(t *testing.T, n int, ttl, slow time.Duration, wrap func(partition.LeaseWrite) partition.LeaseWrite) (*member, *atomic.Int64) {
	t.Helper()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	var renewals atomic.Int64
	a := startMemberWith(t, s.ClientURL(), "a", n, memberSetup{
		config: func(c *partition.Config) { c.TTL = ttl },
		table: func(tbl *partition.Table) {
			tbl.WrapRenewalWrites(func(write partition.LeaseWrite) partition.LeaseWrite {
				if wrap != nil {
					write = wrap(write)
				}
				return func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
					select {
					case <-time.After(slow):
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					renewals.Add(1)
					return write(ctx, m, opts...)
				}
			})
		},
	})
	coverage(t, n, 10*time.Second, a)
	return a, &renewals
}

// noLapse checks, for at least d and until done, that no lease expired
// under m; it fails after a minute.
func noLapse(t *testing.T, m *member, done func() bool, d time.Duration) {
	t.Helper()
	for start := time.Now(); time.Since(start) < d || !done(); time.Sleep(50 * time.Millisecond) {
		require.Zero(t, m.table.Retaken(), "a lease expired under its holder")
		require.Less(t, time.Since(start), time.Minute, "not done within a minute")
	}
	require.Zero(t, m.table.Retaken(), "a lease expired under its holder")
}

// TestARenewalsValidityCountsFromBeforeItsWrite: a holding is valid for
// the time to live from before its renewal's write, never from its
// answer: the lease on the server lives its time to live from when the
// write was stored, somewhere between the two, and this member must stop
// handling the partition before another can take it.
func TestARenewalsValidityCountsFromBeforeItsWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, tbl, slowly := memberWithClock(t, 1)
	tbl.AcquireNow(ctx, 0)
	_, ok := tbl.Holds(0)
	require.True(t, ok)

	// The write takes an hour by the member's clock: the holding's
	// validity, a second from before it, has run out by its answer.
	tbl.WrapRenewalWrites(slowly)
	rev := tbl.LeaseRevision(0)
	tbl.RenewNow(ctx, 0)
	require.Greater(t, tbl.LeaseRevision(0), rev, "renewed")
	_, ok = tbl.Holds(0)
	require.False(t, ok, "valid for the time to live from before the write, not from its answer")
}

// memberWithClock is member "a" of n partitions, driven by the test, on a
// clock of its own; and a wrap of lease writes that makes each take an
// hour by that clock.
func memberWithClock(t *testing.T, n int) (jetstream.KeyValue, *partition.Table, func(partition.LeaseWrite) partition.LeaseWrite) {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n, Now: clock,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { return true }})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	return kv, tbl, func(write partition.LeaseWrite) partition.LeaseWrite {
		return func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			mu.Lock()
			now = now.Add(time.Hour) // answered an hour later
			mu.Unlock()
			return write(ctx, m, opts...)
		}
	}
}

// TestALeaseBeingGivenBackIsRenewedUntilItIsDeleted: a member gives a
// partition back (a new member takes its share) and its Release takes
// longer than the lease lives. The lease is renewed meanwhile, so the
// new member waits for it to be deleted: it never takes the partition
// while the old holder may still be handling it.
func TestALeaseBeingGivenBackIsRenewedUntilItIsDeleted(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, s)
	const (
		n = 8
		// Long enough for a loaded machine's renewals; the lease is
		// given back for twice as long.
		ttl = 2 * time.Second
	)
	unblock := make(chan struct{})
	var releasing sync.Map
	a := startMemberWith(t, s.ClientURL(), "a", n, memberSetup{config: func(c *partition.Config) {
		c.TTL = ttl
		release := c.Release
		c.Release = func(p int, epoch uint64) bool {
			releasing.Store(p, true)
			<-unblock
			return release(p, epoch)
		}
	}})
	t.Cleanup(func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	})
	coverage(t, n, 10*time.Second, a)
	b := startMember(t, s.ClientURL(), "b", n)

	// b's share is being given back by a, for twice the lease's time to
	// live.
	var moving []int
	require.Eventually(t, func() bool {
		moving = moving[:0]
		releasing.Range(func(p, _ any) bool { moving = append(moving, p.(int)); return true })
		return len(moving) > 0 && len(moving)+len(a.held(n)) == n
	}, 10*time.Second, 10*time.Millisecond, "a gives b's share back")
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	for start := time.Now(); time.Since(start) < 2*ttl; time.Sleep(50 * time.Millisecond) {
		for _, p := range moving {
			_, ok := b.table.Holds(p)
			require.False(t, ok, "b took partition %d while a was giving it back", p)
		}
	}
	for _, p := range moving {
		e, err := kv.Get(t.Context(), partition.LeaseKey(p))
		require.NoError(t, err, "partition %d: its lease is still there", p)
		require.Equal(t, "a", string(e.Value()))
	}
	close(unblock)
	coverage(t, n, 10*time.Second, a, b)
	for _, p := range moving {
		epoch, ok := b.table.Holds(p)
		require.True(t, ok)
		require.Equal(t, partition.VacancyReleased, b.table.Vacancy(p, epoch), "partition %d: taken as given back", p)
	}
}

// TestARefusedRenewalWhoseReadFailsLosesNothing: a renewal is refused
// for its expected revision (an earlier one was stored without its
// answer reaching the member), and the read of what the lease holds then
// fails too (a busy server). That tells nothing: the member reports it
// and keeps the partition (nothing released, the same holding), but the
// holding's validity is not extended, so it runs out unless a later
// renewal succeeds; the next renewal, its read answered, renews from the
// revision found.
func TestARefusedRenewalWhoseReadFailsLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Long enough that the stored renewal outlives a slow machine's
	// pauses in real time: its expiry would make the member take the
	// partition anew, not adopt the revision.
	const ttl = 30 * time.Second
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	onError, reports := reporter()
	var released atomic.Int64
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: 1, TTL: ttl, Now: clock,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { released.Add(1); return true },
		OnError: onError})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	tbl.AcquireNow(ctx, 0)
	epoch0, ok := tbl.Holds(0)
	require.True(t, ok)

	// A renewal stored without its answer reaching the member.
	stored, err := js.Publish(ctx, "$KV."+kv.Bucket()+"."+partition.LeaseKey(0), []byte("a"),
		jetstream.WithMsgTTL(ttl), jetstream.WithExpectLastSequencePerSubject(tbl.LeaseRevision(0)))
	require.NoError(t, err)
	var fail atomic.Bool
	fail.Store(true)
	tbl.WrapRenewedReads(func(read partition.LeaseRead) partition.LeaseRead {
		return func(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
			if fail.Load() {
				return nil, context.DeadlineExceeded
			}
			return read(ctx, key)
		}
	})

	advance(ttl / 2)
	rev := tbl.LeaseRevision(0)
	tbl.RenewNow(ctx, 0)
	reported := reports()
	require.Len(t, reported, 1)
	require.Contains(t, reported[0], "read lease 0 after a refused renewal")
	epoch, ok := tbl.Holds(0)
	require.True(t, ok, "still held: the failed read told nothing")
	require.Equal(t, epoch0, epoch, "the same holding")
	require.Equal(t, rev, tbl.LeaseRevision(0), "not renewed")
	require.Zero(t, tbl.Adopted(), "the revision found is not taken: none was read")
	advance(ttl/2 + time.Millisecond)
	_, ok = tbl.Holds(0)
	require.False(t, ok, "the holding's validity was not extended: it ran out, the acquire's time to live after it")

	fail.Store(false)
	tbl.RenewNow(ctx, 0)
	epoch, ok = tbl.Holds(0)
	require.True(t, ok, "valid again: renewed from the revision read")
	require.Equal(t, epoch0, epoch, "the same holding: nothing was reset")
	require.Greater(t, tbl.LeaseRevision(0), stored.Sequence)
	require.EqualValues(t, 1, tbl.Adopted())
	require.Zero(t, released.Load(), "nothing was released")
	require.Len(t, reports(), 1, "nothing more to report")
}
