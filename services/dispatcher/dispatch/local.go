package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/interp"
	"jetflow.dev/services/internal/builtin"
)

// Local steps (docs/adr/0014): an operation step with local: true runs
// in the dispatcher that holds its execution's partition, not on an
// agent. Its dispatch is recorded before it runs, as any operation's
// (step.dispatched, or the previous step's success carrying it); no task
// is published; its result is handed to the execution's turns as a
// report would be (localMsg), and recorded with the step's next event,
// which carries the next dispatch too: one append per step.
//
// A local step runs at least once: a step the history shows sending
// (its dispatcher stopped, or lost the partition, before its result was
// recorded) is run again by whoever decides about it next, not looked
// for. Only noop, log, and call steps whose handlers a dispatcher
// registers may be local, a call only when it says idempotent: yes
// (pkg/workflow checks it).

// localOps runs the local steps of a dispatcher.
type localOps struct {
	handlers map[string]operation.Handler
	// inline: the handlers run in the worker that decided the step (the
	// built-in noop and log, which return at once); the others run on a
	// goroutine of their own, at most cap(slots) at once.
	inline map[string]bool
	slots  chan struct{}

	// ctx is Run's (the runs end with it), queue hands a job to the
	// workers; both set by start.
	ctx   context.Context
	queue func(job)
	// goroutines counts the runs on goroutines of their own, which Run
	// waits for (a while) when it stops.
	goroutines sync.WaitGroup
	// over is set once Run has returned: a report handed back before
	// then and due again after it is dropped.
	over atomic.Bool

	mu      sync.Mutex
	running map[string]*localRun // by task id: running, or its report waiting for its turn
	// unnudged are the partitions for which a run cut short could not ask
	// for its step to run again: the next release of each is not handed
	// over (takeUnnudged), so that its next holder looks for the step.
	unnudged map[int]bool
}

type localRun struct {
	exec, workflow string
	cancel         context.CancelCauseFunc
	// Guarded by localOps.mu. stopped: cut short by a release of its
	// partition; a decision taken here again runs the step anew. ran: its
	// handler was called (a run waiting for a slot, or one with no
	// handler, never ran it). counted: counted in
	// jetflow_dispatcher_local_runs_again_total, once at most.
	stopped, ran, counted bool
	// nudge asks, once, for the run's execution to be decided about again
	// (nudgeOnce); nudged says whether that was published.
	nudge  sync.Once
	nudged bool
}

func newLocalOps(cfg Config, log zerolog.Logger) *localOps {
	l := &localOps{
		handlers: map[string]operation.Handler{workflow.KindNoop: builtin.Noop, workflow.KindLog: builtin.Log(log)},
		inline:   map[string]bool{workflow.KindNoop: true, workflow.KindLog: true},
		slots:    make(chan struct{}, cfg.LocalConcurrency),
		running:  map[string]*localRun{},
		unnudged: map[int]bool{},
	}
	for name, h := range cfg.LocalHandlers {
		l.handlers[name] = h
		delete(l.inline, name)
	}
	return l
}

// start is called by Run before any message is handled.
func (l *localOps) start(ctx context.Context, queue func(job)) { l.ctx, l.queue = ctx, queue }

