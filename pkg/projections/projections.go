// Package projections folds an execution's events into its state. The fold
// is pure: no I/O, no clock, no randomness; timestamps come from events.
// The same history always gives the same state.
package projections

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
)

// Status is an execution's state.
//
// Valid transitions:
//
//	none       -> started       (ExecutionStarted)
//	started    -> succeeded     (ExecutionSucceeded)
//	started    -> failed        (ExecutionFailed)
//	started    -> cancelling    (ExecutionCancelling: a cancel request)
//	cancelling -> cancelled     (ExecutionCancelled: nothing runs any more)
//	started    -> cancelled     (ExecutionCancelled: a force-cancel)
//	started    -> suspended     (ExecutionSuspended: failed, wait_after_fail)
//	suspended  -> cancelled     (ExecutionCancelled)
//	suspended  -> cancelling    (ExecutionCancelling: operations still run)
//	failed, cancelled, suspended, started -> started (ExecutionResumed)
//	failed, cancelled, suspended, succeeded, started -> started (ExecutionReplayed)
//
// While cancelling, the results of running operations are still recorded
// (steps may succeed or fail) but no step starts.
type Status string

// Execution statuses.
const (
	StatusNone      Status = ""
	StatusPending   Status = "pending"
	StatusStarted   Status = "started"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	// StatusCancelling: a cancel was asked; running operations finish first.
	StatusCancelling Status = "cancelling"
	StatusCancelled  Status = "cancelled"
	// StatusSuspended: an execution started with wait_after_fail failed;
	// it waits for an operator to resume or cancel it.
	StatusSuspended Status = "suspended"
)

// ListedStatuses are the statuses an execution's read model can have, in
// lifecycle order: the values the api's execution list filters by.
var ListedStatuses = []Status{StatusStarted, StatusCancelling, StatusSuspended, StatusSucceeded, StatusFailed, StatusCancelled}

// Terminal reports whether s is final.
func (s Status) Terminal() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCancelled
}

// Active reports whether the dispatcher still has work for an execution in
// status s (it runs steps, or waits for running ones to finish).
func (s Status) Active() bool { return s == StatusStarted || s == StatusCancelling }

// Settled reports whether nothing more happens to an execution in status s
// unless an operator acts: it ended, or it is suspended. Following an
// execution's history stops there; a later resume or replay makes it
// unsettled again.
func (s Status) Settled() bool { return s.Terminal() || s == StatusSuspended }

// StatusAfter returns the status of an execution in status s after an
// event of type t, from the lifecycle events alone (the other events leave
// it as it is). It lets a reader of a history know where the execution
// stands from the latest events without folding them, e.g. that a
// cancelled execution was resumed since.
func StatusAfter(s Status, t events.Type) Status {
	switch t {
	case events.TypeExecutionStarted, events.TypeExecutionResumed, events.TypeExecutionReplayed:
		return StatusStarted
	case events.TypeExecutionCancelling:
		return StatusCancelling
	case events.TypeExecutionCancelled:
		return StatusCancelled
	case events.TypeExecutionSuspended:
		return StatusSuspended
	case events.TypeExecutionSucceeded:
		return StatusSucceeded
	case events.TypeExecutionFailed:
		return StatusFailed
	}
	return s
}

// OpStatus is the state of a step's operation (Cloudify's operation states).
//
// Valid transitions (forward skips are allowed because an agent's report is
// proof that the earlier states were passed):
//
//	""          -> pending | skipped | failed  (failed: could not be scheduled)
//	""          -> pending -> sending          (StepDispatched: one event)
//	pending     -> sending | failed | skipped (skipped: a dry run's would-run)
//	pending     -> waiting | succeeded        (steps run by the dispatcher)
//	sending     -> sent | started | succeeded | failed
//	sent        -> started | succeeded | failed
//	started     -> succeeded | failed
//	waiting     -> succeeded | failed
//	failed      -> rescheduled                 (a retry is due later)
//	rescheduled -> pending | failed            (the next attempt)
//	started  -> started  (a later delivery of the same attempt: the task ran
//	                      again because its agent died or timed out)
//
// A success or failure reported by an agent may carry the operation's
// start (events.OperationStart) instead of a step.started before it: the
// step then passed through started at that time, and the fold records it
// (StartedAt, Delivery) as step.started would have. Likewise a step's
// start, success or failure may carry its task's sending
// (events.TaskSent) instead of a step.sent before it: a dispatcher
// records step.sent only in compatibility mode, so a step is sending
// until its next event, also while its task waits in its queue
// (docs/adr/0007).
type OpStatus string

// Operation statuses.
const (
	OpNone      OpStatus = ""
	OpPending   OpStatus = "pending"
	OpSending   OpStatus = "sending"
	OpSent      OpStatus = "sent"
	OpStarted   OpStatus = "started"
	OpSucceeded OpStatus = "succeeded"
	OpFailed    OpStatus = "failed"
	// OpSkipped: the step's condition was false.
	OpSkipped OpStatus = "skipped"
	// OpWaiting: a sleep or wait step waits for a timer or a signal.
	OpWaiting OpStatus = "waiting"
	// OpRescheduled: the attempt failed and the next one waits for its backoff.
	OpRescheduled OpStatus = "rescheduled"
)

var opRank = map[OpStatus]int{OpNone: 0, OpPending: 1, OpSending: 2, OpSent: 3, OpStarted: 4, OpSucceeded: 5, OpFailed: 5}

// Terminal reports whether s is final for its attempt.
func (s OpStatus) Terminal() bool { return s == OpSucceeded || s == OpFailed || s == OpSkipped }

// Done reports whether the step will not run again: it succeeded or was skipped.
func (s OpStatus) Done() bool { return s == OpSucceeded || s == OpSkipped }

// InFlight reports whether an operation is with an agent (or about to be).
func (s OpStatus) InFlight() bool { return s == OpSending || s == OpSent || s == OpStarted }

