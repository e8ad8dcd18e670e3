package partition_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// vacancies lists how m found each partition's lease, for the holding it
// has now (VacancyUnknown for one it does not hold).
func vacancies(m *member, n int) []partition.Vacancy {
	out := make([]partition.Vacancy, n)
	for p := range n {
		if epoch, ok := m.table.Holds(p); ok {
			out[p] = m.table.Vacancy(p, epoch)
		}
	}
	return out
}

func all(n int, v partition.Vacancy) []partition.Vacancy {
	out := make([]partition.Vacancy, n)
	for p := range out {
		out[p] = v
	}
	return out
}

// TestVacancyTellsHowTheLastHolderLeft: a member taking a partition
// learns whether the lease was never held, given back by a holder that
// stopped, or left by one that died (expired), so that a dispatcher looks
// for what a dead holder left undone only when there may be some. A
// lease found under the member's own name (an earlier run of it) counts
// as expired.
func TestVacancyTellsHowTheLastHolderLeft(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const n = 4

	a := startMember(t, s.ClientURL(), "a", n)
	coverage(t, n, 10*time.Second, a)
	require.Equal(t, all(n, partition.VacancyNever), vacancies(a, n), "a new deployment's leases were never held")

	a.cancel() // stops cleanly: deletes its leases once it let the partitions go
	<-a.done
	b := startMember(t, s.ClientURL(), "b", n)
	coverage(t, n, 10*time.Second, b)
	require.Equal(t, all(n, partition.VacancyReleased), vacancies(b, n), "a's leases were given back")

	b.close() // dies: its leases expire
	c := startMember(t, s.ClientURL(), "c", n)
	coverage(t, n, 10*time.Second, c)
	require.Equal(t, all(n, partition.VacancyExpired), vacancies(c, n), "b's leases expired")

	c.mu.Lock()
	c.leaves = true // its releases leave something to look for: its leases are purged
	c.mu.Unlock()
	c.cancel()
	<-c.done
	d := startMember(t, s.ClientURL(), "d", n)
	coverage(t, n, 10*time.Second, d)
	require.Equal(t, all(n, partition.VacancyExpired), vacancies(d, n), "c stopped, leaving something")
}

// TestVacancyIsWhatTheTakeReplaced: a take is a compare-and-set on the
// lease's last message, and its Vacancy is that message's, whatever the
// table's watch showed (here it shows nothing): a lease under the
// member's own name (a create whose answer was lost, or an earlier run)
// is adopted and counts as expired; another member's lease that expired,
// or was purged, counts as expired; one deleted as released; none as
// never held. Another member's live lease is not taken.
func TestVacancyIsWhatTheTakeReplaced(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 6)
	put := func(p int, owner string, opts ...jetstream.KVCreateOpt) {
		t.Helper()
		_, err := kv.Create(ctx, partition.LeaseKey(p), []byte(owner), opts...)
		require.NoError(t, err)
	}
	put(0, "a", jetstream.KeyTTL(10*time.Second))
	put(2, "b", jetstream.KeyTTL(time.Second))
	put(3, "b")
	require.NoError(t, kv.Delete(ctx, partition.LeaseKey(3)))
	put(4, "b")
	require.NoError(t, kv.Purge(ctx, partition.LeaseKey(4)))
	put(5, "b", jetstream.KeyTTL(time.Minute))
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := kv.Get(ctx, partition.LeaseKey(2))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "b's lease of 2 expires")
	for p := range 6 {
		tbl.AcquireNow(ctx, p)
	}
	want := []partition.Vacancy{partition.VacancyExpired, partition.VacancyNever, partition.VacancyExpired,
		partition.VacancyReleased, partition.VacancyExpired, partition.VacancyUnknown}
	got := make([]partition.Vacancy, 6)
	for p := range 6 {
		if e, ok := tbl.Holds(p); ok {
			got[p] = tbl.Vacancy(p, e)
		}
	}
	require.Equal(t, want, got)
	require.EqualValues(t, 1, tbl.Adopted(), "0, found under its own name")
	e1, _ := tbl.Holds(1)
	require.Equal(t, partition.VacancyUnknown, tbl.Vacancy(0, e1), "a holding that is not p's")
}

