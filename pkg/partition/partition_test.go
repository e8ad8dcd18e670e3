package partition_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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

// The results stream partitions reports with nats-server's partition()
// transform; the dispatcher computes partitions with Of. They must agree,
// or a partition's reports would reach another partition's holder.
func TestOfIsTheServersPartitionTransform(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, s)
	n, err := partition.Count(t.Context(), mustKV(t, js))
	require.NoError(t, err)
	require.Equal(t, partition.DefaultCount, n)
	stream, err := js.Stream(t.Context(), bus.StreamResults)
	require.NoError(t, err)
	seen := map[int]bool{}
	for i := range 200 {
		id := fmt.Sprintf("x-%d-%d", i, i*7919)
		ack, err := js.Publish(t.Context(), bus.ResultSubject("default", id), []byte("{}"))
		require.NoError(t, err)
		m, err := stream.GetMsg(t.Context(), ack.Sequence)
		require.NoError(t, err)
		p := partition.Of(id, n)
		require.Equal(t, bus.StoredResultSubject("default", p, id), m.Subject)
		seen[p] = true
	}
	require.Len(t, seen, n, "200 ids reach every partition")
}

func mustKV(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	return kv
}

func TestOwners(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"", ""}, partition.Owners(nil, 2))
	three := []string{"a", "b", "c"}
	owners := partition.Owners(three, 64)
	count := map[string]int{}
	for _, o := range owners {
		count[o]++
	}
	for _, m := range three {
		require.Greater(t, count[m], 10, "%s owns %d of 64: %v", m, count[m], count)
	}
	// A member that joins takes partitions only from the others; the
	// others keep the rest. One that leaves gives only its own away.
	four := partition.Owners(append(three, "d"), 64)
	for p := range 64 {
		if four[p] != "d" {
			require.Equal(t, owners[p], four[p], "partition %d moved between members that stayed", p)
		}
	}
	two := partition.Owners([]string{"a", "c"}, 64)
	for p := range 64 {
		if owners[p] != "b" {
			require.Equal(t, owners[p], two[p], "partition %d of a member that stayed moved", p)
		}
	}
	// Every member computes the same from the same list, in any order.
	require.Equal(t, owners, partition.Owners([]string{"c", "a", "b"}, 64))
}

func TestCount(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, s)
	kv := mustKV(t, js)
	require.NoError(t, partition.SetCount(t.Context(), kv, partition.DefaultCount), "the same count again")
	err := partition.SetCount(t.Context(), kv, 4)
	require.ErrorContains(t, err, "has 8 partitions; it cannot be changed to 4")
	require.ErrorContains(t, partition.SetCount(t.Context(), kv, 0), "use 1 to 256")
	_, err = kv.Put(t.Context(), partition.CountKey, []byte("many"))
	require.NoError(t, err)
	_, err = partition.Count(t.Context(), kv)
	require.ErrorContains(t, err, `"many"`)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := partition.Config{Member: "m", Partitions: 4, Acquire: func(context.Context, int, uint64) error { return nil }, Release: func(int, uint64) bool { return true }}
	require.NoError(t, ok.Validate())
	for name, c := range map[string]func(*partition.Config){
		"member":     func(c *partition.Config) { c.Member = "a.b" },
		"partitions": func(c *partition.Config) { c.Partitions = 0 },
		"ttl":        func(c *partition.Config) { c.TTL = 1500 * time.Millisecond },
		"callbacks":  func(c *partition.Config) { c.Release = nil },
	} {
		mod := ok
		c(&mod)
		require.Error(t, mod.Validate(), name)
	}
}

// member is one Table on its own connection, recording what it handles.
type member struct {
	name   string
	table  *partition.Table
	cancel context.CancelFunc
	done   chan struct{}
	close  func() // closes its connection: it can renew nothing (a crash)

	mu       sync.Mutex
	handling map[int]bool
	events   []string
	leaves   bool // its releases say they left something for the next holder
}

func startMember(t *testing.T, url, name string, n int) *member {
	t.Helper()
	return startMemberWith(t, url, name, n, memberSetup{})
}

// memberSetup changes what startMemberWith starts: its table's
// configuration, and the table before it runs (each if not nil).
type memberSetup struct {
	config func(*partition.Config)
	table  func(*partition.Table)
}