// Execution is the state of one execution.
type Execution struct {
	ID       string          `json:"id"`
	Workflow string          `json:"workflow"`
	Version  int             `json:"version"`
	Status   Status          `json:"status"`
	Input    json.RawMessage `json:"input,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	Token    string          `json:"token,omitempty"`
	// Redacted says that this read model hides values: the input members
	// its workflow's input schema marks writeOnly, and their values
	// wherever they appear, show as "[redacted]". Set where read models
	// are stored and served (package redact), never by the fold.
	Redacted bool `json:"redacted,omitempty"`
	// WaitAfterFail: a failure suspends the execution instead of ending it.
	WaitAfterFail bool `json:"wait_after_fail,omitempty"`
	// DryRun: no operation runs; each is skipped as "would run".
	DryRun     bool   `json:"dry_run,omitempty"`
	CommandKey string `json:"command_key,omitempty"`
	// StartedBy is who started the execution (the subject of
	// StartedByActor, as authenticated).
	StartedBy      string        `json:"started_by,omitempty"`
	StartedByActor *events.Actor `json:"started_by_actor,omitempty"`
	// APIURL is the api's base URL as workflows reach it (workflow.api_url),
	// as recorded when the execution started; "" if none was configured.
	APIURL string `json:"api_url,omitempty"`
	// TraceParent and TraceState are the trace context the execution's
	// start was recorded with (the caller's: the CloudEvents
	// distributed-tracing extension of its start); "" when it had none.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	Steps       []Step `json:"steps"`
	// Vars are the workflow variables, as set by let steps.
	Vars map[string]json.RawMessage `json:"vars,omitempty"`
	// Timers are the durable timers armed, by id.
	Timers map[string]Timer `json:"timers,omitempty"`
	// Cancellation says who asked to cancel the execution, when and why.
	Cancellation *Cancellation `json:"cancellation,omitempty"`
	// Actions are the operators' commands recorded, in order.
	Actions []ActionCommand `json:"actions,omitempty"`
	// Ignored lists the agents' reports that changed nothing (a stale token
	// or attempt), by their CloudEvent id.
	Ignored []string `json:"ignored,omitempty"`
	// Retention is the retention rule in force (package retention syntax;
	// "" for the system default) and RetentionKey the group the execution
	// is counted in ("" for its workflow's name). A step with retention:
	// changes them when it is scheduled.
	Retention    string `json:"retention,omitempty"`
	RetentionKey string `json:"retention_key,omitempty"`
	// Replays are the replays recorded, in order.
	Replays []Replay `json:"replays,omitempty"`
	// Chain, Run and ContinuedFrom link an execution a continue-as-new
	// step started to its chain (the first execution's id), its number
	// in it and its predecessor; ContinuedAs names the successor of one
	// that a continue-as-new step ended.
	Chain         string `json:"chain,omitempty"`
	Run           int    `json:"run,omitempty"`
	ContinuedFrom string `json:"continued_from,omitempty"`
	ContinuedAs   string `json:"continued_as,omitempty"`
	// Parent links a child execution (started by a workflow step with
	// child: true) to its parent's execution and step.
	Parent *events.ParentRef `json:"parent,omitempty"`
	// Compensation is the execution's compensation, once it began (the
	// saga pattern); Compensations counts those recorded (a replay after
	// one may compensate again, with new instances).
	Compensation  *Compensation `json:"compensation,omitempty"`
	Compensations int           `json:"compensations,omitempty"`
	// Compensated maps each instance a compensation undid to its
	// completion then (Step.Completed): it is not undone again unless it
	// ran again (after a replay).
	Compensated map[string]int `json:"compensated,omitempty"`
	// VersionChanges are the moves to another version of the workflow
	// (a resume, force-resume or replay with a version), in order.
	VersionChanges []VersionChange `json:"version_changes,omitempty"`
	// RetiredSteps are the step instances recorded under an earlier
	// version that a later one did not have: their results are ignored
	// (no expression sees them, nothing waits for them). They are no
	// longer in Steps.
	RetiredSteps []Step `json:"retired_steps,omitempty"`
	// Resumes counts the resumes and replays; ResumedAt is the last one's
	// time (the workflow timeout counts from it).
	Resumes   int       `json:"resumes,omitempty"`
	ResumedAt time.Time `json:"resumed_at,omitzero"`
	// Signals received, in order; a wait step takes the first that fits.
	Signals []Signal `json:"signals,omitempty"`
	// Locks are the locks the execution's scopes asked for, by scope (see locks.go).
	Locks     []Lock    `json:"locks,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	// ExpiredAt is when the execution expired under its retention rule
	// (execution.expired): nothing follows, and the janitor deletes it.
	ExpiredAt time.Time `json:"expired_at,omitzero"`
	// LastSeq is the stream sequence of the last event folded (0 if the
	// events carried none), LastEventID its CloudEvent id.
	LastSeq     uint64 `json:"last_seq"`
	LastEventID string `json:"last_event_id,omitempty"`
	// Events counts the events folded.
	Events int `json:"events"`
	// Damaged, when set, says where the history stopped folding: the
	// execution is quarantined until an admin repairs it (see Damage).
	Damaged *Damage `json:"damaged,omitempty"`
	// Repairs are the sequences of events that repairs had folds pass over.
	Repairs []uint64 `json:"repairs,omitempty"`
	// Truncated, on a stored read model, says what was left out so that
	// it stays small (a fold never sets it): the full state is the fold of
	// the history (GET /v1/executions/{id}/steps pages the steps).
	Truncated *Truncation `json:"truncated,omitempty"`
}

// Truncation is what a read model leaves out of the state it stands for.
type Truncation struct {
	// Steps counts the step instances left out: finished ones, oldest
	// first (steps that run, wait or failed are always kept).
	Steps int `json:"steps,omitempty"`
	// Retired counts the retired instances left out (RetiredSteps: a move
	// to another version left them behind). They are left out first, and
	// count neither in the execution's steps nor in those done.
	Retired int `json:"retired,omitempty"`
	// Values counts the inputs, outputs and variables replaced by a note
	// {"omitted": true, "bytes": N, ...}.
	Values int `json:"values,omitempty"`
	// Summary: every step is left out, finished or not (the read model
	// of a parked projection: the steps are too many to store).
	Summary bool `json:"summary,omitempty"`
}

// Replay is a replay as recorded (see events.ExecutionReplayed).
type Replay struct {
	From        string `json:"from"`
	Force       bool   `json:"force,omitempty"`
	Point       string `json:"point,omitempty"`
	Mode        string `json:"mode"`
	Cause       string `json:"cause,omitempty"`
	Automatic   bool   `json:"automatic,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
	// Actor is who asked, as authenticated (nil for an automatic replay).
	Actor  *events.Actor `json:"actor,omitempty"`
	Reason string        `json:"reason,omitempty"`
	At     time.Time     `json:"at,omitzero"`
}

// Cancellation records an operator's cancel, force-cancel or kill.
type Cancellation struct {
	Action      string `json:"action"`
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
	// Actor is who asked, as authenticated.
	Actor       *events.Actor `json:"actor,omitempty"`
	RequestedAt time.Time     `json:"requested_at,omitzero"`
}

// ActionCommand is an operator's command as recorded: its key (CloudEvent
// source#id) and the action it asked for.
type ActionCommand struct {
	Command string `json:"command"`
	Action  string `json:"action"`
	// Actor is who asked, as authenticated.
	Actor *events.Actor `json:"actor,omitempty"`
}

// CommandAction returns the action command key asked for, if the history
// records it.
func (s Execution) CommandAction(key string) (string, bool) {
	for _, a := range s.Actions {
		if a.Command == key {
			return a.Action, true
		}
	}
	return "", false
}

// ActionRefused says why action cannot apply to an execution in status s,
// or "" if it can.
func (s Status) ActionRefused(action string) string {
	switch action {
	case events.ActionResume, events.ActionForceResume:
		switch s {
		case StatusStarted, StatusFailed, StatusCancelled, StatusSuspended:
			return ""
		case StatusCancelling:
			return "is cancelling; wait until it is cancelled (or force-cancel it), then resume"
		}
		return "has already " + string(s) + "; only started, failed, suspended and cancelled executions can be resumed"
	case events.ActionReplay:
		if s == StatusCancelling {
			return "is cancelling; wait until it is cancelled (or force-cancel it), then replay"
		}
		if s == StatusNone || s == StatusPending {
			return "has not started; there is nothing to replay"
		}
		return ""
	case events.ActionRepair:
		if s == StatusNone {
			return "has no history to repair"
		}
		return "" // whatever its status: a repair changes none
	case events.ActionCancel:
		if s == StatusCancelling {
			return "is already cancelling; use force-cancel not to wait for its running steps"
		}
	case events.ActionCompensate:
		if s.Terminal() {
			return ""
		}
		return "is " + string(s) + "; compensate applies to an execution that is over (failed, cancelled or succeeded): cancel it first"
	}
	if s.Terminal() {
		return "has already " + string(s) + "; " + action + " applies to a started or cancelling execution"
	}
	return ""
}

// Timer is a durable timer of the execution.
type Timer struct {
	Purpose string    `json:"purpose"`
	StepID  string    `json:"step_id,omitempty"`
	Attempt int       `json:"attempt,omitempty"`
	Due     time.Time `json:"due"`
	Fired   bool      `json:"fired,omitempty"`
	// FiredAt is when its firing was recorded (the time of its
	// io.jetflow.timer.fired, or of the sleep's success that records it);
	// zero when it has not fired, or in a read model written before it
	// was kept.
	FiredAt time.Time `json:"fired_at,omitzero"`
}

// Signal is a signal the execution received.
type Signal struct {
	ID         string          `json:"id"`
	Name       string          `json:"name"`
	Data       json.RawMessage `json:"data,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	// Actor is who sent it, as authenticated.
	Actor *events.Actor `json:"actor,omitempty"`
	// TakenBy is the wait step that took it ("" while it is kept).
	TakenBy string `json:"taken_by,omitempty"`
}

