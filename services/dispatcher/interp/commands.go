package interp

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// Commands. A command for an execution (a timer coming due, a signal, an
// operator's action) is decided here like any other fact: the events that
// record it and the effects that follow, or a [Rejection] the sender is
// told, or a Retry when it cannot be decided yet. The shell checks what
// only I/O can tell (that the execution exists, and its workflow) before.

// Rejection is a command refused: Code (events.Code*) and Reason are
// published to its sender, and nothing is recorded.
type Rejection struct {
	Code   string
	Reason string
}

// notStarted decides a command for an execution whose history is still
// empty: its start may be on its way (try again for a while: 30 s, or
// StartClaimedWait once its id is claimed, when the start was accepted
// and its first append waits, a cluster electing a leader), else it never
// started.
func notStarted(in Input, id string, sentAt time.Time) Decision {
	age := in.Now.Sub(sentAt)
	if age < 30*time.Second {
		return Decision{Retry: fmt.Sprintf("execution %s is not started yet", id)}
	}
	if age < StartClaimedWait {
		if in.Claimed == nil {
			return Decision{Need: NeedClaim{}}
		}
		if *in.Claimed {
			return Decision{Retry: fmt.Sprintf("execution %s is not started yet: its start was accepted and is on its way", id)}
		}
	}
	return reject(events.CodeNotFound, "execution %q never started", id)
}

// StartClaimedWait is how long a command waits for an execution whose
// start was accepted (its id claimed) but whose history is still empty.
const StartClaimedWait = 10 * time.Minute

// recordedAs reports whether the command with key was recorded already;
// if it was recorded as another action than action, the decision rejects
// it (a command id is one command).
func recordedAs(s projections.Execution, key, action string) (bool, Decision) {
	recorded, seen := s.CommandAction(key)
	if !seen {
		return false, Decision{}
	}
	if recorded != action {
		return true, reject(events.CodeConflict, "command %s was already recorded as a %s; give a new command a new CloudEvent id", key, recorded)
	}
	return true, Decision{}
}

func reject(code, format string, args ...any) Decision {
	return Decision{Reject: &Rejection{Code: code, Reason: fmt.Sprintf(format, args...)}}
}

// Expired is the rejection of a command for an execution that expired
// under its retention rule at at.
func Expired(id string, at time.Time) *Rejection {
	return &Rejection{Code: events.CodeExpired, Reason: fmt.Sprintf(
		"execution %q expired under its retention rule at %s; its history is deleted (or about to be)",
		id, at.UTC().Format(time.RFC3339))}
}

// Fired decides a timer coming due (its FireTimer command was published at
// sentAt): it is recorded, once, and what it means (a sleep ends, a wait or
// an attempt times out, a retry is due, the workflow times out) is decided
// from the recorded timer.fired by the next decision, so it is right after
// any crash. A sleep's end is that next decision most of the time: then
// its success records the firing too (sleepEnded).
func Fired(in Input, timerID string, sentAt time.Time) Decision {
	t, ok := in.State.Timers[timerID]
	switch {
	case !ok && in.Now.Sub(sentAt) < 10*time.Second:
		// Armed by another dispatcher a moment ago? Look again shortly.
		return Decision{Retry: fmt.Sprintf("timer %s not recorded yet", timerID)}
	case !ok:
		return Decision{Ignore: "a timer the history does not know"}
	case in.State.Status.Terminal():
		return Decision{Ignore: "the execution has ended"}
	case t.Fired:
		// Recorded already: by a dispatcher that stopped before it acted
		// on it (this command is the redelivery), or by this one for a
		// duplicate. Deciding again repairs the first and changes nothing
		// in the second.
		return Decision{}
	}
	fired := &events.TimerFired{TimerID: timerID}
	if t.Purpose == events.TimerSleep {
		if p := in.sleepEnded(fired); p != nil {
			return Decision{Events: []events.Payload{p}}
		}
	}
	d := Decision{Events: []events.Payload{fired}}
	switch t.Purpose {
	case events.TimerWorkflowTimeout:
		d.Before = in.abandoned("", "the workflow timed out after "+in.Def.Timeout)
	case events.TimerCallTimeout:
		if st, ok := callInstance(in.State, t.StepID); ok && st.Status == projections.OpPending && t.Attempt == in.State.Resumes {
			// The call still runs (its steps, or its own on-error steps).
			d.Before = in.abandoned(t.StepID+"/", "the workflow it belongs to (called by step "+st.ID+") timed out")
		}
	}
	return d
}

