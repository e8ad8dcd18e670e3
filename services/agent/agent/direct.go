package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// Reports handed straight to the dispatcher (docs/adr/0009). A final
// report about a task whose dispatcher takes them goes to the holder of
// the execution's partition as a core NATS request; that dispatcher
// records it and answers, and the agent acknowledges the task. Without
// that answer the report is stored on the results stream before the task
// is acknowledged, as before direct reports: either way a task leaves its
// queue only once its report is in the history or on the results stream.
//
// The answers come on one subscription of the agent's, on its own answer
// subjects (bus.AnswersPrefix), and one goroutine (sweep) keeps the tasks
// waiting for theirs alive and stores the reports not answered in time: a
// report costs no goroutine, timer or subscription of its own, and the
// worker that ran the operation takes its next task at once, as after
// storing a report.

// deliver reports a task's final result, id its CloudEvent id, and lets
// the task go: handed straight to its dispatcher when it takes direct
// reports, otherwise stored on the results stream and the task
// acknowledged. A report handed straight is settled when its answer
// comes (settle), or when none came in time (sweep).
func (a *Agent) deliver(ctx context.Context, m jetstream.Msg, task *events.Task, id string, p events.Payload, log zerolog.Logger) {
	if !a.cfg.NoDirectReports && !a.direct.paused() {
		req, err := a.directRequest(task, id, p)
		if err == nil {
			_, err = a.direct.send(a.js.Conn(), req, &waiting{m: m, id: id, p: p, log: log})
		}
		if err == nil {
			return
		}
		if !errors.Is(err, errNoDirect) {
			log.Warn().Err(err).Msg("report not handed directly: stored on the results stream")
		}
	}
	a.finish(m, a.report(ctx, id, p), log)
}

// errNoDirect: the task's dispatcher takes no direct reports.
var errNoDirect = errors.New("no direct reports")

// directRequest is the request that hands report p (CloudEvent id) about
// task straight to the holder of its execution's partition. errNoDirect:
// its dispatcher does not take direct reports.
func (a *Agent) directRequest(task *events.Task, id string, p events.Payload) (*nats.Msg, error) {
	if task.Partitions <= 0 || a.direct.inbox == "" {
		return nil, errNoDirect
	}
	msg, err := a.resultMsg(id, p)
	if err != nil {
		return nil, err
	}
	msg.Subject = bus.DirectResultSubject(task.Queue, partition.Of(task.ExecutionID, task.Partitions), task.ExecutionID)
	msg.Header.Set(bus.DirectWaitHeader, strconv.FormatInt(a.cfg.DirectWait.Milliseconds(), 10))
	return msg, nil
}

// waiting is a report handed straight to a dispatcher, waiting for the
// answer: a final report, whose task is then acknowledged (m), or a
// question whose answer goes to ch.
type waiting struct {
	m     jetstream.Msg
	id    string
	p     events.Payload
	log   zerolog.Logger
	ch    chan *nats.Msg
	sent  time.Time
	alive time.Time // when the task was last kept alive
}

// direct is the agent's side of direct reports: those waiting for their
// answers, and when direct reports are paused.
type direct struct {
	until    atomic.Int64 // unix nanoseconds: no direct report before then
	answered atomic.Int64 // unix nanoseconds: when the last answer came

	inbox string // answers come on inbox.<n>
	mu    sync.Mutex
	next  uint64
	wait  map[uint64]*waiting
	// settling counts the reports taken from wait and not settled yet
	// (their tasks not acknowledged): the agent stops once none is.
	settling sync.WaitGroup
}

// listen subscribes to the answers of the reports this agent hands
// straight to dispatchers, on its own answer subjects; settle handles
// each. An agent that hands no final report straight still asks with the
// started report of a task delivered again (attemptOver).
func (a *Agent) listen() (*nats.Subscription, error) {
	nc := a.js.Conn()
	// The inbox names the agent's identity (auth.Inbox), to which its
	// credentials give the answer subjects: jf.answers.<inbox>.<nuid>.
	a.direct.inbox, a.direct.wait = bus.AnswersPrefix+"."+nc.NewInbox(), map[uint64]*waiting{}
	sub, err := nc.Subscribe(a.direct.inbox+".*", a.settle)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the answers of direct reports: %w", err)
	}
	// Answers come as fast as tasks end: the default pending limits are
	// the bound, beyond which an answer is dropped and its report stored.
	return sub, nil
}

// send hands req straight to a dispatcher; w waits for its answer, n.
func (d *direct) send(nc *nats.Conn, req *nats.Msg, w *waiting) (n uint64, err error) {
	w.sent = time.Now()
	w.alive = w.sent
	d.mu.Lock()
	d.next++
	n = d.next
	d.wait[n] = w
	d.mu.Unlock()
	req.Reply = d.inbox + "." + strconv.FormatUint(n, 10)
	if err := nc.PublishMsg(req); err != nil {
		if d.take(n, nil) != nil {
			d.settling.Done()
		}
		return 0, err
	}
	return n, nil
}