// Step is the state of one step.
type Step struct {
	ID       string          `json:"id"`
	Kind     string          `json:"kind"`
	Status   OpStatus        `json:"status"`
	Attempt  int             `json:"attempt,omitempty"`
	TaskID   string          `json:"task_id,omitempty"`
	TaskSeq  uint64          `json:"task_seq,omitempty"`
	Queue    string          `json:"queue,omitempty"`
	Agent    string          `json:"agent,omitempty"`
	Delivery int             `json:"delivery,omitempty"`
	Input    json.RawMessage `json:"input,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	// Child is the child execution the step's current attempt started
	// (a workflow step with child: true), of workflow ChildWorkflow: the
	// step is pending until the child's end is recorded.
	Child         string `json:"child,omitempty"`
	ChildWorkflow string `json:"child_workflow,omitempty"`
	// Stopped: the step failed because its execution, as it ended (or
	// began to compensate), told its child to stop: a resume starts a new
	// child rather than handle the failure.
	Stopped bool `json:"stopped,omitempty"`
	// AfterEnd is what became of the attempt when it was with the agents
	// as the execution ended: its final report, which arrived after the
	// end and changed nothing (events.ResultAfterEnd). Nil until then, and
	// again when it runs again or at its next transition (after a resume
	// or replay).
	AfterEnd *AfterEnd `json:"after_end,omitempty"`
	// Final: the failure is not retried (see events.StepFailed).
	Final bool `json:"final,omitempty"`
	// Lost: the attempt failed because its task was lost (its agents
	// died); see events.StepFailed.
	Lost bool `json:"lost,omitempty"`
	// Token is the execution token the attempt's task carries.
	Token string `json:"token,omitempty"`
	// RetryBase is the attempt a resume counted retries from: the attempt
	// number minus RetryBase is the try within the step's retry policy.
	RetryBase int `json:"retry_base,omitempty"`
	// Entered is the number of the event (counting from 1) that first
	// recorded the instance's current run (scheduled, skipped, or failed
	// before it could be scheduled): the variables it saw are those of
	// the events before it. 0 while it has not run (again, after a replay).
	Entered int `json:"entered,omitempty"`
	// Completed is the number of the event (counting from 1) that
	// recorded the instance's success: compensation runs in reverse order
	// of it.
	Completed int `json:"completed,omitempty"`
	// WaitUntil is when a waiting sleep ends (or a wait times out).
	WaitUntil time.Time `json:"wait_until,omitzero"`
	// SleptFrom is when a sleep began to wait in its current run: run
	// again by a replay resuming at it, its duration counts from then, not
	// from the replay. Kept across attempts, zero again when a replay runs
	// the instance anew.
	SleptFrom   time.Time `json:"slept_from,omitzero"`
	ScheduledAt time.Time `json:"scheduled_at,omitzero"`
	// SentAt is when the attempt's task was stored for the agents
	// (step.sent, or the sent_at of the step's next event): its timeout
	// counts from then.
	SentAt    time.Time `json:"sent_at,omitzero"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// sentUnrecorded: sent as a dispatcher knows, not in the history
	// (MarkSent).
	sentUnrecorded bool
}

// AfterEnd is the final report of an attempt that arrived after its
// execution ended.
type AfterEnd struct {
	// Outcome is succeeded or failed.
	Outcome OpStatus  `json:"outcome"`
	Error   string    `json:"error,omitempty"`
	Agent   string    `json:"agent,omitempty"`
	At      time.Time `json:"at"`
}

// Errors of the fold.
var (
	ErrUnknownEvent = errors.New("projections: unknown event")
	ErrUnknownStep  = errors.New("projections: unknown step")
	// ErrDuplicateStep is a start whose step list names one path twice:
	// an instance is found by its path.
	ErrDuplicateStep = errors.New("projections: duplicate step")
)

// TransitionError reports an event that is illegal in the current state.
type TransitionError struct {
	ExecutionID string
	From        string
	Event       events.Type
	StepID      string
}

func (e *TransitionError) Error() string {
	if e.StepID != "" {
		return fmt.Sprintf("projections: execution %s: step %s: %s is illegal in state %q", e.ExecutionID, e.StepID, e.Event, e.From)
	}
	return fmt.Sprintf("projections: execution %s: %s is illegal in state %q", e.ExecutionID, e.Event, e.From)
}

// Fold applies evs in order to the empty state.
func Fold(evs []events.Event) (Execution, error) {
	var s Execution
	for i, ev := range evs {
		next, err := applyOwned(s, ev)
		if err != nil {
			// applyOwned may have changed s's steps before it failed: the
			// state before ev is folded again, with copies.
			return foldCopying(evs[:i]), err
		}
		s = next
	}
	return s, nil
}

// foldCopying is Fold of events that fold, each applied onto a copy.
func foldCopying(evs []events.Event) Execution {
	var s Execution
	for _, ev := range evs {
		next, err := Apply(s, ev)
		if err != nil {
			return s
		}
		s = next
	}
	return s
}

// Apply returns the state after ev. It does not modify s.
func Apply(s Execution, ev events.Event) (Execution, error) {
	s.Steps = slices.Clone(s.Steps)
	s.Signals = slices.Clone(s.Signals)
	return applyOwned(s, ev)
}

// ApplyOwned is Apply onto a state its caller owns and drops: a state
// returned by Apply, ApplyOwned or Fold (or decoded) that nothing else
// holds. It may change s's steps and signals in place (the state returned
// shares them) instead of copying them: applying each of an execution's
// n events with Apply copies its steps n times. After an error, s is not
// the state before ev: fold again.
func ApplyOwned(s Execution, ev events.Event) (Execution, error) { return applyOwned(s, ev) }

// Peek hands look the state after ev without copying s's steps, as Apply
// does, when ev changes one step instance and nothing else in place: a
// step's schedule (events.StepScheduled), or a success that carries
// neither a signal taken nor the next dispatch (events.StepSucceeded).
// That instance is changed in place (or, scheduled, added past s's last,
// in room s's steps do not use), and put back before Peek returns. It is
// for a look ahead at what follows ev, where the copy cost more than the
// look. s's steps must be its caller's own (see ApplyOwned), nothing else
// may read them while look runs, and no state alive may have more steps
// in the same array (an instance added is left past s's last); look must
// not keep the state it is given. Any other event is applied to a copy.
func Peek(s Execution, ev events.Event, look func(Execution)) error {
	id, ok := peeks(ev)
	if !ok {
		next, err := Apply(s, ev)
		if err == nil {
			look(next)
		}
		return err
	}
	if i := s.StepIndex(id); i >= 0 {
		saved := s.Steps[i]
		defer func() { s.Steps[i] = saved }()
	}
	next, err := applyOwned(s, ev)
	if err != nil {
		return err
	}
	look(next)
	return nil
}

// peeks returns the one step instance ev changes in place when that is
// all apply changes in place (its other changes are to copies, as Vars'),
// and whether it is so.
func peeks(ev events.Event) (string, bool) {
	switch e := ev.Data.(type) {
	case *events.StepScheduled:
		return e.StepID, true
	case *events.StepSucceeded:
		// A signal taken changes Signals in place; a dispatch carried
		// changes another instance.
		return e.StepID, e.SignalID == "" && e.Then == nil
	}
	return "", false
}

// applyAs applies p as if it were ev's data: a state an event carries
// besides its own (a dispatch, a success, a firing, an arming), at the
// event's time and number, an error naming the event's type.
func applyAs(s Execution, ev events.Event, p events.Payload) (Execution, error) {
	ev.Data = p
	return apply(s, ev)
}

// applyOwned is ApplyOwned, which Fold uses: a fold of an execution of n
// steps with Apply took n² step copies.
func applyOwned(s Execution, ev events.Event) (Execution, error) {
	next, err := apply(s, ev)
	if err != nil {
		return s, err
	}
	next.Events++
	if ev.Seq != 0 {
		next.LastSeq = ev.Seq
	}
	next.LastEventID = ev.ID
	if !ev.Time.IsZero() {
		next.UpdatedAt = ev.Time
	}
	return next, nil
}

