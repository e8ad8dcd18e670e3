package dispatch

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
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
				runtime.Gosched() // handling: another worker would overlap here
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

// delivered is a message as a consumer delivers it: only its metadata is
// read by turns.
type delivered struct {
	jetstream.Msg
	consumer string
	seq      uint64
	n        uint64 // the delivery
}

func (d delivered) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Consumer: d.consumer, Sequence: jetstream.SequencePair{Stream: d.seq}, NumDelivered: d.n}, nil
}

// TestRedeliveryReplacesTheWaitingCopy: a message delivered again while
// its first delivery still waits in a backlog takes that one's place (the
// newest delivery is the one acknowledged) instead of adding a copy; the
// replaced job's holding is told it is done with it.
func TestRedeliveryReplacesTheWaitingCopy(t *testing.T) {
	w := newTurns()
	part := &consuming{part: 3}
	part.inFlight.Add(4) // as the consumer's callback counts each delivery
	require.True(t, w.add(job{key: "big", from: part, msg: delivered{consumer: "c", seq: 1, n: 1}}))
	require.True(t, w.add(job{key: "big", from: part, msg: delivered{consumer: "c", seq: 2, n: 1}}))
	require.True(t, w.add(job{key: "big", from: part, msg: delivered{consumer: "c", seq: 2, n: 2}}))
	require.True(t, w.add(job{key: "big", from: part, msg: delivered{consumer: "other", seq: 2, n: 1}}), "another consumer's is another message")
	require.EqualValues(t, 3, part.inFlight.Load(), "the replaced delivery is done")

	var got []string
	for range 3 {
		j, ok := w.next()
		require.True(t, ok)
		md, err := j.msg.Metadata()
		require.NoError(t, err)
		got = append(got, fmt.Sprintf("%s/%d#%d", md.Consumer, md.Sequence.Stream, md.NumDelivered))
		w.done(j)
	}
	require.Equal(t, []string{"c/1#1", "c/2#2", "other/2#1"}, got, "in order, the second in its first place, as delivered again")
	require.Empty(t, w.queues)

	// Once handed to a worker, a message delivered again is queued anew:
	// the worker may fail it, and the new delivery is what retries.
	require.True(t, w.add(job{key: "x", from: part, msg: delivered{consumer: "c", seq: 9, n: 1}}))
	j, ok := w.next()
	require.True(t, ok)
	require.True(t, w.add(job{key: "x", from: part, msg: delivered{consumer: "c", seq: 9, n: 2}}))
	w.done(j)
	k, ok := w.next()
	require.True(t, ok)
	md, _ := k.msg.Metadata()
	require.EqualValues(t, 2, md.NumDelivered)
	w.done(k)
}

// TestWithdrawTakesOutAHoldingsWaitingJobs: withdraw takes out the jobs
// that wait and are chosen, in each execution's order, never one being
// handled; what is left is handed out as before, and a delivery of a
// withdrawn message is queued anew.
func TestWithdrawTakesOutAHoldingsWaitingJobs(t *testing.T) {
	w := newTurns()
	gone, kept := &consuming{part: 1}, &consuming{part: 2}
	add := func(key string, from *consuming, seq uint64) {
		require.True(t, w.add(job{key: key, from: from, msg: delivered{consumer: "c", seq: seq, n: 1}}))
	}
	add("a", gone, 1) // handed to a worker below
	add("a", gone, 2)
	add("a", gone, 3)
	add("b", kept, 4)
	add("c", gone, 5)
	add("b", kept, 6)
	add("d", kept, 7)
	add("d", gone, 8) // one execution's jobs from two holdings: only one is taken
	busy, ok := w.next()
	require.True(t, ok)
	require.Equal(t, "a", busy.key)

	out := w.withdraw(func(j job) bool { return j.from == gone })
	bySeq := map[string][]uint64{}
	for _, j := range out {
		require.Same(t, gone, j.from)
		md, err := j.msg.Metadata()
		require.NoError(t, err)
		bySeq[j.key] = append(bySeq[j.key], md.Sequence.Stream)
	}
	require.Equal(t, map[string][]uint64{"a": {2, 3}, "c": {5}, "d": {8}}, bySeq, "the waiting ones, in order; not the one handled")
	require.Empty(t, w.withdraw(func(j job) bool { return j.from == gone }), "nothing twice")

	// a is still being handled, with nothing left behind it; b and d go
	// on in their order.
	var order []uint64
	for range 3 {
		j, ok := w.next()
		require.True(t, ok)
		md, _ := j.msg.Metadata()
		order = append(order, md.Sequence.Stream)
		w.done(j)
	}
	require.Equal(t, []uint64{4, 7, 6}, order)
	w.done(busy)
	require.Empty(t, w.queues)
	require.Equal(t, w.head, len(w.line), "the line is empty")

	// Delivered again (to the next holder, here this one), it is queued.
	add("a", kept, 2)
	j, ok := w.next()
	require.True(t, ok)
	require.Equal(t, "a", j.key)
	w.done(j)
}

// TestWithdrawForgetsTheWithdrawnDeliveries: a withdrawn message
// delivered again is queued as a new job, not folded into the withdrawn
// one (which would lose it, and count its holding done with it twice).
func TestWithdrawForgetsTheWithdrawnDeliveries(t *testing.T) {
	w := newTurns()
	gone, kept := &consuming{part: 1}, &consuming{part: 2}
	gone.inFlight.Store(1)
	kept.inFlight.Store(2)
	require.True(t, w.add(job{key: "a", from: kept, msg: delivered{consumer: "c", seq: 1, n: 1}}))
	require.True(t, w.add(job{key: "a", from: gone, msg: delivered{consumer: "c", seq: 2, n: 1}}))
	require.Len(t, w.withdraw(func(j job) bool { return j.from == gone }), 1)
	gone.inFlight.Add(-1) // as consuming.withdraw does
	require.True(t, w.add(job{key: "a", from: kept, msg: delivered{consumer: "c", seq: 2, n: 2}}))
	require.Equal(t, 2, w.backlog("a"))
	require.Zero(t, gone.inFlight.Load(), "the withdrawn job is not counted done twice")
	for _, want := range []uint64{1, 2} {
		j, ok := w.next()
		require.True(t, ok)
		md, _ := j.msg.Metadata()
		require.Equal(t, want, md.Sequence.Stream)
		w.done(j)
	}
	require.Empty(t, w.queues)
}