// sleepEnded is the sleep's success carrying its timer's firing (or the
// execution's end carrying both: docs/adr/0015), when the sleep's
// success is the very next decision once fired is recorded and nothing
// else goes with it (no effect before or after): one event records both
// (docs/adr/0017). nil otherwise, and under the bounds of
// Input.after: only in small executions, never with SplitDispatch.
func (in Input) sleepEnded(fired *events.TimerFired) events.Payload {
	if in.SplitDispatch || len(in.State.Steps) > SmallExecution {
		return nil
	}
	t := in.State.Timers[fired.TimerID]
	var out events.Payload
	// The firing changes the timers only: the state after it is a copy
	// (projections.Peek), which the look ahead below may walk.
	err := projections.Peek(in.State, events.Event{Type: fired.EventType(), Subject: in.ID, Time: in.Now, Data: fired}, func(next projections.Execution) {
		after := in
		after.State, after.Memo = next, &Memo{} // no view: walked
		if in.Memo != nil {
			after.Memo.retains = in.Memo.retains
		}
		d := Next(after)
		if d.Need != nil || d.Err != nil || d.Reject != nil || !d.At.IsZero() || len(d.Events) != 1 || len(d.Before)+len(d.After) > 0 {
			return
		}
		ok, _ := d.Events[0].(*events.StepSucceeded)
		end, ended := d.Events[0].(*events.ExecutionSucceeded)
		if ended {
			ok = end.Step
		}
		// Another step's success (an unsettled state: TestFiredInAnUnsettledState);
		// the attempt is checked too, though a sleep's timer is always its
		// current attempt's, so that the fold never refuses what is made here.
		if ok == nil || ok.StepID != t.StepID || ok.Attempt != t.Attempt {
			return
		}
		ok.Fired = fired.TimerID
		out = d.Events[0]
	})
	if err != nil {
		return nil
	}
	return out
}

// callInstance returns the container step whose attempt's instance
// (instancePrefix) is key, if it is that attempt.
func callInstance(s projections.Execution, key string) (projections.Step, bool) {
	st, _, current := s.ContainerAt(key)
	return st, current
}

// instancePrefix is the path prefix of the steps of a container's attempt
// (a container run again gets new instances: blk@2/...).
func instancePrefix(path string, attempt int) string {
	if attempt > 1 {
		return path + "@" + strconv.Itoa(attempt)
	}
	return path
}

// abandoned tells the agents to terminate the attempts a workflow's
// timeout leaves behind: every operation with them under prefix ("" for
// the execution's workflow, else a called workflow's steps) but those of
// the workflow's own on-error steps (which run after the timeout), and
// the child executions there (those whose step says on_parent_end:
// cancel) are told to cancel. Before the
// timer's firing is recorded: a crash in between fires it again, and the
// notices are published again (deduplicated by task); a firing whose
// append conflicts is decided again too (the timer fires however that
// goes).
func (in Input) abandoned(prefix, reason string) []Effect {
	var out []Effect
	left := func(path string) bool { // a compensation runs to its end
		return strings.HasPrefix(path, prefix) && !strings.HasPrefix(path, prefix+workflowOnError) && !inCompensation(path)
	}
	for _, st := range in.State.Steps {
		if st.Status.InFlight() && st.TaskID != "" && left(st.ID) {
			out = append(out, PublishKill{TaskID: st.TaskID, Reason: reason})
		}
	}
	// Child executions it leaves running are told to cancel (their steps
	// go no further; a retry of the call starts new ones).
	for _, c := range in.stoppable(in.State, left) {
		out = append(out, in.stopChild(c, events.ActionCancel, reason))
	}
	return out
}

// SignalCommand is a signal for an execution.
type SignalCommand struct {
	// ID is the signal's id, derived from its command key.
	ID     string
	Name   string
	Data   json.RawMessage
	Sender string
	Actor  *events.Actor
	SentAt time.Time
}

// Signal decides a signal: it is recorded, once, and a wait step takes
// it now or when it is reached.
func Signal(in Input, cmd SignalCommand) Decision {
	s := in.State
	switch {
	case !events.ValidSignalName(cmd.Name):
		return reject(events.CodeInvalid, "signal name %q: %s", cmd.Name, events.SignalNameRule)
	case s.Status == projections.StatusNone:
		return notStarted(in, in.ID, cmd.SentAt)
	case !s.ExpiredAt.IsZero():
		return Decision{Reject: Expired(s.ID, s.ExpiredAt)}
	case s.Status.Terminal():
		return reject(events.CodeConflict, "execution %q has already %s", in.ID, s.Status)
	}
	for _, sig := range s.Signals {
		if sig.ID == cmd.ID {
			return Decision{} // the same signal again
		}
	}
	return Decision{Events: []events.Payload{&events.SignalReceived{SignalID: cmd.ID, Name: cmd.Name, Data: cmd.Data, Sender: cmd.Sender, Actor: cmd.Actor}}}
}

