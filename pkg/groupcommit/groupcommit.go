// Package groupcommit gathers JetStream publishes to one stream into
// atomic batches (NATS ADR-50), for a server that fsyncs every write
// (sync_interval: always): nats-server fsyncs each publish on its own,
// but a committed batch once, whatever its size (docs/adr/0020).
//
// A Committer writes one batch at a time, holding whatever was handed to
// it while the last one was being written: under load the batches grow
// by themselves, and a lone publish waits for nothing but the batch
// before it. Every message keeps its own checks (its expected last
// subject sequence, its message id); a batch stands or falls whole, so
// when it fails every message of it is answered with the batch's error,
// and its publisher decides alone (publishing it on its own learns
// which message failed and why). nats.go has no API for atomic batches:
// orbit.go's jetstreamext (already used to read histories in batches)
// writes them.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// MaxBatch is nats-server's default limit of messages in an atomic batch.
const MaxBatch = 1000

// ErrStopped answers a publish handed to a committer already stopped: it
// was not published.
var ErrStopped = errors.New("groupcommit: the committer stopped before it wrote the message")

// Committer writes the messages handed to it as atomic batches of one
// stream. Its methods are safe for concurrent use.
type Committer struct {
	js      jetstream.JetStream
	timeout time.Duration
	max     int
	onFail  func(error, int)

	// mu guards stopped: a message is handed to the loop under its read
	// lock, so none is handed once Stop has it. start starts the loop
	// with the first message (or, in Stop, marks done a loop never
	// started): a committer never used costs no goroutine.
	mu      sync.RWMutex
	stopped bool
	start   sync.Once
	in      chan pending
	quit    chan struct{}
	done    chan struct{}

	writes, published, failed, failedMessages atomic.Int64
}

type pending struct {
	m     *nats.Msg
	reply chan Result
}

// Result is the outcome of one message: its stream sequence, or why it
// was not stored (the whole batch's error: no message of a failed batch
// is stored, unless the failure was the answer's loss).
type Result struct {
	Seq uint64
	Err error
	// Duplicate: the stream had the message's id already, and stored
	// nothing (Seq is the earlier message's). Only a lone message is
	// answered so: a duplicate in a batch fails the whole batch.
	Duplicate bool
}

// Config of a Committer.
type Config struct {
	// Timeout bounds the wait for each answer of a batch (its first
	// message's and its commit's). Default 5 s.
	Timeout time.Duration
	// MaxBatch is the most messages a batch holds: the server's limit
	// (default and at most MaxBatch).
	MaxBatch int
	// Failed, if set, is called (on the committer's goroutine: quick)
	// with the error of each write that failed and its messages' count.
	Failed func(err error, messages int)
}

// New returns a committer publishing with js; it starts with the first
// message handed to it. Stop it when done.
func New(js jetstream.JetStream, cfg Config) *Committer { return newCommitter(js, cfg) }

func newCommitter(js jetstream.JetStream, cfg Config) *Committer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxBatch <= 0 || cfg.MaxBatch > MaxBatch {
		cfg.MaxBatch = MaxBatch
	}
	return &Committer{js: js, timeout: cfg.Timeout, max: cfg.MaxBatch, onFail: cfg.Failed,
		in: make(chan pending, cfg.MaxBatch), quit: make(chan struct{}), done: make(chan struct{})}
}

// Stop writes what was handed to the committer and ends it; a message
// handed to it afterwards is answered ErrStopped. A second call returns
// once the first is done.
func (c *Committer) Stop() {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		close(c.quit)
	}
	c.mu.Unlock()
	c.start.Do(func() { close(c.done) }) // never started: nothing to wait for
	<-c.done
}

// Publish hands m to the committer and waits for its outcome, or for
// ctx (its outcome then unknown: the batch holding it may be committed).
// m must carry what its stream checks (an expected last subject
// sequence, a message id); the committer adds the batch's headers. Two
// messages checking the same subject's last sequence are never in one
// batch (ADR-50 refuses a check of a subject written earlier in it):
// the later one goes in the next batch. Other expectations
// (Nats-Expected-Last-Sequence, Nats-Expected-Last-Subject-Sequence-Subject)
// are not looked at: a batch holding two that check each other fails.
func (c *Committer) Publish(ctx context.Context, m *nats.Msg) (uint64, error) {
	r := c.PublishResult(ctx, m)
	return r.Seq, r.Err
}

