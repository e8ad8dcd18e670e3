package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
)

// A queue has two lanes (docs/reliability.md, "Fair sharing"): the normal
// lane, and the bulk lane where the dispatcher sends the tasks of an
// execution that already has many in flight on the queue (a fan-out).
// Of a queue's workers, a quarter (reservedWorkers) take only the normal
// lane, so that another execution's task never waits for a fan-out's to
// end; the others (flex workers) take the normal lane first and the bulk
// lane when the normal one is empty.
//
// A worker asks for one task only when it is free, as before: no task
// waits in the agent, where another agent could have run it. A flex
// worker cannot wait on both lanes at once (a task delivered to the pull
// it gave up would wait for the ack wait), so while it has nothing it
// looks at both lanes and waits on one: on the bulk lane, for at most
// lanePoll, while a fan-out runs (a task taken from it within
// bulkActive); otherwise on the normal lane, for as long as a pull lasts
// (bus.PullExpiry), but for one flex worker per queue, the scout, which
// looks again every lanePoll. A fan-out's first tasks are on the normal
// lane, and the flex worker that ends one looks at the bulk lane next:
// the scout is for when reserved workers took them all, and costs an
// idle agent a few requests a second per queue.
const (
	// lanePoll is how long a flex worker waits on one lane before it looks
	// at the other again.
	lanePoll = time.Second
	// bulkActive is how long after the last task taken from the bulk lane
	// flex workers wait on it rather than on the normal lane.
	bulkActive = 2 * time.Second
)

// reservedWorkers is how many of a queue's concurrency workers serve the
// normal lane only: a quarter, at least one, and none when there is one
// worker (it must serve both lanes).
func reservedWorkers(concurrency int) int {
	if concurrency < 2 {
		return 0
	}
	return max(1, concurrency/4)
}

// lanes are the consumers of one queue's two lanes.
type lanes struct {
	queue  string
	normal jetstream.Consumer

	mu   sync.Mutex
	bulk jetstream.Consumer // nil until bound (an older bootstrap did not make it)

	lastBulk atomic.Int64 // unix nanoseconds of the last task taken from the bulk lane
}

func (l *lanes) bulkConsumer() jetstream.Consumer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bulk
}

func (l *lanes) setBulk(c jetstream.Consumer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bulk = c
}

// bindBulk binds the queue's bulk lane, waiting for the bootstrap to make
// it when this agent may not (meanwhile the queue's workers serve the
// normal lane only), until ctx ends. It calls tried once the first
// attempt is over, bound or not.
func (a *Agent) bindBulk(ctx context.Context, l *lanes, tried func()) {
	defer tried()
	spec := bus.AgentBulkQueueConsumer(bus.Durables{TaskAckWait: a.cfg.AckWait, MaxDeliver: a.cfg.MaxDeliver}, l.queue)
	var warned time.Time
	cons, err := bus.Bind(ctx, a.js, !a.cfg.BindOnly, spec, func(err error) {
		if time.Since(warned) >= time.Minute { // it tries every few seconds
			warned = time.Now()
			a.log.Warn().Err(err).Str("queue", l.queue).Str("consumer", spec.Config.Durable).
				Msg("cannot bind the queue's bulk lane: run this release's bootstrap, and give the agent this release's credentials; until then it serves the normal lane only")
		}
		tried()
	})
	if err != nil {
		if ctx.Err() == nil {
			a.log.Error().Err(err).Str("queue", l.queue).Msg("bind the bulk lane; serving the normal lane only")
		}
		return
	}
	l.setBulk(cons)
}

// role is what a worker of a queue serves.
type role int

const (
	reserved role = iota // the normal lane only
	flex                 // the normal lane first, then the bulk lane
	scout                // a flex worker that looks at the bulk lane every lanePoll
)

// roleOf is the role of a queue's worker number w (from 0) of concurrency.
func roleOf(w, concurrency int) role {
	switch r := reservedWorkers(concurrency); {
	case w < r:
		return reserved
	case w == r:
		return scout
	default:
		return flex
	}
}

// next waits for a worker's next task: nil when none came in time (or
// ctx ended). A reserved worker, or any worker while the bulk lane is not
// bound, waits on the normal lane as long as a pull lasts.
func (a *Agent) next(ctx context.Context, l *lanes, r role) (jetstream.Msg, error) {
	bulk := l.bulkConsumer()
	if r == reserved || bulk == nil {
		return fetchOne(ctx, l.normal, bus.PullExpiry, bus.PullHeartbeat)
	}
	if m, err := fetchNow(l.normal); m != nil || err != nil {
		return m, err
	}
	m, err := fetchNow(bulk)
	if err != nil { // the normal lane must not stall with it
		a.log.Warn().Err(err).Str("queue", l.queue).Msg("fetch task from the bulk lane")
	}
	if m != nil {
		l.lastBulk.Store(time.Now().UnixNano())
		return m, nil
	}
	if err == nil && time.Since(time.Unix(0, l.lastBulk.Load())) < bulkActive {
		if m, err = fetchOne(ctx, bulk, lanePoll, 0); m != nil {
			l.lastBulk.Store(time.Now().UnixNano())
		}
		return m, err
	}
	if r == scout {
		return fetchOne(ctx, l.normal, lanePoll, 0)
	}
	return fetchOne(ctx, l.normal, bus.PullExpiry, bus.PullHeartbeat)
}

// fetchOne waits up to expiry for one message of cons (heartbeats every
// hb, none if 0: a pull whose consumer's leader moved is given up within
// two of them).
func fetchOne(ctx context.Context, cons jetstream.Consumer, expiry, hb time.Duration) (jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, expiry)
	defer cancel()
	opts := []jetstream.FetchOpt{jetstream.FetchContext(fctx)}
	if hb > 0 {
		opts = append(opts, jetstream.FetchHeartbeat(hb))
	}
	batch, err := cons.Fetch(1, opts...)
	if err != nil {
		return nil, err
	}
	return first(batch, ctx)
}

// fetchNow takes one message of cons if one is waiting.
func fetchNow(cons jetstream.Consumer) (jetstream.Msg, error) {
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return nil, err
	}
	return first(batch, context.Background())
}

// first returns the batch's message, if any, and the error that ended the
// batch unless it only timed out. A message that arrives as ctx ends is
// handed back.
func first(batch jetstream.MessageBatch, ctx context.Context) (jetstream.Msg, error) {
	var got jetstream.Msg
	for m := range batch.Messages() {
		if got != nil || ctx.Err() != nil {
			_ = m.Nak()
			continue
		}
		got = m
	}
	if err := batch.Error(); got == nil && err != nil && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, err
	}
	return got, nil
}

// serve is one worker of queue l: take a task, run it, repeat until ctx
// ends.
func (a *Agent) serve(ctx, taskCtx context.Context, l *lanes, r role, log zerolog.Logger) {
	for ctx.Err() == nil {
		m, err := a.next(ctx, l, r)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("fetch task")
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
				}
			}
			continue
		}
		switch {
		case m == nil:
		case ctx.Err() != nil: // arrived as we stopped: hand it back
			_ = m.Nak()
		default:
			a.runTask(taskCtx, m)
		}
	}
}
