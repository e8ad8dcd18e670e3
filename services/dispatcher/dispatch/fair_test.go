package dispatch

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTurnsServeExecutionsInTurns: a huge execution's backlog does not
// make another wait; each execution's jobs come in the order they came.
func TestTurnsServeExecutionsInTurns(t *testing.T) {
	w := newTurns()
	for i := range 100 {
		require.True(t, w.add(job{key: "big", intake: i == 0}))
	}
	require.True(t, w.add(job{key: "small"}))
	require.True(t, w.add(job{key: "small"}))

	var order []string
	for range 6 {
		j, ok := w.next()
		require.True(t, ok)
		order = append(order, j.key)
		w.done(j)
	}
	// big, then small (which came after big's 100 jobs), big, small, then
	// only big is left.
	require.Equal(t, []string{"big", "small", "big", "small", "big", "big"}, order)

	// While a job of an execution is handled, its next is not handed out.
	j, ok := w.next()
	require.True(t, ok)
	require.Equal(t, "big", j.key)
	require.True(t, w.add(job{key: "other"}))
	k, ok := w.next()
	require.True(t, ok)
	require.Equal(t, "other", k.key, "big is busy: the next job is another execution's")
	w.done(k)
	w.done(j)
}

// TestTurnsKeepEachExecutionsOrderAcrossWorkers: many workers, many
// executions: each execution's jobs are handled one at a time, in order.
func TestTurnsKeepEachExecutionsOrderAcrossWorkers(t *testing.T) {
	w := newTurns()
	const executions, each = 20, 200
	var mu sync.Mutex
	seen := map[string][]int{}
	busy := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j, ok := w.next()
				if !ok {
					return
				}
				mu.Lock()
				if busy[j.key] {
					select {
					case errs <- fmt.Errorf("two workers on %s at once", j.key):
					default:
					}
				}
				busy[j.key] = true
				seen[j.key] = append(seen[j.key], j.from.part)
				mu.Unlock()
				mu.Lock()
				busy[j.key] = false
				mu.Unlock()
				w.done(j)
			}
		}()
	}
	for i := range each {
		for e := range executions {
			require.True(t, w.add(job{key: fmt.Sprint("x", e), from: &consuming{part: i}}))
		}
	}
	w.close()
	wg.Wait()
	require.False(t, w.add(job{key: "late"}), "closed: a job is refused, for the caller to hand back")
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, seen, executions)
	for key, got := range seen {
		require.Len(t, got, each, key)
		for i, p := range got {
			require.Equal(t, i, p, "%s: job %d out of order", key, i)
		}
	}
	require.Empty(t, w.queues, "every execution's queue is forgotten once empty")
}