// ActionCommand is an operator's action on an execution (all but repair,
// which the shell handles on a damaged execution).
type ActionCommand struct {
	// Key is the command's key (source#id): an action is recorded once
	// per command.
	Key string
	// Record is who asked, why, and the action.
	Record events.ActionRecord
	// From and Force: a replay's.
	From  string
	Force bool
	// Version, for a resume, force-resume or replay: the version of the
	// workflow to move the execution to first (0: it stays on its own).
	Version events.TargetVersion
	// Parent, when set, limits the action to the child execution of that
	// step (a parent stopping its children).
	Parent *events.ParentRef
	SentAt time.Time
}

// Action decides an operator's action. Every action is recorded in the
// history with who asked and why; a command decided twice (redelivered
// after a crash) is recorded once, and what follows its record is done
// again.
func Action(in Input, cmd ActionCommand) Decision {
	s := in.State
	action := cmd.Record.Action
	if !s.ExpiredAt.IsZero() {
		if _, seen := s.CommandAction(cmd.Key); seen {
			return Decision{} // carried out before the execution ended and expired
		}
		return Decision{Reject: Expired(s.ID, s.ExpiredAt)}
	}
	if seen, d := recordedAs(s, cmd.Key, action); seen {
		if d.Reject != nil {
			return d
		}
		// This command again: what follows its record may not have been done.
		// Still the execution's last action, and still over: not resumed,
		// replayed or cancelled otherwise since.
		last := len(s.Actions) > 0 && s.Actions[len(s.Actions)-1].Command == cmd.Key && s.Status == projections.StatusCancelled
		switch {
		case action == events.ActionKill && last:
			return Decision{After: []Effect{PublishKill{Command: cmd.Key}}}
		case action == events.ActionForceCancel && last:
			return Decision{After: endedNotice(s, cmd.Key)}
		}
		switch action {
		case events.ActionResume, events.ActionForceResume, events.ActionReplay:
			return Decision{After: []Effect{CatchUp{}}}
		}
		return Decision{}
	}
	if s.Status == projections.StatusNone {
		return notStarted(in, in.ID, cmd.SentAt)
	}
	if p := cmd.Parent; p != nil && (s.Parent == nil || s.Parent.ExecutionID != p.ExecutionID || s.Parent.StepID != p.StepID || s.Parent.Attempt != p.Attempt) {
		return reject(events.CodeConflict, "execution %q is not the child execution of step %s (attempt %d) of %s: the %s is for that child only",
			in.ID, p.StepID, p.Attempt, p.ExecutionID, action)
	}
	if cmd.Version != 0 && action != events.ActionResume && action != events.ActionForceResume && action != events.ActionReplay {
		return reject(events.CodeInvalid, "version applies to resume, force-resume and replay, not to %s", action)
	}
	if why := s.Status.ActionRefused(action); why != "" {
		return reject(events.CodeConflict, "execution %q %s", in.ID, why)
	}
	if action == events.ActionCancel && s.Status == projections.StatusStarted {
		if a := decideLocked(in.Def, s); a.kind == actWait && a.cause == awaitCompensation {
			return reject(events.CodeConflict, "execution %q is failing: its compensation waits for operations still out; force-cancel it to stop now (compensate it afterwards)", in.ID)
		}
	}
	if next, ok := continuedBy(s); ok && s.Status.Active() {
		switch action {
		case events.ActionCancel, events.ActionForceCancel, events.ActionKill:
			return reject(events.CodeConflict, "execution %q is ending: a continue-as-new step continued it as %s; %s that one instead", in.ID, next, action)
		}
	}
	if s.ContinuedAs != "" {
		switch action {
		case events.ActionReplay, events.ActionCompensate:
			return reject(events.CodeConflict, "execution %q continued as %s (continue-as-new): %s the chain's latest run instead", in.ID, s.ContinuedAs, action)
		}
	}
	if cmd.Version != 0 {
		return changeVersion(in, cmd)
	}
	rec := cmd.Record
	one := func(p events.Payload, after ...Effect) Decision {
		return Decision{Events: []events.Payload{p}, After: after}
	}
	if action == events.ActionCancel && s.Status == projections.StatusSuspended &&
		!slices.ContainsFunc(s.Steps, func(st projections.Step) bool { return st.Status.InFlight() }) {
		return in.childrenStopped(one(&events.ExecutionCancelled{ActionRecord: rec}), action) // nothing runs to wait for
	}
	switch action {
	case events.ActionReplay:
		from := cmp.Or(cmd.From, events.ReplayResume)
		if in.Def.ReplayPolicy().Disabled {
			return reject(events.CodeConflict, "workflow %s says replayable: disabled; it cannot be replayed (resume it instead)", in.Def.Name)
		}
		if in.Stored == nil {
			return Decision{Need: NeedStoredResults{}}
		}
		settled := map[string]bool{}
		for id := range in.Stored {
			settled[id] = true
		}
		for _, st := range s.Steps {
			if st.AfterEnd != nil { // its report came after the end: nothing runs
				settled[st.ID] = true
			}
		}
		ask := replayAsk{from: from, force: cmd.Force, settled: settled}
		plan, err := planReplay(in.Def, s, ask)
		var refused *replayRefused
		if errors.As(err, &refused) {
			refused.instead = alternatives(in.Def, s, ask)
			forced := ""
			if cmd.Force {
				forced = " with force"
			}
			return reject(events.CodeConflict, "execution %q cannot be replayed from %s%s: %s", in.ID, from, forced, refused)
		}
		if err != nil {
			return Decision{Err: err}
		}
		return replayed(in, rec, replayRequest{plan: rerunFailedMeanwhile(s, plan, in.Stored), from: from, force: cmd.Force})
	case events.ActionForceCancel:
		return in.childrenStopped(one(&events.ExecutionCancelled{ActionRecord: rec}, endedNotice(s, cmd.Key)...), action)
	case events.ActionKill:
		// Published once the execution is recorded cancelled, so a task
		// that starts later has its result ignored already.
		return in.childrenStopped(one(&events.ExecutionCancelled{ActionRecord: rec}, PublishKill{Command: cmd.Key}), action)
	case events.ActionResume, events.ActionForceResume:
		if c := s.Compensation; c != nil {
			return reject(events.CodeConflict, "execution %q was compensated (%s): the effects of its steps were undone; replay it instead of resuming it",
				in.ID, c.Status)
		}
		if in.Stored == nil {
			return Decision{Need: NeedStoredResults{}}
		}
		if in.Token == "" {
			return Decision{Need: NeedToken{}}
		}
		failedBefore := failedMeanwhile(s, in.Stored)
		reset := resetFor(in.Def, s, action == events.ActionForceResume, failedBefore)
		// The attempts a force-resume runs again while the agents may
		// still have them: terminated, so the old one does not run beside
		// the new (after the resume is recorded: one refused must not
		// stop anything).
		var after []Effect
		for _, id := range reset {
			st, ok := instanceOf(s, id)
			if ok && action == events.ActionForceResume && !failedBefore[id] && st.Status.InFlight() && st.TaskID != "" {
				after = append(after, PublishKill{TaskID: st.TaskID, Reason: "a force-resume runs the step again"})
			}
		}
		return one(&events.ExecutionResumed{ActionRecord: rec, Token: in.Token, Reset: reset}, append(after, CatchUp{})...)
	case events.ActionCancel:
		return one(&events.ExecutionCancelling{ActionRecord: rec})
	case events.ActionCompensate:
		return compensate(in, rec)
	}
	return reject(events.CodeInvalid, "action %q is not one the interpreter decides", action)
}

