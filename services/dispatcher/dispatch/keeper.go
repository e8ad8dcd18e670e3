package dispatch

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
)

// The tasks stream is a work queue: an agent's acknowledgement removes its
// task. When that removes the last message of the stream's last block (a
// queue that empties, as it does after every task of an execution run one
// step at a time), JetStream's file store replaces the block: it creates a
// new block file. On the machine the benchmarks run on, that costs about
// 250 µs of the server's time per task, in the middle of the next step's
// append (docs/benchmarks.md, "Keepers").
//
// A keeper is an empty message on bus.TasksKeeperSubject, which no
// consumer takes, that expires by itself after keeperTTL. Published
// before a task, on the same connection, it is stored in the same block
// ahead of it, and the block no longer empties when the task goes. A
// dispatcher publishes one before a task once keeperEvery has passed, or
// keeperPer tasks were published, since its last: a block (4 MiB for a
// work queue) then always gets one soon after it is started, also at
// thousands of tasks a second (one a second, or one per keeperPer tasks
// when they come faster). Without tasks, keepers expire and the stream
// empties.
const (
	keeperEvery = time.Second
	keeperPer   = 256
	keeperTTL   = 5 * time.Second
	// keeperAckWait bounds the wait for a keeper's ack, which is only
	// looked at for a stream that does not allow per-message TTLs.
	keeperAckWait = 10 * time.Second
	// keeperRetry is how long keepers stay off once the stream refused
	// one: until its bootstrap has run, which a restart need not follow.
	keeperRetry = time.Minute
)

// errCodeTTLDisabled is JetStream's error for a per-message TTL on a
// stream that does not allow them.
const errCodeTTLDisabled jetstream.ErrorCode = 10166

// keeper publishes the tasks stream's keepers.
type keeper struct {
	js  jetstream.JetStream
	log zerolog.Logger

	mu    sync.Mutex
	last  time.Time // when the last keeper was published
	since int       // tasks published since

	// offUntil (unix nanoseconds): the stream refused a keeper; none is
	// published before then.
	offUntil atomic.Int64
	warned   atomic.Bool
}

func newKeeper(js jetstream.JetStream, log zerolog.Logger) *keeper {
	return &keeper{js: js, log: log}
}

// beforeTask is called before a task is published at now: it publishes a
// keeper when one is due. It never waits for the server (not even for
// room among the connection's unacknowledged publishes), and never fails
// the task: a keeper only saves the server work.
func (k *keeper) beforeTask(now time.Time) {
	if k == nil || now.UnixNano() < k.offUntil.Load() {
		return
	}
	k.mu.Lock()
	k.since++
	due := now.Sub(k.last) >= keeperEvery || k.since >= keeperPer
	if due {
		k.last, k.since = now, 0
	}
	k.mu.Unlock()
	if !due {
		return
	}
	f, err := k.js.PublishMsgAsync(&nats.Msg{Subject: bus.TasksKeeperSubject},
		jetstream.WithMsgTTL(keeperTTL), jetstream.WithStallWait(time.Millisecond))
	if err != nil {
		k.log.Debug().Err(err).Msg("publish a keeper of the tasks stream")
		return
	}
	go k.check(f, now)
}

// check turns keepers off for keeperRetry when the tasks stream does not
// allow them (it was made by an older bootstrap), and says so once.
func (k *keeper) check(f jetstream.PubAckFuture, at time.Time) {
	t := time.NewTimer(keeperAckWait)
	defer t.Stop()
	select {
	case <-f.Ok():
	case <-t.C:
	case err := <-f.Err():
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeTTLDisabled {
			return
		}
		k.offUntil.Store(at.Add(keeperRetry).UnixNano())
		if !k.warned.Swap(true) {
			k.log.Warn().Str("stream", bus.StreamTasks).Dur("retry_in", keeperRetry).
				Msg("the tasks stream does not allow per-message TTLs, so no keepers are published (each step may cost the server a file creation): run jetflow bootstrap of this release (docs/upgrades.md)")
		}
	}
}
