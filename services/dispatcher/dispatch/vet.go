package dispatch

import (
	"fmt"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/services/dispatcher/interp"
)

// The checks the shell makes of a command that intake admitted, before it
// looks its execution up: pure, so that the fuzz target FuzzCommand holds
// them, intake's and the interpreter's decisions to one contract (every
// command ends accepted or rejected with a reason).

// vetCommand says why the command ev is refused before its execution is
// looked at (nil if it is not): its sender is told.
func vetCommand(ev events.Event) *interp.Rejection {
	switch p := ev.Data.(type) {
	case *events.SignalExecution:
		return vetExecutionID(p.ExecutionID)
	case *events.ExecutionAction:
		return vetAction(p)
	case *events.ClearLock:
		return vetClearLock(p)
	}
	return nil
}

func invalid(format string, args ...any) *interp.Rejection {
	return &interp.Rejection{Code: events.CodeInvalid, Reason: fmt.Sprintf(format, args...)}
}

// vetExecutionID refuses a command naming an id no execution can have.
func vetExecutionID(id string) *interp.Rejection {
	if !events.ValidExecutionID(id) {
		return invalid("execution_id %q is not valid: %s", id, events.ExecutionIDRule)
	}
	return nil
}

// vetAction refuses an operator's action that no execution could take.
func vetAction(p *events.ExecutionAction) *interp.Rejection {
	switch {
	case p.Action != events.ActionReplay && (p.From != "" || p.Force):
		return invalid("from and force apply to the replay action only, not to %s (use force-cancel or force-resume)", p.Action)
	case p.Version != 0 && p.Action != events.ActionResume && p.Action != events.ActionForceResume && p.Action != events.ActionReplay:
		return invalid("version applies to resume, force-resume and replay only, not to %s", p.Action)
	case p.Version < events.LatestVersion:
		return invalid("version %d is not a version: give a version number (1, 2, ...) or \"latest\"", int(p.Version))
	case p.Action == events.ActionRepair && p.IgnoreSeq == 0:
		return invalid("repair needs ignore_seq: the stream sequence of the damaged event (jetflow show names it)")
	case p.Action != events.ActionRepair && p.IgnoreSeq > 0:
		return invalid("ignore_seq applies to the repair action only, not to %s", p.Action)
	case p.Action == events.ActionRepair && (p.Actor == nil || p.Actor.Method == events.ActorNATS):
		return &interp.Rejection{Code: events.CodeForbidden,
			Reason: "repair is an admin's action: ask the api for it with a token that has the admin scope (jetflow repair, or POST /v1/executions/{id}/actions)"}
	case !events.ValidAction(p.Action):
		return invalid("action %q is not known; use one of: %s", p.Action, strings.Join(events.Actions, ", "))
	case len(p.Reason) > events.MaxActionReason || len(p.RequestedBy) > events.MaxRequestedBy:
		return invalid("reason is %d bytes and requested_by %d; at most %d and %d are kept",
			len(p.Reason), len(p.RequestedBy), events.MaxActionReason, events.MaxRequestedBy)
	}
	return vetExecutionID(p.ExecutionID)
}

// vetClearLock refuses a clear-lock command that names no lock entry
// that could exist.
func vetClearLock(p *events.ClearLock) *interp.Rejection {
	switch {
	case !events.ValidLockName(p.Lock):
		return invalid("lock %q is not a lock name: %s", p.Lock, events.LockNameRule)
	case len(p.Entries) == 0:
		return invalid("entries: name at least one holder or waiter to clear")
	case len(p.Reason) > events.MaxActionReason || len(p.RequestedBy) > events.MaxRequestedBy:
		return invalid("reason is %d bytes and requested_by %d; at most %d and %d are kept",
			len(p.Reason), len(p.RequestedBy), events.MaxActionReason, events.MaxRequestedBy)
	}
	for i, en := range p.Entries {
		if !events.ValidWorkflowName(en.Workflow) || !events.ValidExecutionID(en.ExecutionID) {
			return invalid("entries[%d]: workflow %q or execution_id %q is not valid", i, en.Workflow, en.ExecutionID)
		}
	}
	return nil
}

// sentAt is when a command counts as sent: its CloudEvent time, but never
// later than stored, when its stream stored it (by the server's clock),
// nor unset. A command waiting for what it names (an execution that is not
// started yet, a timer not recorded yet) is handed back for a while after
// it was sent: from a time in the future (a sender's wrong clock, or a
// forged time) that would be until then, years perhaps.
func sentAt(ceTime, stored time.Time) time.Time {
	if stored.IsZero() || (!ceTime.IsZero() && !ceTime.After(stored)) {
		return ceTime
	}
	return stored
}

// signalCommand is the interpreter's signal command for ev (a
// SignalExecution) sent at sentAt.
func signalCommand(ev events.Event, p *events.SignalExecution, sentAt time.Time) interp.SignalCommand {
	return interp.SignalCommand{ID: events.SignalID(events.CommandKey(ev.Source, ev.ID)), Name: p.Name, Data: p.Data,
		Sender: ev.Source, Actor: p.Actor, SentAt: sentAt}
}

// actionRecord records an operator's action ev (an ExecutionAction).
func actionRecord(ev events.Event, p *events.ExecutionAction) events.ActionRecord {
	rec := events.ActionRecord{Action: p.Action, Reason: p.Reason, RequestedBy: p.RequestedBy, Actor: p.Actor,
		Command: events.CommandKey(ev.Source, ev.ID)}
	if rec.RequestedBy == "" {
		rec.RequestedBy = ev.Source
	}
	return rec
}

// clearRecord records a clear-lock command ev.
func clearRecord(ev events.Event, p *events.ClearLock) events.ActionRecord {
	rec := events.ActionRecord{Action: "clear-lock", Reason: p.Reason, RequestedBy: p.RequestedBy, Actor: p.Actor,
		Command: events.CommandKey(ev.Source, ev.ID)}
	if rec.RequestedBy == "" {
		rec.RequestedBy = ev.Source
	}
	return rec
}
