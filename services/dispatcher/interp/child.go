package interp

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Child executions. A workflow step with child: true runs the workflow
// it calls as an execution of its own, in three steps, each recorded
// before the next is done:
//
//  1. the schedule records the child's id (derived from the step's
//     attempt: events.ChildExecutionID) and its whole start, checked first as its start
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

// scheduleChild schedules a child step: the called workflow's version is
// pinned now, and the child's start checked and recorded with the
// schedule.
func (in Input) scheduleChild(a action, kind string) Decision {
	fail := func(msg string) Decision {
		return in.carry(action{kind: actStepFail, step: a.step, path: a.path, attempt: a.attempt, err: msg, final: true})
	}
	rec, rendered, d, ok := in.calledBy(a, fail)
	if !ok {
		return d
	}
	id := events.ChildExecutionID(in.ID, a.path, a.attempt)
	start := events.StartExecution{Workflow: rec.Name, Version: rec.Version, Input: orEmpty(rendered), ExecutionID: id,
		WaitAfterFail: in.State.WaitAfterFail,
		Parent: &events.ParentRef{ExecutionID: in.ID, Workflow: in.Workflow, StepID: a.path, Attempt: a.attempt,
			Retention: in.State.Retention}}
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

// ChildStart returns the start of the child execution that child step
// st's schedule recorded.
func ChildStart(st projections.Step) (events.StartExecution, bool) {
	var rec childInput
	if !st.ChildStep() || json.Unmarshal(st.Input, &rec) != nil {
		return events.StartExecution{}, false
	}
	return rec.Start, true
}

// notRegistered says that a called workflow (version: 0 for the latest)
// is not registered.
func notRegistered(name string, version int) string {
	if version == 0 {
		return fmt.Sprintf("workflow %q is not registered", name)
	}
	return fmt.Sprintf("workflow %q version %d is not registered", name, version)
}

// calledBy loads the workflow a workflow step calls by name (its
// version, or the latest now), with the input the step rendered for it;
// ok is false with what to decide first (a need, or the step's failure).
func (in Input) calledBy(a action, fail func(string) Decision) (rec *Called, input json.RawMessage, d Decision, ok bool) {
	ref := CalledRef{Name: a.step.Workflow, Version: a.step.Version}
	rec, loaded := in.Called[ref]
	switch {
	case !loaded:
		return nil, nil, Decision{Need: NeedWorkflow{Ref: ref}}, false
	case rec == nil:
		return nil, nil, fail(notRegistered(a.step.Workflow, a.step.Version)), false
	}
	var rendered struct {
		Input json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(a.input, &rendered)
	return rec, rendered.Input, Decision{}, true
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
	// Foreign says why the execution that holds the child's id is not
	// the step's child (another start took the id first).
	Foreign string
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
	case end.Foreign != "":
		return failed(fmt.Sprintf("child execution %s did not start: %s", end.ID, end.Foreign))
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

// WaitingChildren returns the steps of s that wait for the end of the
// child execution they started (Step.Child).
func WaitingChildren(s projections.Execution) []projections.Step {
	var out []projections.Step
	for _, st := range s.Steps {
		if st.Child != "" && st.Status == projections.OpPending {
			out = append(out, st)
		}
	}
	return out
}

// childOfStep is the child execution of child step st.
func childOfStep(st projections.Step) string {
	id, _, _ := st.ChildExecution()
	return id
}

// leftRunning reports whether starting child step st over (a replay) or
// dropping it (a move to another version) would leave running a child
// that must not run without its parent's step: one it waits for whose
// step says on_parent_end: cancel (an abandoned one may run on).
func leftRunning(d workflow.Definition, s projections.Execution, st projections.Step) bool {
	if st.Status != projections.OpPending || !st.ChildStep() || s.Status.Terminal() {
		return false // an ended execution told each such child to stop as it ended
	}
	_, step, ok := resolveFrame(d, s, st.ID)
	return !ok || step.OnParentEnd != workflow.OnParentEndAbandon
}

// runningChild is a child execution a step waits for, or whose start
// its schedule recorded and may have published (a crash, or a publish
// that failed, before child_started was recorded): its id and workflow.
type runningChild struct {
	step   projections.Step
	id, wf string
}

// runningChildren returns the child executions the steps of s may have
// running.
func runningChildren(s projections.Execution) []runningChild {
	var out []runningChild
	for _, st := range s.Steps {
		if id, wf, ok := st.ChildExecution(); ok && st.Status == projections.OpPending {
			out = append(out, runningChild{st, id, wf})
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

// childrenStopped adds to d, a decision whose last event ends the
// execution (or begins its compensation), what becomes of the children
// still running: each whose step says on_parent_end: cancel (the
// default) is told action (cancel, or the parent's force-cancel or
// kill) before the event is recorded (a crash in between tells it again:
// the same command id), and the event records its step failed (one
// event: a crash cannot leave the steps failed and the end unrecorded);
// one that says abandon runs on, its step pending, and so does one of a
// compensation unless a force-cancel or a kill ends it (a compensation
// runs to its end, and a compensate action goes on with it). Nothing for
// an execution that is only suspended.
func (in Input) childrenStopped(d Decision, action string) Decision {
	if len(d.Events) == 0 {
		return d
	}
	last := d.Events[len(d.Events)-1]
	var list *[]events.StoppedChild
	switch e := last.(type) {
	case *events.ExecutionSucceeded:
		list = &e.Children
	case *events.ExecutionFailed:
		list = &e.Children
	case *events.ExecutionCancelled:
		list = &e.Children
	case *events.CompensationStarted:
		list = &e.Children
	default:
		return d
	}
	ended := projections.EndedAs(last) // as the fold says it in the steps' errors
	var before []Effect
	size := 0
	for _, c := range in.stoppable(in.State, func(path string) bool { return action != events.ActionCancel || !inCompensation(path) }) {
		before = append(before, in.stopChild(c, action, fmt.Sprintf("its parent execution %s %s", in.ID, ended)))
		// An event holds as many as fit (a few thousand); a child past
		// them is told all the same, and its step stays pending.
		if size += len(c.step.ID) + len(c.id) + 80; in.MaxEvent <= 0 || size <= in.MaxEvent/4 {
			*list = append(*list, events.StoppedChild{StepID: c.step.ID, Attempt: c.step.Attempt, ExecutionID: c.id, Action: action})
		}
	}
	d.Before = append(before, d.Before...)
	return d
}

// stoppable returns the running children of s at the paths within
// accepts that its end (or a timeout of the scope holding them) stops:
// not those whose step says on_parent_end: abandon.
func (in Input) stoppable(s projections.Execution, within func(path string) bool) []runningChild {
	var out []runningChild
	for _, c := range runningChildren(s) {
		if !within(c.step.ID) {
			continue
		}
		if _, step, ok := resolveFrame(in.Def, s, c.step.ID); ok && step.OnParentEnd == workflow.OnParentEndAbandon {
			continue
		}
		out = append(out, c)
	}
	return out
}

// stopChild is the command that tells child c to do action, why: only
// if it is the child of c's step (Parent), so that an execution another
// start put under the child's id is never stopped.
func (in Input) stopChild(c runningChild, action, why string) PublishAction {
	return PublishAction{ID: childStopID(c.id, action), Workflow: c.wf, Action: events.ExecutionAction{
		ExecutionID: c.id, Action: action, Reason: why, RequestedBy: stepRequestedBy(in.ID, in.Workflow, c.step.ID),
		Parent: &events.ParentRef{ExecutionID: in.ID, Workflow: in.Workflow, StepID: c.step.ID, Attempt: c.step.Attempt}}}
}

// childStopID is the id of the action that tells a child to stop: a
// parent tells a child each action once (a timeout's cancel, then its
// end's kill, are two).
func childStopID(child, action string) string {
	sum := sha256.Sum256([]byte(child + "\x00" + action))
	return "childstop-" + hex.EncodeToString(sum[:12])
}
