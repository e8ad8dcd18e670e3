package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// Timers that come due together are recorded together. Handled one by
// one, as every other message is, each firing costs a worker a
// synchronous append of io.jetflow.timer.fired and then the appends that
// follow (the sleep's step.succeeded, the next step...): with thousands
// due at the same instant, the last one's timer.fired was recorded
// seconds late, behind the others' work.
//
// So the fired timers' messages wait in a fireQueue, and one goroutine
// (fireLoop) takes them in batches: for every execution of a batch it
// takes the execution (the same per-execution lock the workers take),
// loads its state (the cache, or the histories of those not cached,
// read concurrently), asks the interpreter (interp.Fired), and appends
// every timer.fired at once (history.Store.AppendBatch: each with its own
// expected last subject sequence, all acknowledged together). A sleep's
// firing is most often recorded by the sleep's success, which may carry
// the next dispatch or be carried by the execution's end (interp.Fired,
// docs/adr/0017). Then each message goes on to the workers as before:
// the interpreter, seeing the timer recorded, decides nothing more about
// the firing, and the worker advances the execution and acknowledges the
// message. A message is acknowledged only then, so a dispatcher that
// stops in between leaves it to be delivered again, and recorded once
// (interp.Fired). A firing whose event ended the execution leaves the
// workers nothing to do: its message is acknowledged once the event is
// stored, and the execution leaves the cache, as a worker's end does.
//
// Anything a batch does not settle simply goes to the workers, who handle
// it as any message: an execution a worker has in hand, a second firing
// of one execution in the batch, a state not loaded, a decision other
// than "record this firing" (a timer not known yet, a repeated one, an
// ended or damaged execution), a partition whose lease is being renewed,
// and an append that failed. A failed append's state is dropped from the
// cache, so the worker reads the history again and decides anew (a
// conflict: another writer went first).

// fireBatchMax bounds the firings recorded in one batch (and so the
// appends in flight at once on the dispatcher's connection).
const fireBatchMax = 512

// fireLoads bounds the histories a batch reads at once (the executions
// not in the cache).
const fireLoads = 16

// fireQueue holds the fired timers' messages until the fire loop takes
// them. Adding never blocks.
type fireQueue struct {
	mu   sync.Mutex
	jobs []job
	// hand holds the jobs a recorder took and has not handed on yet, by
	// message: they are kept alive as the queued ones are (due).
	hand map[jetstream.Msg]job
	wake chan struct{}
}

func newFireQueue() *fireQueue {
	return &fireQueue{wake: make(chan struct{}, 1), hand: map[jetstream.Msg]job{}}
}

func (q *fireQueue) add(j job) {
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take removes and returns up to n jobs, the oldest first.
func (q *fireQueue) take(n int) []job {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := min(n, len(q.jobs))
	out := make([]job, k)
	copy(out, q.jobs)
	for _, j := range out {
		if j.msg != nil {
			q.hand[j.msg] = j
		}
	}
	clear(q.jobs[:k])
	q.jobs = q.jobs[k:]
	if len(q.jobs) == 0 {
		q.jobs = nil
	} else {
		select { // more for another recorder
		case q.wake <- struct{}{}:
		default:
		}
	}
	return out
}

// release ends a recorder's hold of j, taken by take, and returns it as
// it is now (when it was last kept alive), to be handed on.
func (q *fireQueue) release(j job) job {
	if j.msg == nil {
		return j
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if h, ok := q.hand[j.msg]; ok {
		j.alive = h.alive
		delete(q.hand, j.msg)
	}
	return j
}

// due is turns.due for the jobs waiting here, and those a recorder has in
// hand: a batch's loads and appends, and the hold of the recorded ones,
// may outlast a beat.
func (q *fireQueue) due(now time.Time, every func(job) time.Duration) []jetstream.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []jetstream.Msg
	for i := range q.jobs {
		if q.jobs[i].msg != nil && now.Sub(q.jobs[i].alive) >= every(q.jobs[i]) {
			q.jobs[i].alive = now
			out = append(out, q.jobs[i].msg)
		}
	}
	for m, j := range q.hand {
		if now.Sub(j.alive) >= every(j) {
			j.alive = now
			q.hand[m] = j
			out = append(out, m)
		}
	}
	return out
}

// fireLoop records the queued firings in batches, fireRecorders batches
// at a time, handing each job on to handOn afterwards, until stop is
// closed; then it hands on whatever is left.
func (d *Dispatcher) fireLoop(ctx context.Context, q *fireQueue, handOn func(job), stop <-chan struct{}) {
	var wg sync.WaitGroup
	for range fireRecorders {
		wg.Go(func() { d.recordLoop(ctx, q, handOn, stop) })
	}
	wg.Wait()
	for left := q.take(fireBatchMax); len(left) > 0; left = q.take(fireBatchMax) {
		for _, j := range left {
			handOn(q.release(j))
		}
	}
}

// fireRecorders is how many batches are recorded at once: while one
// waits for its acknowledgements, the next is read and published.
const fireRecorders = 2

// recordLoop is one of fireLoop's recorders.
func (d *Dispatcher) recordLoop(ctx context.Context, q *fireQueue, handOn func(job), stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-q.wake:
		}
		// Jobs whose firing is recorded go on to the workers once the
		// queue is empty, or fireHold after the first was held: while
		// timers keep coming due, recording them comes before acting on
		// them, which would compete for the same server and cores.
		var held []job
		var since time.Time
		for {
			batch := q.take(fireBatchMax)
			for i, o := range d.recordFires(ctx, batch) {
				switch {
				case o.ended:
					j := q.release(batch[i])
					if err := j.msg.Ack(); err != nil {
						d.log.Warn().Err(err).Str("execution_id", j.key).Msg("ack")
					}
					j.from.done()
				case o.recorded:
					if len(held) == 0 {
						since = time.Now()
					}
					held = append(held, batch[i])
				default:
					if o.err != nil {
						d.log.Debug().Err(o.err).Str("execution_id", batch[i].key).Msg("timer not recorded in a batch; a worker handles it")
					}
					handOn(q.release(batch[i]))
				}
			}
			if len(batch) == 0 || time.Since(since) >= min(fireHold, d.cfg.AckWait/4) {
				for _, j := range held {
					handOn(q.release(j))
				}
				held = held[:0]
			}
			if len(batch) == 0 {
				break
			}
		}
	}
}

