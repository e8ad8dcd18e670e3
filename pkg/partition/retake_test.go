package partition_test

import (
	"context"
	"errors"
	"fmt"
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

// TestRetakeAfterAnotherMembersHoldingIsNoticed: during a's stall, b took
// a partition whose lease had expired under a and let it go; a's watch
// lags, so a takes the lease back before it sees b's writes, which are
// then older than a's own create. The retake began a new holding anyway
// (what a cached before is read again); when the watch shows b's holding,
// a is told (HeldMeanwhile), once, and keeps the partition. A lapse that
// nobody else filled tells nothing of the kind, whether a learns of it
// from the watch or from its refused renewal.
func TestRetakeAfterAnotherMembersHoldingIsNoticed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, hooks := memberWithHooks(t, 3)
	w := watchAll(t, kv)
	before := map[int]uint64{}
	for p := range 3 {
		tbl.AcquireNow(ctx, p)
		e, ok := tbl.Holds(p)
		require.True(t, ok)
		before[p] = e
	}
	next := func(what string, match func(jetstream.KeyValueEntry) bool) jetstream.KeyValueEntry {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case e := <-w.Updates():
				if e != nil && match(e) {
					return e
				}
			case <-deadline:
				t.Fatalf("the watch did not show %s within 30 s", what)
			}
		}
	}
	// The stall: every lease expires.
	markers := map[int]jetstream.KeyValueEntry{}
	for len(markers) < 3 {
		e := next("the expiry markers", func(e jetstream.KeyValueEntry) bool { return e.Operation() == jetstream.KeyValuePurge })
		for p := range 3 {
			if e.Key() == partition.LeaseKey(p) {
				markers[p] = e
			}
		}
	}
	// b takes 0 and 1 and gives them back, all within the stall.
	bPut, bDel := map[int]jetstream.KeyValueEntry{}, map[int]jetstream.KeyValueEntry{}
	for _, p := range []int{0, 1} {
		rev, err := kv.Create(ctx, partition.LeaseKey(p), []byte("b"))
		require.NoError(t, err)
		// Seen before the delete: the bucket keeps one value a key, so a
		// delete stored before the watch delivered the create removes it,
		// and the watch never shows it.
		bPut[p] = next("b's create", func(e jetstream.KeyValueEntry) bool { return e.Revision() == rev })
		require.NoError(t, kv.Delete(ctx, partition.LeaseKey(p), jetstream.LastRevision(rev)))
		bDel[p] = next("b's delete", func(e jetstream.KeyValueEntry) bool {
			return e.Key() == partition.LeaseKey(p) && e.Operation() == jetstream.KeyValueDelete
		})
	}

	// a's lagging watch shows its own markers of 0 and 2 only; a learns of
	// 1's expiry from its refused renewal. Each is taken back.
	tbl.ObserveNow(markers[0])
	tbl.ObserveNow(markers[2])
	tbl.ReconcileNow(ctx)
	tbl.RenewNow(ctx, 1)
	// (Epoch, not Holds: without the table's loop nothing renews, and a
	// loaded machine may take longer than the TTL to get here.)
	for p := range 3 {
		e, ok := tbl.Epoch(p)
		require.True(t, ok, "partition %d taken back", p)
		require.Greater(t, e, before[p], "partition %d: a new holding", p)
		require.Greater(t, tbl.LeaseRevision(p), bDel[1].Revision(), "partition %d: the retake's create comes last", p)
	}
	require.Len(t, hooks.retook(), 3)
	require.Empty(t, hooks.released())

	// Then the watch catches up: b's writes, older than a's creates.
	for _, p := range []int{0, 1} {
		tbl.ObserveNow(bPut[p])
		tbl.ObserveNow(bDel[p])
	}
	tbl.ObserveNow(markers[1]) // a's own marker, late: not another member's
	tbl.WaitStarts()
	var told []int
	for _, h := range hooks.heldMeanwhile() {
		e, _ := tbl.Epoch(h.p)
		require.Equal(t, e, h.epoch, "partition %d: told with the retake's holding", h.p)
		told = append(told, h.p)
	}
	require.Equal(t, []int{0, 1}, told, "told once each, of 0 and 1 only")
	for p := range 3 {
		_, ok := tbl.Epoch(p)
		require.True(t, ok, "partition %d: kept", p)
		requireLeaseRevision(t, kv, p, tbl.LeaseRevision(p), "renews from its own create")
	}
	require.Empty(t, hooks.released(), "nothing released")
}