// wait waits up to d for the runs on goroutines of their own to end
// (their contexts ended with Run's).
func (l *localOps) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { l.goroutines.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// errStopped ends a local run whose dispatcher no longer holds its
// execution's partition: the next holder runs it again.
var errStopped = errors.New("the dispatcher stopped running the execution")

// runLocal runs the local operation of e, and returns the task as stored
// at once (the state notes it sent, and waits for its result). A run
// still going on (or whose result waits for its turn) is not started
// twice. Nothing runs for an execution whose partition this dispatcher
// does not hold (a clear-lock handled here decides about executions of
// other partitions; a lease whose renewal is late): its holder is nudged
// to run it, and the step is noted sent.
func (d *Dispatcher) runLocal(x *execState, e interp.PublishTask) interp.Outcome {
	l := d.local
	if l.ctx == nil {
		return nil
	}
	at := d.cfg.Now()
	stored := interp.TaskStored{Task: e, At: at}
	if _, held := d.holds(x.id); !held {
		// Noted sent here all the same, or the next decision would take
		// the same turn again: the holder reads the history, and a
		// reconcile here forgets a step noted so and not running.
		d.nudge(x.id, x.workflow)
		return stored
	}
	t := e.Task
	l.mu.Lock()
	r, ok := l.running[t.TaskID]
	if ok && !r.stopped {
		l.mu.Unlock()
		return stored
	}
	if ok {
		// A run stopped by a release whose handler ended before it
		// noticed: its report may still be handled, and this run is one
		// more (one still going on counts itself when it sees the stop).
		d.countAgainLocked(r)
	}
	ctx, cancel := context.WithCancelCause(l.ctx)
	run := &localRun{exec: x.id, workflow: x.workflow, cancel: cancel}
	l.running[t.TaskID] = run
	l.mu.Unlock()
	h, ok := l.handlers[t.Kind]
	if !ok {
		cancel(nil)
		err := fmt.Errorf("dispatcher %s has no local handler for operation %q (register it in dispatch.Config.LocalHandlers of every dispatcher)", d.cfg.Member, t.Kind)
		d.cfg.Metrics.localRun(err, false)
		d.handLocal(d.localReport(t, at, time.Time{}, nil, err, true), run, 0)
		return stored
	}
	do := func() {
		defer cancel(nil)
		l.mu.Lock()
		run.ran = true
		l.mu.Unlock()
		began := time.Now()
		out, err := operation.Run(ctx, h, operation.Task{TaskID: t.TaskID, ExecutionID: t.ExecutionID, Workflow: t.Workflow,
			StepID: t.StepID, Attempt: t.Attempt, Delivery: 1, Kind: t.Kind, Spec: t.Spec, Input: operation.InputOf(t.Spec)})
		cause := context.Cause(ctx)
		stopped := errors.Is(cause, errStopped) || l.ctx.Err() != nil
		d.cfg.Metrics.localRun(err, stopped)
		if stopped {
			d.cutShort(t.ExecutionID, t.Workflow, run, t.TaskID)
			return
		}
		if err != nil && cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w after running %s (%w)", cause, time.Since(began).Round(time.Millisecond), err)
		}
		d.handLocal(d.localReport(t, at, began, out, err, false), run, 0)
	}
	if l.inline[t.Kind] {
		do()
		return stored
	}
	l.goroutines.Add(1)
	go func() {
		defer l.goroutines.Done()
		select {
		case l.slots <- struct{}{}:
		case <-ctx.Done():
			d.cutShort(t.ExecutionID, t.Workflow, run, t.TaskID)
			return
		}
		defer func() { <-l.slots }()
		if ctx.Err() != nil { // a slot and the end at once: select chose the slot
			d.cutShort(t.ExecutionID, t.Workflow, run, t.TaskID)
			return
		}
		do()
	}()
	return stored
}

// cutShort forgets a run whose result will not be recorded here (its
// dispatcher stops, or no longer holds the partition), and asks the
// partition's next holder, perhaps this dispatcher again, to decide
// about its execution at once, which runs the step again: without it the
// execution would wait for the janitor to find it idle. A dispatcher
// that dies cannot: the one that takes its partitions looks for such
// executions (rescue.go).
//
// The nudge comes before the run is forgotten: a release looking for the
// partition's runs meanwhile finds this one and waits for its nudge
// (nudgeOnce), and one that failed leaves its partition's release not
// handed over (localOps.unnudged).
func (d *Dispatcher) cutShort(exec, wf string, run *localRun, taskID string) {
	d.local.mu.Lock()
	d.countAgainLocked(run)
	d.local.mu.Unlock()
	d.nudgeOnce(run, exec, wf)
	d.local.forget(taskID, run)
}

