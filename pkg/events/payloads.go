package events

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// Payload is the data of a jetflow CloudEvent. The set of payloads is
// closed: only types in this package implement it.
type Payload interface {
	// EventType is the CloudEvents type this payload travels as.
	EventType() Type
	payload()
}

// StepRef names a step of the pinned definition, in execution order.
type StepRef struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
}

// ExecutionStarted is the first event of every execution.
type ExecutionStarted struct {
	Workflow   string          `json:"workflow"`
	Version    int             `json:"version"`
	Input      json.RawMessage `json:"input"`
	Steps      []StepRef       `json:"steps"`
	Definition json.RawMessage `json:"definition"`
	Token      string          `json:"token"`
	// CommandKey identifies the start command (CloudEvent source and id), so
	// a re-delivered or re-published command is recognised.
	CommandKey string `json:"command_key"`
	// CommandDigest is what the start command asked for
	// (StartExecution.Digest): a request under the same key with other
	// data is another request, refused.
	CommandDigest string `json:"command_digest,omitempty"`
	// StartedBy is the subject of the start's actor (before actors were
	// recorded: the start command's CloudEvent source).
	StartedBy string `json:"started_by,omitempty"`
	// Actor is who started the execution, as authenticated.
	Actor *Actor `json:"actor,omitempty"`
	// APIURL is the api's base URL as the dispatcher that started the
	// execution was told workflows reach it (workflow.api_url in
	// expressions); "" if it was not told.
	APIURL string `json:"api_url,omitempty"`
	// WaitAfterFail: a failure suspends the execution instead of ending it.
	WaitAfterFail bool `json:"wait_after_fail,omitempty"`
	// DryRun: the workflow is walked, no operation runs.
	DryRun bool `json:"dry_run,omitempty"`
	// Chain, Run and ContinuedFrom, for an execution a continue-as-new
	// step started: the id of the chain's first execution, this one's
	// number in the chain (the first is 1) and its predecessor.
	Chain         string `json:"chain,omitempty"`
	Run           int    `json:"run,omitempty"`
	ContinuedFrom string `json:"continued_from,omitempty"`
	// Parent, for a child execution: the execution and the step whose
	// attempt started it (the parent waits for its end).
	Parent *ParentRef `json:"parent,omitempty"`
	// Retention is the workflow's retention rule; nil when it sets none
	// (the system default applies).
	Retention *Retention `json:"retention,omitempty"`
	// Then is the first operation's schedule and sending, when sending it
	// was the dispatcher's first decision: one event records both, as if
	// an io.jetflow.step.dispatched followed this one (docs/adr/0008).
	Then *StepDispatched `json:"then,omitempty"`
}

// Retention records the retention rule in force for an execution from an
// event on: Rule in the syntax of package retention (context already
// replaced by the rule before; parent and system are resolved by the
// janitor), and Key the group the execution is counted in ("" for its
// workflow's name).
type Retention struct {
	Rule string `json:"rule"`
	Key  string `json:"key,omitempty"`
}

// ExecutionSuspended records a failure of an execution started with
// wait_after_fail: it is suspended, resumable, not ended.
type ExecutionSuspended struct {
	Error  string `json:"error"`
	StepID string `json:"step_id,omitempty"`
}

// ExecutionSucceeded ends an execution successfully.
type ExecutionSucceeded struct {
	Output json.RawMessage `json:"output,omitempty"`
	// ContinuedAs is the execution that goes on from this one, when a
	// continue-as-new step ended it: its successor, in the same chain.
	ContinuedAs string `json:"continued_as,omitempty"`
	// Children are the child executions this end stopped.
	Children []StoppedChild `json:"stopped_children,omitempty"`
	// Step is the last step's success, when ending the execution was the
	// dispatcher's very next decision once it was recorded: one event
	// records both, as if this one followed an io.jetflow.step.succeeded
	// (docs/adr/0015). It carries no Then.
	Step *StepSucceeded `json:"step,omitempty"`
}

// StoppedChild is a child execution its parent told to stop as it ended
// (or began to compensate): the step that waited for it fails in the same
// event, and the child was sent Action (cancel, force-cancel or kill)
// just before.
type StoppedChild struct {
	StepID      string `json:"step_id"`
	Attempt     int    `json:"attempt"`
	ExecutionID string `json:"execution_id"`
	Action      string `json:"action"`
}

// ExecutionFailed ends an execution with an error.
type ExecutionFailed struct {
	Error  string `json:"error"`
	StepID string `json:"step_id,omitempty"`
	// Children are the child executions this end stopped.
	Children []StoppedChild `json:"stopped_children,omitempty"`
}

// StepScheduled moves a step to pending. StepID is the step's path: its id
// for a top-level step, "<container>/<id>", "<foreach>[<i>]/<id>",
// "<parallel>/<branch>/<id>" or "<switch>/case<i>/<id>" inside containers;
// Kind is set for such nested steps, which the fold creates on this event.
// For a container, Input is what was decided when it was scheduled (the
// items, the case, the called workflow's definition and input).
type StepScheduled struct {
	StepID  string          `json:"step_id"`
	Kind    string          `json:"kind,omitempty"`
	Attempt int             `json:"attempt"`
	Input   json.RawMessage `json:"input,omitempty"`
	// Retention is the execution's retention from now on, set when the
	// step (first attempt) has a retention: field.
	Retention *Retention `json:"retention,omitempty"`
}