// noResponders reports whether ans is NATS's word that nobody listens on
// the subject a request was sent on (no dispatcher holds the partition).
func noResponders(ans *nats.Msg) bool { return len(ans.Data) == 0 && ans.Header.Get("Status") == "503" }

// take removes and returns the report waiting for answer n, if it is
// one that ok (nil: any) takes (nil: none, or it was taken already);
// whoever takes one settles it, then calls settling.Done.
func (d *direct) take(n uint64, ok func(*waiting) bool) *waiting {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.wait[n]
	if w == nil || (ok != nil && !ok(w)) {
		return nil
	}
	delete(d.wait, n)
	d.settling.Add(1)
	return w
}

// settle handles the answer to a direct report: recorded, the task is
// acknowledged; anything else (a refusal, NATS's "no responders" when no
// dispatcher listens), the report is stored first. A question's answer
// goes to its asker.
func (a *Agent) settle(ans *nats.Msg) {
	n, err := strconv.ParseUint(ans.Subject[strings.LastIndexByte(ans.Subject, '.')+1:], 10, 64)
	if err != nil {
		return
	}
	nobody := noResponders(ans)
	if !nobody {
		a.direct.answered.Store(time.Now().UnixNano()) // a dispatcher answers, late or not
	}
	recorded := ans.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded
	w := a.direct.take(n, func(w *waiting) bool {
		// "Recorded" only for its own report: an answer can be made up
		// by anyone who knows the subject (it stores nothing when it
		// says not recorded).
		return !recorded || ans.Header.Get(bus.DirectReportHeader) == w.id
	})
	if w == nil {
		return // settled already (stored after no answer in time), or not its answer
	}
	switch {
	case w.ch != nil:
		w.ch <- ans // buffered
		a.direct.settling.Done()
	case nobody:
		a.store(w, "no dispatcher holds the partition now")
	case recorded:
		a.finish(w.m, nil, w.log)
		a.direct.settling.Done()
	default:
		a.store(w, "refused: "+string(ans.Data))
	}
}

// store stores a report that was not recorded directly, and then
// acknowledges its task, on a goroutine of its own (a store may wait a
// minute for a stream's leader), keeping the task alive meanwhile.
func (a *Agent) store(w *waiting, why string) {
	w.log.Debug().Str("reason", why).Msg("report not recorded directly: stored on the results stream")
	_ = w.m.InProgress() // at once: its last sign of life may be a heartbeat period old
	go func() {
		defer a.direct.settling.Done()
		stop := a.keepAlive(w.m, w.log)
		defer stop()
		a.finish(w.m, a.report(context.Background(), w.id, w.p), w.log)
	}()
}

// keepAlive tells JetStream every heartbeatEvery that the task of m is
// still in hand, until stop is called. A timer, not a goroutine: a task
// that ends before its first beat, most of them, costs no goroutine (one
// per task was one per step, created and woken to exit).
func (a *Agent) keepAlive(m jetstream.Msg, log zerolog.Logger) (stop func()) {
	every := a.heartbeatEvery()
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock() // t is set before its first beat reads it
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped { // fired as stop came: the task is settled
			return
		}
		if err := m.InProgress(); err != nil {
			log.Warn().Err(err).Msg("heartbeat")
		}
		t.Reset(every)
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// sweep keeps the tasks whose reports wait for their answers alive, and
// stores the reports that waited DirectWait. A report nobody answered in
// time, while no other got an answer either, pauses direct reports (see
// directPause). Once stop is closed (no worker hands reports any more),
// it returns when none waits and every one taken is settled.
func (a *Agent) sweep(stop <-chan struct{}) {
	every := min(a.heartbeatEvery(), a.cfg.DirectWait/4)
	t := time.NewTicker(max(every, time.Millisecond))
	defer t.Stop()
	stopping := false
	for {
		select {
		case <-stop:
			stop, stopping = nil, true
			continue
		case <-t.C:
		}
		now := time.Now()
		var late []*waiting
		var alive []jetstream.Msg
		a.direct.mu.Lock()
		for n, w := range a.direct.wait {
			switch {
			case w.ch != nil: // a question: its asker waits for it
			case now.Sub(w.sent) >= a.cfg.DirectWait:
				delete(a.direct.wait, n)
				a.direct.settling.Add(1)
				late = append(late, w)
			case now.Sub(w.alive) >= a.heartbeatEvery():
				w.alive = now
				alive = append(alive, w.m)
			}
		}
		a.direct.mu.Unlock()
		for _, m := range alive {
			_ = m.InProgress()
		}
		for _, w := range late {
			if a.direct.answered.Load() < w.sent.UnixNano() && a.direct.pause(now) {
				a.log.Warn().Str("direct_wait", a.cfg.DirectWait.String()).Str("pause", directPause.String()).
					Msg("no dispatcher answered the reports handed to it directly within -direct-wait: reports are stored on the results stream for a while " +
						"(dispatchers stopped or stuck, agent credentials issued before direct reports: issue them again, or a -direct-wait too short for this machine)")
			}
			a.store(w, "no answer in time")
		}
		if stopping && a.direct.waiting() == 0 {
			a.direct.settling.Wait()
			return
		}
	}
}

// waiting counts the reports waiting for their answers.
func (d *direct) waiting() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.wait)
}

