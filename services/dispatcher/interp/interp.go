// Package interp is the dispatcher's interpreter: given an execution's
// pinned definition, its folded state and what just happened, it returns
// the events to append and the effects to perform. It is pure: no NATS, no
// clock (the time is an input), no logger and no randomness (a fresh token
// is an input; retry jitter is derived from the timer's id), so the same
// input always gives the same decision, and it is tested with tables and
// replayed histories without a server.
//
// A [Decision] is carried out by the dispatcher's shell in a fixed order:
// the Before effects (idempotent: a crash before the append repeats them),
// then the Events, each appended with the expected last sequence of the
// execution's history (the fence), then the After effects. An effect whose
// result the history must record (a task's stream sequence, a lock
// granted) is reported back with [Recorded], which returns the events that
// record it. Events come out final: retention, size limits and output
// rendering are decided here, never changed on the write path.
package interp

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Input is everything a decision depends on.
type Input struct {
	// ID and Workflow name the execution.
	ID, Workflow string
	// Def is the execution's pinned definition and State its folded
	// history. A decision may change State's steps while it is taken, and
	// puts them back before it returns (a look ahead: projections.Peek):
	// nothing else may read them meanwhile, as nothing else does the
	// dispatcher's state of an execution it holds.
	Def   workflow.Definition
	State projections.Execution
	// Memo is what earlier decisions on this execution learned (nil:
	// nothing kept); the caller keeps it with the state.
	Memo *Memo
	// Now is the time decisions count from (sleeps, timeouts, retries).
	Now time.Time
	// Token is a fresh, unguessable token, when a [NeedToken] asked for
	// one: a resume or a replay gives the execution a new one ("" otherwise).
	Token string
	// MaxEvent is the largest payload an event may have (0: no limit);
	// a larger output or input fails its step.
	MaxEvent int
	// Called holds the definitions of called workflows the caller has
	// loaded for a [NeedWorkflow]; a nil value means it is not registered.
	Called map[CalledRef]*Called
	// History is the execution's whole history, when a [NeedHistory]
	// asked for it (nil otherwise).
	History []events.Event
	// Stored are the final reports stored in the results stream for the
	// operations in flight (current attempt and token), by step, when a
	// [NeedStoredResults] asked for them (nil otherwise; empty if none).
	Stored map[string]events.Event
	// Claimed says whether the execution's id is claimed (its start was
	// accepted), when a [NeedClaim] asked (nil otherwise).
	Claimed *bool
	// StartChecks are the checks of starts a [NeedStartCheck] asked for,
	// by its ID: "" when the start passes, else why not (nil otherwise).
	StartChecks map[string]string
	// Holders are the holders of locks, by name, when a [NeedHolders]
	// asked for them (nil otherwise; an empty list: nobody holds it).
	Holders map[string][]events.LockEntry
	// SplitDispatch records an operation's schedule and its sending as
	// two events (StepScheduled, StepSending), as dispatchers before
	// StepDispatched did, for histories that older dispatchers may read
	// during a rolling upgrade.
	SplitDispatch bool
}

// Memo is kept by the caller with an execution's state between decisions.
type Memo struct {
	view view
	// retains: 1 if a step of the definition may set a retention, -1 if
	// none may, 0 not worked out yet.
	retains int
}

// CalledRef names a called workflow's version (0: the latest).
type CalledRef struct {
	Name    string
	Version int
}

// Called is a registered workflow a workflow step calls.
type Called struct {
	Name       string
	Version    int
	Definition workflow.Definition
}

// Decision is what to do for an execution now. The zero Decision means
// there is nothing to do until something happens outside (a result, a
// timer, a signal, a lock granted).
type Decision struct {
	// Before are performed before Events are appended.
	Before []Effect
	// Events are appended in order.
	Events []events.Payload
	// At, when set, is the time Events are recorded at (their CloudEvent
	// time), as the decision saw it: an input it rendered from the state
	// after them (a start's time, in a first dispatch) must agree with
	// what the history records. Zero: the time they are appended.
	At time.Time
	// After are performed once Events are appended.
	After []Effect
	// Need asks the caller to load something into the Input and decide
	// again; nothing else is set then.
	Need Need
	// Stale, on a decision about an agent's report, says why the report
	// is not about the step's current attempt (it is recorded ignored): the
	// caller must be sure its state is the whole history first.
	Stale string
	// Err is a decision that cannot be carried out (a bug, or a history
	// no decision can go on from): it is not retried.
	Err error
	// Reject refuses a command: its sender is told why; nothing else is set.
	Reject *Rejection
	// Retry says a command cannot be decided yet (what it names may not
	// be visible yet): it is handed back, to be decided again later.
	Retry string
	// Ignore says why a fact changes nothing and needs no decision after.
	Ignore string
}

// Empty reports whether d has nothing to carry out (no effect, event,
// need or error; a Reject, Retry or Ignore is for the caller to act on).
func (d Decision) Empty() bool {
	return len(d.Before) == 0 && len(d.Events) == 0 && len(d.After) == 0 && d.Need == nil && d.Err == nil
}

// Effect is something the shell does outside the history. The set is
// closed: ArmTimer, PublishTask, EnqueueLock, ReleaseLock, PublishKill,
// PublishClear, PublishStart, PublishAction and CatchUp.
type Effect interface{ effect() }

// ArmTimer publishes the durable schedule of a timer: at Due it fires the
// execution's FireTimer command. Arming the same TimerID again replaces
// the schedule (ids are deterministic), so it is idempotent.
type ArmTimer struct {
	TimerID string
	Due     time.Time
}

// PublishTask publishes an operation's task to its agents' queue,
// deduplicated by the task id; where it was stored ([TaskStored]) is
// noted in the dispatcher's state (projections.MarkSent) and recorded
// with the step's next event, or at once by io.jetflow.step.sent in
// compatibility mode ([Recorded]).
type PublishTask struct {
	Task events.Task
	// Others is how many other tasks of the execution are in flight on
	// the same queue (counted among its latest instances only, and up to
	// a cap: see othersOnQueue). The shell sends the task to the queue's
	// bulk lane when there are many, so that one execution's fan-out does
	// not queue ahead of every other execution's tasks. Where a task
	// waits is not part of the history: the count changes no decision.
	Others int
	// Since is when the attempt was recorded sending (at the latest):
	// the task may have been stored since then. Within the tasks stream's
	// dedupe window publishing it again stores nothing new; past it the
	// shell first looks for the task in its queue and for its reports.
	Since time.Time
	// Local: the shell runs the operation itself instead of publishing
	// the task (docs/adr/0014), at least once: a local step recorded
	// sending is run again, not looked for.
	Local bool
}

// EnqueueLock puts the current request of the scope at Path in the lock's
// queue (idempotent); if the scope is then a holder, that is recorded
// ([LockHeld]).
type EnqueueLock struct {
	Lock  string
	Limit int
	Path  string
}