// givenBack leaves p's lease as another member gives it back: held by
// b, then deleted.
func givenBack(t *testing.T, kv jetstream.KeyValue, p int) {
	t.Helper()
	_, err := kv.Create(t.Context(), partition.LeaseKey(p), []byte("b"))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(t.Context(), partition.LeaseKey(p)))
}

// requireHeldAs checks that tbl holds p, having found its lease as want.
func requireHeldAs(t *testing.T, tbl *partition.Table, p int, want partition.Vacancy, msgAndArgs ...any) {
	t.Helper()
	e, ok := tbl.Holds(p)
	require.True(t, ok, "partition %d held", p)
	require.Equal(t, want, tbl.Vacancy(p, e), msgAndArgs...)
}

// loseTakeAnswers makes tbl's next n takes' writes stored without
// their answers.
func loseTakeAnswers(tbl *partition.Table, n int) {
	scriptTakeWrites(tbl, slices.Repeat([]takeWrite{storedUnanswered}, n)...)
}

// A takeWrite is what becomes of one take's write (scriptTakeWrites).
type takeWrite int

const (
	storedUnanswered takeWrite = iota // stored, its answer lost
	notStored                         // never reached the server: a timeout
	refused                           // refused as after a stale read
)

// scriptTakeWrites makes tbl's next takes' writes go as script says, one
// each, in the order they are made (a reconcile's takes are made
// together); the writes after them go as usual.
func scriptTakeWrites(tbl *partition.Table, script ...takeWrite) {
	var mu sync.Mutex
	tbl.WrapTakeWrites(func(write partition.LeaseWrite) partition.LeaseWrite {
		return func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			mu.Lock()
			if len(script) == 0 {
				mu.Unlock()
				return write(ctx, m, opts...)
			}
			next := script[0]
			script = script[1:]
			mu.Unlock()
			switch next {
			case storedUnanswered:
				if _, err := write(ctx, m, opts...); err != nil {
					return nil, err
				}
				return nil, context.DeadlineExceeded
			case refused:
				return nil, &jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}
			}
			return nil, context.DeadlineExceeded
		}
	})
}

// TestATakeAnsweredLateFindsTheLeaseAsItWas: a take whose write was
// stored but had no answer (a timeout on a busy machine) finds its own
// lease at the next take. It counts as what the first take found (never
// held, released), not as expired: a dispatcher would otherwise read the
// events stream's last 20 s for local steps nobody left. Only that
// take's write (its token) counts so: a lease of its name written since
// (as an earlier run's would be) leaves it expired.
func TestATakeAnsweredLateFindsTheLeaseAsItWas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 3)
	givenBack(t, kv, 1)
	givenBack(t, kv, 2)

	loseTakeAnswers(tbl, 3)
	for p := range 3 {
		tbl.AcquireNow(ctx, p)
		_, held := tbl.Holds(p)
		require.False(t, held, "partition %d: its take had no answer", p)
		e, err := kv.Get(ctx, partition.LeaseKey(p))
		require.NoError(t, err, "partition %d: the write was stored", p)
		require.Equal(t, "a", string(e.Value()))
		if p == 2 { // written again under its name meanwhile
			_, err := kv.Update(ctx, partition.LeaseKey(p), []byte("a"), e.Revision())
			require.NoError(t, err)
		}
	}
	for p := range 3 {
		tbl.AcquireNow(ctx, p)
	}
	got := make([]partition.Vacancy, 3)
	for p := range 3 {
		if e, ok := tbl.Holds(p); ok {
			got[p] = tbl.Vacancy(p, e)
		}
	}
	require.Equal(t, []partition.Vacancy{partition.VacancyNever, partition.VacancyReleased, partition.VacancyExpired}, got)
	require.EqualValues(t, 3, tbl.Adopted(), "each found under its own name")
}

