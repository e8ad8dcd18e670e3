package dispatch

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"jetflow.dev/pkg/bus"
)

// Before timers kept in memory (soon.go) come due, the dispatcher reads
// their executions' last events (or events near them), so that the
// server has the blocks of the events stream holding those events in
// memory when the firings are appended.
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
// The event read for a timer is its execution's last now if its state is
// cached and free, else the last when the timer was armed. Of the timers
// whose events are in one span of warmSpan sequences, two reads serve all
// (a block of the events stream holds thousands of events, and may end
// within a span): the first and the last. A span read is not read again
// for warmAgain (the server keeps a block's cache 10 s after its last
// use); a look reads at most warmMaxReads, and none for timers already
// due. A read that fails changes nothing: the append loads the block, as
// it would have. Stopping ends a read under way.
const (
	// warmAhead: how long before timers fire their events are read.
	warmAhead = time.Second
	// warmEvery: how often the timers coming within warmAhead are looked at.
	warmEvery = 100 * time.Millisecond
	// warmSpan: at most two reads per this many stream sequences.
	warmSpan = 1000
	// warmAgain: a span read is not read again within this.
	warmAgain = 5 * time.Second
)

// warmEntry is a kept timer's firing time, its execution, and its
// execution's last event when it was armed (the event before its
// TimerArmed: the arming is carried out before it is recorded).
type warmEntry struct {
	at       time.Time
	seq      uint64
	workflow string
	exec     string
}

func (e warmEntry) when() time.Time { return e.at }

// coming removes and returns the entries of the timers that fire after
// now and by until (this process's clock); those due by now are dropped
// (too late to read ahead). A timer armed again or forgotten since keeps
// its entry here: reading for it costs one read, and nothing fires with
// it.
func (s *soonTimers) coming(now, until time.Time) []warmEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []warmEntry
	for len(s.cold) > 0 && !s.cold[0].at.After(until) {
		if e := heap.Pop(&s.cold).(warmEntry); e.at.After(now) {
			out = append(out, e)
		}
	}
	return out
}

// warmMaxReads bounds the reads of one look: past it, the blocks of the
// timers left are read by their firings' appends, as without reading
// ahead.
const warmMaxReads = 128

// warmSoon reads ahead of the timers kept in memory until ctx ends or
// stop is closed (which also ends a read under way).
func (d *Dispatcher) warmSoon(ctx context.Context, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(warmEvery)
	defer t.Stop()
	read := map[uint64]time.Time{} // span → when it was read
	for {
		select {
		case <-ctx.Done():
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
		var spans []uint64 // read in this look: both ends of a span may be
		for _, seq := range d.warmSeqs(d.soon.coming(now, now.Add(warmAhead))) {
			if _, ok := read[seq/warmSpan]; ok || n >= warmMaxReads || ctx.Err() != nil {
				continue
			}
			spans = append(spans, seq/warmSpan)
			n++
			// The stream's leader: it checks the appends. The event itself
			// is not needed.
			if _, err := bus.LeaderGet(ctx, d.js, bus.StreamEvents, bus.MsgQuery{Seq: seq}); err != nil && ctx.Err() == nil {
				d.log.Debug().Err(err).Uint64("seq", seq).Msg("read ahead of timers due soon")
			}
		}
		for _, span := range spans {
			read[span] = now
		}
		if n > 0 {
			d.log.Debug().Int("reads", n).Dur("took", time.Since(now)).Msg("read ahead of timers due soon")
		}
	}
}

// warmSeqs returns the sequences to read for entries (spanEnds): each
// execution's last event now, when its state is cached and no worker has
// it in hand, else the one it was armed at.
func (d *Dispatcher) warmSeqs(entries []warmEntry) []uint64 {
	seqs := make([]uint64, 0, len(entries))
	for _, e := range entries {
		seq := e.seq
		if unlock, ok := d.handling.tryLock(e.exec); ok {
			if x, _, ok, _ := d.cached(e.workflow, e.exec); ok {
				seq = max(seq, x.state.LastSeq)
			}
			unlock()
		}
		seqs = append(seqs, seq)
	}
	return spanEnds(seqs)
}

// spanEnds sorts seqs and keeps, of those in one span of warmSpan, the
// first and the last (a block may end within a span).
func spanEnds(seqs []uint64) []uint64 {
	slices.Sort(seqs)
	var out []uint64
	for i, seq := range seqs {
		switch {
		case i == 0 || seqs[i-1]/warmSpan != seq/warmSpan: // the first of its span
			out = append(out, seq)
		case i == len(seqs)-1 || seqs[i+1]/warmSpan != seq/warmSpan: // the last
			if out[len(out)-1] != seq {
				out = append(out, seq)
			}
		}
	}
	return out
}
