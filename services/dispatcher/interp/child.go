package interp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Child executions. A workflow step with child: true runs the workflow
// it calls as an execution of its own, in three steps, each recorded
// before the next is done:
//
//  1. the schedule records the child's id (derived from the step's
//     attempt: childID) and its whole start, checked first as its start
//     handler will check it (NeedStartCheck), the called version pinned;
//  2. the next decision publishes that start into the inbox (the same id
//     after a crash: the inbox keeps one, and the child's claim holds its
//     digest) before it records io.jetflow.step.child_started;
//  3. the step is pending until the child ends: the child's dispatcher
//     then asks the parent's to look (a reconcile), which reads the
//     child's history and records the step's success (the child's
//     output, through the step's output expression) or its failure
//     (ChildEnded). The janitor's idle sweep and a resume or replay
//     look too, should that ask be lost.
//
// A parent that ends while a child runs tells it what its step's
// on_parent_end says: cancel (the default; a force-cancel or a kill of
// the parent is passed on as such) or abandon (it runs on, and a resume
// of the parent still takes its result).

// childInput is what a child step records when it is scheduled.
type childInput struct {
	Child string                `json:"child"`
	Start events.StartExecution `json:"start"`
}

// childID is the id of the child execution a child step's attempt
// starts: the parent's id and the step's own id, readable, then a hash
// of the parent, the step's path and the attempt (so that two parents,
// two instances or two attempts never share a child), cut to fit an
// execution id.
func childID(parent, path string, attempt int) string {
	sum := sha256.Sum256([]byte(parent + "\x00" + path + "\x00" + strconv.Itoa(attempt)))
	h := "-" + hex.EncodeToString(sum[:5])
	name := []byte(parent + "-" + localID(lastSegment(path)))
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			name[i] = '_'
		}
	}
	if len(name)+len(h) > 128 {
		name = name[:128-len(h)]
	}
	return string(name) + h
}