// StepSending moves a step to sending: its task is about to be published.
type StepSending struct {
	StepID  string `json:"step_id"`
	Attempt int    `json:"attempt"`
	TaskID  string `json:"task_id"`
	Queue   string `json:"queue"`
}

// StepDispatched is a StepScheduled and the StepSending that follows it,
// recorded as one event when nothing can happen between them (an
// operation whose next decision, once pending, is to send its task): the
// step passes through pending to sending. Like StepSending it is written
// before the task is published.
type StepDispatched struct {
	StepID    string          `json:"step_id"`
	Kind      string          `json:"kind,omitempty"`
	Attempt   int             `json:"attempt"`
	Input     json.RawMessage `json:"input,omitempty"`
	Retention *Retention      `json:"retention,omitempty"`
	TaskID    string          `json:"task_id"`
	Queue     string          `json:"queue"`
}

// Scheduled returns the schedule d records.
func (d *StepDispatched) Scheduled() *StepScheduled {
	return &StepScheduled{StepID: d.StepID, Kind: d.Kind, Attempt: d.Attempt, Input: d.Input, Retention: d.Retention}
}

// Sending returns the sending d records.
func (d *StepDispatched) Sending() *StepSending {
	return &StepSending{StepID: d.StepID, Attempt: d.Attempt, TaskID: d.TaskID, Queue: d.Queue}
}

// StepSent moves a step to sent: its task is stored in the tasks stream.
type StepSent struct {
	StepID  string `json:"step_id"`
	Attempt int    `json:"attempt"`
	TaskID  string `json:"task_id"`
	TaskSeq uint64 `json:"task_seq,omitempty"`
}

// StepStarted moves a step to started: an agent runs it.
type StepStarted struct {
	StepID   string `json:"step_id"`
	Attempt  int    `json:"attempt"`
	Agent    string `json:"agent,omitempty"`
	Delivery int    `json:"delivery,omitempty"`
	// StartedAt is when the agent began the operation, from its report
	// (zero from older agents: the event's time is the start then).
	StartedAt time.Time `json:"started_at,omitzero"`
	// TaskSent: as in StepSucceeded.
	TaskSent
}

// StepChildStarted records that a workflow step with child: true
// started its child execution ExecutionID (of Workflow, at Version): the
// step stays pending until the child ends, and then succeeds with the
// child's output or fails with its error.
type StepChildStarted struct {
	StepID      string `json:"step_id"`
	Attempt     int    `json:"attempt"`
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	Version     int    `json:"version"`
}

// StepSucceeded records a step's result. It is recorded at most once per step.
type StepSucceeded struct {
	StepID  string          `json:"step_id"`
	Attempt int             `json:"attempt"`
	Output  json.RawMessage `json:"output,omitempty"`
	// SignalID is the signal a wait step took.
	SignalID string `json:"signal_id,omitempty"`
	// Vars are the variables a let step set (recorded with its success, so
	// that setting them and finishing the step is one event).
	Vars     map[string]json.RawMessage `json:"vars,omitempty"`
	Agent    string                     `json:"agent,omitempty"`
	Duration int64                      `json:"duration_ms,omitempty"`
	// OperationStart is set when the operation's start was not recorded
	// before its result (the agent reports a short operation's start
	// only with its result): the step passed through started, at that
	// time, in that delivery.
	OperationStart
	// TaskSent is set when the step's sending was not recorded by an
	// io.jetflow.step.sent (a dispatcher records it with what follows:
	// docs/adr/0007): the step passed through sent at that time.
	TaskSent
	// Then is the next operation's schedule and sending, when sending it
	// was the dispatcher's very next decision once this success is
	// recorded: one event records both, as if an
	// io.jetflow.step.dispatched followed this one.
	Then *StepDispatched `json:"then,omitempty"`
	// Fired is the timer of a sleep step whose firing this success
	// records too: one event records both, as if it followed an
	// io.jetflow.timer.fired of that timer (docs/adr/0017).
	Fired string `json:"fired,omitempty"`
}

// OperationStart says when an agent began an operation, and in which
// delivery of its task. An agent's final report carries it; a step's
// success or failure carries it when no io.jetflow.step.started recorded
// that start, so that one event records both states. Both members are
// optional: a reader that does not know them passes over them.
type OperationStart struct {
	StartedAt time.Time `json:"started_at,omitzero"`
	Delivery  int       `json:"delivery,omitempty"`
}

// TaskSent says when an operation's task was stored in its queue, and at
// which sequence of the tasks stream: what io.jetflow.step.sent records.
// A step's start, success or failure carries it when no step.sent
// recorded it before (docs/adr/0007), so that one event records both
// states. Both members are optional: a reader that does not know them
// passes over them.
type TaskSent struct {
	SentAt  time.Time `json:"sent_at,omitzero"`
	TaskSeq uint64    `json:"task_seq,omitempty"`
}