// TestRetakeStoredButUnacknowledgedIsAdopted: a retake's create timed out
// and was stored all the same; the next attempt is refused (the key
// exists). The lease holds this member's name: it is adopted, renewed
// from the revision found, and the partition kept as a new holding, not
// reported lost. A lease of another member's is lost, as before.
func TestRetakeStoredButUnacknowledgedIsAdopted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, hooks := memberWithHooks(t, 2)
	w := watchAll(t, kv)
	before := map[int]uint64{}
	for p := range 2 {
		tbl.AcquireNow(ctx, p)
		before[p], _ = tbl.Holds(p)
	}
	// The stall: both leases expire, and a sees it.
	for _, m := range expiryMarkers(t, w, 2) {
		tbl.ObserveNow(m)
	}
	// A retake of 0 stored without its answer reaching a; b takes 1.
	// (A longer TTL than a's: a loaded machine may be slow to come to
	// the retake, and the point is that the lease is there.)
	stored, err := kv.Create(ctx, partition.LeaseKey(0), []byte("a"), jetstream.KeyTTL(10*time.Second))
	require.NoError(t, err)
	_, err = kv.Create(ctx, partition.LeaseKey(1), []byte("b"))
	require.NoError(t, err)
	tbl.Retake(ctx, 0)
	tbl.Retake(ctx, 1)

	e, ok := tbl.Epoch(0)
	require.True(t, ok, "0 is kept")
	require.Greater(t, e, before[0], "as a new holding")
	require.Greater(t, tbl.LeaseRevision(0), stored, "renewed from the revision found")
	requireLeaseRevision(t, kv, 0, tbl.LeaseRevision(0), "renews from the revision it adopted")
	require.EqualValues(t, 1, tbl.Adopted())
	require.Equal(t, partition.VacancyUnknown, tbl.Vacancy(0, e), "a retake is no take: the holding goes on")
	require.Equal(t, []retake{{0, before[0], e}}, hooks.retook())
	_, ok = tbl.Epoch(1)
	require.False(t, ok, "1 is b's")
	natstest.Eventually(t, 10*time.Second, func() bool { return slices.Equal(hooks.released(), []int{1}) }, "1 released, 0 not")
}