func apply(s Execution, ev events.Event) (Execution, error) {
	if ev.Invalid != "" {
		return s, invalid(ev)
	}
	if err := misfiled(s, ev); err != nil {
		return s, err
	}
	if r, ok := ev.Data.(*events.ExecutionRepaired); ok {
		return repaired(s, r), nil // whatever the status: it changes none
	}
	if !s.ExpiredAt.IsZero() && ev.Data != nil {
		return s, &TransitionError{ExecutionID: s.ID, From: "expired", Event: ev.Type}
	}
	if _, ok := ev.Data.(*events.ExecutionExpired); ok {
		if !s.Status.Terminal() {
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		s.ExpiredAt = ev.Time
		return s, nil
	}
	if next, ok, err := applyLock(s, ev); ok {
		return next, err
	}
	if r, ok := ev.Data.(*events.ResultAfterEnd); ok {
		return s.afterEnd(ev, r)
	}
	if s.Status == StatusNone {
		if _, ok := ev.Data.(*events.ExecutionStarted); !ok && ev.Data != nil {
			return s, &TransitionError{ExecutionID: ev.Subject, From: string(s.Status), Event: ev.Type}
		}
	} else if s.Status.Terminal() && ev.Data != nil && !reopens(ev.Data) && ev.Type != events.TypeDefinitionChanged {
		return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
	}
	switch e := ev.Data.(type) {
	case *events.ExecutionStarted:
		if s.Status != StatusNone {
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		s.ID, s.Workflow, s.Version = ev.Subject, e.Workflow, e.Version
		s.Status, s.StartedAt = StatusStarted, ev.Time
		s.Input, s.Token, s.CommandKey, s.StartedBy, s.StartedByActor = e.Input, e.Token, e.CommandKey, e.StartedBy, e.Actor
		s.WaitAfterFail, s.DryRun, s.APIURL = e.WaitAfterFail, e.DryRun, e.APIURL
		s.TraceParent, s.TraceState = ev.TraceParent, ev.TraceState
		s.Chain, s.Run, s.ContinuedFrom, s.Parent = e.Chain, e.Run, e.ContinuedFrom, e.Parent
		if e.Retention != nil {
			s.Retention, s.RetentionKey = e.Retention.Rule, e.Retention.Key
		}
		s.Steps = make([]Step, len(e.Steps))
		for i, r := range e.Steps {
			s.Steps[i] = Step{ID: r.ID, Kind: r.Kind}
		}
		if id, ok := duplicateStep(s.Steps); ok {
			return s, fmt.Errorf("%w: %q in %s", ErrDuplicateStep, id, ev.Type)
		}
		if e.Then == nil {
			return s, nil
		}
		// Then the first operation's dispatch, at the event's time (an
		// error names this event's type).
		return applyAs(s, ev, e.Then)
	case *events.DefinitionChanged:
		return s.changeDefinition(ev, e)
	case *events.CompensationStarted:
		return s.compensate(ev, e)
	case *events.CompensationFinished, *events.CompensationFailed:
		c := s.Compensation
		if c == nil || c.Status != CompensationRunning || !s.Status.Active() {
			return s, &TransitionError{ExecutionID: s.ID, From: "not compensating", Event: ev.Type}
		}
		next := *c
		next.Status, next.EndedAt = CompensationFinished, ev.Time
		if f, ok := e.(*events.CompensationFailed); ok {
			next.Status, next.StepID, next.Failure = CompensationFailed, f.StepID, f.Error
		}
		s.Compensation = &next
		// The instances undone (not the failed one, nor those after it),
		// with their completion: not undone again unless they run again.
		s.Compensated = maps.Clone(s.Compensated)
		if s.Compensated == nil {
			s.Compensated = map[string]int{}
		}
		for _, id := range c.Steps {
			if id == next.StepID {
				break
			}
			if i := s.StepIndex(id); i >= 0 {
				s.Compensated[id] = s.Steps[i].Completed
			}
		}
		return s, nil
	case *events.ExecutionSucceeded:
		if s.Status != StatusStarted { // a cancelling execution ends cancelled
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		if e.Step != nil {
			// First the last step's success, at the event's time (an error
			// names this event's type); it may carry no dispatch.
			if e.Step.Then != nil {
				return s, &TransitionError{ExecutionID: s.ID, From: "an ending execution", Event: ev.Type, StepID: e.Step.StepID}
			}
			var err error
			if s, err = applyAs(s, ev, e.Step); err != nil {
				return s, err
			}
		}
		s.Status, s.EndedAt, s.Output, s.ContinuedAs = StatusSucceeded, ev.Time, e.Output, e.ContinuedAs
		return s.stopChildren(ev, e.Children, EndedAs(ev.Data))
	case *events.ExecutionFailed:
		if s.Status != StatusStarted {
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		s.Status, s.EndedAt, s.Error = StatusFailed, ev.Time, e.Error
		return s.stopChildren(ev, e.Children, EndedAs(ev.Data))
	case *events.ExecutionSuspended:
		if s.Status != StatusStarted {
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		s.Status, s.Error = StatusSuspended, e.Error
		return s, nil
	case *events.ExecutionCancelling:
		if s.Status != StatusStarted && s.Status != StatusSuspended {
			return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
		}
		s.Status = StatusCancelling
		s.Cancellation = cancellation(s.Cancellation, e.ActionRecord, ev.Time)
		s.Actions = withAction(s.Actions, e.ActionRecord)
		return s, nil
	case *events.ExecutionCancelled:
		s.Status, s.EndedAt = StatusCancelled, ev.Time
		s.Cancellation = cancellation(s.Cancellation, e.ActionRecord, ev.Time)
		s.Actions = withAction(s.Actions, e.ActionRecord)
		return s.stopChildren(ev, e.Children, EndedAs(ev.Data))
	case *events.ExecutionResumed:
		return s.resume(ev, e)
	case *events.ExecutionReplayed:
		return s.replay(ev, e)
	case *events.ResultIgnored:
		s.Ignored = append(slices.Clone(s.Ignored), e.ResultID)
		return s, nil
	case *events.StepScheduled:
		s = s.instance(e.StepID, e.Kind)
		if e.Retention != nil {
			s.Retention, s.RetentionKey = e.Retention.Rule, e.Retention.Key
		}
		return s.step(ev, e.StepID, OpPending, func(st *Step) {
			st.enter(s.Events)
			st.Attempt, st.Input, st.ScheduledAt = e.Attempt, e.Input, ev.Time
			st.Output, st.Error, st.StartedAt, st.EndedAt, st.Agent, st.TaskID, st.TaskSeq, st.Delivery, st.Final, st.Lost = nil, "", time.Time{}, time.Time{}, "", "", 0, 0, false, false
			st.SentAt, st.sentUnrecorded = time.Time{}, false
			st.Child, st.ChildWorkflow, st.Stopped = "", "", false
		})
	case *events.StepDispatched:
		// Scheduled, then sending, at the event's time: the two folds in
		// turn (an error names this event's type).
		next, err := applyAs(s, ev, e.Scheduled())
		if err != nil {
			return s, err
		}
		return applyAs(next, ev, e.Sending())
	case *events.StepSending:
		return s.step(ev, e.StepID, OpSending, func(st *Step) { st.TaskID, st.Queue, st.Token = e.TaskID, e.Queue, s.Token })
	case *events.StepSent:
		return s.step(ev, e.StepID, OpSent, func(st *Step) {
			st.TaskID, st.TaskSeq, st.SentAt, st.sentUnrecorded = e.TaskID, e.TaskSeq, ev.Time, false
		})
	case *events.StepChildStarted:
		i := s.StepIndex(e.StepID)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, e.StepID, ev.Type)
		}
		st := &s.Steps[i]
		if st.Status != OpPending || st.Attempt != e.Attempt || st.Child != "" {
			return s, &TransitionError{ExecutionID: s.ID, From: string(st.Status), Event: ev.Type, StepID: e.StepID}
		}
		st.Child, st.ChildWorkflow, st.StartedAt = e.ExecutionID, e.Workflow, ev.Time
		return s, nil
	case *events.StepStarted:
		if i := s.StepIndex(e.StepID); i >= 0 && s.Steps[i].Status == OpStarted {
			// Started again: legal only for a later delivery of the task.
			if e.Delivery <= s.Steps[i].Delivery {
				return s, &TransitionError{ExecutionID: s.ID, From: string(OpStarted), Event: ev.Type, StepID: e.StepID}
			}
			st := &s.Steps[i]
			st.StartedAt, st.Agent, st.Delivery = ev.Time, e.Agent, e.Delivery
			st.started(events.OperationStart{StartedAt: e.StartedAt}, ev.Time)
			return s, nil
		}
		return s.step(ev, e.StepID, OpStarted, func(st *Step) {
			st.sent(e.TaskSent, ev.Time)
			st.StartedAt, st.Agent, st.Delivery = ev.Time, e.Agent, e.Delivery
			st.started(events.OperationStart{StartedAt: e.StartedAt}, ev.Time) // the agent's time, if its report had it
		})
	case *events.StepSucceeded:
		if e.Fired != "" {
			// First the sleep's timer fires, at the event's time (an error
			// names this event's type): it must be that step attempt's.
			if t, ok := s.Timers[e.Fired]; ok && (t.Purpose != events.TimerSleep || t.StepID != e.StepID || t.Attempt != e.Attempt) {
				return s, &TransitionError{ExecutionID: s.ID, From: "a timer of another step", Event: ev.Type, StepID: e.StepID}
			}
			var err error
			if s, err = applyAs(s, ev, &events.TimerFired{TimerID: e.Fired}); err != nil {
				return s, err
			}
		}
		if e.SignalID != "" {
			i := slices.IndexFunc(s.Signals, func(g Signal) bool { return g.ID == e.SignalID })
			if i < 0 || s.Signals[i].TakenBy != "" {
				return s, &TransitionError{ExecutionID: s.ID, From: "signal not kept", Event: ev.Type, StepID: e.StepID}
			}
			s.Signals[i].TakenBy = e.StepID
		}
		if len(e.Vars) > 0 {
			s.Vars = maps.Clone(s.Vars)
			if s.Vars == nil {
				s.Vars = map[string]json.RawMessage{}
			}
			maps.Copy(s.Vars, e.Vars)
		}
		next, err := s.step(ev, e.StepID, OpSucceeded, func(st *Step) {
			st.sent(e.TaskSent, ev.Time)
			st.Output, st.EndedAt, st.Completed = e.Output, ev.Time, s.Events+1
			if e.Agent != "" {
				st.Agent = e.Agent
			}
			st.started(e.OperationStart, ev.Time)
		})
		if err != nil || e.Then == nil {
			return next, err
		}
		// Then the next operation's dispatch, at the event's time (an
		// error names this event's type).
		return applyAs(next, ev, e.Then)
	case *events.StepFailed:
		s = s.instance(e.StepID, e.Kind)
		unscheduled := false // failed before it could be scheduled: the event carries the attempt
		if i := s.StepIndex(e.StepID); i >= 0 {
			unscheduled = s.Steps[i].Status == OpNone || s.Steps[i].Status == OpRescheduled
		}
		return s.step(ev, e.StepID, OpFailed, func(st *Step) {
			st.enter(s.Events)
			if unscheduled {
				st.Attempt, st.ScheduledAt = e.Attempt, ev.Time
			}
			st.sent(e.TaskSent, ev.Time)
			st.Output, st.Error, st.EndedAt, st.Final, st.Lost = e.Output, e.Error, ev.Time, e.Final, e.Lost
			if e.Agent != "" {
				st.Agent = e.Agent
			}
			st.started(e.OperationStart, ev.Time)
		})
	case *events.StepSkipped:
		s = s.instance(e.StepID, e.Kind)
		if i := s.StepIndex(e.StepID); e.DryRun && s.DryRun && i >= 0 && s.Steps[i].Status == OpPending {
			// A dry run's step that would run: scheduled, then skipped.
			s.Steps[i].Status, s.Steps[i].Error, s.Steps[i].EndedAt = OpSkipped, e.Reason, ev.Time
			return s, nil
		}
		return s.step(ev, e.StepID, OpSkipped, func(st *Step) { st.enter(s.Events); st.Error, st.EndedAt = e.Reason, ev.Time })
	case *events.StepWaiting:
		if a := e.Timer; a != nil {
			// First the wait's timer is armed (an error names this
			// event's type): a wait step's timeout, any other's (a sleep,
			// a retry step's backoff) the sleep's end, due when the wait
			// ends, of this step attempt (docs/adr/0018).
			purpose := events.TimerSleep
			if i := s.StepIndex(e.StepID); i >= 0 && s.Steps[i].Kind == "wait" {
				purpose = events.TimerWaitTimeout
			}
			if a.Purpose != purpose || a.StepID != e.StepID || a.Attempt != e.Attempt || !a.Due.Equal(e.Until) {
				return s, &TransitionError{ExecutionID: s.ID, From: "a timer not this wait's", Event: ev.Type, StepID: e.StepID}
			}
			var err error
			if s, err = applyAs(s, ev, a); err != nil {
				return s, err
			}
		}
		return s.step(ev, e.StepID, OpWaiting, func(st *Step) {
			st.WaitUntil, st.StartedAt = e.Until, ev.Time
			if st.Kind == "sleep" && st.SleptFrom.IsZero() {
				st.SleptFrom = ev.Time
			}
		})
	case *events.StepRescheduled:
		return s.step(ev, e.StepID, OpRescheduled, func(st *Step) { st.WaitUntil = e.Due })
	case *events.VariablesSet:
		s.Vars = maps.Clone(s.Vars)
		if s.Vars == nil {
			s.Vars = map[string]json.RawMessage{}
		}
		maps.Copy(s.Vars, e.Vars)
		return s, nil
	case *events.TimerArmed:
		if _, dup := s.Timers[e.TimerID]; dup {
			return s, &TransitionError{ExecutionID: s.ID, From: "armed", Event: ev.Type}
		}
		s.Timers = maps.Clone(s.Timers)
		if s.Timers == nil {
			s.Timers = map[string]Timer{}
		}
		s.Timers[e.TimerID] = Timer{Purpose: e.Purpose, StepID: e.StepID, Attempt: e.Attempt, Due: e.Due}
		return s, nil
	case *events.TimerFired:
		t, ok := s.Timers[e.TimerID]
		if !ok || t.Fired {
			return s, &TransitionError{ExecutionID: s.ID, From: "not armed", Event: ev.Type}
		}
		s.Timers = maps.Clone(s.Timers)
		t.Fired, t.FiredAt = true, ev.Time
		s.Timers[e.TimerID] = t
		return s, nil
	case *events.SignalReceived:
		s.Signals = append(s.Signals, Signal{ID: e.SignalID, Name: e.Name, Data: e.Data, ReceivedAt: ev.Time, Actor: e.Actor})
		return s, nil
	default:
		if ev.Ignorable {
			return s, nil
		}
		return s, fmt.Errorf("%w: %s", ErrUnknownEvent, ev.Type)
	}
}

// withAction records an operator's command (not the dispatcher's own
// conclusions, which carry none).
func withAction(list []ActionCommand, r events.ActionRecord) []ActionCommand {
	if r.Command == "" {
		return list
	}
	return append(slices.Clone(list), ActionCommand{Command: r.Command, Action: r.Action, Actor: r.Actor})
}

// stopChildren fails the steps whose child executions an end (or a
// compensation's start) stopped: each must wait for that child.
func (s Execution) stopChildren(ev events.Event, stopped []events.StoppedChild, ended string) (Execution, error) {
	for _, c := range stopped {
		i := s.StepIndex(c.StepID)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, c.StepID, ev.Type)
		}
		st := &s.Steps[i]
		if st.Status != OpPending || st.Attempt != c.Attempt || !st.ChildStep() {
			return s, &TransitionError{ExecutionID: s.ID, From: string(st.Status), Event: ev.Type, StepID: c.StepID}
		}
		st.Status, st.EndedAt, st.Child, st.Stopped = OpFailed, ev.Time, c.ExecutionID, true
		st.Error = fmt.Sprintf("child execution %s: told to %s, as its parent execution %s %s", c.ExecutionID, c.Action, s.ID, ended)
	}
	return s, nil
}

// renewChild returns a child step's recorded schedule (input) with the
// start of the child of attempt attempt of parent s: its id, its
// parent's attempt, and what it takes from its parent now (retention,
// wait_after_fail).
func renewChild(input json.RawMessage, s Execution, path string, attempt int) json.RawMessage {
	var rec map[string]json.RawMessage
	var start events.StartExecution
	if json.Unmarshal(input, &rec) != nil || json.Unmarshal(rec["start"], &start) != nil || start.Parent == nil {
		return input // not a child's (ChildStep said it was)
	}
	id := events.ChildExecutionID(s.ID, path, attempt)
	p := *start.Parent
	p.Attempt, p.Retention = attempt, s.Retention
	start.ExecutionID, start.Parent, start.WaitAfterFail = id, &p, s.WaitAfterFail
	rec["child"], _ = json.Marshal(id)
	rec["start"], _ = json.Marshal(start)
	out, err := json.Marshal(rec)
	if err != nil {
		return input
	}
	return out
}

// EndedAs says how p, an event that stops children, ended (or changed)
// the execution, for the error of each stopped child's step and the
// reason its child is given.
func EndedAs(p events.Payload) string {
	switch e := p.(type) {
	case *events.ExecutionSucceeded:
		return "succeeded"
	case *events.ExecutionFailed:
		return "failed"
	case *events.ExecutionCancelled:
		return "was cancelled"
	case *events.CompensationStarted:
		return "is compensating (on " + e.Cause + ")"
	}
	return "ended"
}

// ChildStep reports whether the instance's current attempt runs a
// workflow as a child execution: it started one, or its schedule
// recorded the start of one.
func (st Step) ChildStep() bool {
	_, _, ok := st.ChildExecution()
	return ok
}

// ChildExecution returns the child execution (id, workflow) of a child
// step's current attempt: the one it started, or the one whose start its
// schedule recorded (it may have been published before a crash).
func (st Step) ChildExecution() (id, wf string, ok bool) {
	if st.Child != "" {
		return st.Child, st.ChildWorkflow, true
	}
	return st.RecordedChild()
}

// RecordedChild returns the child execution (id, workflow) whose start
// the instance's schedule recorded, if it is a child step.
func (st Step) RecordedChild() (id, wf string, ok bool) {
	if st.Kind != "workflow" || !bytes.Contains(st.Input, []byte(`"child"`)) {
		return "", "", false
	}
	var rec struct {
		Child string `json:"child"`
		Start struct {
			Workflow string            `json:"workflow"`
			Parent   *events.ParentRef `json:"parent"`
		} `json:"start"`
	}
	if json.Unmarshal(st.Input, &rec) != nil || rec.Child == "" || rec.Start.Parent == nil {
		return "", "", false
	}
	return rec.Child, rec.Start.Workflow, true
}

// containerKinds are the step kinds whose instances contain others.
var containerKinds = map[string]bool{"workflow": true, "foreach": true, "parallel": true, "switch": true}

// resume applies a resume: the execution is started again with a new
// token, and each step instance in e.Reset runs again with fresh retry
// counts. An operation or a dispatcher's step gets a new attempt, pending
// with its recorded input (a new task id, so it is sent anew); a
// container keeps its attempt (so its instances are kept) and is pending
// again; a step that failed before it could be scheduled (Final) starts
// over from its condition.
func (s Execution) resume(ev events.Event, e *events.ExecutionResumed) (Execution, error) {
	if s.Status.ActionRefused(events.ActionResume) != "" {
		return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
	}
	s.Status, s.EndedAt, s.Error, s.Output, s.Cancellation = StatusStarted, time.Time{}, "", nil, nil
	s.Token, s.Resumes, s.ResumedAt = e.Token, s.Resumes+1, ev.Time
	s.Actions = withAction(s.Actions, e.ActionRecord)
	for _, id := range e.Reset {
		i := s.StepIndex(id)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
		s.Steps[i] = rerun(s, s.Steps[i], ev.Time)
	}
	return s, nil
}

// rerun is a step instance run again by a resume (at time at): an
// operation or a dispatcher's step gets a new attempt, pending with its
// recorded input (a new task id, so it is sent anew); a container keeps
// its attempt (so its instances are kept) and is pending again; a step
// that failed before it could be scheduled (Final) starts over from its
// condition; a child step gets a new attempt, pending with its recorded
// start renewed for it (a new child execution). Its retries count
// afresh.
func rerun(s Execution, st Step, at time.Time) Step {
	st.Error, st.Output, st.EndedAt, st.WaitUntil, st.Lost, st.AfterEnd, st.Stopped = "", nil, time.Time{}, time.Time{}, false, nil, false
	switch {
	case st.Final:
		st.Status, st.Final, st.RetryBase, st.Entered, st.SleptFrom = OpNone, false, st.Attempt, 0, time.Time{}
		st.Child, st.ChildWorkflow = "", ""
	case st.ChildStep():
		// A new child under a new attempt, from the recorded start (its
		// id and its parent's attempt renewed): the step is not decided
		// again, as an operation is sent again with its recorded input.
		st.Attempt++
		st.Status, st.RetryBase, st.ScheduledAt = OpPending, st.Attempt-1, at
		st.Child, st.ChildWorkflow, st.StartedAt = "", "", time.Time{}
		st.Input = renewChild(st.Input, s, st.ID, st.Attempt)
	case containerKinds[st.Kind]:
		st.Status, st.RetryBase = OpPending, st.Attempt-1
	default:
		st.Attempt++
		st.Status, st.RetryBase, st.ScheduledAt = OpPending, st.Attempt-1, at
		st.StartedAt, st.SentAt, st.Agent, st.TaskID, st.TaskSeq, st.Delivery, st.Token = time.Time{}, time.Time{}, "", "", 0, 0, ""
	}
	return st
}

// afterEnd notes the final report of the step's current attempt that
// came after the execution ended (it was with the agents at the end, or
// the dispatcher had given up on it): legal only once the execution has
// ended, for the step's current attempt, once.
func (s Execution) afterEnd(ev events.Event, r *events.ResultAfterEnd) (Execution, error) {
	i := s.StepIndex(r.StepID)
	illegal := &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type, StepID: r.StepID}
	switch {
	case !s.Status.Terminal():
		return s, illegal
	case i < 0:
		return s, fmt.Errorf("%w: %s", ErrUnknownStep, r.StepID)
	}
	st := &s.Steps[i]
	if st.Attempt != r.Attempt || st.AfterEnd != nil {
		illegal.From = string(st.Status)
		return s, illegal
	}
	outcome := OpFailed
	if r.ResultType == events.TypeOperationSucceeded {
		outcome = OpSucceeded
	}
	st.AfterEnd = &AfterEnd{Outcome: outcome, Error: r.Error, Agent: r.Agent, At: ev.Time}
	return s, nil
}