// StepFailed records a step's failure. It may be a step's first event
// (a step that could not even be scheduled: its condition or input could
// not be evaluated), and then carries the attempt and, for a nested step,
// its kind.
type StepFailed struct {
	StepID  string `json:"step_id"`
	Kind    string `json:"kind,omitempty"`
	Attempt int    `json:"attempt"`
	Error   string `json:"error"`
	// Final marks a failure that retrying cannot change (an expression
	// that cannot be evaluated, a condition that does not give a boolean):
	// the retry policy does not apply, on-error steps still run.
	Final  bool            `json:"final,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	Agent  string          `json:"agent,omitempty"`
	// Lost marks a failure because the task was lost (its agents kept
	// dying, or it left its queue without a result): a workflow
	// replayable automatically is replayed resuming.
	Lost bool `json:"lost,omitempty"`
	// OperationStart and TaskSent: as in StepSucceeded.
	OperationStart
	TaskSent
}

// StepSkipped records that a step did not run because its condition was false.
type StepSkipped struct {
	StepID string `json:"step_id"`
	Kind   string `json:"kind,omitempty"`
	Reason string `json:"reason,omitempty"`
	// DryRun: the step would run (its input is recorded with its
	// schedule) but a dry run runs nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// StepWaiting records that a sleep or wait step waits.
type StepWaiting struct {
	StepID  string    `json:"step_id"`
	Attempt int       `json:"attempt"`
	Until   time.Time `json:"until,omitzero"`
	Signals []string  `json:"signals,omitempty"`
	// Timer, when set, records the arming of the timer the wait waits
	// for (a sleep's end, a wait's timeout: its step, attempt and due
	// time are the wait's), where a TimerArmed of its own came just
	// before (docs/adr/0018). Applied before the wait.
	Timer *TimerArmed `json:"timer,omitempty"`
}

// StepRescheduled records that attempt failed and NextAttempt runs at Due.
type StepRescheduled struct {
	StepID      string    `json:"step_id"`
	Attempt     int       `json:"attempt"`
	NextAttempt int       `json:"next_attempt"`
	Due         time.Time `json:"due"`
	TimerID     string    `json:"timer_id"`
}

// VariablesSet records variables set by a step (merged into the others).
type VariablesSet struct {
	StepID string                     `json:"step_id,omitempty"`
	Vars   map[string]json.RawMessage `json:"vars"`
}

// Timer purposes.
const (
	TimerSleep           = "sleep"
	TimerWaitTimeout     = "wait-timeout"
	TimerStepTimeout     = "step-timeout"
	TimerRetry           = "retry"
	TimerWorkflowTimeout = "workflow-timeout"
	// TimerCallTimeout bounds a workflow called by name (its own
	// timeout); StepID is the calling step, Attempt its attempt.
	TimerCallTimeout = "call-timeout"
	// TimerLockTimeout bounds the wait for a workflow step's lock
	// (lock_timeout); StepID is the step, Attempt the scope's request.
	TimerLockTimeout = "lock-timeout"
)

// TimerArmed records a durable timer.
type TimerArmed struct {
	TimerID string    `json:"timer_id"`
	Purpose string    `json:"purpose"`
	StepID  string    `json:"step_id,omitempty"`
	Attempt int       `json:"attempt,omitempty"`
	Due     time.Time `json:"due"`
}

// TimerFired records that a timer fired and was acted on.
type TimerFired struct {
	TimerID string `json:"timer_id"`
}

// SignalReceived records a signal.
type SignalReceived struct {
	SignalID string          `json:"signal_id"`
	Name     string          `json:"name"`
	Data     json.RawMessage `json:"data,omitempty"`
	// Sender is the signal command's CloudEvent source.
	Sender string `json:"sender,omitempty"`
	// Actor is who sent the signal, as authenticated.
	Actor *Actor `json:"actor,omitempty"`
}

// SignalExecution is the data of a signal command.
type SignalExecution struct {
	ExecutionID string          `json:"execution_id"`
	Name        string          `json:"name"`
	Data        json.RawMessage `json:"data,omitempty"`
	// Actor is set by the api only ([Actor]).
	Actor *Actor `json:"actor,omitempty"`
}

// Operators' actions on an execution.
const (
	// ActionCancel stops the execution at the next step boundary: running
	// operations finish (their results are recorded), nothing new starts.
	ActionCancel = "cancel"
	// ActionForceCancel marks the execution cancelled at once, without
	// waiting for running operations; their late results are ignored.
	ActionForceCancel = "force-cancel"
	// ActionKill is a force-cancel that also has the agents terminate the
	// execution's running operations.
	ActionKill = "kill"
	// ActionResume runs a started, failed or cancelled execution on: its
	// failed and rescheduled steps run again (with their recorded input
	// and fresh retry counts); operations with the agents are waited for.
	ActionResume = "resume"
	// ActionForceResume also runs again the operations that were sending,
	// sent or started (their agents may have died).
	ActionForceResume = "force-resume"
	// ActionReplay runs the execution again from a replay point (From:
	// resume, last, start or a step id), with the variables as they were
	// there; Force ignores the steps' idempotency and replay points.
	ActionReplay = "replay"
)

// Where a replay goes on from (ExecutionAction.From), besides a step id.
const (
	// ReplayResume resumes at the last incomplete step if it is
	// idempotent, else replays from the last replay point before it.
	ReplayResume = "resume"
	// ReplayLast replays from the last replay point.
	ReplayLast = "last"
	// ReplayStart replays from the start (the workflow must say
	// replayable: from start, unless forced).
	ReplayStart = "start"
)

// Actions lists the actions the dispatcher carries out.
var Actions = []string{ActionCancel, ActionForceCancel, ActionKill, ActionResume, ActionForceResume, ActionReplay, ActionCompensate, ActionRepair}

// ActionCompensate runs the compensate steps of the steps that succeeded,
// in reverse order of completion, in an execution that is over.
const ActionCompensate = "compensate"

// Why compensation ran (CompensationStarted.Cause).
const (
	CompensateForFailure  = "failure"
	CompensateForCancel   = "cancel"
	CompensateForOperator = "operator"
)

// CompensationStarted records that the execution's compensation begins
// (the saga pattern): the compensate steps of Steps run, one step's after
// the other's, in that order (the reverse of their completion). Cause
// says why: the execution failed (Error) or was cancelled and its
// workflow compensates then, or an operator asked (the action record;
// Token is then the execution's new token, as a resume gives one).
type CompensationStarted struct {
	ActionRecord
	Cause string   `json:"cause"`
	Error string   `json:"error,omitempty"`
	Steps []string `json:"steps"`
	Token string   `json:"token,omitempty"`
	// Children are the child executions stopped as the compensation
	// began (a failure's or a cancel's: they did not succeed, and nothing
	// of theirs is compensated).
	Children []StoppedChild `json:"stopped_children,omitempty"`
}

// CompensationFinished records that every compensation ran.
type CompensationFinished struct{}

// CompensationFailed records that the compensation of StepID failed
// (Error): the compensations after it do not run.
type CompensationFailed struct {
	StepID string `json:"step_id"`
	Error  string `json:"error"`
}

// Bounds of what an operator's action carries into the history.
const (
	MaxActionReason = 4096
	MaxRequestedBy  = 256
)

// ValidAction reports whether a names an action the dispatcher carries out.
func ValidAction(a string) bool { return slices.Contains(Actions, a) }

// KillOperations tells agents to terminate every operation of an execution
// they run (published on jf.kills.<execution> after a kill).
type KillOperations struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	// Command is the key of the kill command.
	Command string `json:"command,omitempty"`
	// Lift, set when the execution is resumed, ends the kill: its new
	// tasks run.
	Lift bool `json:"lift,omitempty"`
}

// RefuseTasks tells agents that an execution ended with operations still
// with them (a force-cancel, a failure while other branches ran): they
// refuse its tasks that have not started and carry one of Tokens, and
// let the running ones finish. Published on jf.kills.<execution> after
// the end is recorded.
type RefuseTasks struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	// Tokens are the execution tokens of the tasks out at the end (its
	// token, and older ones of attempts sent before a resume).
	Tokens []string `json:"tokens"`
	// Command is the key of the command that ended it, if one did.
	Command string `json:"command,omitempty"`
}

// TerminateTask tells agents to terminate one attempt whose step gave up
// on it (its timeout, or the workflow's, fired) and to refuse its task if
// it comes later; the rest of the execution runs on. Published on
// jf.kills.<execution>.<task hash>.
type TerminateTask struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	TaskID      string `json:"task_id"`
	// Reason says why, for the terminated operation's error.
	Reason string `json:"reason"`
}

// ExecutionAction is the data of an action command.
type ExecutionAction struct {
	ExecutionID string `json:"execution_id"`
	Action      string `json:"action"`
	// Reason is the operator's explanation, kept in the history.
	Reason string `json:"reason,omitempty"`
	// RequestedBy names who asked; the command's CloudEvent source if empty.
	RequestedBy string `json:"requested_by,omitempty"`
	// From is where a replay goes on from: resume (the default), last,
	// start, or a step's id or path.
	From string `json:"from,omitempty"`
	// Force makes a replay ignore idempotency and replay points.
	Force bool `json:"force,omitempty"`
	// Version, for a resume, force-resume or replay, moves the execution
	// to that version of its workflow first ([DefinitionChanged]).
	Version TargetVersion `json:"version,omitempty"`
	// Actor is set by the api only ([Actor]).
	Actor *Actor `json:"actor,omitempty"`
	// Parent, when set, limits the action to the child execution of that
	// step of its parent: a parent's dispatcher sets it when it stops its
	// children, so that it never stops an execution another start put
	// under a child's id.
	Parent *ParentRef `json:"parent,omitempty"`
	// IgnoreSeq is, for a repair, the stream sequence of the event that
	// made the execution damaged.
	IgnoreSeq uint64 `json:"ignore_seq,omitempty"`
}

// ActionRecord says who asked for an action, why, and with which command;
// it is recorded in the history with the action's events.
type ActionRecord struct {
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
	// RequestedBy is a free-text remark on who asked (the command's
	// CloudEvent source if it gave none); Actor is who asked, as
	// authenticated (nil for actions jetflow takes by itself, such as an
	// automatic replay, and in histories recorded before actors were).
	RequestedBy string `json:"requested_by,omitempty"`
	Actor       *Actor `json:"actor,omitempty"`
	// Command is the command key (CloudEvent source#id) that asked.
	Command string `json:"command,omitempty"`
}

// ExecutionCancelling records a cancel request.
type ExecutionCancelling struct {
	ActionRecord
}

// ExecutionCancelled records that the execution ended cancelled.
type ExecutionCancelled struct {
	ActionRecord
	// Children are the child executions this end stopped.
	Children []StoppedChild `json:"stopped_children,omitempty"`
}

// ResultIgnored records a report from an agent that was not applied: its
// token is stale (the execution was resumed since its task was sent) or it
// is about an attempt that is not the step's current one.
type ResultIgnored struct {
	// ResultID is the report's CloudEvent id, ResultType its type.
	ResultID   string `json:"result_id"`
	ResultType Type   `json:"result_type"`
	TaskID     string `json:"task_id"`
	StepID     string `json:"step_id"`
	Attempt    int    `json:"attempt"`
	Agent      string `json:"agent,omitempty"`
	Reason     string `json:"reason"`
}

// ResultAfterEnd is the final report of an operation that was with the
// agents when its execution ended, recorded when it arrives: the ended
// execution's state does not change (its step keeps its status, with
// this report noted), and a resume still runs such a step again if it
// failed (the report is also kept in the results stream).
type ResultAfterEnd struct {
	// ResultID is the report's CloudEvent id, ResultType its type
	// (operation.succeeded or operation.failed).
	ResultID   string    `json:"result_id"`
	ResultType Type      `json:"result_type"`
	TaskID     string    `json:"task_id"`
	StepID     string    `json:"step_id"`
	Attempt    int       `json:"attempt"`
	Agent      string    `json:"agent,omitempty"`
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
}

// ExecutionResumed records a resume or force-resume.
type ExecutionResumed struct {
	ActionRecord
	// Token is the new execution token: tasks sent from now on carry it.
	Token string `json:"token"`
	// Reset lists the step instances that run again.
	Reset []string `json:"reset,omitempty"`
}

// DefinitionChanged records that an action (a resume, force-resume or
// replay, the action record says which and who asked) moved the
// execution from FromVersion of its workflow to Version, whose
// definition it carries: the events after it run that definition. Steps
// are matched by id (path): a recorded step the new version still has
// keeps its result; Retired lists the recorded step instances it has
// not, whose results are ignored from now on; a step new in it runs when
// it is reached. It is recorded just before the action's own event.
type DefinitionChanged struct {
	ActionRecord
	FromVersion int             `json:"from_version"`
	Version     int             `json:"version"`
	Definition  json.RawMessage `json:"definition"`
	// Steps are the new version's top-level steps, as ExecutionStarted's.
	Steps []StepRef `json:"steps"`
	// Moved maps the path of each step instance the new version moved
	// (into or out of a block, say) to its new path; the instances inside
	// it move with it ([MovedPath]).
	Moved   map[string]string `json:"moved,omitempty"`
	Retired []string          `json:"retired,omitempty"`
	// Retention is the new version's workflow retention rule, when it
	// differs from the old version's: in force from now on.
	Retention *Retention `json:"retention,omitempty"`
}

// MovedPath returns where path is after the moves of a DefinitionChanged:
// a moved instance's new path, or an instance inside one (or inside a
// later attempt of it, or an item of a moved foreach) under the new path.
func MovedPath(path string, moved map[string]string) (string, bool) {
	if to, ok := moved[path]; ok {
		return to, true
	}
	for i := 0; i < len(path); i++ {
		if path[i] != '/' && path[i] != '@' && path[i] != '[' {
			continue
		}
		if to, ok := moved[path[:i]]; ok {
			return to + path[i:], true
		}
	}
	return "", false
}

// TargetVersion is the version of its workflow an action moves an
// execution to: a number from 1, or [LatestVersion], written "latest".
// Zero means none: the execution stays on its version.
type TargetVersion int

// LatestVersion is "latest": the workflow's latest version when the
// action is decided.
const LatestVersion TargetVersion = -1

// MarshalJSON writes a number, or "latest".
func (v TargetVersion) MarshalJSON() ([]byte, error) {
	if v == LatestVersion {
		return []byte(`"latest"`), nil
	}
	return []byte(strconv.Itoa(int(v))), nil
}

// UnmarshalJSON reads a number from 1, or "latest". Anything else is a
// *json.UnmarshalTypeError, whose member the decoder names (ExplainJSON:
// `version: must be a version number (1, 2, ...) or "latest", not 0`;
// encoding/json's v2 implementation does not name it: UnmarshalJSONFrom
// does, in a build with it).
func (v *TargetVersion) UnmarshalJSON(b []byte) error {
	if string(b) == "null" { // as if not given
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil && s == "latest" {
		*v = LatestVersion
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil || n < 1 {
		return &json.UnmarshalTypeError{Value: string(b), Type: reflect.TypeFor[TargetVersion]()}
	}
	*v = TargetVersion(n)
	return nil
}

// String is the version as written: a number, or latest.
func (v TargetVersion) String() string {
	if v == LatestVersion {
		return "latest"
	}
	return strconv.Itoa(int(v))
}

// ExecutionReplayed records a replay: asked by an operator (the action
// record says who), by jetflow for an execution replayable automatically,
// or by a retry step with replay in on-error steps (Cause names it).
type ExecutionReplayed struct {
	ActionRecord
	// From is what was asked (resume, last, start, a step); Force whether
	// idempotency and replay points were ignored.
	From  string `json:"from"`
	Force bool   `json:"force,omitempty"`
	// Point is the step instance the execution goes on from ("" for the
	// start), Mode how: "resume" runs Point again with its recorded
	// input; "replay" re-checks conditions and re-evaluates inputs.
	Point string `json:"point,omitempty"`
	Mode  string `json:"mode"`
	// Token is the new execution token.
	Token string `json:"token"`
	// Resume lists the instances that run again with their recorded
	// input (as a resume does), Reopen the containers around Point that
	// run on (they keep the instances done inside them), Reset the
	// instances that start over from their condition.
	Resume []string `json:"resume,omitempty"`
	Reopen []string `json:"reopen,omitempty"`
	Reset  []string `json:"reset,omitempty"`
	// Vars are the workflow variables as they were when Point was
	// entered: they replace the current ones.
	Vars map[string]json.RawMessage `json:"vars,omitempty"`
	// Cause is the retry step that asked (its place in the definition),
	// "" for an operator's or an automatic replay.
	Cause string `json:"cause,omitempty"`
	// Automatic marks a replay of an execution replayable automatically.
	Automatic bool `json:"automatic,omitempty"`
}

// Replay modes (ExecutionReplayed.Mode).
const (
	ReplayModeResume = "resume"
	ReplayModeReplay = "replay"
)

// FireTimer is the data of a timer coming due.
type FireTimer struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	TimerID     string `json:"timer_id"`
}

// TimerNotice is the data of a long timer's notice (docs/adr/0019): the
// timer, and the due time of the arming it was set for (a notice of an
// earlier arming, or of a timer that fired since, changes nothing).
type TimerNotice struct {
	ExecutionID string    `json:"execution_id"`
	Workflow    string    `json:"workflow"`
	TimerID     string    `json:"timer_id"`
	Due         time.Time `json:"due"`
}

// StartExecution is the data of a start command.
type StartExecution struct {
	Workflow string `json:"workflow"`
	// Version pins a definition version; 0 means the latest.
	Version int             `json:"version,omitempty"`
	Input   json.RawMessage `json:"input,omitempty"`
	// ExecutionID is optional; without it the id is derived from the
	// CloudEvent's source and id, so publishing the same event twice starts
	// one execution.
	ExecutionID string `json:"execution_id,omitempty"`
	// WaitAfterFail: a failure suspends the execution (an operator can fix
	// the cause and resume it) instead of ending it.
	WaitAfterFail bool `json:"wait_after_fail,omitempty"`
	// DryRun walks the workflow (conditions and expressions evaluated,
	// every operation recorded with its resolved input) without running
	// any operation, sleeping or waiting.
	DryRun bool `json:"dry_run,omitempty"`
	// Actor is set by the api only ([Actor]); it is not part of the
	// request's [StartExecution.Digest].
	Actor *Actor `json:"actor,omitempty"`
	// Chain, Run and ContinuedFrom are set by the dispatcher only, for
	// the successor a continue-as-new step starts (see ExecutionStarted).
	Chain         string `json:"chain,omitempty"`
	Run           int    `json:"run,omitempty"`
	ContinuedFrom string `json:"continued_from,omitempty"`
	// Parent is set by the dispatcher only, for the child execution a
	// workflow step with child: true starts (see ExecutionStarted).
	Parent *ParentRef `json:"parent,omitempty"`
}

// ParentRef links a child execution to its parent: the execution, its
// workflow, and the step and attempt that started the child.
type ParentRef struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	StepID      string `json:"step_id"`
	Attempt     int    `json:"attempt"`
	// Retention is the parent's retention rule when it started the child
	// ("" for the system default): the child's rule parent stands for it.
	Retention string `json:"retention,omitempty"`
}

// ReconcileExecution asks the dispatcher to look at an execution again.
type ReconcileExecution struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	Reason      string `json:"reason,omitempty"`
}

// Task is an operation for an agent. TaskID doubles as the idempotency key
// (execution, step, attempt) that handlers can use.
type Task struct {
	TaskID      string          `json:"task_id"`
	ExecutionID string          `json:"execution_id"`
	Workflow    string          `json:"workflow"`
	StepID      string          `json:"step_id"`
	Attempt     int             `json:"attempt"`
	Token       string          `json:"token"`
	Kind        string          `json:"kind"`
	Queue       string          `json:"queue"`
	Spec        json.RawMessage `json:"spec,omitempty"`
	// Partitions is the number of partitions of the dispatcher that sent
	// the task, when it takes reports handed straight to it
	// (docs/adr/0009): an agent may then hand its reports to the holder
	// of the execution's partition, on
	// jf.direct.<queue>.<partition>.<execution>. Zero: reports go to the
	// results stream only. An agent that does not know the field does so.
	Partitions int `json:"partitions,omitempty"`
}

// TaskRef identifies the task a result belongs to.
type TaskRef struct {
	TaskID      string `json:"task_id"`
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	StepID      string `json:"step_id"`
	Attempt     int    `json:"attempt"`
	Token       string `json:"token"`
	// Queue is the agent queue the task was sent to; a report is published
	// on that queue's results subject.
	Queue string `json:"queue,omitempty"`
	Agent string `json:"agent,omitempty"`
	// Delivery is the task's delivery count when this result was produced.
	Delivery int `json:"delivery,omitempty"`
	// TaskSeq and StoredAt are where and when the task was stored in the
	// tasks stream (its message's metadata; zero from older agents and
	// from reports not made by an agent): the dispatcher records the
	// step's sending from them when it has not recorded it itself.
	TaskSeq  uint64    `json:"task_seq,omitempty"`
	StoredAt time.Time `json:"stored_at,omitzero"`
}

// Ref returns the reference of t, for results about it.
func (t Task) Ref(agent string, delivery int) TaskRef {
	return TaskRef{TaskID: t.TaskID, ExecutionID: t.ExecutionID, Workflow: t.Workflow,
		StepID: t.StepID, Attempt: t.Attempt, Token: t.Token, Queue: t.Queue, Agent: agent, Delivery: delivery}
}

// OperationStarted reports that an agent began a task.
type OperationStarted struct {
	TaskRef
	// StartedAt is when the agent began the operation: the report is
	// published only once it has run for a while (the agent's
	// -report-started-after), so its own time is later (zero from older
	// agents).
	StartedAt time.Time `json:"started_at,omitzero"`
}

// OperationSucceeded reports a task's successful result.
type OperationSucceeded struct {
	TaskRef
	Output   json.RawMessage `json:"output,omitempty"`
	Duration int64           `json:"duration_ms,omitempty"`
	// StartedAt is when the agent began the operation (zero from agents
	// that report every start on its own, and for an operation that
	// never ran).
	StartedAt time.Time `json:"started_at,omitzero"`
}

// OperationFailed reports a task's failure.
type OperationFailed struct {
	TaskRef
	Error  string          `json:"error"`
	Output json.RawMessage `json:"output,omitempty"`
	// Lost: the janitor found the task lost (see StepFailed.Lost).
	Lost bool `json:"lost,omitempty"`
	// Final: retrying cannot help (the agent refused to run the operation,
	// or a secret it references is missing); see StepFailed.Final.
	Final bool `json:"final,omitempty"`
	// StartedAt: as in OperationSucceeded (zero for an operation the
	// agent refused, which never ran).
	StartedAt time.Time `json:"started_at,omitzero"`
}

// CommandRejected explains why a command was not applied.
type CommandRejected struct {
	// CommandKey is the command's CloudEvent source#id; for a message
	// that has none, its subject#seq-<stream sequence>.
	CommandKey  string `json:"command_key"`
	CommandType Type   `json:"command_type,omitempty"`
	ExecutionID string `json:"execution_id,omitempty"`
	Code        string `json:"code"`
	Reason      string `json:"reason"`
	// Field is the member of the command's data at fault, when one is
	// (a start's workflow, version, execution_id, input, input.<path>).
	Field string `json:"field,omitempty"`
	// Subject and StreamSeq say where the message was stored, for a
	// message rejected as it arrived (not a CloudEvent, or on the wrong
	// subject).
	Subject   string `json:"subject,omitempty"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
}