// PublishResult is Publish with the whole result.
func (c *Committer) PublishResult(ctx context.Context, m *nats.Msg) Result {
	select {
	case r := <-c.Submit(m):
		return r
	case <-ctx.Done():
		return Result{Err: ctx.Err()}
	}
}

// Submit hands m to the committer without waiting: its outcome comes on
// the channel returned (once).
func (c *Committer) Submit(m *nats.Msg) <-chan Result {
	r := make(chan Result, 1)
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.stopped {
		r <- Result{Err: ErrStopped}
		return r
	}
	c.start.Do(func() { go c.loop() })
	c.in <- pending{m: m, reply: r} // the loop runs until Stop, which waits for this lock
	return r
}

// Stats count what a committer wrote.
type Stats struct {
	// Writes counts the batches (or lone publishes) written, Messages
	// the messages they held, Failed the writes that failed (each of
	// their messages answered with the error) and FailedMessages the
	// messages they held.
	Writes, Messages, Failed, FailedMessages int64
}

// Stats returns what the committer wrote so far.
func (c *Committer) Stats() Stats {
	return Stats{Writes: c.writes.Load(), Messages: c.published.Load(), Failed: c.failed.Load(), FailedMessages: c.failedMessages.Load()}
}

// loop writes one batch at a time: a second in flight (tried) halved the
// batches and cost more than it overlapped, nats-server staging each
// batch in a store of its own. Once stopped, it writes what is left and
// ends.
func (c *Committer) loop() {
	defer close(c.done)
	var carry []pending // deferred from the last batch: their subject was in it
	stopping := false
	for {
		var batch []pending
		subjects := map[string]bool{}
		// add puts p in the batch, or defers it to the next when the
		// batch checks its subject already.
		add := func(p pending) {
			if checksSubject(p.m) && subjects[p.m.Subject] {
				carry = append(carry, p)
				return
			}
			subjects[p.m.Subject] = true
			batch = append(batch, p)
		}
		deferred := carry
		carry = nil
		for _, p := range deferred {
			add(p)
		}
		if len(batch) == 0 {
			if stopping {
				select {
				case p := <-c.in:
					add(p)
				default:
					return // nothing is handed to it any more (Stop)
				}
			} else {
				select {
				case p := <-c.in:
					add(p)
				case <-c.quit:
					stopping = true
					continue
				}
			}
		}
	gather:
		for len(batch) < c.max && len(carry) < c.max {
			select {
			case p := <-c.in:
				add(p)
			default:
				break gather
			}
		}
		c.writes.Add(1)
		c.published.Add(int64(len(batch)))
		seqs, dup, err := c.write(batch)
		if err != nil {
			c.failed.Add(1)
			c.failedMessages.Add(int64(len(batch)))
			if c.onFail != nil {
				c.onFail(err, len(batch))
			}
		}
		for i, p := range batch {
			if err != nil {
				p.reply <- Result{Err: err}
				continue
			}
			p.reply <- Result{Seq: seqs[i], Duplicate: dup}
		}
	}
}

// checksSubject says whether m checks its subject's last sequence.
func checksSubject(m *nats.Msg) bool { return m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) != "" }

// write writes batch as one atomic batch (a lone message as a plain
// publish) and returns each message's sequence: a committed batch's
// messages are stored one after another, the last at the acknowledged
// sequence. dup: a lone message was a duplicate.
func (c *Committer) write(batch []pending) (seqs []uint64, dup bool, err error) {
	n := len(batch)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if n == 1 { // a batch of one would cost a batch's staging (docs/adr/0020)
		ack, err := c.js.PublishMsg(ctx, batch[0].m)
		if err != nil {
			return nil, false, fmt.Errorf("groupcommit: %w", err)
		}
		return []uint64{ack.Sequence}, ack.Duplicate, nil
	}
	ms := make([]*nats.Msg, n)
	for i, p := range batch {
		ms[i] = p.m
	}
	ack, err := jetstreamext.PublishMsgBatch(ctx, c.js, ms,
		jetstreamext.BatchFlowControl{AckFirst: true, AckTimeout: c.timeout})
	if err != nil {
		return nil, false, fmt.Errorf("groupcommit: batch of %d: %w", n, err)
	}
	if ack.Sequence < uint64(n) {
		return nil, false, fmt.Errorf("groupcommit: batch of %d: acknowledged at sequence %d", n, ack.Sequence)
	}
	seqs = make([]uint64, n)
	for k := range seqs {
		seqs[k] = ack.Sequence - uint64(n-1-k)
	}
	return seqs, false, nil
}
