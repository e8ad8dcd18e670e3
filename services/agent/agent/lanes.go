package agent

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
)

// A queue has two lanes (docs/reliability.md, "Fair sharing"): the normal
// lane, and the bulk lane where the dispatcher sends the tasks of an
// execution that already has several in flight on the queue (a fan-out).
// Of a queue's workers, a quarter (reservedWorkers) take only the normal
// lane, so that another execution's task does not wait for a fan-out's to
// end; the others (flex workers) take the normal lane first and the bulk
// lane when the normal one is empty, but for one task in bulkTurn, where
// they look at the bulk lane first, so that a busy normal lane cannot
// starve a fan-out.
//
// A worker asks for one task only when it is free, as before: no task
// waits in the agent, where another agent could have run it. A flex
// worker cannot wait on both lanes at once (a task delivered to the pull
// it gave up would wait for the ack wait), so while it has nothing it
// looks at both lanes and waits on one: on the bulk lane, for at most
// lanePoll, while a fan-out runs (a task taken from it within
// bulkActive); otherwise on the normal lane, for as long as a pull lasts
// (longPoll), but for one idle flex worker at a time per queue, the
// scout, which looks again every lanePoll. A fan-out's first tasks are on
// the normal lane, and the flex worker that ends one looks at the bulk
// lane next: the scout is for when reserved workers took them all, and
// costs an idle agent a few requests a second per queue. The other flex
// workers, waiting on the normal lane, join a fan-out that started while
// they were idle when their pull ends (longPoll) or a task comes.
//
// Each look that finds a lane empty costs a request and the server's
// answer. Tasks that come one at a time (one execution's steps, back to
// back) would cost two such looks a task, beside the dispatcher's work on
// the next step: so a flex worker that ended a task alone on the normal
// lane (none behind it, at its first delivery) waits on the normal lane
// at once (a task waiting there is delivered at once, as to a look),
// without looking at the bulk lane, while that lane is idle and a look
// found it empty within bulkRecheck. The first worker to end a task
// after that looks at both lanes again, as the scout does every lanePoll:
// a fan-out's bulk task waits at most bulkRecheck longer while tasks
// come, and no longer than before when none do. (So the worker that ends
// a fan-out's first task looks at the bulk lane next only when no look
// found it empty within bulkRecheck.)
const (
	// lanePoll is how long a flex worker waits on one lane before it looks
	// at the other again. The pull's own expiry ends it.
	lanePoll = time.Second
	// bulkActive is how long after the last task taken from the bulk lane
	// flex workers wait on it rather than on the normal lane.
	bulkActive = 2 * time.Second
	// bulkTurn: a flex worker looks at the bulk lane first for one task
	// in bulkTurn.
	bulkTurn = 4
)

// bulkRecheck is how long a look that found the bulk lane empty stands
// for a flex worker whose last task had none behind it on the normal
// lane, while the bulk lane is idle. A variable for tests.
var bulkRecheck = 20 * time.Millisecond

// longPoll is how long a worker waits on the normal lane when nothing
// else is to be watched: a pull with heartbeats, given up within two
// missed ones when its consumer's leader moved. A variable for tests.
var longPoll = bus.PullExpiry

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
	queue string

	mu     sync.Mutex
	normal jetstream.Consumer
	bulk   jetstream.Consumer // nil until bound (an older bootstrap did not make it)
	// rebinding: a worker is binding the lane's consumer again (normal,
	// bulk), found gone (rebindIfGone).
	rebinding [2]atomic.Bool

	inFlight upDown // its tasks in hand (metrics)

	lastBulk  stamp        // the last task taken from the bulk lane
	bulkEmpty stamp        // the last look that found the bulk lane empty
	scout     atomic.Bool  // an idle flex worker is the queue's scout
	warned    atomic.Int64 // unix nanoseconds of the last warning about the bulk lane
}

func (l *lanes) normalConsumer() jetstream.Consumer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.normal
}