// Rejection codes, stable for clients.
const (
	CodeInvalid  = "invalid"
	CodeNotFound = "not_found"
	CodeConflict = "conflict"
	// CodeForbidden: the command's sender may not ask for it (a repair
	// published on NATS instead of asked of the api by an admin).
	CodeForbidden = "forbidden"
)

func (*ExecutionStarted) EventType() Type     { return TypeExecutionStarted }
func (*ExecutionSucceeded) EventType() Type   { return TypeExecutionSucceeded }
func (*ExecutionFailed) EventType() Type      { return TypeExecutionFailed }
func (*StepScheduled) EventType() Type        { return TypeStepScheduled }
func (*StepSending) EventType() Type          { return TypeStepSending }
func (*StepSent) EventType() Type             { return TypeStepSent }
func (*StepDispatched) EventType() Type       { return TypeStepDispatched }
func (*StepStarted) EventType() Type          { return TypeStepStarted }
func (*StepChildStarted) EventType() Type     { return TypeStepChildStarted }
func (*StepSucceeded) EventType() Type        { return TypeStepSucceeded }
func (*StepFailed) EventType() Type           { return TypeStepFailed }
func (*StartExecution) EventType() Type       { return TypeStartExecution }
func (*ReconcileExecution) EventType() Type   { return TypeReconcileExecution }
func (*Task) EventType() Type                 { return TypeTask }
func (*OperationStarted) EventType() Type     { return TypeOperationStarted }
func (*OperationSucceeded) EventType() Type   { return TypeOperationSucceeded }
func (*OperationFailed) EventType() Type      { return TypeOperationFailed }
func (*CommandRejected) EventType() Type      { return TypeCommandRejected }
func (*FireTimer) EventType() Type            { return TypeFireTimer }
func (*TimerNotice) EventType() Type          { return TypeTimerNotice }
func (*SignalExecution) EventType() Type      { return TypeSignalExecution }
func (*SignalReceived) EventType() Type       { return TypeSignalReceived }
func (*TimerFired) EventType() Type           { return TypeTimerFired }
func (*TimerArmed) EventType() Type           { return TypeTimerArmed }
func (*VariablesSet) EventType() Type         { return TypeVariablesSet }
func (*StepRescheduled) EventType() Type      { return TypeStepRescheduled }
func (*StepWaiting) EventType() Type          { return TypeStepWaiting }
func (*StepSkipped) EventType() Type          { return TypeStepSkipped }
func (*ExecutionAction) EventType() Type      { return TypeExecutionAction }
func (*KillOperations) EventType() Type       { return TypeKillOperations }
func (*RefuseTasks) EventType() Type          { return TypeRefuseTasks }
func (*TerminateTask) EventType() Type        { return TypeTerminateTask }
func (*ExecutionResumed) EventType() Type     { return TypeExecutionResumed }
func (*ExecutionReplayed) EventType() Type    { return TypeExecutionReplayed }
func (*DefinitionChanged) EventType() Type    { return TypeDefinitionChanged }
func (*CompensationStarted) EventType() Type  { return TypeCompensationStarted }
func (*CompensationFinished) EventType() Type { return TypeCompensationFinished }
func (*CompensationFailed) EventType() Type   { return TypeCompensationFailed }
func (*ResultIgnored) EventType() Type        { return TypeResultIgnored }
func (*ResultAfterEnd) EventType() Type       { return TypeResultAfterEnd }
func (*ExecutionSuspended) EventType() Type   { return TypeExecutionSuspended }
func (*ExecutionCancelling) EventType() Type  { return TypeExecutionCancelling }
func (*ExecutionCancelled) EventType() Type   { return TypeExecutionCancelled }