// ask hands req, the report whose CloudEvent id is id, straight to a
// dispatcher and waits up to DirectWait for the answer (nil: none came,
// or NATS said no dispatcher listens).
func (a *Agent) ask(ctx context.Context, req *nats.Msg, id string) *nats.Msg {
	w := &waiting{ch: make(chan *nats.Msg, 1), id: id}
	n, err := a.direct.send(a.js.Conn(), req, w)
	if err != nil {
		return nil
	}
	t := time.NewTimer(a.cfg.DirectWait)
	defer t.Stop()
	select {
	case ans := <-w.ch:
		if noResponders(ans) {
			return nil
		}
		return ans
	case <-t.C:
	case <-ctx.Done():
	}
	if a.direct.take(n, nil) != nil {
		a.direct.settling.Done()
	}
	return nil
}

// directPause is how long an agent stores every final report once direct
// reports went unanswered, none answered since the first of them was
// sent: its credentials do not let it hand them (a permission violation
// is no error a request sees: each would wait DirectWait), or its
// dispatchers are stuck. A report that one dead dispatcher took with it
// while others answer pauses nothing: it is stored after DirectWait.
const directPause = 30 * time.Second

func (d *direct) paused() bool { return time.Now().UnixNano() < d.until.Load() }

// pause pauses direct reports from now (only sweep calls it); it reports
// whether they were not paused already.
func (d *direct) pause(now time.Time) bool {
	was := d.until.Load()
	d.until.Store(now.Add(directPause).UnixNano())
	return was < now.UnixNano()
}

// attemptOver asks the dispatcher whether the attempt of a task delivered
// again (delivery) is over: it hands the operation's started report
// straight to the dispatcher, which records it and answers whether the
// attempt is still in flight. An earlier delivery's report may have been
// recorded that way, and its task not acknowledged: such a task is not
// run again (its step may have gone on, past its lock). It asks whenever
// the task says its dispatcher takes direct reports, whatever this
// agent's own setting or pause (another agent may have reported so), and
// only an answer decides: without one (no dispatcher holds the partition,
// a refusal, no answer) it asks again, the task kept alive, for as long
// as it takes: no operation's result can be recorded without a
// dispatcher anyway. Only an agent that never had an answer since it
// started, asking for askFor, runs the operation then, as before direct
// reports, with a warning: its credentials may not let it ask. A stopping
// agent hands the task back.
func (a *Agent) attemptOver(ctx context.Context, task *events.Task, ref events.TaskRef, delivery int, log zerolog.Logger) attempt {
	began := time.Now()
	warned := false
	for backoff := 50 * time.Millisecond; ; backoff = min(backoff*2, time.Second) {
		id := startedReportID(task.TaskID, delivery)
		req, err := a.directRequest(task, id, &events.OperationStarted{TaskRef: ref, StartedAt: time.Now().UTC()})
		if err != nil {
			return attemptRun // its dispatcher takes no direct reports: none was recorded so
		}
		if ans := a.ask(ctx, req, id); ans != nil && ans.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded {
			if ans.Header.Get(bus.DirectAttemptHeader) == bus.DirectAttemptOver {
				return attemptOver
			}
			return attemptRun
		}
		if time.Since(began) >= a.askFor() {
			if a.direct.answered.Load() == 0 {
				log.Warn().Str("asked_for", a.askFor().String()).
					Msg("no dispatcher ever answered this agent: running a task delivered again without knowing whether an earlier delivery was recorded (no dispatcher holds the execution's partition: see the dispatchers' partition logs; or agent credentials issued before direct reports: issue them again)")
				return attemptRun
			}
			if !warned {
				warned = true
				log.Warn().Str("asked_for", a.askFor().String()).Msg("no dispatcher says whether an earlier delivery of this task was recorded: asking on")
			}
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return attemptHandBack
		case <-a.stopping:
			return attemptHandBack
		}
	}
}

// attempt is what attemptOver found.
type attempt int

const (
	attemptRun      attempt = iota // run the operation
	attemptOver                    // acknowledge the task without running it
	attemptHandBack                // stopping: hand the task back
)

// askFor is how long an agent that never had an answer asks attemptOver's
// question before it runs the task: long enough for a partition to move
// to another dispatcher (a second or two), at most half a minute.
func (a *Agent) askFor() time.Duration {
	return min(max(10*a.cfg.DirectWait, 3*time.Second), 30*time.Second)
}