// fireHold bounds how long the fire loop keeps recorded firings from the
// workers while more timers come due (and a quarter of the messages' ack
// wait, at most), checked after each batch: the jobs it holds are kept
// alive meanwhile (fireQueue.due).
const fireHold = 500 * time.Millisecond

// fireOutcome is what a batch did with one fired timer: recorded its
// firing (and ended its execution: nothing is left for a worker), or
// left it to a worker (err says why when it tried and failed).
type fireOutcome struct {
	recorded, ended bool
	err             error
}

// firing is one timer of a batch, from its execution's lock to its append.
type firing struct {
	i      int // the job's index in the batch
	p      *events.FireTimer
	x      *execState
	unlock func()
	ev     events.Event          // the event recording the firing
	next   projections.Execution // the state after it
}

// recordFires records the firings of a batch of fired timers' messages
// (each carrying a FireTimer), at most one per execution, and says what
// it did with each. It neither acknowledges nor hands on any message.
func (d *Dispatcher) recordFires(ctx context.Context, batch []job) []fireOutcome {
	out := make([]fireOutcome, len(batch))
	var fs []*firing
	defer func() {
		for _, f := range fs {
			if f.unlock != nil {
				f.unlock()
			}
		}
	}()
	seen := make(map[string]bool, len(batch))
	// held: whether the holding each job came from still holds its
	// partition, asked once per holding in a batch (a renewal merely late
	// is waited for, as a worker does), and before any execution is
	// taken: a late renewal waited for must not keep the batch's other
	// executions from the workers.
	held := map[*consuming]bool{}
	for _, j := range batch {
		if _, asked := held[j.from]; j.from != nil && !asked {
			held[j.from] = d.parts.table.Await(ctx, j.from.part, j.from.epoch.Load(), handOver)
		}
	}
	for i := range batch {
		j := &batch[i]
		p, ok := j.ev.Data.(*events.FireTimer)
		if !ok || seen[p.ExecutionID] || !events.ValidWorkflowName(p.Workflow) || !events.ValidExecutionID(p.ExecutionID) {
			continue
		}
		if j.from != nil && !held[j.from] {
			continue // moved on: the worker hands it back
		}
		unlock, ok := d.handling.tryLock(p.ExecutionID)
		if !ok {
			continue // a worker has it in hand
		}
		seen[p.ExecutionID] = true
		if j.msg != nil {
			if md, err := j.msg.Metadata(); err == nil {
				j.ev.Time = sentAt(j.ev.Time, md.Timestamp) // as process does
			}
		}
		fs = append(fs, &firing{i: i, p: p, unlock: unlock})
	}
	d.loadFirings(ctx, fs, out)

	var appends []history.Pending
	var appending []*firing
	for _, f := range fs {
		if f.x == nil || f.x.state.Damaged != nil {
			continue
		}
		ev, next, ok := d.firedEvent(f.x, f.p.TimerID, batch[f.i].ev.Time)
		if !ok {
			continue
		}
		f.ev, f.next = ev, next
		appends = append(appends, history.Pending{Subject: f.x.subject(), LastSeq: f.x.state.LastSeq, Event: ev})
		appending = append(appending, f)
	}
	if len(appends) == 0 {
		return out
	}
	for k, a := range d.hist.AppendBatch(ctx, appends) {
		f := appending[k]
		d.cfg.Metrics.appendResult(a.Err)
		if a.Err != nil {
			// Whatever happened, the stream is the truth: the worker reads
			// the history again and decides anew.
			d.evict(f.x.id)
			out[f.i].err = a.Err
			continue
		}
		f.next.LastSeq = a.Seq
		d.cfg.Metrics.appended(&f.x.state, &f.next, &f.ev, d.cfg.Now) // its steps are next's: only its other members tell what was
		d.traced(&f.x.state, &f.next, &f.ev)
		f.x.state, f.x.current, f.x.torn = f.next, true, nil
		out[f.i].recorded = true
		if f.next.Status.Terminal() {
			out[f.i].ended = true
			d.evict(f.x.id) // as withExecution does after an end
			// Said as a worker's end says it (carryOut).
			log := d.log.With().Str("execution_id", f.x.id).Str("handling", string(batch[f.i].ev.Type)).Str("timer_id", f.p.TimerID).Logger()
			logDecided(log.WithContext(ctx), f.ev.Data)
		}
	}
	return out
}