// TestAwaitIsWokenByTheRetake: a job of a holding whose lease lapsed
// waits (Await) for it; the retake, a new holding, wakes it with true:
// the jobs in hand go on in the new holding. A later acquire's holding
// does not count as the old one's.
func TestAwaitIsWokenByTheRetake(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, _ := memberWithHooks(t, 1)
	tbl.AcquireNow(ctx, 0)
	old, ok := tbl.Holds(0)
	require.True(t, ok)
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := kv.Get(ctx, partition.LeaseKey(0))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the lease expires")
	tbl.RenewNow(ctx, 0) // refused, lapsed; taken back at once, as the key is absent
	e, ok := tbl.Epoch(0)
	require.True(t, ok)
	require.Greater(t, e, old)
	now, ok := tbl.Current(0, old)
	require.True(t, ok, "the first holding's jobs go on in the retake")
	require.Equal(t, e, now)

	// Lapsed again; a waiter from the first holding is woken by the retake.
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := kv.Get(ctx, partition.LeaseKey(0))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the lease expires again")
	done := make(chan bool, 1)
	go func() { done <- tbl.Await(ctx, 0, old, time.Minute) }()
	select {
	case <-done:
		t.Fatal("Await returned while the lease had lapsed")
	case <-time.After(100 * time.Millisecond):
	}
	began := time.Now()
	tbl.RenewNow(ctx, 0)
	select {
	case got := <-done:
		require.True(t, got)
		require.Less(t, time.Since(began), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("Await was not woken by the retake")
	}
	e2, _ := tbl.Epoch(0)
	require.Greater(t, e2, e)

	// Another member's lease: lost; a later acquire is a new chain.
	_, err := kv.Put(ctx, partition.LeaseKey(0), []byte("b"))
	require.NoError(t, err)
	tbl.RenewNow(ctx, 0)
	_, ok = tbl.Epoch(0)
	require.False(t, ok)
	require.NoError(t, kv.Delete(ctx, partition.LeaseKey(0)))
	tbl.AcquireNow(ctx, 0)
	e3, ok := tbl.Epoch(0)
	require.True(t, ok)
	require.Greater(t, e3, e2)
	require.False(t, tbl.Await(ctx, 0, old, time.Minute), "the first holding's jobs are not the new acquire's")
	require.False(t, tbl.Await(ctx, 0, e2, time.Minute))
	_, ok = tbl.Current(0, e3)
	require.True(t, ok)
}

// TestRacingCreatesOnAClusterAreNoErrors: on a replicated bucket, members
// racing for leases that never existed, were deleted or expired all
// answer as refusals, never as failures: nats.go's Create returns code
// 10164 as it is (not ErrKeyExists) when another create came first on a
// key that had been deleted, and a replicated stream now and then
// refuses a create that conflicts with nothing. Exactly one member holds
// each lease (once the refused ones are tried again, as a reconcile does).
func TestRacingCreatesOnAClusterAreNoErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	ctx := t.Context()
	jss := natstest.ConnectCluster(t, natstest.RunCluster(t))
	kv0, err := jss[0].KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)

	const n, rounds = 16, 6
	var mu sync.Mutex
	var failures []string
	for round := range rounds {
		var tables []*partition.Table
		for i, js := range jss {
			kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
			require.NoError(t, err)
			name := fmt.Sprintf("m%d", i)
			tbl, err := partition.New(js, kv, partition.Config{Member: name, Partitions: n,
				Acquire: func(context.Context, int, uint64) error { return nil }, Release: func(int, uint64) bool { return true },
				OnError: func(err error, what string) {
					mu.Lock()
					defer mu.Unlock()
					failures = append(failures, fmt.Sprintf("round %d %s: %s: %v", round, name, what, err))
				}})
			require.NoError(t, err)
			tables = append(tables, tbl)
		}
		var wg sync.WaitGroup
		for _, tbl := range tables {
			wg.Go(func() {
				for p := range n {
					tbl.AcquireNow(ctx, p)
				}
			})
		}
		wg.Wait()
		holders := func(p int) int {
			n := 0
			for _, tbl := range tables {
				if _, ok := tbl.Epoch(p); ok {
					n++
				}
			}
			return n
		}
		for p := range n {
			// Every create refused (a replicated stream may refuse one that
			// conflicts with nothing, all three on a loaded machine): nobody
			// holds it, and the members' next reconciles try again, as here.
			for try := 0; try < 20 && holders(p) == 0; try++ {
				for _, tbl := range tables {
					tbl.AcquireNow(ctx, p)
				}
			}
			mu.Lock()
			require.Empty(t, failures, "round %d", round)
			mu.Unlock()
			require.Equal(t, 1, holders(p), "round %d: partition %d", round, p)
		}
		for _, tbl := range tables {
			tbl.WaitStarts()
		}
		// The next round races for deleted keys, then for expired ones.
		for p := range n {
			if round%2 == 0 {
				require.NoError(t, kv0.Delete(ctx, partition.LeaseKey(p)))
			}
		}
		if round%2 == 1 {
			natstest.Eventually(t, 30*time.Second, func() bool {
				for p := range n {
					if _, err := kv0.Get(ctx, partition.LeaseKey(p)); !errors.Is(err, jetstream.ErrKeyNotFound) {
						return false
					}
				}
				return true
			}, "round %d: the leases expire", round)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, failures)
}

// retake is a call of Retook.
type retake struct {
	p        int
	old, new uint64
}

// hooks records what a table told.
type hooks struct {
	mu    sync.Mutex
	rel   []int
	took  []retake
	meanw []retakeHolding
}

type retakeHolding struct {
	p     int
	epoch uint64
}

func (h *hooks) released() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(slices.Values(h.rel))
}

func (h *hooks) retook() []retake {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.took)
}

func (h *hooks) heldMeanwhile() []retakeHolding {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.SortedFunc(slices.Values(h.meanw), func(a, b retakeHolding) int { return a.p - b.p })
}

// memberWithHooks is member "a"'s table of n partitions, which acquires
// without doing anything, and what it told so far.
// memberWithHooks is member "a" of n partitions on a server of its own,
// driven by the test (its loop does not run), its hooks recorded; kv is
// the dispatchers' bucket.
func memberWithHooks(t *testing.T, n int) (jetstream.KeyValue, *partition.Table, *hooks) {
	t.Helper()
	_, kv, tbl, h := memberOn(t, n)
	return kv, tbl, h
}

// memberOn is memberWithHooks, with its connection's JetStream.
func memberOn(t *testing.T, n int) (jetstream.JetStream, jetstream.KeyValue, *partition.Table, *hooks) {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	h := &hooks{}
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(p int, _ uint64) bool { h.mu.Lock(); h.rel = append(h.rel, p); h.mu.Unlock(); return true },
		Retook: func(p int, old, new uint64) {
			h.mu.Lock()
			h.took = append(h.took, retake{p, old, new})
			h.mu.Unlock()
		},
		HeldMeanwhile: func(p int, epoch uint64) {
			h.mu.Lock()
			h.meanw = append(h.meanw, retakeHolding{p, epoch})
			h.mu.Unlock()
		}})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	return js, kv, tbl, h
}

