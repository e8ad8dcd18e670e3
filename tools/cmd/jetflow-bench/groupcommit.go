package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
// the appends gathered by one committer into atomic batches of what has
// come while the last one was being written.

// atomicBatchMax is nats-server's default limit of messages in a batch.
const atomicBatchMax = 1000

// appendProbe is one run's result.
type appendProbe struct {
	perSecond float64
	cpuPer    time.Duration // of this process (server included); -1 when unknown
	perBatch  float64       // appends per write: 1 one by one
}

// probeAppends runs workers appending for d, one by one or gathered into
// atomic batches, against an embedded server fsyncing every write.
func probeAppends(ctx context.Context, d time.Duration, workers int, gathered bool) (appendProbe, error) {
	nc, js, stop, err := syncAlwaysServer()
	if err != nil {
		return appendProbe{}, err
	}
	defer stop()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"probe.>"},
		Storage: jetstream.FileStorage, AllowAtomicPublish: true}); err != nil {
		return appendProbe{}, fmt.Errorf("append probe: create stream: %w", err)
	}
	payload := make([]byte, 600) // about a step's event
	var c *committer
	if gathered {
		c = newCommitter(nc)
		defer c.stop() // also on a failure before the count below
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
					seq, err = c.append(ctx, m)
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
		c.stop() // its counts are read once it is stopped
		if c.appended != total {
			return appendProbe{}, fmt.Errorf("append probe: the committer wrote %d appends, the workers made %d", c.appended, total)
		}
		if c.writes > 0 {
			res.perBatch = float64(c.appended) / float64(c.writes)
		}
	}
	return res, nil
}

// committer gathers appends into atomic batches: one batch written at a
// time, holding whatever came while the last was being written.
type committer struct {
	nc   *nats.Conn
	in   chan pendingAppend
	done chan struct{}
	once sync.Once
	// writes and appended count the batches (or lone publishes) written
	// and the appends they held: read once stopped. writes also names
	// the batches (an id is unique while its batch is open).
	writes, appended int
}

type pendingAppend struct {
	m     *nats.Msg
	reply chan appendResult
}

type appendResult struct {
	seq uint64
	err error
}

func newCommitter(nc *nats.Conn) *committer {
	c := &committer{nc: nc, in: make(chan pendingAppend, atomicBatchMax), done: make(chan struct{})}
	go c.loop()
	return c
}

// stop ends the committer once every append handed to it is answered; a
// second call returns at once. No append may be handed to it after.
func (c *committer) stop() { c.once.Do(func() { close(c.in) }); <-c.done }

// append hands m to the committer and waits for its sequence.
func (c *committer) append(ctx context.Context, m *nats.Msg) (uint64, error) {
	r := make(chan appendResult, 1)
	c.in <- pendingAppend{m: m, reply: r}
	select {
	case res := <-r:
		return res.seq, res.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// loop writes one batch at a time: a second in flight (tried) halved the
// batches and cost more than it overlapped, nats-server staging each
// batch in a store of its own.
func (c *committer) loop() {
	defer close(c.done)
	for first := range c.in {
		batch := []pendingAppend{first}
	gather:
		for len(batch) < atomicBatchMax {
			select {
			case p, ok := <-c.in:
				if !ok {
					break gather
				}
				batch = append(batch, p)
			default:
				break gather
			}
		}
		c.writes++
		c.appended += len(batch)
		seqs, err := c.write("probe-"+strconv.Itoa(c.writes), batch)
		for i, p := range batch {
			if err != nil {
				p.reply <- appendResult{err: err}
				continue
			}
			p.reply <- appendResult{seq: seqs[i]}
		}
	}
}

// batchAck is nats-server's answer to a batch's first message (empty when
// staged) and to its commit (a publish acknowledgement with the batch).
type batchAck struct {
	Seq   uint64              `json:"seq"`
	Count int                 `json:"count"`
	Error *jetstream.APIError `json:"error"`
}

// batchReply reads nats-server's answer r to the message of a batch of n
// that asked for one; empty (a message staged) is a zero batchAck.
func batchReply(r *nats.Msg, n int) (batchAck, error) {
	var ack batchAck
	if len(r.Data) == 0 {
		return ack, nil
	}
	if err := json.Unmarshal(r.Data, &ack); err != nil {
		return ack, fmt.Errorf("batch of %d: answered %q: %w", n, r.Data, err)
	}
	if ack.Error != nil {
		return ack, fmt.Errorf("batch of %d: %w", n, ack.Error)
	}
	return ack, nil
}

// write writes batch as one atomic batch (a lone append as a plain
// publish) and returns each append's sequence: a committed batch's
// messages are stored one after another, the last at the acknowledged
// sequence. The probe's appends never conflict; a committer of the
// dispatcher's would append a failed batch's members one by one, to learn
// which failed and why (a batch fails whole).
func (c *committer) write(id string, batch []pendingAppend) ([]uint64, error) {
	n := len(batch)
	for i, p := range batch {
		m := p.m
		if n > 1 {
			m.Header.Set("Nats-Batch-Id", id)
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		}
		switch {
		case i == n-1:
			if n > 1 {
				m.Header.Set("Nats-Batch-Commit", "1")
			}
			r, err := c.nc.RequestMsg(m, 10*time.Second)
			if err != nil {
				return nil, err
			}
			ack, err := batchReply(r, n)
			if err != nil {
				return nil, err
			}
			if n > 1 && ack.Count != n {
				return nil, fmt.Errorf("batch of %d: %d committed", n, ack.Count)
			}
			seqs := make([]uint64, n)
			for k := range seqs {
				seqs[k] = ack.Seq - uint64(n-1-k)
			}
			return seqs, nil
		case i == 0:
			r, err := c.nc.RequestMsg(m, 10*time.Second)
			if err != nil {
				return nil, err
			}
			if _, err := batchReply(r, n); err != nil {
				return nil, err
			}
		default:
			if err := c.nc.PublishMsg(m); err != nil {
				return nil, err
			}
		}
	}
	return nil, errors.New("empty batch")
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