// scheduleChild schedules a child step: the called workflow's version is
// pinned now, and the child's start checked and recorded with the
// schedule.
func (in Input) scheduleChild(a action, kind string) Decision {
	fail := func(msg string) Decision {
		return in.carry(action{kind: actStepFail, step: a.step, path: a.path, attempt: a.attempt, err: msg, final: true})
	}
	ref := CalledRef{Name: a.step.Workflow, Version: a.step.Version}
	rec, loaded := in.Called[ref]
	switch {
	case !loaded:
		return Decision{Need: NeedWorkflow{Ref: ref}}
	case rec == nil:
		return fail(fmt.Sprintf("workflow %q version %d is not registered", a.step.Workflow, a.step.Version))
	}
	var rendered struct {
		Input json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(a.input, &rendered)
	id := childID(in.ID, a.path, a.attempt)
	start := events.StartExecution{Workflow: rec.Name, Version: rec.Version, Input: orEmpty(rendered.Input), ExecutionID: id,
		WaitAfterFail: in.State.WaitAfterFail,
		Parent:        &events.ParentRef{ExecutionID: in.ID, Workflow: in.Workflow, StepID: a.path, Attempt: a.attempt}}
	problem, checked := in.StartChecks[childStartID(id)]
	switch {
	case !checked:
		return Decision{Need: NeedStartCheck{ID: childStartID(id), Start: start}}
	case problem != "":
		return fail(fmt.Sprintf("child execution %s could not start: %s", id, problem))
	}
	input, err := json.Marshal(childInput{Child: id, Start: start})
	if err != nil {
		return Decision{Err: err}
	}
	return Decision{Events: []events.Payload{in.final(&events.StepScheduled{StepID: a.path, Kind: kind, Attempt: a.attempt, Input: input})}}
}

// recordedChild reports whether instance st was scheduled as a child
// step (its schedule recorded a child's start).
func recordedChild(st projections.Step) bool {
	if st.Child != "" {
		return true
	}
	if st.Kind != "" && st.Kind != workflow.KindWorkflow || !bytes.Contains(st.Input, []byte(`"child"`)) {
		return false
	}
	var rec childInput
	return json.Unmarshal(st.Input, &rec) == nil && rec.Child != "" && rec.Start.Parent != nil
}

// childStartID is the id of a child's start command (and its message id).
func childStartID(child string) string { return "child-" + child }

// childStep decides a pending child step: its recorded start is
// published and the start recorded, or it waits for the child's end.
func (e *engine) childStep(step workflow.Step, st projections.Step) result {
	if st.Child != "" {
		return result{state: running, act: action{kind: actWait}}
	}
	return result{state: running, act: action{kind: actStartChild, step: step, path: st.ID, attempt: st.Attempt, input: st.Input}}
}

// startChild publishes a child's recorded start, then records it.
func (in Input) startChild(a action) Decision {
	var rec childInput
	if err := json.Unmarshal(a.input, &rec); err != nil {
		return Decision{Err: fmt.Errorf("step %s: the recorded start of its child execution is unreadable: %w", a.path, err)}
	}
	if rec.Child == "" {
		return Decision{Err: fmt.Errorf("step %s: its schedule recorded no child execution", a.path)}
	}
	return Decision{
		// Before: a crash before the append publishes the same start again.
		Before: []Effect{PublishStart{ID: childStartID(rec.Child), Start: rec.Start}},
		Events: []events.Payload{&events.StepChildStarted{StepID: a.path, Attempt: a.attempt, ExecutionID: rec.Child,
			Workflow: rec.Start.Workflow, Version: rec.Start.Version}},
	}
}

// ChildEnd is how a child execution ended, as its history records it.
type ChildEnd struct {
	ID     string
	Status projections.Status
	Output json.RawMessage
	Error  string
	// Expired: its history was deleted under its retention rule before
	// its end was read (how it ended is not known any more).
	Expired bool
}

// ChildEnded decides the end of the child execution of step stepID: the
// step succeeds with the child's output (through its output expression)
// or fails with why the child did not succeed, if it still waits for
// that child; anything else records nothing (an end read again, a child
// an earlier attempt started, an execution that ended meanwhile).
func ChildEnded(in Input, stepID string, end ChildEnd) Decision {
	s := in.State
	i := s.StepIndex(stepID)
	if i < 0 || !s.Status.Active() || !end.Status.Terminal() {
		return Decision{}
	}
	st := s.Steps[i]
	if st.Child != end.ID || st.Status != projections.OpPending {
		return Decision{}
	}
	failed := func(msg string) Decision {
		return Decision{Events: []events.Payload{&events.StepFailed{StepID: st.ID, Attempt: st.Attempt, Error: msg}}}
	}
	switch {
	case end.Expired:
		return failed(fmt.Sprintf("child execution %s expired under its retention rule, and its history was deleted, before its end was read", end.ID))
	case end.Status == projections.StatusFailed:
		return failed(fmt.Sprintf("child execution %s failed: %s", end.ID, end.Error))
	case end.Status == projections.StatusCancelled:
		return failed(fmt.Sprintf("child execution %s was cancelled", end.ID))
	}
	out := end.Output
	if f, step, ok := resolveFrame(in.Def, s, st.ID); ok && step.Output != nil {
		mapped, err := render(step.Output, with(newEngine(in.Def, s).env(f), "result", decode(out)))
		if err != nil {
			return failed("output: " + err.Error())
		}
		out = mapped
	}
	return Decision{Events: []events.Payload{in.final(&events.StepSucceeded{StepID: st.ID, Attempt: st.Attempt, Output: out})}}
}

// WaitingChildren returns the steps of s that wait for a child
// execution to end: their ids, and each one's child and its workflow.
func WaitingChildren(s projections.Execution) []projections.Step {
	var out []projections.Step
	for _, st := range s.Steps {
		if st.Child != "" && st.Status == projections.OpPending {
			out = append(out, st)
		}
	}
	return out
}

// PublishAction hands an action on another execution (a child's, when
// its parent ends) to the dispatchers, deduplicated by ID.
type PublishAction struct {
	ID       string
	Workflow string
	Action   events.ExecutionAction
}

func (PublishAction) effect() {}

// childrenStopped adds to d, a decision that ends the execution (its
// last event), what becomes of the children still running: each whose
// step says on_parent_end: cancel (the default) is told action (cancel,
// or the parent's force-cancel or kill), before the end is recorded (a
// crash in between tells it again: the same command id), and its step
// fails with why; one that says abandon runs on. Nothing for an
// execution that is only suspended.
func (in Input) childrenStopped(d Decision, action string) Decision {
	if len(d.Events) == 0 {
		return d
	}
	var ended string
	switch d.Events[len(d.Events)-1].(type) {
	case *events.ExecutionSucceeded:
		ended = "succeeded"
	case *events.ExecutionFailed:
		ended = "failed"
	case *events.ExecutionCancelled:
		ended = "was cancelled"
	default:
		return d
	}
	var evs []events.Payload
	var before []Effect
	for _, st := range WaitingChildren(in.State) {
		if _, step, ok := resolveFrame(in.Def, in.State, st.ID); ok && step.OnParentEnd == workflow.OnParentEndAbandon {
			continue
		}
		why := fmt.Sprintf("its parent execution %s %s", in.ID, ended)
		before = append(before, PublishAction{ID: childStopID(st.Child), Workflow: st.ChildWorkflow, Action: events.ExecutionAction{
			ExecutionID: st.Child, Action: action, Reason: why, RequestedBy: stepRequestedBy(in.ID, in.Workflow, st.ID)}})
		evs = append(evs, &events.StepFailed{StepID: st.ID, Attempt: st.Attempt,
			Error: fmt.Sprintf("child execution %s: told to %s, as %s", st.Child, action, why)})
	}
	if len(evs) == 0 {
		return d
	}
	d.Before = append(before, d.Before...)
	d.Events = append(evs, d.Events...)
	return d
}

// childStopID is the id of the action that stops a child when its
// parent ends: a parent stops a child once.
func childStopID(child string) string {
	sum := sha256.Sum256([]byte(child))
	return "childstop-" + hex.EncodeToString(sum[:12])
}
