package dispatch

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"jetflow.dev/pkg/bus"
)

// Before timers kept in memory (soon.go) come due, the dispatcher reads
// one event near each one's execution's last, so that the server has the
// blocks of the events stream holding those events in memory when the
// firings are appended.
//
// Every append names the execution's last event (the expected last
// subject sequence), and nats-server checks it by loading that event: from
// its block's cache, which the file store drops 10 s after the block was
// last used, or else by reading the whole block from disk, in the
// stream's one loop that stores every append. Timers armed more than 10 s
// before they are due find those blocks cold: 10,000 due at one instant,
// armed 30 s before, made the first batches of their burst wait for
// about 40 block reads one after another (the first two batches of 512
// firings took 250-280 ms, the next ones 20-70 ms). Read warmAhead
// before, they cost nothing at the due time.
//
// One read serves every timer whose event is in the same span of
// warmSpan sequences (a block of the events stream holds thousands of
// events), and a span read is not read again for warmAgain (the server
// keeps a block's cache 10 s after its last use). A read that fails
// changes nothing: the append loads the block, as it would have.
const (
	// warmAhead: how long before timers fire their events are read.
	warmAhead = time.Second
	// warmEvery: how often the timers coming within warmAhead are looked at.
	warmEvery = 100 * time.Millisecond
	// warmSpan: one read per this many stream sequences.
	warmSpan = 1000
	// warmAgain: a span read is not read again within this.
	warmAgain = 5 * time.Second
)

// warmEntry is a kept timer's firing time and its execution's last event
// when it was armed.
type warmEntry struct {
	at  time.Time
	seq uint64
}

type warmHeap []warmEntry

func (h warmHeap) Len() int           { return len(h) }
func (h warmHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h warmHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *warmHeap) Push(x any)        { *h = append(*h, x.(warmEntry)) }
func (h *warmHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// coming removes and returns the sequences of the timers that fire by
// until (this process's clock), sorted. A timer armed again or forgotten
// since keeps its entry here: reading for it costs one read, and nothing
// fires with it.
func (s *soonTimers) coming(until time.Time) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint64
	for len(s.cold) > 0 && !s.cold[0].at.After(until) {
		out = append(out, heap.Pop(&s.cold).(warmEntry).seq)
	}
	slices.Sort(out)
	return out
}

// warmSoon reads ahead of the timers kept in memory until ctx ends or
// stop is closed.
func (d *Dispatcher) warmSoon(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTicker(warmEvery)
	defer t.Stop()
	read := map[uint64]time.Time{} // span → when it was read
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		for span, at := range read {
			if now.Sub(at) >= warmAgain {
				delete(read, span)
			}
		}
		n := 0
		for _, seq := range d.soon.coming(now.Add(warmAhead)) {
			if _, ok := read[seq/warmSpan]; ok {
				continue
			}
			read[seq/warmSpan] = now
			n++
			// The stream's leader: it checks the appends. The event itself
			// is not needed.
			if _, err := bus.LeaderGet(ctx, d.js, bus.StreamEvents, bus.MsgQuery{Seq: seq}); err != nil && ctx.Err() == nil {
				d.log.Debug().Err(err).Uint64("seq", seq).Msg("read ahead of timers due soon")
			}
		}
		if n > 0 {
			d.log.Debug().Int("reads", n).Dur("took", time.Since(now)).Msg("read ahead of timers due soon")
		}
	}
}