// TestTakesAnsweredLateWhileRunning: a running member whose takes of
// leases given back are all stored without their answers takes every
// partition as released, at once. The watch shows each write as the
// member's lease before the next take: that lease is taken again, not
// left to expire (which took a whole time to live, and then counted the
// partition expired).
func TestTakesAnsweredLateWhileRunning(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const n = 4
	a := startMember(t, s.ClientURL(), "a", n)
	coverage(t, n, 10*time.Second, a)
	a.cancel() // gives its leases back
	<-a.done
	// A time to live long enough for a loaded machine to come to the
	// next take before the lease expires (which would count it expired).
	const ttl = 10 * time.Second
	b := startMemberWith(t, s.ClientURL(), "b", n, memberSetup{
		config: func(c *partition.Config) { c.TTL = ttl },
		table:  func(tbl *partition.Table) { loseTakeAnswers(tbl, n) },
	})
	coverage(t, n, ttl, b)
	require.Equal(t, all(n, partition.VacancyReleased), vacancies(b, n))
}

// TestTakesAnsweredLateInARowFindTheLeaseAsItWas: a take answered late,
// then one whose write was not stored, then one answered: the lease is
// the first take's write, still counted as what that take found.
func TestTakesAnsweredLateInARowFindTheLeaseAsItWas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 1)
	givenBack(t, kv, 0)
	scriptTakeWrites(tbl, storedUnanswered, notStored)
	tbl.AcquireNow(ctx, 0)
	require.Equal(t, 1, tbl.Unanswered(0))
	tbl.AcquireNow(ctx, 0)
	require.Equal(t, 2, tbl.Unanswered(0), "written on top of the first, which may be the one stored")
	tbl.AcquireNow(ctx, 0)
	requireHeldAs(t, tbl, 0, partition.VacancyReleased, "the first take's write found")
	require.Zero(t, tbl.Unanswered(0), "forgotten once a take is answered")
}

// TestTwoTakesStoredWithoutAnswers: two takes in a row stored without
// their answers (the second written on top of the first): the lease is
// the second's, counted as the first found it.
func TestTwoTakesStoredWithoutAnswers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 1)
	givenBack(t, kv, 0)
	loseTakeAnswers(tbl, 2)
	tbl.AcquireNow(ctx, 0)
	tbl.AcquireNow(ctx, 0)
	require.Equal(t, 2, tbl.Unanswered(0))
	tbl.AcquireNow(ctx, 0)
	requireHeldAs(t, tbl, 0, partition.VacancyReleased)
}

// TestUnansweredTakesOutliveRefusalsAndFailedReads: a write refused (as
// after a replica's stale read) and a read that failed say nothing of a
// take stored without its answer: it is still known at the next take.
func TestUnansweredTakesOutliveRefusalsAndFailedReads(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 1)
	givenBack(t, kv, 0)
	scriptTakeWrites(tbl, storedUnanswered, refused)
	tbl.AcquireNow(ctx, 0)
	tbl.AcquireNow(ctx, 0)
	require.Equal(t, 1, tbl.Unanswered(0), "kept across a refusal")
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	tbl.AcquireNow(stopped, 0) // its read fails
	require.Equal(t, 1, tbl.Unanswered(0), "kept across a failed read")
	tbl.AcquireNow(ctx, 0)
	requireHeldAs(t, tbl, 0, partition.VacancyReleased)
}

// TestAnUnansweredTakeOfAPartitionNowAnothersIsLeftAlone: the reconcile
// takes again a lease of this member's written by a take without an
// answer only while the partition is this member's to hold: once
// another member owns it, it is left to expire for that member.
func TestAnUnansweredTakeOfAPartitionNowAnothersIsLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const n = 8
	kv, tbl, _ := memberWithHooks(t, n)
	p := slices.Index(partition.Owners([]string{"a", "b"}, n), "b")
	require.GreaterOrEqual(t, p, 0, "b owns one of %d partitions beside a", n)
	givenBack(t, kv, p)
	loseTakeAnswers(tbl, 1)
	tbl.AcquireNow(ctx, p)
	require.Equal(t, 1, tbl.Unanswered(p))
	lease, err := kv.Get(ctx, partition.LeaseKey(p))
	require.NoError(t, err)
	tbl.ObserveNow(lease)
	_, err = kv.Put(ctx, partition.MemberKey("b"), []byte("b's nonce"))
	require.NoError(t, err)
	member, err := kv.Get(ctx, partition.MemberKey("b"))
	require.NoError(t, err)
	tbl.ObserveNow(member)
	tbl.ReconcileNow(ctx)
	_, held := tbl.Holds(p)
	require.False(t, held, "b owns it")
}