// watchAll watches the changes of kv from now on, until the test ends.
func watchAll(t *testing.T, kv jetstream.KeyValue) jetstream.KeyWatcher {
	t.Helper()
	w, err := kv.WatchAll(t.Context(), jetstream.UpdatesOnly())
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

// requireLeaseRevision checks that p's lease in the bucket is at
// revision want. Nothing renews the lease in these tests (the table's
// loop does not run) and its TTL is 1 s: on a machine so loaded that the
// test took longer than that since the lease was written, the lease has
// expired, which is said and not checked.
func requireLeaseRevision(t *testing.T, kv jetstream.KeyValue, p int, want uint64, what string) {
	t.Helper()
	e, err := kv.Get(t.Context(), partition.LeaseKey(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Logf("partition %d: its lease expired before it was read (a slow machine): revision not checked", p)
		return
	}
	require.NoError(t, err)
	require.Equal(t, "a", string(e.Value()), "partition %d: this member's lease", p)
	require.Equal(t, want, e.Revision(), "partition %d %s", p, what)
}

// expiryMarkers waits for the expiry markers of partitions 0 to n-1's
// leases on w, a watch of the bucket.
func expiryMarkers(t *testing.T, w jetstream.KeyWatcher, n int) map[int]jetstream.KeyValueEntry {
	t.Helper()
	markers := map[int]jetstream.KeyValueEntry{}
	deadline := time.After(30 * time.Second)
	for len(markers) < n {
		select {
		case e := <-w.Updates():
			if e == nil || e.Operation() != jetstream.KeyValuePurge {
				continue
			}
			for p := range n {
				if e.Key() == partition.LeaseKey(p) {
					markers[p] = e
				}
			}
		case <-deadline:
			t.Fatalf("the leases did not expire within 30 s: %d markers of %d", len(markers), n)
		}
	}
	return markers
}

// TestTakesAndRetakesOfManyPartitionsGoOutTogether: a reconcile's takes
// (a member taking partitions free) and its retakes (a member taking its
// leases back after a stall, whether the watch shows their expiry or its
// renewals find it) are written together: one after the other, each
// waited two round trips (the lease's read, then its write) before the
// next, and the last partition was handled that much later. Each write
// here waits until every take of the reconcile has written.
func TestTakesAndRetakesOfManyPartitionsGoOutTogether(t *testing.T) {
	t.Parallel()
	const (
		n   = 8
		ttl = 30 * time.Second // a batch's requests have half of it
	)
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	h := &hooks{}
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n, TTL: ttl,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(p int, _ uint64) bool { h.mu.Lock(); h.rel = append(h.rel, p); h.mu.Unlock(); return true },
		Retook:  func(p int, old, new uint64) { h.mu.Lock(); h.took = append(h.took, retake{p, old, new}); h.mu.Unlock() }})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	writes := &meeting{}
	tbl.WrapTakeWrites(writes.wrap)
	w := watchAll(t, kv)

	writes.expect(n)
	tbl.ReconcileNow(ctx) // the partitions all free, all this member's
	for p := range n {
		_, ok := tbl.Epoch(p)
		require.True(t, ok, "partition %d taken", p)
	}
	require.Equal(t, n, writes.most(), "the takes' writes were all under way at once")

	// The leases gone as if expired (a purge, as the server's expiry
	// marker), the watch showing it: taken back together.
	for p := range n {
		require.NoError(t, kv.Purge(ctx, partition.LeaseKey(p)))
	}
	markers := expiryMarkers(t, w, n)
	for p := range n {
		tbl.ObserveNow(markers[p])
	}
	writes.expect(n)
	tbl.ReconcileNow(ctx)
	require.Len(t, h.retook(), n, "each partition taken back")
	require.Equal(t, n, writes.most(), "the retakes' writes were all under way at once")

	// Again, the watch not showing it yet: the tick's renewals, refused,
	// find the leases gone; taken back together.
	for p := range n {
		require.NoError(t, kv.Purge(ctx, partition.LeaseKey(p)))
	}
	writes.expect(n)
	tbl.TickNow(ctx)
	require.Len(t, h.retook(), 2*n, "each partition taken back again")
	require.Equal(t, n, writes.most(), "the retakes after refused renewals were all under way at once")
	require.Empty(t, h.released())
}