// loadFirings loads the state of each firing's execution: from the cache,
// or, for those not cached, from their histories, fireLoads at a time. A
// firing whose state could not be loaded keeps a nil state (a worker
// handles it).
func (d *Dispatcher) loadFirings(ctx context.Context, fs []*firing, out []fireOutcome) {
	sem := make(chan struct{}, fireLoads)
	var wg sync.WaitGroup
	for _, f := range fs {
		if x, _, ok, verify := d.cached(f.p.Workflow, f.p.ExecutionID); ok && !verify {
			f.x = x
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			x, _, err := d.load(ctx, f.p.Workflow, f.p.ExecutionID, loading{})
			if err != nil {
				out[f.i].err = err
				return
			}
			f.x = x
		})
	}
	wg.Wait()
}

// batchable are the purposes of the timers whose firing a batch records:
// those for which nothing that may come between the firing recorded and
// the worker acting on it (a signal, a report, a cancel) can be decided
// otherwise because the firing is recorded but not yet acted on. A
// sleep's end and a retry's backoff are such. A timeout is not: a
// signal taken by a wait, or an attempt's success, handled in between
// would win over a timeout already recorded; the worker records and acts
// on those in one turn.
var batchable = map[string]bool{events.TimerSleep: true, events.TimerRetry: true}

// firedEvent is the event recording that timer id of x fired (its
// FireTimer was sent at sentAt), and the state after it; ok is false
// unless the interpreter decides exactly that and nothing else (then a
// worker handles the message as any other). The event is the
// timer.fired, or a sleep's success recording the firing, which may
// carry the next dispatch or be carried by the execution's end
// (docs/adr/0017).
//
// The event is applied to x's state in place, as append does (a copy of
// the steps at each firing made a timer of a large execution cost more
// the more steps it had): x is torn until the caller records the append
// (x.state = next, x.torn = nil) or drops x. An event the fold refuses,
// or an end that a worker must follow up (a parent to tell, locks to
// release), leaves x torn and out of the cache, and ok false: the worker
// reads the history again and decides anew.
func (d *Dispatcher) firedEvent(x *execState, id string, sentAt time.Time) (ev events.Event, next projections.Execution, ok bool) {
	if x.torn != nil || !batchable[x.state.Timers[id].Purpose] {
		return events.Event{}, projections.Execution{}, false
	}
	dec := interp.Fired(d.input(x), id, sentAt)
	if dec.Need != nil || dec.Err != nil || dec.Reject != nil || dec.Retry != "" || dec.Ignore != "" ||
		len(dec.Before) > 0 || len(dec.After) > 0 || !dec.At.IsZero() || len(dec.Events) != 1 || events.FiringOf(dec.Events[0]) != id {
		return events.Event{}, projections.Execution{}, false
	}
	ev = d.event(x, dec.Events[0], time.Time{})
	x.torn = errTorn
	next, err := projections.ApplyOwned(x.state, ev)
	if err != nil || (!next.Status.Active() && (next.Parent != nil || len(next.Locks) > 0)) {
		d.evict(x.id)
		return events.Event{}, projections.Execution{}, false // the worker refuses it, as d.append does, or follows the end up
	}
	return ev, next, true
}