// TestARetakeAnsweredLateIsForgotten: a retake's write that had no
// answer is not remembered as a take's: the partition's holding lapsed
// before it, so a later take finding it counts it expired.
func TestARetakeAnsweredLateIsForgotten(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 1)
	w := watchAll(t, kv)
	tbl.AcquireNow(ctx, 0)
	for _, m := range expiryMarkers(t, w, 1) {
		tbl.ObserveNow(m)
	}
	loseTakeAnswers(tbl, 1)
	tbl.Retake(ctx, 0)
	_, err := kv.Get(ctx, partition.LeaseKey(0))
	require.NoError(t, err, "the retake's write was stored")
	require.Zero(t, tbl.Unanswered(0))
}

// TestAGiveBackAfterAnUnansweredRenewalDeletes: a stop can cut short a
// renewal that was stored all the same, so the member knows an older
// revision of its lease than the bucket holds. Its delete at that
// revision is refused; it deletes at the lease's revision, the lease
// being still its own, rather than leaving it to expire (which the next
// holder would take for a death). Another member's lease is left alone.
func TestAGiveBackAfterAnUnansweredRenewalDeletes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, kv, tbl, _ := memberOn(t, 2)
	for p := range 2 {
		tbl.AcquireNow(ctx, p)
	}
	// 0: renewed by this member, unanswered; 1: taken by another since.
	_, err := js.Publish(ctx, "$KV."+kv.Bucket()+"."+partition.LeaseKey(0), []byte("a"),
		jetstream.WithExpectLastSequencePerSubject(tbl.LeaseRevision(0)))
	require.NoError(t, err)
	_, err = js.Publish(ctx, "$KV."+kv.Bucket()+"."+partition.LeaseKey(1), []byte("b"),
		jetstream.WithExpectLastSequencePerSubject(tbl.LeaseRevision(1)))
	require.NoError(t, err)
	tbl.GiveBackNow(ctx, 0)
	tbl.GiveBackNow(ctx, 1)

	_, err = kv.Get(ctx, partition.LeaseKey(0))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "0 given back")
	e, err := kv.Get(ctx, partition.LeaseKey(1))
	require.NoError(t, err)
	require.Equal(t, "b", string(e.Value()), "1 is b's: left alone")
	other, err := partition.New(js, kv, partition.Config{Member: "c", Partitions: 2,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { return true }})
	require.NoError(t, err)
	t.Cleanup(other.WaitStarts)
	other.AcquireNow(ctx, 0)
	epoch, ok := other.Holds(0)
	require.True(t, ok)
	require.Equal(t, partition.VacancyReleased, other.Vacancy(0, epoch), "deleted, not expired")
}

// TestAGiveBackOfALeaseNoLongerHeldIsNoError: a lease that expired while
// its release waited (gone, or another member's since) is not given
// back, and no error is reported: the clean stop of a busy dispatcher
// logged "wrong last sequence" for it.
func TestAGiveBackOfALeaseNoLongerHeldIsNoError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	tbl, reports := reportingMember(t, js, kv, 3)
	for p := range 3 {
		tbl.AcquireNow(ctx, p)
	}
	// 0: gone (expired); 1: another member's since; 2: still a's.
	require.NoError(t, kv.Delete(ctx, partition.LeaseKey(0)))
	_, err = kv.Put(ctx, partition.LeaseKey(1), []byte("b"))
	require.NoError(t, err)
	for p := range 3 {
		tbl.GiveBackNow(ctx, p)
	}
	require.Empty(t, reports(), "nothing to give back is no error")
	e, err := kv.Get(ctx, partition.LeaseKey(1))
	require.NoError(t, err)
	require.Equal(t, "b", string(e.Value()), "b's lease left alone")
	_, err = kv.Get(ctx, partition.LeaseKey(2))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a's own given back")

	// A give back that fails otherwise is still reported.
	_, err = kv.Put(ctx, partition.LeaseKey(2), []byte("a"))
	require.NoError(t, err)
	tbl.AcquireNow(ctx, 2)
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	tbl.GiveBackNow(stopped, 2)
	reported := reports()
	require.Len(t, reported, 1, "%v", reported)
	require.Contains(t, reported[0], "give back partition 2")
}