// nudgeOnce nudges execution exec of workflow wf for run, unless that
// was done for run already (by the release that stopped it, then at its
// end), and reports whether the nudge was published. A second call
// waits for the first's.
func (d *Dispatcher) nudgeOnce(run *localRun, exec, wf string) bool {
	run.nudge.Do(func() {
		run.nudged = d.nudge(exec, wf)
		if !run.nudged {
			d.local.mu.Lock()
			d.local.unnudged[d.partitionOf(exec)] = true
			d.local.mu.Unlock()
		}
	})
	return run.nudged
}

// countAgainLocked counts run in jetflow_dispatcher_local_runs_again_total
// if its handler ran and it was not counted before: a run whose step runs
// again, or ran again already. One that never reached its handler is no
// run more than the steps. Called with localOps.mu held.
func (d *Dispatcher) countAgainLocked(run *localRun) {
	if run.ran && !run.counted {
		run.counted = true
		d.cfg.Metrics.again()
	}
}

// nudge asks the holder of an execution's partition to decide about it
// again (a reconcile in its inbox, under a new id each time), for a
// local step that was not run here, or whose run was cut short.
func (d *Dispatcher) nudge(exec, wf string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p := &events.ReconcileExecution{ExecutionID: exec, Workflow: wf, Reason: "a local step is to run at the partition's holder"}
	if err := d.publishOwn(ctx, "reconcile-local-"+exec+"-"+newToken()[:8], exec, wf, p); err != nil {
		d.log.Warn().Err(err).Str("execution_id", exec).
			Msg("a local step is to run at its partition's holder, which could not be nudged: the janitor will find the execution idle")
		return false
	}
	return true
}

// localReport is the report of a local run of t, which began at began
// (zero: it did not run), as an agent would make it.
func (d *Dispatcher) localReport(t events.Task, sent, began time.Time, out any, err error, final bool) events.Event {
	ref := t.Ref("local@"+d.cfg.Member, 1) // who ran it: this dispatcher
	ref.StoredAt = sent.UTC()
	var p events.Payload
	if err == nil {
		raw, merr := operation.EncodeOutput(out)
		if merr == nil {
			p = &events.OperationSucceeded{TaskRef: ref, Output: d.fitOutput(raw), Duration: time.Since(began).Milliseconds(), StartedAt: began.UTC()}
		}
		err = merr
	}
	if err != nil {
		msg, raw := operation.Failed(err)
		var startedAt time.Time
		if !began.IsZero() {
			startedAt = began.UTC()
		}
		p = &events.OperationFailed{TaskRef: ref, Error: msg, Output: d.fitOutput(raw), Final: final, StartedAt: startedAt}
	}
	ev := events.New(d.cfg.Source, t.ExecutionID, t.Workflow, d.cfg.Now(), p)
	ev.ID = t.TaskID + ".done.local"
	return ev
}

// fitOutput replaces an output too large for the step's event with a
// note saying so: the operation did run, and its status must be recorded.
func (d *Dispatcher) fitOutput(raw json.RawMessage) json.RawMessage {
	if limit := d.maxEvent / 2; len(raw) > limit {
		note, _ := json.Marshal(map[string]any{"output_dropped": true, "bytes": len(raw),
			"reason": fmt.Sprintf("the output is %d bytes; a local step's output may have at most %d", len(raw), limit)})
		return note
	}
	return raw
}

// handLocal hands a local run's report to its execution's turns, if this
// dispatcher still holds the execution's partition (if not, the run is
// cut short: its next holder runs the step again). tries counts the
// handings back before.
func (d *Dispatcher) handLocal(ev events.Event, run *localRun, tries int) {
	ref, _ := events.ResultRef(ev.Data)
	var from *consuming
	if d.local.ctx.Err() == nil {
		from = d.holding(d.partitionOf(ref.ExecutionID))
	}
	if from == nil {
		d.cutShort(ref.ExecutionID, ref.Workflow, run, ref.TaskID)
		return
	}
	d.local.queue(job{msg: &localMsg{d: d, ev: ev, run: run, task: ref.TaskID, tries: tries}, ev: ev, key: ref.ExecutionID, from: from})
}

