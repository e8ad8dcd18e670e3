package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/operation/builtin"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/interp"
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
	log    zerolog.Logger

	// ctx is Run's (the runs end with it), queue hands a job to the
	// workers; both set by start.
	ctx   context.Context
	queue func(job)

	mu      sync.Mutex
	running map[string]*localRun // by task id: running, or its report waiting for its turn
}

type localRun struct {
	exec   string
	cancel context.CancelCauseFunc
}

func newLocalOps(cfg Config, log zerolog.Logger) *localOps {
	l := &localOps{
		handlers: map[string]operation.Handler{workflow.KindNoop: builtin.Noop, workflow.KindLog: builtin.Log(log)},
		inline:   map[string]bool{workflow.KindNoop: true, workflow.KindLog: true},
		slots:    make(chan struct{}, cfg.LocalConcurrency),
		log:      log,
		running:  map[string]*localRun{},
	}
	for name, h := range cfg.LocalHandlers {
		l.handlers[name] = h
		delete(l.inline, name)
	}
	return l
}

// start is called by Run before any message is handled.
func (l *localOps) start(ctx context.Context, queue func(job)) { l.ctx, l.queue = ctx, queue }

// errStopped ends a local run whose dispatcher stops, or no longer holds
// its execution's partition: the next holder runs it again.
var errStopped = errors.New("the dispatcher stopped running the execution")

// runLocal runs the local operation of e, and returns the task as stored
// at once (the state notes it sent, and waits for its result). A run
// still going on (or whose result waits for its turn) is not started
// twice.
func (d *Dispatcher) runLocal(x *execState, e interp.PublishTask) interp.Outcome {
	l := d.local
	at := d.cfg.Now()
	stored := interp.TaskStored{Task: e, At: at}
	t := e.Task
	l.mu.Lock()
	if _, ok := l.running[t.TaskID]; ok || l.ctx == nil {
		l.mu.Unlock()
		return stored
	}
	ctx, cancel := context.WithCancelCause(l.ctx)
	l.running[t.TaskID] = &localRun{exec: x.id, cancel: cancel}
	l.mu.Unlock()
	h, ok := l.handlers[t.Kind]
	if !ok {
		cancel(nil)
		err := fmt.Errorf("dispatcher %s has no local handler for operation %q (register it in dispatch.Config.LocalHandlers of every dispatcher)", d.cfg.Member, t.Kind)
		d.handLocal(d.localReport(t, at, time.Time{}, nil, err, true))
		return stored
	}
	run := func() {
		defer cancel(nil)
		began := time.Now()
		out, err := operation.Run(ctx, h, operation.Task{TaskID: t.TaskID, ExecutionID: t.ExecutionID, Workflow: t.Workflow,
			StepID: t.StepID, Attempt: t.Attempt, Delivery: 1, Kind: t.Kind, Spec: t.Spec, Input: specInput(t.Spec)})
		cause := context.Cause(ctx)
		stopped := errors.Is(cause, errStopped) || l.ctx.Err() != nil
		d.cfg.Metrics.localRun(err, stopped)
		if stopped {
			l.forget(t.TaskID) // run again by whoever decides about the step next
			return
		}
		if err != nil && cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w after running %s (%w)", cause, time.Since(began).Round(time.Millisecond), err)
		}
		d.handLocal(d.localReport(t, at, began, out, err, false))
	}
	if l.inline[t.Kind] {
		run()
		return stored
	}
	go func() {
		select {
		case l.slots <- struct{}{}:
		case <-ctx.Done():
			l.forget(t.TaskID)
			return
		}
		defer func() { <-l.slots }()
		run()
	}()
	return stored
}

// specInput is a call step's input, from its spec.
func specInput(spec json.RawMessage) json.RawMessage {
	var s struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(spec, &s) != nil || len(s.Input) == 0 || string(s.Input) == "null" {
		return nil
	}
	return s.Input
}

// localReport is the report of a local run of t, which began at began
// (zero: it did not run), as an agent would make it.
func (d *Dispatcher) localReport(t events.Task, sent, began time.Time, out any, err error, final bool) events.Event {
	ref := t.Ref(d.cfg.Member, 1)
	ref.StoredAt = sent.UTC()
	var p events.Payload
	if err == nil {
		raw, merr := encodeOutput(out)
		if merr == nil {
			p = &events.OperationSucceeded{TaskRef: ref, Output: d.fitOutput(raw), Duration: time.Since(began).Milliseconds(), StartedAt: began.UTC()}
		}
		err = merr
	}
	if err != nil {
		var fail *operation.Failure
		var raw json.RawMessage
		if errors.As(err, &fail) {
			raw, _ = encodeOutput(fail.Output)
		}
		msg := err.Error()
		if len(msg) > 8<<10 {
			msg = msg[:8<<10] + "…"
		}
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

func encodeOutput(out any) (json.RawMessage, error) {
	if out == nil {
		return nil, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode operation output: %w", err)
	}
	return b, nil
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
// dispatcher still holds the execution's partition (if not, its next
// holder runs the step again).
func (d *Dispatcher) handLocal(ev events.Event) {
	ref, _ := events.ResultRef(ev.Data)
	from := d.holding(d.partitionOf(ref.ExecutionID))
	if from == nil || d.local.ctx.Err() != nil {
		from.done()
		d.local.forget(ref.TaskID)
		return
	}
	d.local.queue(job{msg: &localMsg{d: d, ev: ev, task: ref.TaskID}, ev: ev, key: ref.ExecutionID, from: from})
}

// forget drops a run once its report is handled, or will not be.
func (l *localOps) forget(taskID string) {
	l.mu.Lock()
	delete(l.running, taskID)
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

// release ends the runs of the executions of a partition this
// dispatcher no longer holds: its next holder runs them again.
func (l *localOps) release(inPartition func(exec string) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.running {
		if inPartition(r.exec) {
			r.cancel(errStopped)
		}
	}
}

// localMsg is a local run's report, seen by the handling as a consumer's
// message: acknowledged (handled) or terminated, the run is over; handed
// back, it is queued again after a while, while the partition is held.
type localMsg struct {
	d    *Dispatcher
	ev   events.Event
	task string
}

var errLocal = errors.New("a local step's report is stored nowhere: it has no metadata")

func (m *localMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errLocal }
func (m *localMsg) Data() []byte                              { return nil }
func (m *localMsg) Headers() nats.Header                      { return nil }
func (m *localMsg) Subject() string                           { return "" }
func (m *localMsg) Reply() string                             { return "" }
func (m *localMsg) InProgress() error                         { return nil }
func (m *localMsg) Ack() error                                { m.d.local.forget(m.task); return nil }
func (m *localMsg) DoubleAck(context.Context) error           { return m.Ack() }
func (m *localMsg) Term() error                               { return m.Ack() }
func (m *localMsg) TermWithReason(string) error               { return m.Ack() }
func (m *localMsg) Nak() error                                { return m.NakWithDelay(localAgain) }

// NakWithDelay queues the report again after delay.
func (m *localMsg) NakWithDelay(delay time.Duration) error {
	time.AfterFunc(delay, func() { m.d.handLocal(m.ev) })
	return nil
}

// localAgain is how soon a report handed back without a delay is queued
// again.
const localAgain = 100 * time.Millisecond
