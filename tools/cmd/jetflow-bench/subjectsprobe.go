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

// subjectsProbeCold is how long the subjects probe waits before its last
// measure: longer than nats-server keeps a message block's cache after
// its last use, so that what stays is what the server keeps for every
// subject, not the messages it read or wrote last.
var subjectsProbeCold = 12 * time.Second

// minSubjectsProbe is the fewest keys the subjects probe puts: below it
// the server's fixed cost (about 2 MiB) outweighs what the keys cost.
const minSubjectsProbe = 10000

// runSubjectsProbe measures what an embedded nats-server keeps in memory
// for each subject that holds a message, whatever the message's size: it
// puts n keys, each of its own subject as an execution id's claim is
// (KV_JF_EXECUTION_IDS), in a bucket of a file store, and reports the
// heap in use after a garbage collection, per key (and per key since
// the last measure, which leaves out the fixed cost), after each quarter
// and once the server's block caches have gone cold. It runs in a
// temporary directory of its own. Every execution
// ever started keeps such a claim, and every retained execution a
// history's subject and a read model's key.
func runSubjectsProbe(ctx context.Context, out io.Writer, n int) error {
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
	fmt.Fprintf(out, "subjects probe: an embedded server's heap in use per subject holding a message, %d keys of a bucket (an execution id's claim each)\n", n)
	base := heapInUse()
	last, lastKeys := base, 0
	report := func(keys int, when string) {
		now := heapInUse()
		grew := float64(now) - float64(base)
		line := fmt.Sprintf("  %9d keys  heap +%7.1f MiB  %5.0f B a key", keys, grew/(1<<20), grew/float64(keys))
		if keys > lastKeys && lastKeys > 0 {
			line += fmt.Sprintf(" (%.0f B a key since %d)", (float64(now)-float64(last))/float64(keys-lastKeys), lastKeys)
		}
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
	case <-time.After(subjectsProbeCold):
	}
	report(n, fmt.Sprintf(", %s later", subjectsProbeCold))
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

// heapInUse is the process's heap in use after a garbage collection.
func heapInUse() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