// startMemberWith is startMember, set up as setup says.
func startMemberWith(t *testing.T, url, name string, n int, setup memberSetup) *member {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	m := &member{name: name, handling: map[int]bool{}, done: make(chan struct{}), close: nc.Close}
	cfg := partition.Config{
		Member: name, Partitions: n,
		Acquire: func(_ context.Context, p int, _ uint64) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.handling[p] = true
			m.events = append(m.events, "+"+strconv.Itoa(p))
			return nil
		},
		Release: func(p int, _ uint64) bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			delete(m.handling, p)
			m.events = append(m.events, "-"+strconv.Itoa(p))
			return !m.leaves
		},
	}
	if setup.config != nil {
		setup.config(&cfg)
	}
	table, err := partition.New(js, mustKV(t, js), cfg)
	require.NoError(t, err)
	m.table = table
	if setup.table != nil {
		setup.table(table)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() { defer close(m.done); _ = table.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-m.done })
	return m
}

// held lists the partitions the member holds now.
func (m *member) held(n int) []int {
	var out []int
	for p := range n {
		if _, ok := m.table.Holds(p); ok {
			out = append(out, p)
		}
	}
	return out
}

// coverage waits until every partition is held by exactly one of ms,
// checking all along that none is ever held by two at once.
func coverage(t *testing.T, n int, timeout time.Duration, ms ...*member) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		owner := map[int]string{}
		for _, m := range ms {
			for _, p := range m.held(n) {
				require.Empty(t, owner[p], "partition %d held by %s and %s at once", p, owner[p], m.name)
				owner[p] = m.name
			}
		}
		if len(owner) == n {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("after %s only %d of %d partitions are held: %v", timeout, len(owner), n, owner)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTableSharesAndFailsOver(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const n = 16
	a := startMember(t, s.ClientURL(), "a", n)
	coverage(t, n, 10*time.Second, a)

	// A second and third member join: partitions move to them, and no
	// partition is ever held twice meanwhile.
	b := startMember(t, s.ClientURL(), "b", n)
	c := startMember(t, s.ClientURL(), "c", n)
	natstest.Eventually(t, 10*time.Second, func() bool {
		return len(b.held(n)) > 0 && len(c.held(n)) > 0 && len(a.held(n)) < n
	}, "b and c take partitions from a")
	coverage(t, n, 10*time.Second, a, b, c)
	want := partition.Owners([]string{"a", "b", "c"}, n)
	natstest.Eventually(t, 10*time.Second, func() bool {
		for p, o := range want {
			m := map[string]*member{"a": a, "b": b, "c": c}[o]
			if _, ok := m.table.Holds(p); !ok {
				return false
			}
		}
		return true
	}, "the partitions settle where rendezvous hashing puts them")

	// b crashes: its connection is gone, so its member key and leases
	// expire, and a and c take its partitions within a few TTLs (a busy
	// machine may delay a renewal or a watch; the failover benchmark
	// reports the figure).
	lost := b.held(n)
	require.NotEmpty(t, lost)
	b.close()
	took := coverage(t, n, 10*time.Second, a, c)
	t.Logf("b's %d partitions were taken over in %s", len(lost), took)
	require.Empty(t, b.held(n), "a member that cannot renew stops handling its partitions")

	// c stops cleanly: it gives its partitions back at once.
	c.cancel()
	<-c.done
	c.mu.Lock()
	require.Empty(t, c.handling, "every partition released: %v", c.events)
	c.mu.Unlock()
	took = coverage(t, n, 10*time.Second, a)
	t.Logf("c's partitions were handed over in %s", took)
}

// TestDuplicateMemberIsAnError: two processes given one member name would
// renew each other's key and hand partitions back and forth; the table
// notices the other's renewals and Run returns ErrDuplicateMember, so
// the dispatcher stops, saying why.
func TestDuplicateMemberIsAnError(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s)
	errs := make(chan error, 2)
	for range 2 {
		nc, err := nats.Connect(s.ClientURL())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		table, err := partition.New(js, mustKV(t, js), partition.Config{Member: "twin", Partitions: 4,
			Acquire: func(context.Context, int, uint64) error { return nil }, Release: func(int, uint64) bool { return true }})
		require.NoError(t, err)
		go func() { errs <- table.Run(t.Context()) }()
	}
	select {
	case err := <-errs:
		require.ErrorIs(t, err, partition.ErrDuplicateMember)
		require.ErrorContains(t, err, `member "twin"`)
	case <-time.After(30 * time.Second):
		t.Fatal("two processes share a member name and neither noticed")
	}
}

func TestValidMember(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"d0", "disp-b", "host_1-4242-ab12cd34", strings.Repeat("a", 128)} {
		require.True(t, partition.ValidMember(ok), ok)
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>b", "disp:x", "ä-ü", strings.Repeat("a", 129)} {
		require.False(t, partition.ValidMember(bad), bad)
	}
}
