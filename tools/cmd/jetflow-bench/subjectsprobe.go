package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/natsserver"
)

// subjectsProbeCold is how long the subjects probe waits before its last
// measure: longer than nats-server keeps a message block's cache after
// its last use, so that what stays is what the server keeps for every
// subject, not the messages it read or wrote last.
var subjectsProbeCold = 12 * time.Second

// runSubjectsProbe measures what an embedded nats-server keeps in memory
// for each subject that holds a message, whatever the message's size: it
// puts n keys, each of its own subject as an execution id's claim is
// (KV_JF_EXECUTION_IDS), in a bucket of a file store, and reports the
// heap in use after a garbage collection, per key, after each quarter
// and once the server's block caches have gone cold. Every execution
// ever started keeps such a claim, and every retained execution a
// history's subject and a read model's key.
func runSubjectsProbe(ctx context.Context, out io.Writer, n int) error {
	dir, err := os.MkdirTemp("", "jetflow-bench-subjects-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir, Port: -1})
	if err != nil {
		return err
	}
	defer natsserver.Stop(srv)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	var refused atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { refused.Add(1) }))
	if err != nil {
		return err
	}
	const bucket = "PROBE_IDS"
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("subjects probe: create bucket: %w", err)
	}
	fmt.Fprintf(out, "subjects probe: an embedded server's heap in use per subject holding a message, %d keys of a bucket (an execution id's claim each)\n", n)
	base := heapInUse()
	report := func(keys int, when string) {
		grew := float64(heapInUse()) - float64(base)
		fmt.Fprintf(out, "  %9d keys  heap +%7.1f MiB  %5.0f B a key%s\n", keys, grew/(1<<20), grew/float64(keys), when)
	}
	claim := make([]byte, 170) // a claim's size: its command's key and digest
	quarter := max(n/4, 1)
	for i := range n {
		// Ids as users give them: a prefix, a number, a date.
		if _, err := js.PublishAsync(fmt.Sprintf("$KV.%s.order-%09d-2026-12-07", bucket, i), claim); err != nil {
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

// heapInUse is the process's heap in use after a garbage collection.
func heapInUse() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