// reopens reports whether p may follow an execution's end: a resume or
// a replay runs it on.
func reopens(p events.Payload) bool {
	switch p.(type) {
	case *events.ExecutionResumed, *events.ExecutionReplayed, *events.CompensationStarted:
		return true
	}
	return false
}

// enter records the event that starts the instance's run, if this is it
// (events is the count of events before it).
func (st *Step) enter(events int) {
	if st.Entered == 0 {
		st.Entered = events + 1
	}
}

// replay applies a replay: the execution is started again with a new
// token and the variables as they were at the replay point. Instances in
// e.Resume run again with their recorded input (as after a resume);
// containers in e.Reopen are pending again and keep what was done in
// them; instances in e.Reset start over from their condition, with a new
// attempt number when they run (so their tasks, timers and nested
// instances are new) and fresh retry counts.
func (s Execution) replay(ev events.Event, e *events.ExecutionReplayed) (Execution, error) {
	if why := s.Status.ActionRefused(events.ActionReplay); why != "" {
		return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
	}
	s.Status, s.EndedAt, s.Error, s.Output, s.Cancellation = StatusStarted, time.Time{}, "", nil, nil
	s.Token, s.Resumes, s.ResumedAt = e.Token, s.Resumes+1, ev.Time
	s.Actions = withAction(s.Actions, e.ActionRecord)
	s.Compensation = nil // a new run: it may be compensated again (Compensations counts them)
	s.ContinuedAs = ""
	s.Vars = nil
	if len(e.Vars) > 0 {
		s.Vars = maps.Clone(e.Vars)
	}
	s.Replays = append(slices.Clone(s.Replays), Replay{From: e.From, Force: e.Force, Point: e.Point, Mode: e.Mode, Cause: e.Cause,
		Automatic: e.Automatic, RequestedBy: e.RequestedBy, Actor: e.Actor, Reason: e.Reason, At: ev.Time})
	for _, id := range e.Resume {
		i := s.StepIndex(id)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
		s.Steps[i] = rerun(s, s.Steps[i], ev.Time)
	}
	for _, id := range e.Reopen {
		i := s.StepIndex(id)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
		st := &s.Steps[i]
		st.Status, st.Error, st.Output, st.EndedAt, st.Final, st.Lost = OpPending, "", nil, time.Time{}, false, false
	}
	for _, id := range e.Reset {
		i := s.StepIndex(id)
		if i < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
		st := s.Steps[i]
		s.Steps[i] = Step{ID: st.ID, Kind: st.Kind, Status: OpNone, Attempt: st.Attempt, RetryBase: st.Attempt, Queue: st.Queue}
	}
	return s, nil
}

