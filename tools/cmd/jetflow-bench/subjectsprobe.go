package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultSubjectsProbeCold is how long the subjects probe waits, by
// default, before its last measure: longer than nats-server keeps what
// it read or wrote of a message block (its cache, 10 s, and its index of
// the block's subjects, 2 min, after the block's last use), so that what
// stays is what the server keeps for every subject for as long as it
// holds a message.
const DefaultSubjectsProbeCold = 2*time.Minute + 15*time.Second

// minSubjectsProbe is the fewest keys the subjects probe puts: below it
// the server's fixed cost (about 2 MiB) outweighs what the keys cost.
const minSubjectsProbe = 10000

// runSubjectsProbe measures what an embedded nats-server keeps in memory
// for each subject that holds a message, whatever the message's size: it
// puts n keys, each of its own subject as an execution id's claim is
// (KV_JF_EXECUTION_IDS), in a bucket of a file store, and reports the
// live heap after a garbage collection, per key (and per key since the
// last measure, which leaves out the fixed cost), and the heap in use
// (the live heap and its spans' free room), after each quarter and once
// the server's block caches and indexes have gone cold (after cold). It
// runs in a temporary directory of its own. Every execution
// ever started keeps such a claim, and every retained execution a
// history's subject and a read model's key.
func runSubjectsProbe(ctx context.Context, out io.Writer, n int, cold time.Duration) error {
	var refused atomic.Int64
	js, stop, err := probeServer("jetflow-bench-subjects-", false, jetstream.WithPublishAsyncMaxPending(1024),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { refused.Add(1) }))
	if err != nil {
		return err
	}
	defer stop()
	const bucket = "PROBE_IDS"
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("subjects probe: create bucket: %w", err)
	}
	fmt.Fprintf(out, "subjects probe: an embedded server's heap per subject holding a message, %d keys of a bucket (an execution id's claim each)\n", n)
	base := heapNow()
	last, lastKeys := base, 0
	report := func(keys int, when string) {
		now := heapNow()
		live := float64(now.live) - float64(base.live)
		line := fmt.Sprintf("  %9d keys  live heap +%7.1f MiB  %4.0f B a key", keys, live/(1<<20), live/float64(keys))
		if keys > lastKeys && lastKeys > 0 {
			line += fmt.Sprintf(" (%.0f since %d)", (float64(now.live)-float64(last.live))/float64(keys-lastKeys), lastKeys)
		}
		line += fmt.Sprintf("; in use %4.0f B a key", (float64(now.inUse)-float64(base.inUse))/float64(keys))
		fmt.Fprintln(out, line+when)
		last, lastKeys = now, keys
	}
	claim := make([]byte, 170) // a claim's size: its command's key and digest
	quarter := max(n/4, 1)
	for i := range n {
		// A loaded machine answers late: wait for room, never fail for it.
		if _, err := js.PublishAsync("$KV."+bucket+"."+probeID(i), claim, jetstream.WithStallWait(time.Minute)); err != nil {
			return fmt.Errorf("subjects probe: put: %w", err)
		}
		if (i+1)%quarter == 0 || i+1 == n {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Minute):
				return fmt.Errorf("subjects probe: %d puts unanswered after a minute", js.PublishAsyncPending())
			}
			if r := refused.Load(); r > 0 {
				return fmt.Errorf("subjects probe: %d puts refused", r)
			}
			report(i+1, "")
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cold):
	}
	report(n, fmt.Sprintf(", %s later", cold))
	return nil
}

// probeID is the probe's i-th execution id, shaped as the api makes
// them (UUIDv7): a millisecond timestamp, here a thousand ids each, then
// random bits (a hash of i).
func probeID(i int) string {
	r := uint64(i) + 0x9e3779b97f4a7c15 // splitmix64
	r = (r ^ r>>30) * 0xbf58476d1ce4e5b9
	r = (r ^ r>>27) * 0x94d049bb133111eb
	r ^= r >> 31
	ms := uint64(1_796_000_000_000) + uint64(i/1000)
	return fmt.Sprintf("%08x-%04x-7%03x-%04x-%012x", ms>>16, ms&0xffff, r>>52, 0x8000|r>>36&0x3fff, r&0xffffffffffff)
}

// heap is the process's live heap and heap in use.
type heap struct{ live, inUse uint64 }

// heapNow is the process's heap after a garbage collection.
func heapNow() heap {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return heap{live: m.HeapAlloc, inUse: m.HeapInuse}
}