func (l *lanes) setNormal(c jetstream.Consumer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.normal = c
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

// warnBulk logs a problem with the bulk lane at most once a minute: the
// workers meet it at every look.
func (l *lanes) warnBulk(log zerolog.Logger, err error, msg string) {
	last := l.warned.Load()
	if time.Since(time.Unix(0, last)) < time.Minute || !l.warned.CompareAndSwap(last, time.Now().UnixNano()) {
		return
	}
	log.Warn().Err(err).Str("queue", l.queue).Msg(msg)
}

// bindAttempt bounds one attempt to bind the bulk lane: a consumer this
// agent may not read gets no answer at all (a permission violation), and
// the agent's readiness waits for the first attempt.
const bindAttempt = 2 * time.Second

// bindBulk binds the queue's bulk lane, trying again (every 2 s, backing
// off to a minute) while it is missing (an older bootstrap), forbidden
// (older credentials) or unreachable; meanwhile the queue's workers serve
// the normal lane only. It calls tried once the first attempt is over,
// bound or not, and returns when bound or when ctx ends.
func (a *Agent) bindBulk(ctx context.Context, l *lanes, tried func()) {
	defer tried()
	spec := bus.AgentBulkQueueConsumer(bus.Durables{TaskAckWait: a.cfg.AckWait, MaxDeliver: a.cfg.MaxDeliver}, l.queue)
	for backoff := 2 * time.Second; ; backoff = min(2*backoff, time.Minute) {
		actx, cancel := context.WithTimeout(ctx, bindAttempt)
		cons, err := bus.Bind(actx, a.js, !a.cfg.BindOnly, spec, nil)
		cancel()
		if err == nil {
			l.setBulk(cons)
			return
		}
		if ctx.Err() != nil {
			return
		}
		l.warnBulk(a.log.With().Str("consumer", spec.Config.Durable).Logger(), err,
			"cannot bind the queue's bulk lane: run this release's bootstrap, and give the agent this release's credentials; until then it serves the normal lane only")
		tried()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

// worker is what one worker of a queue serves and remembers.
type worker struct {
	reserved bool // the normal lane only
	taken    int  // tasks taken from either lane, for bulkTurn
	// alone: its last task came from the normal lane at its first
	// delivery, with no other waiting behind it.
	alone bool
	pulls *pulls
	asked *requestCounts // the queue's (metrics)
}

// next waits for a worker's next task: nil when none came in time (or
// ctx ended). A reserved worker, or any worker while the bulk lane is not
// bound, waits on the normal lane as long as a pull lasts.
func (a *Agent) next(ctx context.Context, l *lanes, w *worker, log zerolog.Logger) (jetstream.Msg, error) {
	m, err := a.take(ctx, l, w, log)
	w.alone = m != nil && aloneOnNormal(m, l.queue)
	if m != nil {
		w.taken++
	}
	return m, err
}

// aloneOnNormal reports whether task m came from queue's normal lane at
// its first delivery with no other task waiting behind it (a count that
// leaves out tasks due for redelivery: a task delivered again says that
// something is amiss, and the lanes are looked at).
func aloneOnNormal(m jetstream.Msg, queue string) bool {
	md, err := m.Metadata()
	return err == nil && md.NumPending == 0 && md.NumDelivered == 1 && md.Consumer == bus.AgentConsumer(queue)
}

// waitAtOnce reports whether flex worker w may wait on the normal lane
// without looking at both lanes first: its last task was alone on the
// normal lane, the bulk lane is idle, and a look found it empty within
// bulkRecheck.
func (l *lanes) waitAtOnce(w *worker, now time.Time) bool {
	return w.alone && l.lastBulk.age(now) >= bulkActive && l.bulkEmpty.age(now) < bulkRecheck
}

// A stamp is when something last happened, on the monotonic clock (on
// the wall clock, set back, an old moment would look recent): the time
// since clockStart, plus one; zero is never.
type stamp struct{ ns atomic.Int64 }

var clockStart = time.Now()

// mark says it happened at now.
func (s *stamp) mark(now time.Time) { s.ns.Store(int64(now.Sub(clockStart)) + 1) }

// age is how long before now it last happened; never is older than any
// duration.
func (s *stamp) age(now time.Time) time.Duration {
	v := s.ns.Load()
	if v == 0 {
		return math.MaxInt64
	}
	return now.Sub(clockStart) - time.Duration(v-1)
}

func (a *Agent) take(ctx context.Context, l *lanes, w *worker, log zerolog.Logger) (jetstream.Msg, error) {
	bulk, normal := l.bulkConsumer(), l.normalConsumer()
	if w.reserved || bulk == nil {
		return w.fetchOne(ctx, normal, laneNormal, longPoll, bus.PullHeartbeat)
	}
	lookNormal := func() (jetstream.Msg, error) { return w.fetchNow(ctx, normal, laneNormal) }
	lookBulk := func() (jetstream.Msg, error) {
		m, err := w.fetchNow(ctx, bulk, laneBulk)
		switch {
		case err != nil: // the normal lane must not stall with it
			l.warnBulk(log, err, "fetch a task from the bulk lane")
			a.rebindIfGone(ctx, l, true, log)
		case m != nil:
			l.lastBulk.mark(time.Now())
		default:
			l.bulkEmpty.mark(time.Now())
		}
		return m, nil
	}
	if !l.waitAtOnce(w, time.Now()) {
		looks := []func() (jetstream.Msg, error){lookNormal, lookBulk}
		if (w.taken+1)%bulkTurn == 0 { // this worker's every bulkTurn-th task
			looks[0], looks[1] = lookBulk, lookNormal
		}
		for _, look := range looks {
			if m, err := look(); m != nil || err != nil {
				return m, err
			}
		}
		if l.lastBulk.age(time.Now()) < bulkActive {
			m, err := w.fetchShort(ctx, bulk, laneBulk)
			if m != nil {
				l.lastBulk.mark(time.Now())
			}
			return m, err
		}
	}
	if l.scout.CompareAndSwap(false, true) {
		defer l.scout.Store(false)
		return w.fetchShort(ctx, normal, laneNormal)
	}
	return w.fetchOne(ctx, normal, laneNormal, longPoll, bus.PullHeartbeat)
}

// fetchOne waits up to expiry for one message of cons, with heartbeats
// every hb (a pull whose consumer's leader moved is given up within two
// of them); ctx ending ends it at once.
func (w *worker) fetchOne(ctx context.Context, cons jetstream.Consumer, lane int, expiry, hb time.Duration) (jetstream.Msg, error) {
	return w.fetch(ctx, cons, lane, pullOpts{expires: expiry, heartbeat: hb})
}

// fetchShort waits up to lanePoll for one message of cons: the server's
// expiry of the pull ends it. ctx ending ends it at once, and the pull
// with it (pull.go: a task that already came is handed back).
func (w *worker) fetchShort(ctx context.Context, cons jetstream.Consumer, lane int) (jetstream.Msg, error) {
	return w.fetch(ctx, cons, lane, pullOpts{expires: lanePoll})
}

// fetchNow takes one message of cons if one is waiting.
func (w *worker) fetchNow(ctx context.Context, cons jetstream.Consumer, lane int) (jetstream.Msg, error) {
	return w.fetch(ctx, cons, lane, pullOpts{noWait: true})
}

// fetch asks cons, lane of the worker's queue, for one task as o says,
// and counts the request with its answer.
func (w *worker) fetch(ctx context.Context, cons jetstream.Consumer, lane int, o pullOpts) (jetstream.Msg, error) {
	m, err := w.pulls.take(ctx, cons, o)
	if m != nil || ctx.Err() == nil { // not a request the agent's stop ended
		w.asked.count(lane, m, err)
	}
	return m, err
}

// serve is one worker of queue l: take a task, run it, repeat until ctx
// ends.
func (a *Agent) serve(ctx, taskCtx context.Context, l *lanes, w *worker, log zerolog.Logger) {
	var failing fetchFailures
	for ctx.Err() == nil {
		m, err := a.next(ctx, l, w, log)
		if err != nil {
			if ctx.Err() == nil {
				pause, quiet := failing.failed(err, time.Now())
				ev := log.Warn()
				if quiet {
					ev = log.Debug()
				}
				ev.Err(err).Int("failures", failing.count).Dur("retry_in", pause).Msg("fetch task")
				a.rebindIfGone(ctx, l, false, log)
				select {
				case <-time.After(pause):
				case <-ctx.Done():
				}
			}
			continue
		}
		if lasted, said := failing.over(time.Now()); said {
			log.Info().Dur("after", lasted).Msg("fetching tasks again")
		}
		switch {
		case m == nil:
		case ctx.Err() != nil: // arrived as we stopped: hand it back
			_ = m.Nak()
		default:
			l.inFlight.Inc()
			a.runTask(taskCtx, m)
			l.inFlight.Dec()
		}
	}
}

// A worker whose fetch failed tries again after a pause that starts
// short and doubles: on a cluster a consumer's leader moves (a node
// restarts, a rolling upgrade), its pulls end ("leadership change", no
// heartbeats, nobody answering for a moment), and its new leader serves
// them again within moments. A worker that waited a whole second let the
// queue's tasks wait as long. Such a move, seen by every idle worker of
// every queue at once, is said at debug level unless it lasts; any other
// failure is a warning.
const (
	firstFetchPause = 50 * time.Millisecond
	maxFetchPause   = time.Second
	// quietFailures is how long a streak of leader moves' failures is
	// said at debug level.
	quietFailures = 5 * time.Second
)

// fetchFailures is a worker's streak of failed fetches.
type fetchFailures struct {
	count int
	since time.Time // the streak's first failure
	loud  bool      // a failure of the streak was a warning
}

// failed counts a failed fetch at now and returns the pause before the
// next, and whether the failure is said quietly.
func (f *fetchFailures) failed(err error, now time.Time) (pause time.Duration, quiet bool) {
	if f.count == 0 {
		f.since = now
	}
	f.count++
	pause = min(maxFetchPause, firstFetchPause<<min(f.count-1, 5))
	quiet = leaderMoving(err) && now.Sub(f.since) < quietFailures
	f.loud = f.loud || !quiet
	return pause, quiet
}

// over ends a streak at a fetch that succeeded at now: how long it
// lasted, and whether that is worth saying (a warning was).
func (f *fetchFailures) over(now time.Time) (lasted time.Duration, said bool) {
	if f.count == 0 {
		return 0, false
	}
	lasted, said = now.Sub(f.since), f.loud
	*f = fetchFailures{}
	return lasted, said
}

// leaderMoving reports whether a fetch's failure is what a consumer's
// leader moving looks like to a pull.
func leaderMoving(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerLeadershipChanged) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrNoResponders)
}

// rebindIfGone binds a lane's consumer again (making it again unless
// BindOnly) if it is gone: deleted under the agent (by hand, by a tool,
// or with its stream), after which every fetch fails ("consumer deleted",
// then "no responders") and the queue's tasks would wait for ever. It is
// asked after a fetch failed; one worker of the queue does it at a time,
// the others go on (and fail, and ask again after their pause: 50 ms,
// doubling up to a second).
func (a *Agent) rebindIfGone(ctx context.Context, l *lanes, bulk bool, log zerolog.Logger) {
	i, d := 0, bus.Durables{TaskAckWait: a.cfg.AckWait, MaxDeliver: a.cfg.MaxDeliver}
	spec := bus.AgentQueueConsumer(d, l.queue)
	if bulk {
		i, spec = 1, bus.AgentBulkQueueConsumer(d, l.queue)
	}
	if !l.rebinding[i].CompareAndSwap(false, true) {
		return
	}
	defer l.rebinding[i].Store(false)
	actx, cancel := context.WithTimeout(ctx, bindAttempt)
	defer cancel()
	if _, err := a.js.Consumer(actx, spec.Stream, spec.Config.Durable); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return // there, or not known to be gone
	}
	log = log.With().Str("consumer", spec.Config.Durable).Logger()
	log.Warn().Msg("the queue's consumer is gone (deleted?): binding it again")
	cons, err := bus.Bind(actx, a.js, !a.cfg.BindOnly, spec, nil)
	if err != nil {
		log.Warn().Err(err).Msg("bind the queue's consumer again; trying again at the next failed fetch")
		return
	}
	if bulk {
		l.setBulk(cons)
	} else {
		l.setNormal(cons)
	}
}