// changeDefinition moves a settled execution to another version of its
// workflow: the new version's top-level steps it has no instance of are
// added (a top-level step retired earlier comes back fresh), and the
// instances it has not are retired: moved from Steps to RetiredSteps,
// with their results.
func (s Execution) changeDefinition(ev events.Event, e *events.DefinitionChanged) (Execution, error) {
	if !s.Status.Settled() {
		return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
	}
	if len(e.Moved) > 0 {
		s.Steps = slices.Clone(s.Steps)
		for i := range s.Steps {
			if to, ok := events.MovedPath(s.Steps[i].ID, e.Moved); ok {
				s.Steps[i].ID = to
			}
		}
	}
	retired := make(map[string]bool, len(e.Retired))
	for _, id := range e.Retired {
		if s.StepIndex(id) < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
		retired[id] = true
	}
	steps := make([]Step, 0, len(s.Steps)+len(e.Steps))
	gone := slices.Clone(s.RetiredSteps)
	for _, st := range s.Steps {
		if retired[st.ID] {
			gone = append(gone, st)
			continue
		}
		steps = append(steps, st)
	}
	s.Steps, s.RetiredSteps = steps, gone
	for _, r := range e.Steps {
		if s.StepIndex(r.ID) < 0 {
			// A step retired earlier and back in this version goes on
			// counting its attempts, so its tasks and timers are new.
			attempt := s.RetiredAttempts(r.ID)
			s.Steps = append(s.Steps, Step{ID: r.ID, Kind: r.Kind, Attempt: attempt, RetryBase: attempt})
		}
	}
	if e.Retention != nil {
		s.Retention, s.RetentionKey = e.Retention.Rule, e.Retention.Key
	}
	s.VersionChanges = append(slices.Clone(s.VersionChanges), VersionChange{From: e.FromVersion, To: e.Version, Action: e.Action,
		Reason: e.Reason, RequestedBy: e.RequestedBy, Actor: e.Actor, At: ev.Time, Moved: e.Moved, Retired: e.Retired})
	s.Version = e.Version
	return s, nil
}