// ReleaseLock removes the scope at Path, as of its request number Request,
// from the lock (promoting the first waiters); removing an entry that is
// not listed changes nothing.
type ReleaseLock struct {
	Lock    string
	Path    string
	Request int
	Reason  string
}

// PublishKill tells agents to terminate the execution's running
// operations (Command: the command that asked, for deduplication); with
// Ended, to refuse its tasks that have not started (it ended with
// operations still with them) and let the running ones finish; with
// TaskID, to terminate that attempt (Reason: why) and refuse its task;
// with Lift, that its new tasks may run again.
type PublishKill struct {
	Command string
	Lift    bool
	Ended   bool
	TaskID  string
	Reason  string
	// Tokens are the execution tokens of the tasks out when the
	// execution was killed or ended (runTokens): agents terminate and
	// refuse only tasks carrying one of them.
	Tokens []string
}

// PublishClear hands a clear-lock command (a clear-lock step's) to the
// dispatchers, deduplicated by ID: each entry is then removed from the
// lock and lock.cleared recorded in its execution's history, as for an
// operator's clear.
type PublishClear struct {
	ID    string
	Clear events.ClearLock
}

// runTokens are the tokens the execution's tasks out carry: its own, and
// the older ones of attempts sent before a resume that are still out.
func runTokens(s projections.Execution) []string {
	out := []string{s.Token}
	for _, st := range s.Steps {
		if st.Status.InFlight() {
			if t := taskToken(s, st); !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}

// endedNotice is the notice that refuses the tasks of an execution that
// ends in state s (before its end) with operations still with the agents,
// if it has some: they are then of no use, until a resume. Published
// after the end is recorded (an end that is not recorded must not refuse
// anything); command is the key of the command that ended it, if one did.
func endedNotice(s projections.Execution, command string) []Effect {
	if !slices.ContainsFunc(s.Steps, func(st projections.Step) bool { return st.Status.InFlight() }) {
		return nil
	}
	return []Effect{PublishKill{Ended: true, Command: command, Tokens: runTokens(s)}}
}

// CatchUp fires the execution's timers that came due and records the
// results of its operations that arrived while nothing recorded them (the
// execution was over, or damaged): after a resume or a replay.
type CatchUp struct{}

func (ArmTimer) effect()     {}
func (PublishTask) effect()  {}
func (EnqueueLock) effect()  {}
func (ReleaseLock) effect()  {}
func (PublishKill) effect()  {}
func (PublishClear) effect() {}
func (PublishStart) effect() {}
func (CatchUp) effect()      {}

// Need is something a decision needs loaded into its Input.
type Need interface{ need() }

// NeedWorkflow asks for a called workflow's definition (Input.Called).
type NeedWorkflow struct{ Ref CalledRef }

// NeedHistory asks for the execution's whole history (Input.History).
type NeedHistory struct{}

// NeedToken asks for a fresh, unguessable token (Input.Token): rare
// (resumes and replays), so no other decision pays for making one.
type NeedToken struct{}

// NeedClaim asks whether the execution's id is claimed (Input.Claimed):
// a command for an execution whose history is still empty waits longer
// for a start that was accepted.
type NeedClaim struct{}

// NeedStoredResults asks for the reports of the operations in flight
// that are stored but not recorded (Input.Stored).
type NeedStoredResults struct{}

// NeedStartCheck asks for the check of a start, as its start handler will
// check it (Input.StartChecks[ID]): a continue-as-new step fails rather
// than record a successor that would not start.
type NeedStartCheck struct {
	ID    string
	Start events.StartExecution
}

// NeedHolders asks for the holders of lock Lock (Input.Holders): a
// clear-lock step records whom it clears.
type NeedHolders struct{ Lock string }

func (NeedWorkflow) need()      {}
func (NeedHistory) need()       {}
func (NeedStoredResults) need() {}
func (NeedHolders) need()       {}
func (NeedStartCheck) need()    {}
func (NeedToken) need()         {}
func (NeedClaim) need()         {}

// Outcome is what performing an effect found that the history records.
type Outcome interface{ outcome() }

// TaskStored: the task of PublishTask is stored at stream sequence Seq,
// since At.
type TaskStored struct {
	Task PublishTask
	Seq  uint64
	At   time.Time
}

// LockHeld: after EnqueueLock the scope is among the lock's holders.
type LockHeld struct{ Lock EnqueueLock }

func (TaskStored) outcome() {}
func (LockHeld) outcome()   {}

// Next decides what the execution does next. A step's success that it
// decides itself (a let's, a return's, a sleep's or a wait's end, a
// container's) carries what follows it, as an operation's success does
// (Result): the next operation's dispatch (docs/adr/0008) or the
// execution's end (docs/adr/0015), when that is the very next decision.
func Next(in Input) Decision {
	d := in.carry(in.decide(in.State))
	if len(d.Events) != 1 || len(d.Before)+len(d.After) > 0 {
		return d
	}
	if ok, isOK := d.Events[0].(*events.StepSucceeded); isOK && ok.Then == nil {
		d.Events = []events.Payload{in.carried(ok)}
	}
	return d
}

// carried is what records the success ok: the execution's end carrying
// it, or ok carrying the next operation's dispatch (Input.after), or ok
// alone.
func (in Input) carried(ok *events.StepSucceeded) events.Payload {
	size := len(ok.Output)
	for _, v := range ok.Vars {
		size += len(v)
	}
	then, end := in.after(ok, size)
	if end != nil {
		return end
	}
	ok.Then = then
	return ok
}

// decide is the action for the execution in state s (its state, or the
// state one event further).
func (in Input) decide(s projections.Execution) action {
	var v *view
	if in.Memo != nil && len(s.Steps) > viewOver {
		// A small execution is cheaper to walk than to keep a view of. A
		// state one event further has the instances the view will see
		// next, and no item that event ends.
		v = &in.Memo.view
	}
	a := decideLockedIn(in.Def, s, v)
	if verifyView && v != nil {
		if b := decideLocked(in.Def, s); !reflect.DeepEqual(a, b) {
			panic(fmt.Sprintf("execution %s: with its view the decision is %+v, without it %+v", in.ID, a, b))
		}
	}
	return a
}

// Noted returns the state with the storing of a task noted
// (projections.MarkSent) and true, when o is a TaskStored that the
// history records with the step's next event: in every mode but
// SplitDispatch, in which Recorded returns its io.jetflow.step.sent. It
// notes it in place, in in.State's steps: the caller owns in.State and
// drops it for the state returned (see projections.ApplyOwned).
func Noted(in Input, o Outcome) (projections.Execution, bool) {
	t, ok := o.(TaskStored)
	if !ok || (in.SplitDispatch && !t.Task.Local) {
		// A local step's run is never recorded sent, even for older
		// dispatchers: a history that said sent would be waited on by
		// whoever reads it next, where the step must run again.
		return in.State, false
	}
	return projections.MarkSentOwned(in.State, t.Task.Task.StepID, t.Task.Task.Attempt, t.Seq, t.At.UTC()), true
}

// Recorded returns the events that record an effect's outcome.
func Recorded(in Input, o Outcome) Decision {
	switch o := o.(type) {
	case TaskStored:
		t := o.Task.Task
		return Decision{Events: []events.Payload{&events.StepSent{StepID: t.StepID, Attempt: t.Attempt, TaskID: t.TaskID, TaskSeq: o.Seq}}}
	case LockHeld:
		return Decision{Events: []events.Payload{&events.LockAcquired{Lock: o.Lock.Lock, Path: o.Lock.Path}}}
	}
	return Decision{Err: fmt.Errorf("unknown outcome %T", o)}
}

// Waiting returns the enqueueing, again, of every lock the execution waits
// for: a promotion in the bucket is then recorded, and a request the
// bucket lost (a crash between the append and the write) is made again.
func Waiting(in Input) Decision {
	if !in.State.Status.Active() {
		return Decision{}
	}
	var d Decision
	for _, l := range in.State.WaitingLocks() {
		d.After = append(d.After, EnqueueLock{Lock: l.Name, Limit: l.Limit, Path: l.Path})
	}
	return d
}

// Unlocking returns the release of a lock of an execution that stopped
// running (a force-cancel or a kill ends it without a decision), one at a
// time; the zero Decision when none is left.
func Unlocking(in Input) Decision {
	if in.State.Status.Active() {
		return Decision{}
	}
	l, ok := openLock(in.State)
	if !ok {
		return Decision{}
	}
	return in.carry(unlock(l, "the execution is "+string(in.State.Status)))
}

// carry turns an action of decide into the events and effects that carry
// it out.
func (in Input) carry(a action) Decision {
	s := in.State
	switch a.kind {
	case actWait:
		return Decision{}
	case actLock:
		return Decision{
			Events: []events.Payload{&events.LockRequested{Lock: a.lock.name, Path: a.path, Limit: a.lock.limit}},
			After:  []Effect{EnqueueLock{Lock: a.lock.name, Limit: a.lock.limit, Path: a.path}},
		}
	case actUnlock:
		l, ok := s.LockAt(a.path)
		if !ok || !l.Status.Open() {
			return Decision{Err: fmt.Errorf("release of lock %s by scope %q, which does not hold it", a.lock.name, a.path)}
		}
		return Decision{
			Before: []Effect{ReleaseLock{Lock: l.Name, Path: a.path, Request: l.Requests, Reason: a.lock.reason}},
			Events: []events.Payload{&events.LockReleased{Lock: l.Name, Path: a.path, Reason: a.lock.reason}},
		}
	case actCompensate:
		// Children still running are stopped now: they did not succeed, and
		// nothing of theirs is compensated.
		return in.childrenStopped(Decision{Events: []events.Payload{&events.CompensationStarted{Cause: a.cause, Error: a.err, Steps: a.compensate}}},
			events.ActionCancel)
	case actCompensated:
		return Decision{Events: []events.Payload{&events.CompensationFinished{}}}
	case actCompensationFailed:
		return Decision{Events: []events.Payload{&events.CompensationFailed{StepID: a.path, Error: a.err}}}
	case actLockTimeout:
		// The release and the step's failure in one decision: the failure
		// is what the release is for. (After a crash between the two the
		// step, no longer waiting, asks for the lock again.)
		l, ok := s.LockAt(a.path)
		if !ok || l.Status != projections.LockWaiting {
			return Decision{Err: fmt.Errorf("lock timeout of scope %q, which does not wait for lock %s", a.path, a.lock.name)}
		}
		d := in.carry(action{kind: actStepFail, step: a.step, path: a.path, attempt: a.attempt, err: a.err})
		d.Before = append([]Effect{ReleaseLock{Lock: l.Name, Path: a.path, Request: l.Requests, Reason: a.lock.reason}}, d.Before...)
		d.Events = append([]events.Payload{&events.LockReleased{Lock: l.Name, Path: a.path, Reason: a.lock.reason}}, d.Events...)
		return d
	}
	id := a.path
	if id == "" {
		id = a.step.ID
	}
	a.path = id
	nestedKind := "" // nested steps and later rounds are created by their first event
	if strings.ContainsAny(id, "/~") {
		nestedKind = a.step.Kind
	}
	one := func(p events.Payload, after ...Effect) Decision {
		return Decision{Events: []events.Payload{in.final(p)}, After: after}
	}
	if reason := dryRunSkip(s, a); reason != "" { // nothing runs, sleeps or waits
		return one(&events.StepSkipped{StepID: id, Kind: nestedKind, DryRun: true, Reason: reason}) // a nested step is created by it
	}
	switch a.kind {
	case actSkip:
		return one(&events.StepSkipped{StepID: id, Kind: nestedKind, Reason: cmp.Or(a.err, "condition is false")})
	case actSchedule:
		if a.step.Kind == workflow.KindWorkflow && a.step.Workflow != "" && a.step.Child {
			return in.scheduleChild(a, nestedKind)
		}
		if a.step.Kind == workflow.KindWorkflow && a.step.Workflow != "" {
			return in.scheduleCalled(a, nestedKind)
		}
		if a.step.Kind == workflow.KindClearLock {
			return in.scheduleClear(a, nestedKind)
		}
		return in.schedule(a, &events.StepScheduled{StepID: id, Kind: nestedKind, Attempt: a.attempt, Input: a.input})
	case actSend:
		// Recorded first: a task that may have been published is never
		// forgotten. The next decision publishes it (actResend).
		return one(&events.StepSending{StepID: id, Attempt: a.attempt, TaskID: events.TaskID(in.ID, id, a.attempt), Queue: a.step.QueueName()})
	case actResend:
		return in.send(a)
	case actStepFail: // one event, also for a step that could not be scheduled
		var sent events.TaskSent // an attempt that timed out with its task noted stored
		var d Decision
		if i := s.StepIndex(id); i >= 0 {
			st := s.Steps[i]
			sent = st.Unrecorded()
			if a.terminate && st.TaskID != "" {
				// Before: a crash before the append decides the timeout
				// again, and the notice is published again (deduplicated).
				d.Before = []Effect{PublishKill{TaskID: st.TaskID, Reason: a.err}}
			}
		}
		d.Events = []events.Payload{&events.StepFailed{StepID: id, Kind: nestedKind, Attempt: a.attempt, Error: a.err, Final: a.final, TaskSent: sent}}
		return d
	case actLet: // the variables and the step's success are one event
		return one(&events.StepSucceeded{StepID: id, Attempt: a.attempt, Vars: a.vars})
	case actArmTimer:
		d, _ := in.arm(a.purpose, id, a.attempt, a.until)
		return d
	case actClearLock:
		var rec clearInput
		if err := json.Unmarshal(a.input, &rec); err != nil {
			return Decision{Err: fmt.Errorf("step %s: the recorded clear is unreadable: %w", id, err)}
		}
		cleared := make([]map[string]string, 0, len(rec.Entries))
		for _, en := range rec.Entries {
			cleared = append(cleared, map[string]string{"execution_id": en.ExecutionID, "path": en.Path})
		}
		out, _ := json.Marshal(map[string]any{"lock": rec.Lock, "cleared": cleared})
		d := one(&events.StepSucceeded{StepID: id, Attempt: a.attempt, Output: out})
		if len(rec.Entries) > 0 {
			// Before: a crash before the append publishes it again (the
			// same id: the inbox keeps one).
			d.Before = []Effect{PublishClear{ID: clearID(in.ID, id, a.attempt), Clear: events.ClearLock{Lock: rec.Lock, Entries: rec.Entries,
				Reason: rec.Reason, RequestedBy: stepRequestedBy(in.ID, in.Workflow, id)}}}
		}
		return d
	case actContinue:
		return in.continueAsNew(a, id)
	case actStartChild:
		return in.startChild(a)
	case actReturn, actComplete:
		// A return's step succeeds; the next decision ends what it ends
		// (the execution, or a called workflow).
		return one(&events.StepSucceeded{StepID: id, Attempt: a.attempt, Output: a.output})
	case actSleep:
		until := a.until
		if until.IsZero() {
			until = in.Now.Add(a.delay)
		}
		d, due := in.arm(events.TimerSleep, id, a.attempt, until)
		return in.waiting(d, &events.StepWaiting{StepID: id, Attempt: a.attempt, Until: due.UTC()})
	case actWaitSignal:
		var d Decision
		var until time.Time
		if a.step.Timeout != "" {
			dur, err := time.ParseDuration(a.step.Timeout)
			if err != nil {
				return in.carry(action{kind: actStepFail, step: a.step, path: id, attempt: a.attempt, err: "timeout: " + err.Error()})
			}
			d, until = in.arm(events.TimerWaitTimeout, id, a.attempt, in.Now.Add(dur))
		}
		return in.waiting(d, &events.StepWaiting{StepID: id, Attempt: a.attempt, Until: until.UTC(), Signals: a.step.WaitSignals()})
	case actTakeSignal:
		out := signalOutput(a.signal)
		if a.step.Output != nil {
			f, _, _ := resolveFrame(in.Def, s, id)
			mapped, err := render(a.step.Output, with(newEngine(in.Def, s).env(f), "result", decode(out)))
			if err != nil {
				return in.carry(action{kind: actStepFail, step: a.step, path: id, attempt: a.attempt, err: "output: " + err.Error(), final: true})
			}
			out = mapped
		}
		return one(&events.StepSucceeded{StepID: id, Attempt: a.attempt, SignalID: a.signal.ID, Output: out})
	case actReschedule:
		tid := timerID(in.ID, events.TimerRetry, id, a.attempt)
		d, due := in.arm(events.TimerRetry, id, a.attempt, in.Now.Add(time.Duration(float64(a.delay)*jitter(tid, a.jitter))))
		d.Events = append(d.Events, &events.StepRescheduled{StepID: id, Attempt: a.attempt, NextAttempt: a.attempt + 1,
			Due: due.UTC(), TimerID: tid})
		return d
	case actSucceed:
		d := one(&events.ExecutionSucceeded{Output: a.output, ContinuedAs: a.continued})
		if a.continued != "" {
			// The successor's start, as the step recorded it, just
			// before: a crash in between publishes the same again.
			if st, _, ok := continuedEnd(a.output); ok {
				d.Before = []Effect{st}
			}
		}
		if _, suspended := d.Events[0].(*events.ExecutionSuspended); !suspended { // an output too big, with wait_after_fail
			d.After = endedNotice(s, "")
		}
		return in.childrenStopped(d, events.ActionCancel)
	case actFail:
		if s.WaitAfterFail { // an operator fixes the cause and resumes it
			return one(&events.ExecutionSuspended{Error: a.err, StepID: id})
		}
		return in.childrenStopped(one(&events.ExecutionFailed{Error: a.err, StepID: id}, endedNotice(s, "")...), events.ActionCancel)
	case actCancelled:
		return in.childrenStopped(one(cancelled(s), endedNotice(s, "")...), events.ActionCancel)
	case actReplay:
		rec := events.ActionRecord{Action: events.ActionReplay, RequestedBy: "retry step " + a.replay.cause}
		if a.replay.automatic {
			rec.RequestedBy, rec.Reason = "jetflow (replayable: automatically)", "step "+id+" was interrupted: "+stepError(s, id)
		}
		return replayed(in, rec, *a.replay)
	}
	return Decision{Err: fmt.Errorf("unknown action %d", a.kind)}
}

// schedule records an attempt's schedule. An operation whose next
// decision, once it is pending, is to send its task (no lock, timer, dry
// run or cancel comes between) is scheduled and sending in one event,
// StepDispatched: like StepSending, it is recorded before the task is
// published, and the next decision publishes it.
func (in Input) schedule(a action, sched *events.StepScheduled) Decision {
	p := in.final(sched)
	sc, ok := p.(*events.StepScheduled)
	if !ok || !workflow.IsOperation(a.step.Kind) || in.State.DryRun || in.SplitDispatch {
		return Decision{Events: []events.Payload{p}}
	}
	// A look at the state after it, not a copy: in.State's steps are the
	// dispatcher's own while it decides (see Input.State).
	sends := false
	err := projections.Peek(in.State, events.Event{Type: sc.EventType(), Subject: in.ID, Time: in.Now, Data: sc}, func(next projections.Execution) {
		b := in.decide(next)
		sends = b.kind == actSend && b.path == sc.StepID && b.attempt == sc.Attempt
	})
	if err != nil || !sends { // appending it reports an error
		return Decision{Events: []events.Payload{p}}
	}
	return Decision{Events: []events.Payload{&events.StepDispatched{StepID: sc.StepID, Kind: sc.Kind, Attempt: sc.Attempt,
		Input: sc.Input, Retention: sc.Retention, TaskID: events.TaskID(in.ID, sc.StepID, sc.Attempt), Queue: a.step.QueueName()}}}
}

// jitter is the factor a retry's backoff is multiplied by: within
// [1-j, 1+j], spread by the timer's id (deterministic, and recorded with
// the due time, so a replayed history decides the same).
func jitter(timerID string, j float64) float64 {
	if j <= 0 {
		return 1
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(timerID))
	frac := float64(h.Sum64()>>11) / (1 << 53)
	return 1 - j + 2*j*frac
}

// arm returns the arming of a timer due at due, and the due time in force:
// a timer armed already keeps its first due time (its schedule is
// published again, which replaces it), one that fired is left alone.
func (in Input) arm(purpose, stepID string, attempt int, due time.Time) (Decision, time.Time) {
	id := timerID(in.ID, purpose, stepID, attempt)
	t, known := in.State.Timers[id]
	switch {
	case known && t.Fired:
		return Decision{}, t.Due
	case known:
		return Decision{Before: []Effect{ArmTimer{TimerID: id, Due: t.Due}}}, t.Due
	}
	// The schedule is published first: if the dispatcher dies before the
	// append, the orphan fires for a timer the history does not know (and
	// is ignored), and the decision taken again re-arms the same id.
	return Decision{
		Before: []Effect{ArmTimer{TimerID: id, Due: due}},
		Events: []events.Payload{&events.TimerArmed{TimerID: id, Purpose: purpose, StepID: stepID, Attempt: attempt, Due: due.UTC()}},
	}, due
}

// waiting adds w to d, the arming of w's timer if any (in.arm): w
// records the arming (StepWaiting.Timer, docs/adr/0018), one event where
// there were two with nothing between them, but with SplitDispatch (for
// readers older than schema 5), where the arming keeps its own event.
func (in Input) waiting(d Decision, w *events.StepWaiting) Decision {
	if len(d.Events) == 1 && !in.SplitDispatch {
		if a, ok := d.Events[0].(*events.TimerArmed); ok && a.StepID == w.StepID && a.Attempt == w.Attempt && a.Due.Equal(w.Until) {
			w.Timer = a
			d.Events = d.Events[:0]
		}
	}
	d.Events = append(d.Events, w)
	return d
}

// send publishes an attempt's task; its stream sequence is recorded with
// StepSent ([Recorded]). The attempt's timeout, if any, is armed by the
// next decision: decide arms every timeout that is due to exist and is not
// recorded, so a crash between two appends cannot lose one.
func (in Input) send(a action) Decision {
	spec := a.input
	if len(spec) == 0 { // scheduled before inputs were recorded
		var err error
		if spec, err = json.Marshal(a.step); err != nil {
			return Decision{Err: fmt.Errorf("encode step %s: %w", a.step.ID, err)}
		}
	}
	token := in.State.Token
	var since time.Time
	if i := in.State.StepIndex(a.path); i >= 0 { // recorded with step.sending
		token = taskToken(in.State, in.State.Steps[i])
		since = in.State.Steps[i].ScheduledAt
	}
	queue := a.step.QueueName()
	return Decision{After: []Effect{PublishTask{Task: events.Task{
		TaskID: events.TaskID(in.ID, a.path, a.attempt), ExecutionID: in.ID, Workflow: in.Workflow, StepID: a.path, Attempt: a.attempt,
		Token: token, Kind: a.step.OperationKind(), Queue: queue, Spec: spec,
	}, Others: othersOnQueue(in.State, queue, a.path), Since: since, Local: a.step.Local}}}
}

// Bounds of othersOnQueue: it looks at the latest othersScan instances
// (where a fan-out's operations in flight are: instances are listed in
// the order they were first run) and stops counting at othersCap, so
// that sending a task costs the same in an execution of any size.
const (
	othersScan = 512
	othersCap  = 256
)

// othersOnQueue counts the operations of s other than the instance at
// path that are in flight on queue.
func othersOnQueue(s projections.Execution, queue, path string) int {
	n := 0
	for i := len(s.Steps) - 1; i >= 0 && i >= len(s.Steps)-othersScan && n < othersCap; i-- {
		st := &s.Steps[i]
		if st.Status.InFlight() && st.Queue == queue && st.ID != path {
			n++
		}
	}
	return n
}

// scheduleCalled schedules a workflow step that calls another workflow by
// name: it pins the called workflow's definition (and checks the input
// against its schema) by recording them with the schedule.
func (in Input) scheduleCalled(a action, kind string) Decision {
	fail := func(msg string) Decision { // recorded before it was scheduled: a resume starts it over
		return in.carry(action{kind: actStepFail, step: a.step, path: a.path, attempt: a.attempt, err: msg, final: true})
	}
	if strings.Count(a.path, "/") > 4*workflow.MaxDepth {
		return fail("workflows call each other too deep (a workflow calling itself?)")
	}
	rec, rendered, d, ok := in.calledBy(a, fail)
	if !ok {
		return d
	}
	if problems := rec.Definition.CheckInput(rendered); len(problems) > 0 {
		return fail(fmt.Sprintf("input of workflow %s: %s %s", rec.Name, problems[0].Field, problems[0].Message))
	}
	input, err := json.Marshal(map[string]any{"workflow": rec.Name, "version": rec.Version,
		"definition": rec.Definition, "input": orEmpty(rendered)})
	if err != nil {
		return Decision{Err: err}
	}
	return Decision{Events: []events.Payload{in.final(&events.StepScheduled{StepID: a.path, Kind: kind, Attempt: a.attempt, Input: input})}}
}

// PublishStart hands the start of another execution to the dispatchers
// (a continue-as-new step's successor), deduplicated by ID: the inbox
// keeps one, so a start published again after a crash starts nothing new.
type PublishStart struct {
	ID    string
	Start events.StartExecution
}

// continueAsNew decides a continue-as-new step. The successor's start
// is checked as its start handler will check it (startcheck: its input, the
// version's schema, the retention key, the size), then recorded, whole,
// with the step's success: {"continued_as", "run", "start"}. The next
// decision ends the execution succeeded, continued as it, publishing the
// recorded start just before (continuedEnd): a crash in between publishes
// the same start again (the inbox keeps one, and the successor's claim
// holds its digest), and nothing decided after the record can make it
// another (a new version applied meanwhile, a cancel: refused then).
func (in Input) continueAsNew(a action, id string) Decision {
	s := in.State
	fail := func(msg string) Decision {
		return in.carry(action{kind: actStepFail, step: a.step, path: id, attempt: a.attempt, err: msg, final: true})
	}
	ref := CalledRef{Name: in.Workflow, Version: a.step.Version}
	rec, loaded := in.Called[ref]
	switch {
	case !loaded:
		return Decision{Need: NeedWorkflow{Ref: ref}}
	case rec == nil:
		return fail(fmt.Sprintf("workflow %s version %d is not registered: there is nothing to continue as", in.Workflow, a.step.Version))
	}
	chain, run := cmp.Or(s.Chain, in.ID), max(s.Run, 1)
	next := successorID(chain, run+1)
	start := events.StartExecution{Workflow: in.Workflow, Version: rec.Version, Input: a.input, ExecutionID: next,
		WaitAfterFail: s.WaitAfterFail, Chain: chain, Run: run + 1, ContinuedFrom: in.ID}
	problem, checked := in.StartChecks["continue-"+next]
	switch {
	case !checked:
		return Decision{Need: NeedStartCheck{ID: "continue-" + next, Start: start}}
	case problem != "":
		return fail("the next run could not start: " + problem)
	}
	out, err := json.Marshal(continuation{ContinuedAs: next, Run: run + 1, Start: start})
	if err != nil {
		return Decision{Err: err}
	}
	return Decision{Events: []events.Payload{in.final(&events.StepSucceeded{StepID: id, Attempt: a.attempt, Output: out})}}
}

// continuation is a continue-as-new step's output: the successor, and
// the start that starts it.
type continuation struct {
	ContinuedAs string                `json:"continued_as"`
	Run         int                   `json:"run"`
	Start       events.StartExecution `json:"start"`
}

// continuedEnd is the end of an execution a continue-as-new step ended
// (its recorded output): the successor's start, published before the
// execution is recorded succeeded, continued as it.
func continuedEnd(output json.RawMessage) (Effect, string, bool) {
	var c continuation
	if json.Unmarshal(output, &c) != nil || c.ContinuedAs == "" {
		return nil, "", false
	}
	return PublishStart{ID: "continue-" + c.ContinuedAs, Start: c.Start}, c.ContinuedAs, true
}

// continuedBy returns the continuation recorded in this run (a
// continue-as-new step that succeeded), if there is one: the execution
// is ending, continued as its successor.
func continuedBy(s projections.Execution) (string, bool) {
	for _, st := range s.Steps {
		if st.Kind == workflow.KindContinue && st.Status == projections.OpSucceeded {
			if _, next, ok := continuedEnd(st.Output); ok {
				return next, true
			}
		}
	}
	return "", false
}

// continuing reports whether a continuation is recorded in this run: the
// execution ends continued, whatever else came meanwhile.
func continuing(s projections.Execution) bool {
	_, ok := continuedBy(s)
	return ok
}

// successorID is the id of run n of the chain that execution chain
// began: "<chain>-run<n>"; a chain id too long for that is cut and ends
// with a hash of the whole, so two chains never share a successor.
func successorID(chain string, n int) string {
	suffix := "-run" + strconv.Itoa(n)
	if len(chain)+len(suffix) > 128 {
		sum := sha256.Sum256([]byte(chain))
		h := "-" + hex.EncodeToString(sum[:6])
		chain = chain[:128-len(suffix)-len(h)] + h
	}
	return chain + suffix
}

// clearInput is what a clear-lock step records when it is scheduled:
// the lock, the reason, and the holders it clears (the lock's holders
// then, but its own execution's scopes).
type clearInput struct {
	Lock    string             `json:"lock"`
	Reason  string             `json:"reason,omitempty"`
	Entries []events.LockEntry `json:"entries"`
}

// scheduleClear records a clear-lock step's schedule with whom it clears:
// read from the lock bucket when it is scheduled and recorded, so that the
// clear it then asks for (and its output) is the same after any crash.
func (in Input) scheduleClear(a action, kind string) Decision {
	var rec clearInput
	if err := json.Unmarshal(a.input, &rec); err != nil {
		return Decision{Err: fmt.Errorf("step %s: %w", a.path, err)}
	}
	holders, loaded := in.Holders[rec.Lock]
	if !loaded {
		return Decision{Need: NeedHolders{Lock: rec.Lock}}
	}
	rec.Entries = []events.LockEntry{}
	for _, h := range holders {
		if h.ExecutionID != in.ID { // its own scopes end their holds themselves
			rec.Entries = append(rec.Entries, h)
		}
	}
	input, err := json.Marshal(rec)
	if err != nil {
		return Decision{Err: err}
	}
	return Decision{Events: []events.Payload{in.final(&events.StepScheduled{StepID: a.path, Kind: kind, Attempt: a.attempt, Input: input})}}
}

// stepRequestedBy names a step as who asked for what it asks another
// execution (a clear-lock step's clear, a child's stop),
// within the bound a clear command's requested_by has (a long path is cut
// in the middle).
func stepRequestedBy(execution, wf, path string) string {
	by := fmt.Sprintf("execution %s (workflow %s), step %s", execution, wf, path)
	if len(by) <= events.MaxRequestedBy {
		return by
	}
	keep := events.MaxRequestedBy - len(by) + len(path) - len("...")
	return by[:len(by)-len(path)] + path[:keep/2] + "..." + path[len(path)-(keep-keep/2):]
}

// clearID is the id of the clear-lock command of a clear-lock step's
// attempt: the same after a crash, so the inbox keeps one.
func clearID(execution, path string, attempt int) string {
	sum := sha256.Sum256([]byte(execution + "\x00" + path + "\x00" + strconv.Itoa(attempt)))
	return "clearlock-" + hex.EncodeToString(sum[:12])
}

// replayed returns the recording of a replay (asked by an operator, a
// retry step or automatic recovery): the variables are restored from the
// history as they were when the replay point was entered, and then timers
// that came due while the execution was over fire and results that arrived
// meanwhile are recorded (CatchUp).
func replayed(in Input, rec events.ActionRecord, r replayRequest) Decision {
	var vars map[string]json.RawMessage
	if r.plan.entered > 1 {
		if in.History == nil {
			return Decision{Need: NeedHistory{}}
		}
		if len(in.History) < r.plan.entered-1 {
			return Decision{Err: fmt.Errorf("history of %s has %d events, the replay point is event %d", in.ID, len(in.History), r.plan.entered)}
		}
		// A repaired history: the repair (later) has the fold pass over
		// the event it names.
		s := projections.FoldQuarantinedPrefix(in.ID, in.History, r.plan.entered-1)
		if d := s.Damaged; d != nil {
			return Decision{Err: fmt.Errorf("fold history up to the replay point: damaged at sequence %d: %s", d.Seq, d.Reason)}
		}
		vars = s.Vars
	}
	if in.Token == "" {
		return Decision{Need: NeedToken{}}
	}
	return Decision{
		Events: []events.Payload{&events.ExecutionReplayed{ActionRecord: rec, From: r.from, Force: r.force, Point: r.plan.point, Mode: r.plan.mode,
			Token: in.Token, Resume: r.plan.resume, Reopen: r.plan.reopen, Reset: r.plan.reset, Vars: vars,
			Cause: r.cause, Automatic: r.automatic}},
		After: []Effect{CatchUp{}},
	}
}

// Result decides what an agent's report about a task records: the
// step's start, success or failure if it is about the step's current
// attempt and new; a report of a stale attempt is recorded ignored (once);
// a repeated one records nothing.
func Result(in Input, ref events.TaskRef, ev events.Event) Decision {
	s := in.State
	i := s.StepIndex(ref.StepID)
	if i < 0 {
		return Decision{}
	}
	st := s.Steps[i]
	if s.Status.Terminal() {
		return afterEnd(s, st, ref, ev)
	}
	if stale := Stale(s, st, ref); stale != "" {
		d := Decision{Stale: stale}
		if !contains(s.Ignored, ev.ID) { // recorded already: this report delivered again
			d.Events = []events.Payload{&events.ResultIgnored{ResultID: ev.ID, ResultType: ev.Type, TaskID: ref.TaskID,
				StepID: ref.StepID, Attempt: ref.Attempt, Agent: ref.Agent, Reason: stale}}
		}
		return d
	}
	if over := attemptOverReport(s, st, ev); over != "" {
		if contains(s.Ignored, ev.ID) {
			return Decision{}
		}
		return Decision{Events: []events.Payload{&events.ResultIgnored{ResultID: ev.ID, ResultType: ev.Type, TaskID: ref.TaskID,
			StepID: ref.StepID, Attempt: ref.Attempt, Agent: ref.Agent, Reason: over}}}
	}
	var p events.Payload
	switch r := ev.Data.(type) {
	case *events.OperationStarted:
		// Record the first start, and every later delivery that runs the
		// operation again (its agent died or timed out).
		if st.Status == projections.OpSending || st.Status == projections.OpSent ||
			(st.Status == projections.OpStarted && r.Delivery > st.Delivery) {
			p = &events.StepStarted{StepID: st.ID, Attempt: st.Attempt, Agent: r.Agent, Delivery: r.Delivery, StartedAt: r.StartedAt,
				TaskSent: unrecordedSent(st, ref)}
		}
	case *events.OperationSucceeded:
		if st.Status.InFlight() {
			p = in.succeeded(st, ref, r)
		}
	case *events.OperationFailed:
		if st.Status.InFlight() {
			p = &events.StepFailed{StepID: st.ID, Attempt: st.Attempt, Error: r.Error, Output: r.Output, Agent: r.Agent, Lost: r.Lost, Final: r.Final,
				OperationStart: unrecordedStart(st, ref, r.StartedAt), TaskSent: unrecordedSent(st, ref)}
		}
	}
	if p == nil {
		return Decision{}
	}
	p = in.final(p)
	if ok, isOK := p.(*events.StepSucceeded); isOK {
		p = in.carried(ok)
	}
	return Decision{Events: []events.Payload{p}}
}

// attemptOverReport says why a final report of the step's current
// attempt comes after its timeout failed it (the agent reports how it
// terminated it), or "" for any other (one of an attempt in flight, or
// the report that ended it, delivered again).
func attemptOverReport(s projections.Execution, st projections.Step, ev events.Event) string {
	if st.Status.InFlight() || !timerFired(s, events.TimerStepTimeout, st.ID, st.Attempt) {
		return "" // only an attempt given up on has a report after its end
	}
	said := ""
	switch r := ev.Data.(type) {
	case *events.OperationSucceeded:
		if st.Status == projections.OpSucceeded {
			return ""
		}
	case *events.OperationFailed:
		if (st.Status == projections.OpFailed || st.Status == projections.OpRescheduled) && r.Error == st.Error {
			return ""
		}
		said = r.Error // how a terminated operation ended
	default:
		return ""
	}
	why := fmt.Sprintf("attempt %d was over (%s) when this report came", st.Attempt, cmp.Or(st.Error, string(st.Status)))
	if len(said) > maxIgnoredError {
		said = said[:maxIgnoredError] + "…"
	}
	if said != "" {
		why += "; it says: " + said
	}
	return why
}

// maxIgnoredError bounds the report's error quoted in a result.ignored.
const maxIgnoredError = 1024

// afterEnd decides a report about an operation of an ended execution: the
// final report of the step's current attempt that was with the agents at
// the end (what became of it: killed, refused, finished after a
// force-cancel), or that the dispatcher had given up on (a timeout, which
// ended the execution), is recorded, once; anything else, or an expired
// execution's, is not.
// Either way it changes nothing, and the agent keeps the report in the
// results stream, where a resume finds it.
func afterEnd(s projections.Execution, st projections.Step, ref events.TaskRef, ev events.Event) Decision {
	if !s.ExpiredAt.IsZero() || st.AfterEnd != nil || Stale(s, st, ref) != "" ||
		(!st.Status.InFlight() && attemptOverReport(s, st, ev) == "") { // the report that ended it, again
		return Decision{}
	}
	p := &events.ResultAfterEnd{ResultID: ev.ID, ResultType: ev.Type, TaskID: ref.TaskID, StepID: st.ID, Attempt: st.Attempt, Agent: ref.Agent}
	switch r := ev.Data.(type) {
	case *events.OperationSucceeded:
		p.StartedAt = r.StartedAt
	case *events.OperationFailed:
		p.Error, p.StartedAt = r.Error, r.StartedAt
	default:
		return Decision{}
	}
	return Decision{Events: []events.Payload{p}}
}

// Start decides what an execution's start records: started, with the
// first operation's dispatch when sending it is the first decision (one
// event for both, as a success carries the next dispatch: docs/adr/0008).
// in is the execution before it started (its definition, no state).
func Start(in Input, started *events.ExecutionStarted) Decision {
	started.Then = in.dispatchedAfter(started, len(started.Input)+len(started.Definition))
	// Recorded at in.Now, the start time the first input was rendered
	// with (${workflow.started_at}).
	return Decision{Events: []events.Payload{started}, At: in.Now}
}

// dispatchedAfter is the dispatch (schedule and sending) of the operation
// the execution sends next once p is recorded, when that is the very next
// decision; nil otherwise. It is recorded with p (an operation's success,
// or the execution's start), one event for both, which saves an append
// on the path of every step that follows an operation, and of an
// execution's first. Only in small executions, whose decisions walk the
// state (a larger one's view follows one event at a time), and not for
// histories older dispatchers may read (SplitDispatch). size is the
// bytes of what p records that may be large (a success's output, a
// start's input and definition): with the next input, at most half of
// the largest event, or each goes in its own event.
func (in Input) dispatchedAfter(p events.Payload, size int) *events.StepDispatched {
	disp, _ := in.after(p, size)
	return disp
}

// after is the one look at the state after p (the start, or a step's
// success) that both carries decide from: the next operation's dispatch
// (dispatchedAfter), or, after a step's success, the execution's success
// carrying it, when ending the execution successfully is the very next
// decision and nothing else goes with the end (no successor to start, no
// child to stop, no task to kill, no lock to release): one event records
// both (docs/adr/0015). Under the same bounds; an end also not when the
// step's output and the execution's would together take more than half
// of the largest event. A let's success carries no dispatch (only the
// end is looked for): the instance a dispatch carried is entered at the
// success's event, and a replay from it restores the variables of the
// events before that one (docs/adr/0008), which would be without those
// the let set.
func (in Input) after(p events.Payload, size int) (disp *events.StepDispatched, end *events.ExecutionSucceeded) {
	if in.SplitDispatch || len(in.State.Steps) > SmallExecution {
		return nil, nil
	}
	success, _ := p.(*events.StepSucceeded)
	dispatch := success == nil || len(success.Vars) == 0
	// A peek, not a copy: a success changes its one instance (Input.State).
	err := projections.Peek(in.State, events.Event{Type: p.EventType(), Subject: in.ID, Time: in.Now, Data: p}, func(next projections.Execution) {
		if len(next.Steps) > SmallExecution {
			return
		}
		after := in
		after.State, after.Memo = next, &Memo{} // no view: walked
		if in.Memo != nil {
			after.Memo.retains = in.Memo.retains
		}
		a := after.decide(next)
		if (a.kind != actSchedule || !dispatch) && (a.kind != actSucceed || success == nil) {
			return
		}
		d := after.carry(a)
		if d.Need != nil || d.Err != nil || len(d.Events) != 1 || len(d.Before)+len(d.After) > 0 {
			return
		}
		// Two large payloads in one event: each goes in its own.
		fits := func(n int) bool { return in.MaxEvent <= 0 || size+n <= in.MaxEvent/2 }
		switch x := d.Events[0].(type) {
		case *events.StepDispatched:
			if fits(len(x.Input)) {
				disp = x
			}
		case *events.ExecutionSucceeded:
			if x.ContinuedAs == "" && len(x.Children) == 0 && x.Step == nil && fits(len(x.Output)) {
				x.Step = success
				end = x
			}
		}
	})
	if err != nil {
		return nil, nil
	}
	return disp, end
}

// Stale says why an agent's report about step st of s does not count
// ("" if it does): it is about another attempt, was sent with another
// token, or comes from another queue's agent (agents may report for their
// own queues only, whatever token they carry).
func Stale(s projections.Execution, st projections.Step, ref events.TaskRef) string {
	switch {
	case ref.Attempt != st.Attempt:
		return fmt.Sprintf("attempt %d is not the step's current attempt %d", ref.Attempt, st.Attempt)
	case ref.Token != taskToken(s, st):
		return "stale execution token: the task was not sent with it"
	case st.Queue != "" && ref.Queue != st.Queue:
		return fmt.Sprintf("the report came from queue %q; the step's task went to queue %q", ref.Queue, st.Queue)
	}
	return ""
}

// AttemptOver reports whether the attempt a task reference names is no
// longer in flight in s: its result is recorded, the step went on to
// another attempt, or the task was sent with another token (a resume). A
// task of such an attempt delivered again need not run: its report would
// be stale, or a repeat. An attempt still in flight in an execution that
// ended is not over: a resume waits for its report (docs/adr/0009), and
// neither is one of a step the state does not know (a cached state may
// be behind its history).
func AttemptOver(s projections.Execution, ref events.TaskRef) bool {
	i := s.StepIndex(ref.StepID)
	if i < 0 {
		// A step a move to another version retired is over for good.
		return slices.ContainsFunc(s.RetiredSteps, func(st projections.Step) bool { return st.ID == ref.StepID })
	}
	st := s.Steps[i]
	return Stale(s, st, ref) != "" || !st.Status.InFlight()
}

// unrecordedStart returns the start a final report carries, to record
// with the step's success or failure, when no io.jetflow.step.started
// recorded it: the agent reports a short operation's start only with its
// result, so that the start costs no report and no append of its own. A
// start recorded already for this delivery (or a later one) is not
// recorded again; a report without a start (an older agent's, or an
// operation that never ran) records none.
func unrecordedStart(st projections.Step, ref events.TaskRef, at time.Time) events.OperationStart {
	if at.IsZero() || (st.Status == projections.OpStarted && ref.Delivery <= st.Delivery) {
		return events.OperationStart{}
	}
	return events.OperationStart{StartedAt: at.UTC(), Delivery: ref.Delivery}
}

// succeeded records an operation's result, mapped through the step's
// output expression (whose root "result" is the operation's output).
func (in Input) succeeded(st projections.Step, ref events.TaskRef, r *events.OperationSucceeded) events.Payload {
	f, step, _ := resolveFrame(in.Def, in.State, st.ID)
	out := r.Output
	start := unrecordedStart(st, ref, r.StartedAt)
	if step.Output != nil {
		mapped, err := render(step.Output, with(newEngine(in.Def, in.State).env(f), "result", decode(r.Output)))
		if err != nil {
			return &events.StepFailed{StepID: st.ID, Attempt: st.Attempt, Error: "output: " + err.Error(), Output: r.Output, Agent: r.Agent, OperationStart: start,
				TaskSent: unrecordedSent(st, ref)}
		}
		out = mapped
	}
	return &events.StepSucceeded{StepID: st.ID, Attempt: st.Attempt, Output: out, Agent: r.Agent, Duration: r.Duration, OperationStart: start,
		TaskSent: unrecordedSent(st, ref)}
}

// unrecordedSent is the sending of step st's task that its next event
// must record: the one its dispatcher noted (projections.MarkSent), or,
// for a step still sending as far as it knows (another dispatcher
// published the task, or it was read anew), the one the agent's report
// tells (the task's stream sequence and stored time; nothing from an
// older agent: the step then passes through sent without a time).
// Nothing for a step whose sending is recorded.
func unrecordedSent(st projections.Step, ref events.TaskRef) events.TaskSent {
	switch {
	case st.SentUnrecorded():
		return st.Unrecorded()
	case st.Status == projections.OpSending:
		return events.TaskSent{SentAt: ref.StoredAt.UTC(), TaskSeq: ref.TaskSeq}
	}
	return events.TaskSent{}
}

// final gives an event its final form: a step's first schedule carries
// the retention its retention: field sets, and an event too large for a
// message becomes the failure it amounts to.
func (in Input) final(p events.Payload) events.Payload {
	return in.fit(in.withRetention(p))
}

// fit turns an event too large for a message (an output, a rendered input
// or a called definition of about the size limit) into the failure it
// amounts to, so the execution ends clearly instead of retrying an append
// that can never fit.
func (in Input) fit(p events.Payload) events.Payload {
	limit := in.MaxEvent
	if limit <= 0 {
		return p
	}
	tooBig := func(what string, n int) string {
		return fmt.Sprintf("%s is %d bytes; an event holds at most about %d", what, n, limit)
	}
	switch e := p.(type) {
	case *events.StepSucceeded:
		n := len(e.Output)
		for _, v := range e.Vars {
			n += len(v)
		}
		if n > limit { // the operation ran: who ran it and when stay recorded
			return &events.StepFailed{StepID: e.StepID, Attempt: e.Attempt, Error: tooBig("the step's output", n), Final: true,
				Agent: e.Agent, OperationStart: e.OperationStart, TaskSent: e.TaskSent}
		}
	case *events.StepScheduled:
		if len(e.Input) > limit {
			return &events.StepFailed{StepID: e.StepID, Kind: e.Kind, Attempt: e.Attempt, Error: tooBig("the step's input", len(e.Input)), Final: true}
		}
	case *events.ExecutionSucceeded:
		if len(e.Output) > limit {
			if in.State.WaitAfterFail {
				return &events.ExecutionSuspended{Error: tooBig("the workflow's output", len(e.Output))}
			}
			return &events.ExecutionFailed{Error: tooBig("the workflow's output", len(e.Output))}
		}
	}
	return p
}