// rerunFailedMeanwhile adds to a replay of an execution that was over
// the operations out at its end whose failure came meanwhile (a task
// refused because the execution had ended, an operation killed): they run
// again, as a resume runs them, instead of their failure being taken as
// the replayed run's.
func rerunFailedMeanwhile(s projections.Execution, plan replayPlan, stored map[string]events.Event) replayPlan {
	if !s.Status.Settled() {
		return plan
	}
	reset := map[string]bool{}
	for id := range failedMeanwhile(s, stored) {
		if st, ok := instanceOf(s, id); ok && st.Status.InFlight() && !slices.Contains(plan.resume, id) && !slices.Contains(plan.reset, id) {
			reset[id] = true
		}
	}
	if len(reset) == 0 {
		return plan
	}
	for _, id := range plan.reset {
		reset[id] = true
	}
	plan.reset = sortedPaths(s, reset)
	return plan
}

// ExpireCommand is the janitor's ask to record that a finished execution
// expired under its retention rule, as of the history's last sequence it
// saw.
type ExpireCommand struct {
	LastSeq     uint64
	Rule, Group string
	By          string
}

// Expire records that the execution expired, only if its history still
// ends where the janitor saw it: one resumed or replayed since is kept, and
// the janitor decides again on its new state. Once execution.expired is
// recorded nothing can follow it (the fold refuses any event after it), so
// an operator's resume arriving later is refused rather than lost with the
// history the janitor then deletes.
func Expire(in Input, cmd ExpireCommand) Decision {
	s := in.State
	switch {
	case !s.ExpiredAt.IsZero():
		return Decision{} // recorded already (this command again)
	case s.Status == projections.StatusNone:
		return Decision{Ignore: "expire: no history, nothing to record"}
	case s.LastSeq != cmd.LastSeq || !s.Status.Terminal():
		return Decision{Ignore: fmt.Sprintf("expire: the execution changed since the janitor looked (sequence %d, %s), kept", s.LastSeq, s.Status)}
	}
	if _, open := openLock(s); open {
		// Its end was recorded but a crash came before its locks were
		// given up: give them up now; the janitor decides again.
		return Unlocking(in)
	}
	return Decision{Events: []events.Payload{&events.ExecutionExpired{Rule: cmd.Rule, Group: cmd.Group, RequestedBy: cmd.By}}}
}