func (*ExecutionStarted) payload()     {}
func (*DefinitionChanged) payload()    {}
func (*CompensationStarted) payload()  {}
func (*CompensationFinished) payload() {}
func (*CompensationFailed) payload()   {}
func (*ExecutionSucceeded) payload()   {}
func (*ExecutionFailed) payload()      {}
func (*StepScheduled) payload()        {}
func (*StepSending) payload()          {}
func (*StepSent) payload()             {}
func (*StepDispatched) payload()       {}
func (*StepStarted) payload()          {}
func (*StepChildStarted) payload()     {}
func (*StepSucceeded) payload()        {}
func (*StepFailed) payload()           {}
func (*StartExecution) payload()       {}
func (*ReconcileExecution) payload()   {}
func (*Task) payload()                 {}
func (*OperationStarted) payload()     {}
func (*OperationSucceeded) payload()   {}
func (*OperationFailed) payload()      {}
func (*CommandRejected) payload()      {}
func (*FireTimer) payload()            {}
func (*TimerNotice) payload()          {}
func (*SignalExecution) payload()      {}
func (*SignalReceived) payload()       {}
func (*TimerFired) payload()           {}
func (*TimerArmed) payload()           {}
func (*VariablesSet) payload()         {}
func (*StepRescheduled) payload()      {}
func (*StepWaiting) payload()          {}
func (*StepSkipped) payload()          {}
func (*ExecutionAction) payload()      {}
func (*KillOperations) payload()       {}
func (*RefuseTasks) payload()          {}
func (*TerminateTask) payload()        {}
func (*ExecutionResumed) payload()     {}
func (*ResultAfterEnd) payload()       {}
func (*ExecutionReplayed) payload()    {}
func (*ResultIgnored) payload()        {}
func (*ExecutionSuspended) payload()   {}
func (*ExecutionCancelling) payload()  {}
func (*ExecutionCancelled) payload()   {}

