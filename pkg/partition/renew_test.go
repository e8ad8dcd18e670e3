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
	var mu sync.Mutex
	var reported []string
	tbl, err := partition.New(js, kv, partition.Config{Member: "a", Partitions: n,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { return true },
		OnError: func(err error, what string) {
			mu.Lock()
			reported = append(reported, what+": "+err.Error())
			mu.Unlock()
		}})
	require.NoError(t, err)
	t.Cleanup(tbl.WaitStarts)
	return tbl, func() []string {
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
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const (
		n   = 8
		ttl = 2 * time.Second
		// A renewal's round trip: one after the other, a tick's eight
		// take 3.2 s, past the time to live; together, 0.4 s.
		slow = 400 * time.Millisecond
	)
	var renewals atomic.Int64
	a := startMemberWith(t, s.ClientURL(), "a", n, memberSetup{
		config: func(c *partition.Config) { c.TTL = ttl },
		table: func(tbl *partition.Table) {
			tbl.WrapRenewalWrites(func(write partition.TakeWrite) partition.TakeWrite {
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
	// Four times the time to live, and at least a few renewals of each.
	for start := time.Now(); time.Since(start) < 4*ttl || renewals.Load() < 4*n; {
		require.Zero(t, a.table.Retaken(), "a lease expired under its holder")
		time.Sleep(50 * time.Millisecond)
	}
	require.Zero(t, a.table.Retaken(), "a lease expired under its holder")
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Len(t, a.events, n, "each partition taken once, none lost: %v", a.events)
}
