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
// The answers come on one subscription of the agent's (direct.answers),
// and one goroutine (direct.sweep) keeps the tasks waiting for theirs
// alive and stores the reports not answered in time: a report costs no
// goroutine, timer or subscription of its own, and the worker that ran the
// operation takes its next task at once, as after storing a report.

// deliver reports a task's final result, id its CloudEvent id, and lets
// the task go: handed straight to its dispatcher when it takes direct
// reports, otherwise stored on the results stream and the task
// acknowledged. A report handed straight is settled when its answer
// comes (settle), or when none came in time (sweep).
func (a *Agent) deliver(ctx context.Context, m jetstream.Msg, task *events.Task, id string, p events.Payload, log zerolog.Logger) {
	req, err := a.directRequest(task, id, p)
	if err == nil {
		if err = a.direct.send(a.js.Conn(), req, &waiting{m: m, id: id, p: p, log: log}); err == nil {
			return
		}
		log.Debug().Err(err).Msg("report not handed directly: stored on the results stream")
	} else if !errors.Is(err, errNoDirect) {
		log.Warn().Err(err).Msg("report not handed directly: stored on the results stream")
	}
	a.finish(m, a.report(ctx, id, p), log)
}

// waiting is a report handed straight to a dispatcher, waiting for the
// answer.
type waiting struct {
	m     jetstream.Msg
	id    string
	p     events.Payload
	log   zerolog.Logger
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
	// stored counts the reports being stored after no answer.
	stored sync.WaitGroup
}

// listen subscribes to the answers of the reports this agent hands
// straight to dispatchers; settle handles each. It returns the
// subscription, nil when the agent hands none.
func (a *Agent) listen() (*nats.Subscription, error) {
	if a.cfg.NoDirectReports {
		return nil, nil
	}
	nc := a.js.Conn()
	a.direct.inbox, a.direct.wait = nc.NewInbox(), map[uint64]*waiting{}
	sub, err := nc.Subscribe(a.direct.inbox+".*", a.settle)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the answers of direct reports: %w", err)
	}
	// Answers come as fast as tasks end: the default pending limits are
	// the bound, beyond which an answer is dropped and its report stored.
	return sub, nil
}

// send hands req straight to a dispatcher; w waits for its answer.
func (d *direct) send(nc *nats.Conn, req *nats.Msg, w *waiting) error {
	w.sent = time.Now()
	w.alive = w.sent
	d.mu.Lock()
	d.next++
	n := d.next
	d.wait[n] = w
	d.mu.Unlock()
	req.Reply = d.inbox + "." + strconv.FormatUint(n, 10)
	if err := nc.PublishMsg(req); err != nil {
		d.take(n)
		return err
	}
	return nil
}

// take removes and returns the report waiting for answer n (nil: none,
// or it was settled already).
func (d *direct) take(n uint64) *waiting {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.wait[n]
	delete(d.wait, n)
	return w
}

// settle handles the answer to a direct report: recorded, the task is
// acknowledged; anything else (a refusal, NATS's "no responders" when no
// dispatcher listens), the report is stored first.
func (a *Agent) settle(ans *nats.Msg) {
	n, err := strconv.ParseUint(ans.Subject[strings.LastIndexByte(ans.Subject, '.')+1:], 10, 64)
	if err != nil {
		return
	}
	w := a.direct.take(n)
	if w == nil {
		return // settled already: stored after no answer in time
	}
	if len(ans.Data) == 0 && ans.Header.Get("Status") == "503" { // NATS: no responders
		a.store(w, "no dispatcher holds the partition now")
		return
	}
	a.direct.answered.Store(time.Now().UnixNano())
	if ans.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded {
		a.finish(w.m, nil, w.log)
		return
	}
	a.store(w, "refused: "+string(ans.Data))
}

// store stores a report that was not recorded directly, and then
// acknowledges its task, on a goroutine of its own (a store may wait for
// a stream's leader).
func (a *Agent) store(w *waiting, why string) {
	w.log.Debug().Str("reason", why).Msg("report not recorded directly: stored on the results stream")
	a.direct.stored.Go(func() { a.finish(w.m, a.report(context.Background(), w.id, w.p), w.log) })
}

// sweep keeps the tasks whose reports wait for their answers alive, and
// stores the reports that waited DirectWait. A report nobody answered in
// time, while no other got an answer either, pauses direct reports (see
// directPause). Once stop is closed (no worker hands reports any more),
// it returns when none waits and those it stored are stored.
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
			case now.Sub(w.sent) >= a.cfg.DirectWait:
				delete(a.direct.wait, n)
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
				a.log.Warn().Dur("direct_wait", a.cfg.DirectWait).Dur("pause", directPause).
					Msg("no dispatcher answered the reports handed to it directly: reports are stored on the results stream for a while " +
						"(dispatchers stopped or stuck, or agent credentials issued before direct reports: issue them again)")
			}
			a.store(w, "no answer in time")
		}
		if stopping && a.direct.waiting() == 0 {
			a.direct.stored.Wait()
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

// errNoDirect: the task's dispatcher takes no direct reports, or this
// agent hands none.
var errNoDirect = errors.New("no direct reports")

// directRequest is the request that hands report p (CloudEvent id) about
// task straight to the holder of its execution's partition. errNoDirect:
// the report is not to be handed so.
func (a *Agent) directRequest(task *events.Task, id string, p events.Payload) (*nats.Msg, error) {
	if a.cfg.NoDirectReports || task.Partitions <= 0 || a.direct.paused() {
		return nil, errNoDirect
	}
	msg, err := a.resultMsg(id, p)
	if err != nil {
		return nil, err
	}
	msg.Subject = bus.DirectResultSubject(task.Queue, partition.Of(task.ExecutionID, task.Partitions), task.ExecutionID)
	return msg, nil
}

// request sends a direct report and waits up to DirectWait for the
// answer (the redelivery's question, attemptOver).
func (a *Agent) request(req *nats.Msg) (*nats.Msg, error) {
	answer, err := a.js.Conn().RequestMsg(req, a.cfg.DirectWait)
	if err == nil {
		a.direct.answered.Store(time.Now().UnixNano())
	}
	return answer, err
}

// directPause is how long an agent stores every report once direct
// reports went unanswered, none answered since the first of them was
// sent: its credentials do not let it hand them (a permission violation
// is no error a request sees: each would wait DirectWait), or its
// dispatchers are stuck. A report that one dead dispatcher took with it
// while others answer pauses nothing: it is stored after DirectWait.
const directPause = 30 * time.Second

func (d *direct) paused() bool { return time.Now().UnixNano() < d.until.Load() }

// pause pauses direct reports from now; it reports whether they were not
// paused already.
func (d *direct) pause(now time.Time) bool {
	was := d.until.Load()
	return d.until.CompareAndSwap(was, now.Add(directPause).UnixNano()) && was < now.UnixNano()
}

// attemptOver asks the dispatcher whether the attempt of a task delivered
// again (delivery) is over: its operation's started report, handed
// straight to the dispatcher, is recorded, and the answer says whether
// the attempt is still in flight. False when it cannot know (no direct
// reports, no answer): the operation then runs, as before direct reports.
func (a *Agent) attemptOver(ctx context.Context, task *events.Task, ref events.TaskRef, delivery int) bool {
	req, err := a.directRequest(task, startedReportID(task.TaskID, delivery), &events.OperationStarted{TaskRef: ref, StartedAt: time.Now().UTC()})
	if err != nil {
		return false
	}
	answer, err := a.request(req)
	return err == nil && answer.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded &&
		answer.Header.Get(bus.DirectAttemptHeader) == bus.DirectAttemptOver
}