// TestASurvivorTakesTheLeasesThatExpiredTogetherTogether: a member's
// leases, renewed together, expire together when it dies, their expiries
// in one sweep of the server's (or two: the sweeps are 250 ms apart or
// more, and the client may hand a burst on in parts); the survivor takes
// those its watch has shown in one reconcile (before, it took one per
// expiry shown). Each take's write here is held 300 ms.
func TestASurvivorTakesTheLeasesThatExpiredTogetherTogether(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const n = 16
	writes := &overlap{hold: 300 * time.Millisecond}
	ttl := func(c *partition.Config) { c.TTL = 3 * time.Second }
	a := startMemberWith(t, s.ClientURL(), "a", n, memberSetup{config: ttl, table: func(tbl *partition.Table) { tbl.WrapTakeWrites(writes.wrap) }})
	coverage(t, n, 30*time.Second, a)
	b := startMemberWith(t, s.ClientURL(), "b", n, memberSetup{config: ttl})
	owners := partition.Owners([]string{"a", "b"}, n)
	natstest.Eventually(t, 30*time.Second, func() bool {
		for p, owner := range owners {
			if _, ok := map[string]*member{"a": a, "b": b}[owner].table.Holds(p); !ok {
				return false
			}
		}
		return true
	}, "the partitions shared out")
	lost := 0
	for _, owner := range owners {
		if owner == "b" {
			lost++
		}
	}
	require.GreaterOrEqual(t, lost, 6, "b holds a few partitions: %v", owners)
	writes.arm()
	b.close() // dies: its leases expire
	coverage(t, n, 30*time.Second, a)
	require.GreaterOrEqual(t, writes.most(), lost/3, "takes of the %d leases that expired together were under way at once", lost)
}

// TestATakesValidityCountsFromBeforeItsWrite: a holding taken is valid
// for the time to live from before its lease's write, not from its
// answer (the lease may expire that much earlier on the server).
func TestATakesValidityCountsFromBeforeItsWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv, tbl, slowly := memberWithClock(t, 2)
	tbl.WrapTakeWrites(slowly)
	tbl.ReconcileNow(ctx)
	for p := range 2 {
		_, taken := tbl.Epoch(p)
		require.True(t, taken, "partition %d taken", p)
		_, ok := tbl.Holds(p)
		require.False(t, ok, "partition %d: valid for the TTL from before the write, not from its answer", p)
	}
	// A retake's too: its renewal refused, the lease found gone.
	before, _ := tbl.Epoch(0)
	require.NoError(t, kv.Purge(ctx, partition.LeaseKey(0)))
	tbl.TickNow(ctx)
	after, held := tbl.Epoch(0)
	require.True(t, held && after != before, "partition 0 taken back")
	_, ok := tbl.Holds(0)
	require.False(t, ok, "a retake: valid for the TTL from before the write, not from its answer")
}

// meeting holds each lease write back until the n expected have come
// (or 5 s, or the write's time runs out), and counts the most under way
// at once.
type meeting struct {
	mu                 sync.Mutex
	n, came, now, peak int
	all                chan struct{}
}

// expect starts a new count, of n writes.
func (m *meeting) expect(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n, m.came, m.now, m.peak, m.all = n, 0, 0, 0, make(chan struct{})
}

// most is the most writes under way at once since expect.
func (m *meeting) most() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

func (m *meeting) wrap(write partition.LeaseWrite) partition.LeaseWrite {
	return func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
		m.mu.Lock()
		m.came++
		m.now++
		m.peak = max(m.peak, m.now)
		all := m.all
		if m.came == m.n {
			close(all)
		}
		m.mu.Unlock()
		select {
		case <-all:
		case <-time.After(5 * time.Second): // one after the other: fail in seconds, not in the batch's 15 s each
		case <-ctx.Done():
		}
		m.mu.Lock()
		m.now--
		m.mu.Unlock()
		return write(ctx, msg, opts...)
	}
}

// overlap holds each lease write, once armed, for hold, and counts the
// most under way at once.
type overlap struct {
	hold      time.Duration
	armed     atomic.Bool
	mu        sync.Mutex
	now, peak int
}

func (o *overlap) arm() { o.armed.Store(true) }

// most is the most writes under way at once since armed.
func (o *overlap) most() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.peak
}

func (o *overlap) wrap(write partition.LeaseWrite) partition.LeaseWrite {
	return func(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
		if !o.armed.Load() {
			return write(ctx, m, opts...)
		}
		o.mu.Lock()
		o.now++
		o.peak = max(o.peak, o.now)
		o.mu.Unlock()
		select {
		case <-time.After(o.hold):
		case <-ctx.Done():
		}
		o.mu.Lock()
		o.now--
		o.mu.Unlock()
		return write(ctx, m, opts...)
	}
}