// RetiredAttempts is the highest attempt of the instances at path that a
// move to another version retired (0: none): a step back in a later
// version goes on counting from it, so its tasks and timers are new.
func (s Execution) RetiredAttempts(path string) int {
	n := 0
	for _, st := range s.RetiredSteps {
		if st.ID == path {
			n = max(n, st.Attempt)
		}
	}
	return n
}

// Compensation statuses.
const (
	CompensationRunning  = "running"
	CompensationFinished = "finished"
	CompensationFailed   = "failed"
)

// Compensation is an execution's compensation: why (Cause: failure,
// cancel, operator), the failure it answers, the steps whose compensate
// steps run (in that order), how it went, and for an operator's, the
// status the execution had (it ends in it again).
type Compensation struct {
	Cause  string   `json:"cause"`
	Error  string   `json:"error,omitempty"`
	Steps  []string `json:"steps"`
	Status string   `json:"status"`
	StepID string   `json:"step_id,omitempty"`
	// Failure is why the compensation of StepID failed.
	Failure     string        `json:"failure,omitempty"`
	Round       int           `json:"round"`
	Prior       Status        `json:"prior,omitempty"`
	RequestedBy string        `json:"requested_by,omitempty"`
	Actor       *events.Actor `json:"actor,omitempty"`
	Reason      string        `json:"reason,omitempty"`
	StartedAt   time.Time     `json:"started_at"`
	EndedAt     time.Time     `json:"ended_at,omitzero"`
}

// compensate begins the execution's compensation: at the end of a
// failing or cancelling run, or, asked by an operator, on an execution
// that is over (it runs again, with a new token, until the compensation
// ends, then ends as it was).
func (s Execution) compensate(ev events.Event, e *events.CompensationStarted) (Execution, error) {
	operator := e.Cause == events.CompensateForOperator
	resumed := s.Compensation != nil && s.Compensation.Status == CompensationRunning && operator && s.Status.Terminal()
	switch {
	case s.Compensation != nil && !resumed: // one per run: a replay clears it
		return s, &TransitionError{ExecutionID: s.ID, From: "compensated", Event: ev.Type}
	case operator && !s.Status.Terminal(), !operator && !s.Status.Active():
		return s, &TransitionError{ExecutionID: s.ID, From: string(s.Status), Event: ev.Type}
	}
	if resumed { // a compensation a force-cancel or a kill stopped goes on where it was
		c := *s.Compensation
		if c.Prior == "" {
			c.Prior = s.Status
		}
		s.Compensation = &c
		s.Status, s.EndedAt, s.Token, s.Resumes, s.ResumedAt = StatusStarted, time.Time{}, e.Token, s.Resumes+1, ev.Time
		s.Actions = withAction(s.Actions, e.ActionRecord)
		return s, nil
	}
	for _, id := range e.Steps {
		if s.StepIndex(id) < 0 {
			return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
		}
	}
	s.Compensations++
	c := &Compensation{Cause: e.Cause, Error: e.Error, Steps: e.Steps, Status: CompensationRunning, Round: s.Compensations,
		RequestedBy: e.RequestedBy, Actor: e.Actor, Reason: e.Reason, StartedAt: ev.Time}
	if operator {
		c.Prior = s.Status
		if c.Error == "" {
			c.Error = s.Error
		}
		s.Status, s.EndedAt, s.Token, s.Resumes, s.ResumedAt = StatusStarted, time.Time{}, e.Token, s.Resumes+1, ev.Time
		s.Actions = withAction(s.Actions, e.ActionRecord)
	}
	s.Compensation = c
	return s.stopChildren(ev, e.Children, EndedAs(ev.Data))
}

// VersionChange is a move of an execution to another version of its
// workflow, asked with an action.
type VersionChange struct {
	From        int           `json:"from"`
	To          int           `json:"to"`
	Action      string        `json:"action"`
	Reason      string        `json:"reason,omitempty"`
	RequestedBy string        `json:"requested_by,omitempty"`
	Actor       *events.Actor `json:"actor,omitempty"`
	At          time.Time     `json:"at"`
	// Moved are the step instances the new version moved (old path: new
	// path), Retired those it did not have.
	Moved   map[string]string `json:"moved,omitempty"`
	Retired []string          `json:"retired,omitempty"`
}

// cancellation adds an action to the record of the cancellation so far
// (a force-cancel after a cancel keeps the first request's time).
func cancellation(c *Cancellation, r events.ActionRecord, at time.Time) *Cancellation {
	next := Cancellation{Action: r.Action, Reason: r.Reason, RequestedBy: r.RequestedBy, Actor: r.Actor, RequestedAt: at}
	if c != nil {
		next.RequestedAt = c.RequestedAt
		if next.Reason == "" {
			next.Reason = c.Reason
		}
	}
	return &next
}

