package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/groupcommit"
)

// The fsync probe's second half: history appends, as a dispatcher's
// workers make them (docs/adr/0020). Each worker appends to an execution
// of its own, one event at a time: its subject, the subject's last
// sequence expected, a message id, and it waits for the acknowledgement
// before its next. nats-server fsyncs each write of a stream on its own
// under sync_interval: always, but an atomic batch (NATS ADR-50) is
// staged, then written whole with one fsync of the stream before it is
// acknowledged (2.15): two fsyncs or so a batch, whatever its size. So
// the probe runs the workers twice: each append its own publish, then
// the appends gathered by the committer the dispatcher's -group-commit
// uses (package groupcommit) into atomic batches of what has come while
// the last one was being written.

// appendProbe is one run's result.
type appendProbe struct {
	perSecond float64
	cpuPer    time.Duration // of this process (server included); -1 when unknown
	perBatch  float64       // appends per write: 1 one by one
}

// probeAppends runs workers appending for d, one by one or gathered into
// atomic batches, against an embedded server fsyncing every write.
func probeAppends(ctx context.Context, d time.Duration, workers int, gathered bool) (appendProbe, error) {
	js, stop, err := syncAlwaysServer()
	if err != nil {
		return appendProbe{}, err
	}
	defer stop()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"probe.>"},
		Storage: jetstream.FileStorage, AllowAtomicPublish: true}); err != nil {
		return appendProbe{}, fmt.Errorf("append probe: create stream: %w", err)
	}
	payload := make([]byte, 600) // about a step's event
	var c *groupcommit.Committer
	if gathered {
		c = groupcommit.New(js, groupcommit.Config{Timeout: 10 * time.Second})
		defer c.Stop() // also on a failure before the count below
	}
	var (
		mu     sync.Mutex
		total  int
		failed error
	)
	cpu0 := cpuTime()
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			subject := "probe.x" + strconv.Itoa(w)
			var last uint64
			n := 0
			for time.Now().Before(end) && ctx.Err() == nil {
				m := nats.NewMsg(subject)
				m.Data = payload
				m.Header.Set(jetstream.MsgIDHeader, subject+"-"+strconv.Itoa(n))
				m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
				var seq uint64
				var err error
				if c != nil {
					seq, err = c.Publish(ctx, m)
				} else {
					var ack *jetstream.PubAck
					if ack, err = js.PublishMsg(ctx, m); err == nil {
						seq = ack.Sequence
					}
				}
				if err != nil {
					mu.Lock()
					if failed == nil {
						failed = fmt.Errorf("append probe: %s: %w", subject, err)
					}
					mu.Unlock()
					return
				}
				last = seq
				n++
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	if failed != nil {
		return appendProbe{}, failed
	}
	res := appendProbe{perSecond: float64(total) / d.Seconds(), cpuPer: -1, perBatch: 1}
	if cpu0 >= 0 && total > 0 {
		res.cpuPer = cpu / time.Duration(total)
	}
	if c != nil {
		c.Stop() // its counts are read once it is stopped
		st := c.Stats()
		if st.Messages != int64(total) {
			return appendProbe{}, fmt.Errorf("append probe: the committer wrote %d appends, the workers made %d", st.Messages, total)
		}
		if st.Writes > 0 {
			res.perBatch = float64(st.Messages) / float64(st.Writes)
		}
	}
	return res, nil
}

// runAppendProbe prints the appends' half of the fsync probe.
func runAppendProbe(ctx context.Context, out io.Writer, d time.Duration, workers int) error {
	fmt.Fprintf(out, "history appends under fsync: %d workers, each appending to an execution of its own and waiting for each append (docs/adr/0020)\n", workers)
	for _, gathered := range []bool{false, true} {
		res, err := probeAppends(ctx, d, workers, gathered)
		if err != nil {
			return err
		}
		how := "one by one"
		if gathered {
			how = "gathered, atomic batch"
		}
		cpu := "unknown"
		if res.cpuPer >= 0 {
			cpu = fmt.Sprintf("%.1f µs", float64(res.cpuPer.Nanoseconds())/1000)
		}
		fmt.Fprintf(out, "  %-22s  %6.0f appends/s, %5.1f a write, CPU %s an append\n", how, res.perSecond, res.perBatch, cpu)
	}
	return nil
}