// NewPayload returns a pointer to a zero payload of type t, for decoding
// its JSON data into, or nil if t is no type this version knows. It is
// the registry of payload types that [FromCloudEvent], [StrictData] and
// the NATS codec (package bus) decode with.
func NewPayload(t Type) Payload {
	switch t {
	case TypeExecutionStarted:
		return &ExecutionStarted{}
	case TypeExecutionSucceeded:
		return &ExecutionSucceeded{}
	case TypeExecutionFailed:
		return &ExecutionFailed{}
	case TypeStepScheduled:
		return &StepScheduled{}
	case TypeStepSending:
		return &StepSending{}
	case TypeStepDispatched:
		return &StepDispatched{}
	case TypeStepSent:
		return &StepSent{}
	case TypeStepChildStarted:
		return &StepChildStarted{}
	case TypeStepStarted:
		return &StepStarted{}
	case TypeStepSucceeded:
		return &StepSucceeded{}
	case TypeStepFailed:
		return &StepFailed{}
	case TypeStartExecution:
		return &StartExecution{}
	case TypeReconcileExecution:
		return &ReconcileExecution{}
	case TypeTask:
		return &Task{}
	case TypeOperationStarted:
		return &OperationStarted{}
	case TypeOperationSucceeded:
		return &OperationSucceeded{}
	case TypeOperationFailed:
		return &OperationFailed{}
	case TypeCommandRejected:
		return &CommandRejected{}
	case TypeFireTimer:
		return &FireTimer{}
	case TypeTimerNotice:
		return &TimerNotice{}
	case TypeSignalExecution:
		return &SignalExecution{}
	case TypeSignalReceived:
		return &SignalReceived{}
	case TypeTimerFired:
		return &TimerFired{}
	case TypeTimerArmed:
		return &TimerArmed{}
	case TypeVariablesSet:
		return &VariablesSet{}
	case TypeStepRescheduled:
		return &StepRescheduled{}
	case TypeStepWaiting:
		return &StepWaiting{}
	case TypeStepSkipped:
		return &StepSkipped{}
	case TypeExecutionAction:
		return &ExecutionAction{}
	case TypeKillOperations:
		return &KillOperations{}
	case TypeRefuseTasks:
		return &RefuseTasks{}
	case TypeTerminateTask:
		return &TerminateTask{}
	case TypeExecutionResumed:
		return &ExecutionResumed{}
	case TypeExecutionReplayed:
		return &ExecutionReplayed{}
	case TypeDefinitionChanged:
		return &DefinitionChanged{}
	case TypeCompensationStarted:
		return &CompensationStarted{}
	case TypeCompensationFinished:
		return &CompensationFinished{}
	case TypeCompensationFailed:
		return &CompensationFailed{}
	case TypeResultIgnored:
		return &ResultIgnored{}
	case TypeResultAfterEnd:
		return &ResultAfterEnd{}
	case TypeExecutionSuspended:
		return &ExecutionSuspended{}
	case TypeExecutionCancelling:
		return &ExecutionCancelling{}
	case TypeExecutionCancelled:
		return &ExecutionCancelled{}
	}
	return newLockPayload(t)
}

// ResultRef returns the task a result payload is about: the TaskRef of an
// OperationStarted, OperationSucceeded or OperationFailed.
func ResultRef(p Payload) (TaskRef, bool) {
	switch r := p.(type) {
	case *OperationStarted:
		return r.TaskRef, true
	case *OperationSucceeded:
		return r.TaskRef, true
	case *OperationFailed:
		return r.TaskRef, true
	}
	return TaskRef{}, false
}