// step moves one step to status to, checking the transition.
func (s Execution) step(ev events.Event, id string, to OpStatus, set func(*Step)) (Execution, error) {
	i := s.StepIndex(id)
	if i < 0 {
		return s, fmt.Errorf("%w: %q in %s", ErrUnknownStep, id, ev.Type)
	}
	// In place: a copy handed to set would be one more on the heap
	// every time (set is not known here).
	st := &s.Steps[i]
	if !legal(st.Status, to, internalKinds[st.Kind]) {
		return s, &TransitionError{ExecutionID: s.ID, From: string(st.Status), Event: ev.Type, StepID: id}
	}
	st.Status = to
	st.AfterEnd = nil // a note of the time the execution was over: it runs again
	if to != OpSent {
		st.sentUnrecorded = false
	}
	set(st)
	return s, nil
}

// sent records the sending a step's start or end carries (when no
// io.jetflow.step.sent recorded it): the task was stored then, at that
// sequence. The time is the server's: one before the schedule or after
// the event (clocks apart) is taken as the nearer one.
func (st *Step) sent(t events.TaskSent, end time.Time) {
	if st.TaskSeq == 0 {
		st.TaskSeq = t.TaskSeq
	}
	if t.SentAt.IsZero() || !st.SentAt.IsZero() {
		return
	}
	st.SentAt = t.SentAt
	if !st.ScheduledAt.IsZero() && st.SentAt.Before(st.ScheduledAt) {
		st.SentAt = st.ScheduledAt
	}
	if !end.IsZero() && st.SentAt.After(end) {
		st.SentAt = end
	}
}

// MarkSent returns s with the attempt of step id marked sent: its task
// was stored at sequence seq, at time at. It is what a dispatcher knows
// and its history does not say yet (it records the sending with the
// step's next event: docs/adr/0007); nothing changes unless the step's
// current attempt is sending. [Step.SentUnrecorded] tells such a step
// apart.
func MarkSent(s Execution, id string, attempt int, seq uint64, at time.Time) Execution {
	i := s.StepIndex(id)
	if i < 0 || s.Steps[i].Status != OpSending || s.Steps[i].Attempt != attempt {
		return s
	}
	s.Steps = slices.Clone(s.Steps)
	return MarkSentOwned(s, id, attempt, seq, at)
}

// MarkSentOwned is MarkSent onto a state its caller owns (see
// ApplyOwned): it changes s's steps in place.
func MarkSentOwned(s Execution, id string, attempt int, seq uint64, at time.Time) Execution {
	i := s.StepIndex(id)
	if i < 0 || s.Steps[i].Status != OpSending || s.Steps[i].Attempt != attempt {
		return s
	}
	st := &s.Steps[i]
	st.Status, st.TaskSeq, st.SentAt, st.sentUnrecorded = OpSent, seq, at, true
	if st.SentAt.Before(st.ScheduledAt) { // clocks apart: as the fold keeps it
		st.SentAt = st.ScheduledAt
	}
	return s
}

// ForgetSent returns s without what MarkSent noted of the steps ids:
// they are sending again, as the history records them.
func ForgetSent(s Execution, ids ...string) Execution {
	forget := func(st Step) bool { return st.SentUnrecorded() && slices.Contains(ids, st.ID) }
	if !slices.ContainsFunc(s.Steps, forget) {
		return s
	}
	s.Steps = slices.Clone(s.Steps)
	for i := range s.Steps {
		if st := &s.Steps[i]; forget(*st) {
			st.Status, st.TaskSeq, st.SentAt, st.sentUnrecorded = OpSending, 0, time.Time{}, false
		}
	}
	return s
}

// SentUnrecorded reports whether st is sent only as its dispatcher knows
// ([MarkSent]): the history does not record it yet.
func (st Step) SentUnrecorded() bool { return st.sentUnrecorded && st.Status == OpSent }

// RecordedStatus is st's status as its history records it: sending for
// a step only its dispatcher knows sent.
func (st Step) RecordedStatus() OpStatus {
	if st.SentUnrecorded() {
		return OpSending
	}
	return st.Status
}

// Unrecorded returns what st's next event must carry of its sending: the
// sending MarkSent noted, or nothing.
func (st Step) Unrecorded() events.TaskSent {
	if !st.SentUnrecorded() {
		return events.TaskSent{}
	}
	return events.TaskSent{SentAt: st.SentAt, TaskSeq: st.TaskSeq}
}

// started records the start an operation's result carries (when no
// io.jetflow.step.started recorded it): the step was started at that time,
// in that delivery, before it ended at end. The start is the agent's
// clock, the schedule and the end the dispatcher's: a start outside them
// (clocks apart) is taken as the nearer one, so that no step starts
// before it was scheduled nor ends before it starts.
func (st *Step) started(o events.OperationStart, end time.Time) {
	if o.StartedAt.IsZero() {
		return
	}
	st.StartedAt = o.StartedAt
	if !st.ScheduledAt.IsZero() && st.StartedAt.Before(st.ScheduledAt) {
		st.StartedAt = st.ScheduledAt
	}
	if !end.IsZero() && st.StartedAt.After(end) {
		st.StartedAt = end
	}
	if o.Delivery > 0 {
		st.Delivery = o.Delivery
	}
	if st.SentAt.After(st.StartedAt) { // clocks apart: not sent after it started
		st.SentAt = st.StartedAt
	}
}

// internalKinds are the step kinds the dispatcher runs itself.
var internalKinds = map[string]bool{"let": true, "sleep": true, "wait": true, "fail": true, "return": true, "goto": true, "retry": true, "replayable": true, "clear-lock": true, "continue-as-new": true,
	"workflow": true, "foreach": true, "parallel": true, "switch": true}

func legal(from, to OpStatus, internal bool) bool {
	switch to {
	case OpPending:
		return from == OpNone || from == OpRescheduled
	case OpSkipped:
		return from == OpNone
	case OpSending:
		return from == OpPending && !internal
	case OpWaiting:
		return from == OpPending && internal
	case OpRescheduled:
		return from == OpFailed
	case OpSucceeded:
		if from == OpPending || from == OpWaiting {
			return internal
		}
	case OpFailed:
		if from == OpNone || from == OpRescheduled || from == OpPending || from == OpWaiting {
			return true // a condition or input that could not be evaluated, or a step the dispatcher runs
		}
	}
	return opRank[from] >= opRank[OpSending] && opRank[from] <= opRank[OpStarted] && opRank[to] > opRank[from]
}

// instance adds a step instance the first time it is scheduled or
// skipped: a nested step (a path inside a container), or a step run again
// after a goto (its path ends in ~<round>). Top-level steps come from
// ExecutionStarted.
func (s Execution) instance(path, kind string) Execution {
	if kind == "" || !strings.ContainsAny(path, "/~") || s.StepIndex(path) >= 0 {
		return s
	}
	n := s.RetiredAttempts(path) // back after a move to another version retired it
	s.Steps = append(s.Steps, Step{ID: path, Kind: kind, Attempt: n, RetryBase: n})
	return s
}

// StepIndex returns the index of the last instance at path id, or -1. It
// looks from the last: the instances most events are about (a loop's
// latest round, a foreach's latest items) are the last added. A path is
// one instance but in a history whose move to another version, made
// before 2026-12-05, renamed two onto one path: the fold, and the
// interpreter's views, then find the last.
func (s Execution) StepIndex(id string) int {
	for i := len(s.Steps) - 1; i >= 0; i-- {
		if s.Steps[i].ID == id {
			return i
		}
	}
	return -1
}

// duplicateStep returns a path that steps holds twice, if one does
// (a short list is compared pair by pair: no map for most starts).
func duplicateStep(steps []Step) (string, bool) {
	if len(steps) <= 32 {
		for i := range steps {
			for j := i + 1; j < len(steps); j++ {
				if steps[i].ID == steps[j].ID {
					return steps[i].ID, true
				}
			}
		}
		return "", false
	}
	seen := make(map[string]bool, len(steps))
	for _, st := range steps {
		if seen[st.ID] {
			return st.ID, true
		}
		seen[st.ID] = true
	}
	return "", false
}