// forget drops a run once its report is handled, or will not be (if
// it is still the task's: a run started since in its place stays).
func (l *localOps) forget(taskID string, run *localRun) {
	l.mu.Lock()
	if l.running[taskID] == run {
		delete(l.running, taskID)
	}
	l.mu.Unlock()
}

// has reports whether a run of the task is going on, or its report waits
// for its turn.
func (l *localOps) has(taskID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.running[taskID]
	return ok
}

// runs reports whether a local step of execution exec runs here, or its
// report waits for its turn.
func (l *localOps) runs(exec string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.running {
		if r.exec == exec && !r.stopped {
			return true
		}
	}
	return false
}

// kill ends the runs of an execution's local steps (of one task, if
// taskID is not empty) with cause; the runs report a failure.
func (l *localOps) kill(exec, taskID string, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, r := range l.running {
		if r.exec == exec && (taskID == "" || id == taskID) {
			r.cancel(cause)
		}
	}
}

// takeUnnudged reports, and forgets, whether a run of partition p could
// not be nudged since the last call.
func (l *localOps) takeUnnudged(p int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	was := l.unnudged[p]
	delete(l.unnudged, p)
	return was
}

// release ends the runs of the executions of a partition this
// dispatcher no longer holds, and returns them: its next holder runs them
// again, once nudged.
func (l *localOps) release(inPartition func(exec string) bool) []*localRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	var stopped []*localRun
	for _, r := range l.running {
		if inPartition(r.exec) {
			r.stopped = true
			r.cancel(errStopped)
			stopped = append(stopped, r)
		}
	}
	return stopped
}

// localMsg is a local run's report, seen by the handling as a consumer's
// message: acknowledged (handled) or terminated, the run is over; handed
// back, it is queued again after a while (longer each time, as a stored
// message's redeliveries), while the partition is held.
type localMsg struct {
	d     *Dispatcher
	ev    events.Event
	run   *localRun
	task  string
	tries int
}

var errLocal = errors.New("a local step's report is stored nowhere: it has no metadata")

func (m *localMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errLocal }
func (m *localMsg) Data() []byte                              { return nil }
func (m *localMsg) Headers() nats.Header                      { return nil }
func (m *localMsg) Subject() string                           { return "" }
func (m *localMsg) Reply() string                             { return "" }
func (m *localMsg) InProgress() error                         { return nil }
func (m *localMsg) Ack() error                                { m.d.local.forget(m.task, m.run); return nil }
func (m *localMsg) DoubleAck(context.Context) error           { return m.Ack() }
func (m *localMsg) Term() error                               { return m.Ack() }
func (m *localMsg) TermWithReason(string) error               { return m.Ack() }
func (m *localMsg) Nak() error                                { return m.NakWithDelay(0) }

// NakWithDelay queues the report again after delay, or after the retry
// policy's delay for its tries if that is longer.
func (m *localMsg) NakWithDelay(delay time.Duration) error {
	if m.d.local.ctx.Err() != nil { // stopping: the next holder runs it again, asked now
		ref, _ := events.ResultRef(m.ev.Data)
		m.d.cutShort(ref.ExecutionID, ref.Workflow, m.run, m.task)
		return nil
	}
	time.AfterFunc(max(delay, retryDelay(m.tries+1)), func() {
		if m.d.local.over.Load() {
			// Run has returned: the next holder finds the step (rescue.go),
			// or the janitor does, and runs it again.
			m.d.local.mu.Lock()
			m.d.countAgainLocked(m.run)
			m.d.local.mu.Unlock()
			return
		}
		m.d.handLocal(m.ev, m.run, m.tries+1)
	})
	return nil
}
