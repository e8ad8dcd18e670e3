package apiv1

import (
	"encoding/json"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// StartRequest is the JSON body of POST /v1/executions (the other form
// of a start is a CloudEvent of type io.jetflow.execution.start). Unknown
// members are an error.
type StartRequest struct {
	// Workflow is the workflow's name; it is required.
	Workflow string `json:"workflow"`
	// Version is a definition version; 0 means the latest.
	Version int `json:"version,omitempty"`
	// Input is a JSON object, kept as sent; absent or null means {}.
	Input json.RawMessage `json:"input,omitempty"`
	// ID is the execution id; "" means a new UUIDv7 (or, with an
	// Idempotency-Key, one derived from the key).
	ID string `json:"id,omitempty"`
	// WaitAfterFail: a failure suspends the execution instead of ending it.
	WaitAfterFail bool `json:"wait_after_fail,omitempty"`
	// DryRun walks the workflow without running any operation.
	DryRun bool `json:"dry_run,omitempty"`
}

// Started answers POST /v1/executions.
type Started struct {
	ID       string `json:"id"`
	Workflow string `json:"workflow"`
	// Version is the version of the workflow the execution runs: in a 201
	// and a 200 (when its state is known), as the dispatcher started it;
	// in a 202 only when the request named it (else the dispatcher
	// decides, the latest when it takes the start).
	Version int `json:"version,omitempty"`
	// Status is "started" (201), the execution's current status or
	// "accepted" (200), "accepted" (202).
	Status string `json:"status"`
	// Created is true when this request started the execution (201).
	Created bool `json:"created"`
	// Links are the execution's URLs (self, events), relative to the api.
	Links map[string]string `json:"links"`
	// Execution is the current state, in the answer to the same request
	// again (200) when there is one, as GET /v1/executions/{id} shows it.
	Execution *Execution `json:"execution,omitempty"`
	// HTTPStatus is 201 (started), 200 (the same request again) or 202
	// (accepted, the dispatcher has not answered yet). It is not in the
	// body: a client sets it from the answer.
	HTTPStatus int `json:"-"`
}

// Execution is an execution's state, as GET /v1/executions/{id} answers
// it: its read model (or the fold of its history), without execution
// tokens.
type Execution = projections.Execution

// ExecutionSummary is a row of GET /v1/executions.
type ExecutionSummary struct {
	ID       string `json:"id"`
	Workflow string `json:"workflow"`
	Version  int    `json:"version"`
	// Status is one of [projections.ListedStatuses].
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Steps counts step instances, Done those done: succeeded or
	// skipped.
	Steps     int       `json:"steps"`
	Done      int       `json:"steps_done"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Damaged is set for a damaged (quarantined) execution (see
	// docs/operations.md#damaged-executions).
	Damaged *projections.Damage `json:"damaged,omitempty"`
}

// ExecutionList is a page of executions, as GET /v1/executions answers
// it, sorted by id.
type ExecutionList struct {
	Executions []ExecutionSummary `json:"executions"`
	// Next is the cursor of the next page ("" on the last page): pass it
	// as ?after=.
	Next string `json:"next,omitempty"`
	// Partial says the api stopped looking before the page was full: it
	// examines a bounded number of executions per request. Go on with
	// Next; a page may then hold fewer than limit, or none.
	Partial bool `json:"partial,omitempty"`
}

// ExecutionCounts is how many executions are in each status, as GET
// /v1/executions/_counts answers: of all the executions the visibility
// index holds, or of one workflow's.
type ExecutionCounts struct {
	// Counts is the number of executions by status; a status without
	// executions is absent.
	Counts map[string]int `json:"counts"`
	// Total is the sum of Counts.
	Total int `json:"total"`
}

// Event is a history event as the api shows it, in GET
// /v1/executions/{id}/events and as the data of its server-sent events.
type Event struct {
	// Seq is the event's sequence in the events stream.
	Seq      uint64      `json:"seq"`
	ID       string      `json:"id"`
	Type     events.Type `json:"type"`
	Source   string      `json:"source"`
	Subject  string      `json:"subject,omitempty"`
	Workflow string      `json:"workflow,omitempty"`
	Time     time.Time   `json:"time"`
	// Data is the event's payload, with the values the workflow's input
	// schema marks writeOnly hidden.
	Data json.RawMessage `json:"data,omitempty"`
	// Invalid says why the stored message is no valid event (Data is not
	// shown then); the execution is damaged at it.
	Invalid string `json:"invalid,omitempty"`
}

// EventList is a history, as GET /v1/executions/{id}/events answers it.
type EventList struct {
	Events []Event `json:"events"`
}

// Signaled answers POST /v1/executions/{id}/signals/{name}.
type Signaled struct {
	ExecutionID string `json:"execution_id"`
	// Recorded is true once the signal is in the execution's history
	// (200), false if the dispatcher has not recorded it yet (202).
	Recorded bool   `json:"recorded"`
	Signal   string `json:"signal"`
	// SignalID is the signal's id (derived from the Idempotency-Key, if any).
	SignalID string `json:"signal_id"`
}

// ActionRequest is the body of POST /v1/executions/{id}/actions: an
// operator's action on an execution. Unknown members are an error.
type ActionRequest struct {
	// Action is cancel, force-cancel, kill, resume, force-resume, replay
	// or repair.
	Action string `json:"action"`
	// Reason is kept in the execution's history.
	Reason string `json:"reason,omitempty"`
	// RequestedBy names who asks (a person, a tool); the api's source if empty.
	RequestedBy string `json:"requested_by,omitempty"`
	// From and Force apply to a replay: where it goes on from (resume,
	// last, start, or a step's id or path), and whether to ignore
	// idempotency and replay points.
	From  string `json:"from,omitempty"`
	Force bool   `json:"force,omitempty"`
	// Version, for a resume, force-resume or replay, moves the execution
	// to that version of its workflow first: a number, or "latest"
	// (events.LatestVersion). Steps are matched by id.
	Version events.TargetVersion `json:"version,omitempty"`
	// IgnoreSeq, for a repair (admin scope), is the stream sequence of
	// the damaged event that folds pass over from now on.
	IgnoreSeq uint64 `json:"ignore_seq,omitempty"`
}

// Acted answers POST /v1/executions/{id}/actions.
type Acted struct {
	Action string `json:"action"`
	// Command is the key of the command that carries the action.
	Command     string `json:"command"`
	ExecutionID string `json:"execution_id"`
	// Recorded is true once the action is in the execution's history
	// (200), false if the dispatcher has not recorded it yet (202).
	Recorded bool `json:"recorded"`
}

// StepPage answers GET /v1/executions/{id}/steps: step instances of the
// execution in the order they were first recorded, from Offset; Total
// counts them all. It is the whole step table, also of an execution whose
// read model leaves finished steps out (its "truncated").
type StepPage struct {
	ID     string             `json:"id"`
	Total  int                `json:"total"`
	Offset int                `json:"offset"`
	Steps  []projections.Step `json:"steps"`
}
