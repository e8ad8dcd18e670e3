package partition_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// TestGhostMemberAndLeaseAreDropped: the member key and a lease of a
// dispatcher long dead that the server kept past their TTL (nats-server
// 2.15 brings expired keys back after an unclean stop, for good:
// nats-io/nats-server#8505; here they are stored without a TTL, which
// looks the same) hold the ghost's share of the partitions unheld only
// until they are older than the TTL and its slack: then the live member
// forgets the ghost, deletes its keys and takes every partition. (Not
// parallel: it sets the slack every table in the package uses.)
func TestGhostMemberAndLeaseAreDropped(t *testing.T) {
	defer partition.SetStaleSlack(time.Hour)()
	s := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, s)
	kv := mustKV(t, js)
	const n = 8
	owners := partition.Owners([]string{"ghost", "live"}, n)
	ghostP := slices.Index(owners, "ghost")
	require.GreaterOrEqual(t, ghostP, 0, "the ghost owns a partition")
	_, err := kv.Put(t.Context(), partition.MemberKey("ghost"), []byte("long gone"))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), partition.LeaseKey(ghostP), []byte("ghost"))
	require.NoError(t, err)

	var mu sync.Mutex
	held := map[int]bool{}
	table, err := partition.New(js, kv, partition.Config{
		Member: "live", Partitions: n,
		Acquire: func(_ context.Context, p int, _ uint64) error {
			mu.Lock()
			defer mu.Unlock()
			held[p] = true
			return nil
		},
		Release: func(p int, _ uint64) bool {
			mu.Lock()
			defer mu.Unlock()
			delete(held, p)
			return true
		},
		OnError: func(err error, what string) { t.Logf("%s: %v", what, err) },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = table.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	mine := func() bool {
		for p, o := range owners {
			if _, ok := table.Holds(p); ok != (o == "live") {
				return false
			}
		}
		return true
	}
	natstest.Eventually(t, 10*time.Second, mine, "while the ghost looks alive, the live member holds its own share only")

	partition.SetStaleSlack(0) // the ghost's keys, older than the TTL, are now stale
	natstest.Eventually(t, 10*time.Second, func() bool {
		for p := range n {
			if _, ok := table.Holds(p); !ok {
				return false
			}
		}
		return true
	}, "the live member holds every partition")
	epoch, _ := table.Holds(ghostP)
	require.Equal(t, partition.VacancyExpired, table.Vacancy(ghostP, epoch), "the ghost's lease was purged, not given back: its holder died")
	for _, key := range []string{partition.MemberKey("ghost"), partition.LeaseKey(ghostP)} {
		e, err := kv.Get(t.Context(), key)
		if err == nil {
			require.Equal(t, "live", string(e.Value()), "%s: the ghost's key is gone", key)
			continue
		}
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound, key)
	}
}

// TestAStaleKeyChangedSinceIsLeftUnreported: deleting a stale key is a
// compare-and-set on the revision it was seen at; a key changed since
// (renewed, or taken by another) is no longer stale: it is kept, and
// nothing is reported (a newcomer read the refusal as an error).
func TestAStaleKeyChangedSinceIsLeftUnreported(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv := mustKV(t, js)
	var mu sync.Mutex
	var reported []string
	table, err := partition.New(js, kv, partition.Config{
		Member: "live", Partitions: 4,
		Acquire: func(context.Context, int, uint64) error { return nil },
		Release: func(int, uint64) bool { return true },
		OnError: func(err error, what string) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, what+": "+err.Error())
		},
	})
	require.NoError(t, err)
	key := partition.LeaseKey(3)
	seen, err := kv.Put(t.Context(), key, []byte("ghost"))
	require.NoError(t, err)
	now, err := kv.Put(t.Context(), key, []byte("taken since"))
	require.NoError(t, err)

	table.DeleteIfUnchanged(t.Context(), key, seen)
	e, err := kv.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, "taken since", string(e.Value()), "a key changed since is kept")
	table.DeleteIfUnchanged(t.Context(), key, now)
	_, err = kv.Get(t.Context(), key)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a key unchanged is deleted")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, reported)
}
