package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/natsserver"
)

// fsyncProbeStreams are the numbers of streams the fsync probe writes to.
var fsyncProbeStreams = []int{1, 2, 4, 8}

// runFsyncProbe measures what the machine's disk gives a JetStream file
// store that fsyncs every write (sync_interval: always): for each number
// of work-queue streams, publishers (inflight of them, each waiting for
// its acknowledgement, spread over the streams) publish for d, and a
// consumer of each stream acknowledges every message (which removes it:
// a second write), as tasks are published and taken. nats-server fsyncs
// each write of a stream on its own, so what one stream takes bounds
// what a step that writes there twice can do (docs/adr/0016). Then it
// measures history appends, one by one and gathered into atomic batches
// (groupcommit.go, docs/adr/0020).
func runFsyncProbe(ctx context.Context, out io.Writer, d time.Duration, inflight int) error {
	fmt.Fprintf(out, "fsync probe: an embedded server fsyncing every write, %d publishers waiting for their acks, each message taken and acknowledged, %s a run\n", inflight, d)
	for _, n := range fsyncProbeStreams {
		rate, err := probeStreams(ctx, n, d, inflight)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  %d work-queue stream(s)  %6.0f messages/s\n", n, rate)
	}
	return runAppendProbe(ctx, out, d, inflight)
}

// probeStreams is one run of the probe over n streams: the messages
// published (and taken) a second.
func probeStreams(ctx context.Context, n int, d time.Duration, inflight int) (float64, error) {
	js, stop, err := syncAlwaysServer()
	if err != nil {
		return 0, err
	}
	defer stop()
	for i := range n {
		name := fmt.Sprintf("PROBE%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("probe.%d", i)},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
			return 0, fmt.Errorf("fsync probe: create stream: %w", err)
		}
		c, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "take", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4 * inflight})
		if err != nil {
			return 0, fmt.Errorf("fsync probe: create consumer: %w", err)
		}
		cc, err := c.Consume(func(m jetstream.Msg) { _ = m.Ack() })
		if err != nil {
			return 0, fmt.Errorf("fsync probe: consume: %w", err)
		}
		defer cc.Stop()
	}
	payload := make([]byte, 512) // about a task's size
	var published atomic.Int64
	var failed atomic.Pointer[error]
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for p := range inflight {
		wg.Go(func() {
			subject := fmt.Sprintf("probe.%d", p%n)
			for time.Now().Before(end) && ctx.Err() == nil {
				if _, err := js.Publish(ctx, subject, payload); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				published.Add(1)
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, fmt.Errorf("fsync probe: publish: %w", *err)
	}
	return float64(published.Load()) / d.Seconds(), nil
}

// syncAlwaysServer starts an embedded server of its own, in a temporary
// directory, whose file store fsyncs every write, and connects to it;
// stop closes the connection, stops the server and removes the directory.
func syncAlwaysServer() (js jetstream.JetStream, stop func(), err error) {
	return probeServer("jetflow-bench-fsync-", true)
}

// probeServer starts an embedded server of its own, in a temporary
// directory named after prefix, fsyncing every write if syncAlways, and
// returns a JetStream client of it (with opts), and what stops both and
// removes the directory.
func probeServer(prefix string, syncAlways bool, opts ...jetstream.JetStreamOpt) (js jetstream.JetStream, stop func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, nil, err
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir, Port: -1, SyncAlways: syncAlways})
	if err != nil {
		return nil, nil, errors.Join(err, os.RemoveAll(dir))
	}
	var nc *nats.Conn
	stop = func() {
		if nc != nil {
			nc.Close()
		}
		natsserver.Stop(srv)
		_ = os.RemoveAll(dir)
	}
	if nc, err = nats.Connect(srv.ClientURL()); err != nil {
		stop()
		return nil, nil, err
	}
	if js, err = jetstream.New(nc, opts...); err != nil {
		stop()
		return nil, nil, err
	}
	return js, stop, nil
}
