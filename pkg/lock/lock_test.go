package lock_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/natstest"
)

func open(t *testing.T) *lock.Table {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	tb, err := lock.Open(t.Context(), js, nil)
	require.NoError(t, err)
	return tb
}

func entry(id string) lock.Entry { return lock.Entry{ExecutionID: id, Workflow: "wf", Request: 1} }

func TestFIFOMutex(t *testing.T) {
	t.Parallel()
	tb := open(t)
	ctx := t.Context()
	held, err := tb.Enqueue(ctx, "db", 1, entry("a"))
	require.NoError(t, err)
	require.True(t, held)
	for _, id := range []string{"b", "c"} {
		held, err := tb.Enqueue(ctx, "db", 1, entry(id))
		require.NoError(t, err)
		require.False(t, held, id)
	}
	held, err = tb.Enqueue(ctx, "db", 1, entry("b")) // asking again changes nothing
	require.NoError(t, err)
	require.False(t, held)
	r, _, found, err := tb.Get(ctx, "db")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, []string{"a"}, ids(r.Holders))
	require.Equal(t, []string{"b", "c"}, ids(r.Waiters))

	removed, promoted, err := tb.Remove(ctx, "db", entry("a"))
	require.NoError(t, err)
	require.True(t, removed)
	require.Equal(t, []string{"b"}, ids(promoted), "the first waiter is promoted")
	removed, promoted, err = tb.Remove(ctx, "db", entry("c")) // a waiter gives up
	require.NoError(t, err)
	require.True(t, removed)
	require.Empty(t, promoted)
	removed, _, err = tb.Remove(ctx, "db", entry("c"))
	require.NoError(t, err)
	require.False(t, removed, "removing twice is a no-op")
	_, _, err = tb.Remove(ctx, "db", entry("b"))
	require.NoError(t, err)
	_, _, found, err = tb.Get(ctx, "db")
	require.NoError(t, err)
	require.False(t, found, "a free lock's key is deleted")
	held, err = tb.Enqueue(ctx, "db", 1, entry("d"))
	require.NoError(t, err)
	require.True(t, held, "the key can be created again after its delete")
}

func TestSemaphoreKeepsOrder(t *testing.T) {
	t.Parallel()
	tb := open(t)
	ctx := t.Context()
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		held, err := tb.Enqueue(ctx, "pool", 2, entry(id))
		require.NoError(t, err)
		require.Equal(t, i < 2, held, id)
	}
	_, promoted, err := tb.Remove(ctx, "pool", entry("b"))
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, ids(promoted))
	held, err := tb.Enqueue(ctx, "pool", 2, entry("f"))
	require.NoError(t, err)
	require.False(t, held, "a newcomer never overtakes waiters")
	r, _, _, err := tb.Get(ctx, "pool")
	require.NoError(t, err)
	require.Equal(t, 2, r.Limit)
	require.Equal(t, []string{"a", "c"}, ids(r.Holders))
	require.Equal(t, []string{"d", "e", "f"}, ids(r.Waiters))
}

func TestInvalidName(t *testing.T) {
	t.Parallel()
	tb := open(t)
	for _, name := range []string{"", ".x", "x.", "a..b", "a b", "a/b", "a*"} {
		_, err := tb.Enqueue(t.Context(), name, 1, entry("a"))
		require.ErrorIs(t, err, lock.ErrInvalidName, name)
	}
}

// TestContention has many writers on separate connections take the same
// lock (a mutex, then a semaphore of 3) through compare-and-set only, and
// checks that the holders inside never exceed the limit, and that the
// semaphore does let more than one in at once (a holder stays inside
// until a second one came, for at most 10 s: a semaphore that admits one
// holder at a time makes it wait that long and fail).
func TestContention(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	for _, limit := range []int{1, 3} {
		name := fmt.Sprintf("hot-%d", limit)
		var inside, most, entered atomic.Int64
		overlapBy := time.Now().Add(10 * time.Second)
		var wg sync.WaitGroup
		for w := range 4 {
			_, js := natstest.Connect(t, srv)
			tb, err := lock.Open(t.Context(), js, nil)
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 8 {
					e := entry(fmt.Sprintf("w%d-%d", w, i))
					held, err := tb.Enqueue(t.Context(), name, limit, e)
					if err != nil {
						t.Error(err)
						return
					}
					for !held {
						time.Sleep(time.Millisecond)
						r, _, _, err := tb.Get(t.Context(), name)
						if err != nil {
							t.Error(err)
							return
						}
						held = r.Holds(e)
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					entered.Add(1)
					for limit > 1 && most.Load() < 2 && time.Now().Before(overlapBy) {
						time.Sleep(time.Millisecond)
					}
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					if _, _, err := tb.Remove(t.Context(), name, e); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		require.EqualValues(t, 32, entered.Load())
		require.LessOrEqual(t, most.Load(), int64(limit), "more holders than the limit at once")
		if limit > 1 {
			require.GreaterOrEqual(t, most.Load(), int64(2), "never two holders inside a semaphore of %d at once", limit)
		}
	}
}

func ids(es []lock.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ExecutionID
	}
	return out
}