// RepairCommand is an admin's repair of a damaged execution: folds pass
// over the event at IgnoreSeq. FirstSeq is the stream sequence of the
// history's first event.
type RepairCommand struct {
	Key       string
	IgnoreSeq uint64
	Record    events.ActionRecord
	FirstSeq  uint64
}

// Repair decides a repair: it records execution.repaired if the execution
// is damaged at the event the command names, and refuses it otherwise. The
// same command again records nothing (what follows its record is done
// again by the caller).
func Repair(in Input, cmd RepairCommand) Decision {
	s := in.State
	if seen, d := recordedAs(s, cmd.Key, events.ActionRepair); seen {
		return d // the caller does again what follows the record
	}
	dmg := s.Damaged
	switch {
	case !s.ExpiredAt.IsZero():
		return Decision{Reject: Expired(s.ID, s.ExpiredAt)}
	case dmg == nil:
		return reject(events.CodeConflict, "execution %q is not damaged: there is nothing to repair", in.ID)
	case dmg.Seq != cmd.IgnoreSeq:
		return reject(events.CodeConflict, "execution %q is damaged at sequence %d, not %d: a repair names the event at fault (see jetflow show %s)",
			in.ID, dmg.Seq, cmd.IgnoreSeq, in.ID)
	case s.Status == projections.StatusNone || dmg.Seq == cmd.FirstSeq:
		return reject(events.CodeConflict, "execution %q is damaged at its first event (sequence %d): without its start there is nothing to go on with; start a new execution",
			in.ID, dmg.Seq)
	}
	return Decision{Events: []events.Payload{&events.ExecutionRepaired{IgnoreSeq: cmd.IgnoreSeq, ActionRecord: cmd.Record}}}
}

// ClearCommand is an operator's (or the janitor's) force-clear of one
// entry of a lock: the scope at Path of this execution, as of its request
// number Request.
type ClearCommand struct {
	Lock    string
	Path    string
	Request int
	Record  events.ActionRecord
	// OnlyEnded (the janitor) leaves alone an entry whose execution runs
	// and still holds or waits for it.
	OnlyEnded bool
}

// Clear decides the clearing of a lock entry: the entry is removed from
// the lock (whatever the history says: a stale entry goes too), and
// lock.cleared is recorded, with who asked and why, if the history still
// shows that request open.
func Clear(in Input, cmd ClearCommand) Decision {
	s := in.State
	l, ok := s.LockAt(cmd.Path)
	current := ok && l.Name == cmd.Lock && l.Status.Open() && l.Requests == cmd.Request && s.ExpiredAt.IsZero()
	if current && cmd.OnlyEnded && s.Status.Active() {
		return Decision{Ignore: "the execution runs again since the sweep saw it ended: its lock stays"}
	}
	d := Decision{Before: []Effect{ReleaseLock{Lock: cmd.Lock, Path: cmd.Path, Request: cmd.Request, Reason: "cleared"}}}
	if current {
		d.Events = []events.Payload{&events.LockCleared{ActionRecord: cmd.Record, Lock: cmd.Lock, Path: cmd.Path}}
	}
	// Not current: a stale entry (the history does not hold it), or this
	// command again after a dispatcher recorded the clearing and stopped
	// before acting on it; deciding what follows repairs that.
	return d
}
