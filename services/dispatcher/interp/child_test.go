package interp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// nap is the workflow the tests' child steps run.
func nap() *Called {
	return &Called{Name: "nap", Version: 3, Definition: workflow.Definition{Name: "nap", Version: 3,
		Input: map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}},
		Steps: []workflow.Step{{ID: "zz", Kind: workflow.KindSleep, Duration: "1h"}}}}
}

func childParent(steps ...workflow.Step) workflow.Definition {
	return workflow.Definition{Name: "parent", Steps: steps}
}

func childStep(id, policy string) workflow.Step {
	return workflow.Step{ID: id, Kind: workflow.KindWorkflow, Workflow: "nap", Child: true, OnParentEnd: policy,
		Input: map[string]any{"n": "${input.n}"}}
}

// TestChildStep: a child step records its child's start (checked, the
// version pinned), publishes it before it records the start, waits for
// the end, and takes the child's output through its output expression;
// an end read again, or another child's, records nothing.
func TestChildStep(t *testing.T) {
	t.Parallel()
	call := childStep("call", "")
	call.Output = "${result.x}"
	m := newMemShell(t, childParent(call, workflow.Step{ID: "after", Kind: workflow.KindReturn, Output: "${steps.call.output}"}), `{"n":7}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	require.Equal(t, []string{"execution.started", "step.scheduled", "step.child_started"}, m.types())
	st := m.state.Steps[m.state.StepIndex("call")]
	id := events.ChildExecutionID("x1", "call", 1)
	require.Equal(t, id, st.Child)
	require.Equal(t, "nap", st.ChildWorkflow)
	require.Equal(t, projections.OpPending, st.Status)
	require.Len(t, m.starts, 1)
	start := m.starts[0]
	require.Equal(t, "child-"+id, start.ID)
	require.Equal(t, id, start.Start.ExecutionID)
	require.Equal(t, 3, start.Start.Version, "the version that was the latest when it was scheduled")
	require.JSONEq(t, `{"n":7}`, string(start.Start.Input))
	require.Equal(t, &events.ParentRef{ExecutionID: "x1", Workflow: "parent", StepID: "call", Attempt: 1}, start.Start.Parent)
	require.True(t, Next(m.input()).Empty(), "it waits")

	for _, end := range []ChildEnd{
		{ID: "another", Status: projections.StatusSucceeded},      // not its child
		{ID: id, Status: projections.StatusStarted},               // not ended
		{ID: id, Status: projections.StatusSuspended, Error: "x"}, // waits for an operator
	} {
		require.True(t, ChildEnded(m.input(), "call", end).Empty(), "%+v", end)
	}
	d := ChildEnded(m.input(), "call", ChildEnd{ID: id, Status: projections.StatusSucceeded, Output: json.RawMessage(`{"x":5}`)})
	m.carry(d)
	require.True(t, ChildEnded(m.input(), "call", ChildEnd{ID: id, Status: projections.StatusSucceeded, Output: json.RawMessage(`{"x":5}`)}).Empty(),
		"read again, it records nothing")
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status)
	require.JSONEq(t, `5`, string(m.state.Output))
}

// TestChildStartedAgainAfterACrash: the start recorded with the schedule
// is what is published, the same after a crash before child_started,
// and after a new version of the called workflow is applied meanwhile.
func TestChildStartedAgainAfterACrash(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	for m.state.StepIndex("call") < 0 || m.state.Steps[m.state.StepIndex("call")].Status != projections.OpPending {
		require.True(t, m.carry(Next(m.input())), "history: %v", m.types())
	}
	v4 := nap()
	v4.Version = 4
	m.catalog[CalledRef{Name: "nap"}] = v4
	first, again := Next(m.input()), Next(m.input())
	require.Equal(t, first, again)
	require.Len(t, first.Before, 1)
	require.Equal(t, 3, first.Before[0].(PublishStart).Start.Version)
}

// TestChildFailsItsStep: a child that failed or was cancelled fails its
// step with why.
func TestChildFailsItsStep(t *testing.T) {
	t.Parallel()
	for status, want := range map[projections.Status]string{
		projections.StatusFailed:    "child execution %s failed: step zz failed: boom",
		projections.StatusCancelled: "child execution %s was cancelled",
	} {
		m := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
		m.catalog[CalledRef{Name: "nap"}] = nap()
		m.advance()
		id := events.ChildExecutionID("x1", "call", 1)
		m.carry(ChildEnded(m.input(), "call", ChildEnd{ID: id, Status: status, Error: "step zz failed: boom"}))
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status)
		require.Equal(t, "step call failed: "+strings.ReplaceAll(want, "%s", id), m.state.Error)
	}
}

// TestChildrenWhenTheParentEnds: a parent that ends tells each child
// whose step says cancel (the default) to stop, before its end is
// recorded, with its own action for a force-cancel or a kill, and fails
// that step; a child whose step says abandon runs on, its step pending.
func TestChildrenWhenTheParentEnds(t *testing.T) {
	t.Parallel()
	def := childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{childStep("stopped", "")}},
		{ID: "b", Steps: []workflow.Step{childStep("left", workflow.OnParentEndAbandon)}},
	}})
	for _, action := range []string{events.ActionCancel, events.ActionForceCancel, events.ActionKill} {
		m := newMemShell(t, def, `{"n":1}`)
		m.catalog[CalledRef{Name: "nap"}] = nap()
		m.advance()
		require.Len(t, m.starts, 2)
		d := m.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: action, Command: "c", RequestedBy: "ops"}})
		require.Nil(t, d.Reject)
		m.carry(d)
		m.advance()
		require.Equal(t, projections.StatusCancelled, m.state.Status, action)
		require.Len(t, m.actions, 1, action)
		a := m.actions[0]
		stopped, left := m.state.Steps[m.state.StepIndex("both/a/stopped")], m.state.Steps[m.state.StepIndex("both/b/left")]
		require.Equal(t, stopped.Child, a.Action.ExecutionID)
		require.Equal(t, action, a.Action.Action)
		require.Equal(t, "nap", a.Workflow)
		require.Equal(t, "its parent execution x1 was cancelled", a.Action.Reason)
		require.Equal(t, "execution x1 (workflow parent), step both/a/stopped", a.Action.RequestedBy)
		require.Equal(t, len(m.evs)-1, a.after, "published just before the end is recorded")
		end, ok := m.evs[len(m.evs)-1].Data.(*events.ExecutionCancelled)
		require.True(t, ok, "history: %v", m.types())
		require.Equal(t, []events.StoppedChild{{StepID: "both/a/stopped", Attempt: 1, ExecutionID: a.Action.ExecutionID, Action: action}},
			end.Children, "the step's failure is recorded with the end, in one event")
		require.Equal(t, &events.ParentRef{ExecutionID: "x1", Workflow: "parent", StepID: "both/a/stopped", Attempt: 1}, a.Action.Parent,
			"for that child only")
		require.Equal(t, projections.OpFailed, stopped.Status)
		require.Contains(t, stopped.Error, "told to "+action)
		require.Equal(t, projections.OpPending, left.Status, "abandoned: it runs on")
	}

	// A failure ends it too; a suspension (wait_after_fail) does not.
	fails := childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{childStep("stopped", "")}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
	}})
	m := newMemShell(t, fails, `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Len(t, m.actions, 1)
	require.Equal(t, "its parent execution x1 failed", m.actions[0].Action.Reason)

	w := newMemShell(t, fails, `{"n":1}`)
	w.state.WaitAfterFail = true
	w.catalog[CalledRef{Name: "nap"}] = nap()
	w.advance()
	require.Equal(t, projections.StatusSuspended, w.state.Status)
	require.Empty(t, w.actions, "a suspended parent may be resumed: its child runs on")
}

// TestChildRefusals: a child whose start would be refused fails its step
// and starts nothing; a dry run starts none; a child may not continue
// as new.
func TestChildRefusals(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, childParent(childStep("call", "")), `{"n":"seven"}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Contains(t, m.state.Error, "child execution "+events.ChildExecutionID("x1", "call", 1)+" could not start: the input does not match workflow nap's input schema")
	require.Empty(t, m.starts)

	dry := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	dry.state.DryRun = true
	dry.catalog[CalledRef{Name: "nap"}] = nap()
	dry.advance()
	require.Equal(t, projections.StatusSucceeded, dry.state.Status, "history: %v", dry.types())
	require.Empty(t, dry.starts)

	c := newMemShell(t, countdown(), `{"n":2}`)
	c.state.Parent = &events.ParentRef{ExecutionID: "p1", Workflow: "parent", StepID: "call", Attempt: 1}
	c.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 1, Definition: countdown()}
	c.advance()
	require.Equal(t, projections.StatusFailed, c.state.Status)
	require.Contains(t, c.state.Error, "continue-as-new cannot end a child execution: its parent p1 waits for this one's result")
	require.Empty(t, c.starts)
}

// TestChildIDs: ids are valid execution ids, readable, at most 128
// characters, and apart for two attempts, two instances or two parents.
func TestChildIDs(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("p", 128)
	seen := map[string]bool{}
	for _, c := range [][3]any{
		{"order-1", "ship", 1}, {"order-1", "ship", 2}, {"order-1", "each[3]/ship", 1}, {"order-1", "blk@2/ship~1", 1},
		{"order", "1-ship", 1}, {long, "ship", 1}, {long[:127], "ship", 1},
	} {
		id := events.ChildExecutionID(c[0].(string), c[1].(string), c[2].(int))
		require.True(t, events.ValidExecutionID(id), id)
		require.False(t, seen[id], "%v gives %s twice", c, id)
		seen[id] = true
	}
	require.Regexp(t, `^order-1-ship-[0-9a-f]{16}$`, events.ChildExecutionID("order-1", "each[3]/ship", 1))
}

// TestChildAcrossVersionsAndRetention: a move to a version that runs a
// waiting child step's workflow inline is refused; a child deleted
// under its retention before its end was read fails its step saying so.
func TestChildAcrossVersionsAndRetention(t *testing.T) {
	t.Parallel()
	fails := childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{childStep("call", "")}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
	}})
	m := newMemShell(t, fails, `{"n":1}`)
	m.state.WaitAfterFail = true
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	require.Equal(t, projections.StatusSuspended, m.state.Status)
	v2 := childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{{ID: "call", Kind: workflow.KindWorkflow, Workflow: "nap"}}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindLog, Message: "fine"}}},
	}})
	v2.Version = 2
	m.catalog[CalledRef{Name: "parent", Version: 2}] = &Called{Name: "parent", Version: 2, Definition: v2}
	d := m.act(resumeOn(2, events.ActionResume))
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "step both/a/call runs a workflow as a child execution, and the new version runs it inline")

	r := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	r.catalog[CalledRef{Name: "nap"}] = nap()
	r.advance()
	id := events.ChildExecutionID("x1", "call", 1)
	r.carry(ChildEnded(r.input(), "call", ChildEnd{ID: id, Status: projections.StatusFailed, Expired: true}))
	r.advance()
	require.Equal(t, projections.StatusFailed, r.state.Status)
	require.Contains(t, r.state.Error, "child execution "+id+" expired under its retention rule, and its history was deleted, before its end was read")
}

// TestChildRunAgain: a resume of a parent whose child did not succeed
// runs the step again with a new child (a new attempt, a new id), never
// the old one; a replay over a step that waits for its child, and a move
// to a version without that step, are refused (the child would be left
// running).
func TestChildRunAgain(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	first := events.ChildExecutionID("x1", "call", 1)

	d := m.act(ActionCommand{Key: "r", From: events.ReplayStart, Force: true, Record: events.ActionRecord{Action: events.ActionReplay, Command: "r"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "step call waits for its child execution "+first+", which its parent must stop when it ends (on_parent_end: cancel)")

	m.carry(ChildEnded(m.input(), "call", ChildEnd{ID: first, Status: projections.StatusCancelled}))
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	m.carry(m.act(ActionCommand{Key: "res", Record: events.ActionRecord{Action: events.ActionResume, Command: "res"}}))
	m.advance()
	st := m.state.Steps[m.state.StepIndex("call")]
	require.Equal(t, 2, st.Attempt)
	second := events.ChildExecutionID("x1", "call", 2)
	require.NotEqual(t, first, second)
	require.Equal(t, second, st.Child)
	require.Len(t, m.starts, 2)
	require.Equal(t, second, m.starts[1].Start.ExecutionID)
	require.True(t, ChildEnded(m.input(), "call", ChildEnd{ID: first, Status: projections.StatusSucceeded}).Empty(), "the old child's end changes nothing")

	// Suspended (wait_after_fail) with the child running: a move to a
	// version without the step is refused.
	w := newMemShell(t, childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{childStep("call", "")}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
	}}), `{"n":1}`)
	w.state.WaitAfterFail = true
	w.catalog[CalledRef{Name: "nap"}] = nap()
	w.advance()
	v2 := childParent(workflow.Step{ID: "other", Kind: workflow.KindLog, Message: "fine"})
	v2.Version = 2
	w.catalog[CalledRef{Name: "parent", Version: 2}] = &Called{Name: "parent", Version: 2, Definition: v2}
	d = w.act(resumeOn(2, events.ActionResume))
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "step both/a/call waits for its child execution "+events.ChildExecutionID("x1", "both/a/call", 1)+", and the new version has no step both/a/call")
}

// TestChildStoppedBeforeItsStartIsRecorded: a crash (or a publish that
// failed) after the child's start was published and before
// child_started was recorded still stops that child when the parent
// ends.
func TestChildStoppedBeforeItsStartIsRecorded(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	for m.state.StepIndex("call") < 0 || m.state.Steps[m.state.StepIndex("call")].Status != projections.OpPending {
		require.True(t, m.carry(Next(m.input())), "history: %v", m.types())
	}
	d := Next(m.input())
	require.Len(t, d.Before, 1)
	m.perform(d.Before[0]) // published; the append of child_started is lost
	m.carry(m.act(ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionKill, Command: "k"}}))
	require.Equal(t, projections.StatusCancelled, m.state.Status)
	require.Len(t, m.actions, 1)
	require.Equal(t, events.ChildExecutionID("x1", "call", 1), m.actions[0].Action.ExecutionID)
	require.Equal(t, events.ActionKill, m.actions[0].Action.Action)
	require.Equal(t, "nap", m.actions[0].Workflow)
	require.Equal(t, projections.OpFailed, m.state.Steps[m.state.StepIndex("call")].Status)
}

// TestChildStoppedWhenCompensationBegins: a failure's compensation stops
// a child still running (it did not succeed: nothing of it is
// compensated) as it begins, in its compensation.started.
func TestChildStoppedWhenCompensationBegins(t *testing.T) {
	t.Parallel()
	call := childStep("call", "")
	call.Compensate = []workflow.Step{{ID: "undo", Kind: workflow.KindLog, Message: "undo"}}
	def := childParent(
		workflow.Step{ID: "book", Kind: workflow.KindLog, Message: "booked", Compensate: []workflow.Step{{ID: "unbook", Kind: workflow.KindLog, Message: "unbook"}}},
		workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{call}},
			{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
		}})
	def.CompensateOn = []string{events.CompensateForFailure}
	m := newMemShell(t, def, `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	for len(m.tasks) > 0 && m.state.Status.Active() { // the log steps run on agents
		m.carry(m.report(&events.OperationSucceeded{}))
		m.advance()
	}
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
	require.NotNil(t, m.state.Compensation)
	require.Equal(t, []string{"book"}, m.state.Compensation.Steps)
	require.Len(t, m.actions, 1)
	require.Contains(t, m.actions[0].Action.Reason, "its parent execution x1 is compensating (on failure)")
	call1 := m.state.Steps[m.state.StepIndex("both/a/call")]
	require.Equal(t, projections.OpFailed, call1.Status)
	require.Negative(t, m.state.StepIndex("both/a/call/compensate/undo"), "the child did not succeed: nothing to undo")
}

// TestChildSecondReview: a dry run with a nested child step skips it; a
// called workflow's timeout stops the children it leaves; a resume runs a
// child step again from its recorded start (not decided again) and does
// not bring back its old attempt's on-error steps; an end records only
// the stopped children that fit, and tells them all; an action for a
// parent's child refuses another execution.
func TestChildSecondReview(t *testing.T) {
	t.Parallel()
	each := workflow.Step{ID: "each", Kind: workflow.KindForeach, Items: []any{1, 2}, Steps: []workflow.Step{childStep("call", "")}}
	dry := newMemShell(t, childParent(each), `{"n":1}`)
	dry.state.DryRun = true
	dry.catalog[CalledRef{Name: "nap"}] = nap()
	dry.advance()
	require.Equal(t, projections.StatusSucceeded, dry.state.Status, "history: %v", dry.types())
	require.Empty(t, dry.starts)

	inner := &Called{Name: "inner", Version: 1, Definition: workflow.Definition{Name: "inner", Timeout: "1m", Steps: []workflow.Step{childStep("kid", "")}}}
	c := newMemShell(t, childParent(workflow.Step{ID: "call", Kind: workflow.KindWorkflow, Workflow: "inner", Input: map[string]any{"n": 1}}), `{}`)
	c.catalog[CalledRef{Name: "nap"}], c.catalog[CalledRef{Name: "inner"}] = nap(), inner
	c.advance()
	require.Len(t, c.starts, 1)
	kid := c.starts[0].Start.ExecutionID
	var timer string
	for id, tm := range c.state.Timers {
		if tm.Purpose == events.TimerCallTimeout {
			timer, c.now = id, tm.Due
		}
	}
	require.NotEmpty(t, timer, "history: %v", c.types())
	d := Fired(c.input(), timer, c.now)
	require.Len(t, d.Before, 1, "%+v", d)
	stop := d.Before[0].(PublishAction)
	require.Equal(t, kid, stop.Action.ExecutionID)
	require.Equal(t, events.ActionCancel, stop.Action.Action)

	h := childStep("call", "")
	h.OnError = []workflow.Step{{ID: "h", Kind: workflow.KindFail, Message: "still broken"}}
	r := newMemShell(t, childParent(h), `{"n":1}`)
	r.catalog[CalledRef{Name: "nap"}] = nap()
	r.advance()
	first := r.starts[0]
	r.carry(ChildEnded(r.input(), "call", ChildEnd{ID: first.Start.ExecutionID, Status: projections.StatusFailed, Error: "boom"}))
	r.advance()
	require.Equal(t, projections.StatusFailed, r.state.Status)
	before := len(r.evs)
	r.carry(r.act(ActionCommand{Key: "res", Record: events.ActionRecord{Action: events.ActionResume, Command: "res"}}))
	r.advance()
	for _, ev := range r.evs[before:] {
		require.NotEqual(t, events.TypeStepScheduled, ev.Type, "the step is not decided again: %v", r.types())
	}
	require.Len(t, r.starts, 2)
	second := r.starts[1].Start
	require.Equal(t, events.ChildExecutionID("x1", "call", 2), second.ExecutionID)
	require.Equal(t, 2, second.Parent.Attempt)
	require.JSONEq(t, string(first.Start.Input), string(second.Input), "its recorded input")
	if i := r.state.StepIndex("call/on-error1/h"); i >= 0 {
		require.NotEqual(t, projections.OpPending, r.state.Steps[i].Status, "the old attempt's handler is not run again")
	}

	many := workflow.Step{ID: "each", Kind: workflow.KindForeach, Items: []any{1, 2, 3, 4, 5, 6}, Concurrency: 6, Steps: []workflow.Step{childStep("call", "")}}
	m := newMemShell(t, childParent(many), `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	require.Len(t, m.starts, 6)
	in := m.input()
	in.MaxEvent = 4 * 3 * (len("each[0]/call") + len(m.starts[0].Start.ExecutionID) + 80) // room for three
	d = Action(in, ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionKill, Command: "k"}})
	require.Len(t, d.Before, 6, "every child is told")
	require.Len(t, d.Events[len(d.Events)-1].(*events.ExecutionCancelled).Children, 3, "those that fit are recorded")

	other := newMemShell(t, countdown(), `{"n":2}`)
	other.state.Parent = &events.ParentRef{ExecutionID: "p1", Workflow: "parent", StepID: "call", Attempt: 1}
	d = other.act(ActionCommand{Key: "c", Parent: &events.ParentRef{ExecutionID: "p1", Workflow: "parent", StepID: "call", Attempt: 2},
		Record: events.ActionRecord{Action: events.ActionCancel, Command: "c"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, `execution "x1" is not the child execution of step call (attempt 2) of p1`)
}

// fireCallTimeout records the firing of the execution's call timeout, as
// the shell does for its FireTimer command, and decides on.
func fireCallTimeout(t *testing.T, c *memShell) {
	t.Helper()
	var timer string
	for id, tm := range c.state.Timers {
		if tm.Purpose == events.TimerCallTimeout && !tm.Fired {
			timer, c.now = id, tm.Due
		}
	}
	require.NotEmpty(t, timer, "history: %v", c.types())
	c.carry(Fired(c.input(), timer, c.now))
	c.advance()
}

// TestChildThirdReview: a timeout's cancel and a later kill of the
// parent are two commands for the child; a kill during a compensation
// stops the compensation's child; a move that would carry a waiting child
// step to another path is refused; a resume runs a step its parent's end
// stopped again, with a new child, not its on-error steps.
func TestChildThirdReview(t *testing.T) {
	t.Parallel()
	inner := &Called{Name: "inner", Version: 1, Definition: workflow.Definition{Name: "inner", Timeout: "1m", Steps: []workflow.Step{childStep("kid", "")}}}
	call := workflow.Step{ID: "call", Kind: workflow.KindWorkflow, Workflow: "inner", Input: map[string]any{"n": 1},
		OnError: []workflow.Step{{ID: "wait", Kind: workflow.KindSleep, Duration: "1h"}}}
	c := newMemShell(t, childParent(call), `{}`)
	c.catalog[CalledRef{Name: "nap"}], c.catalog[CalledRef{Name: "inner"}] = nap(), inner
	c.advance()
	fireCallTimeout(t, c)
	require.Len(t, c.actions, 1)
	c.carry(c.act(ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionKill, Command: "k"}}))
	require.Len(t, c.actions, 2)
	require.Equal(t, events.ActionKill, c.actions[1].Action.Action)
	require.NotEqual(t, c.actions[0].ID, c.actions[1].ID, "the kill is a command of its own")

	comp := childParent(
		workflow.Step{ID: "book", Kind: workflow.KindLog, Message: "booked", Compensate: []workflow.Step{childStep("undo", "")}},
		workflow.Step{ID: "boom", Kind: workflow.KindFail, Message: "boom"})
	comp.CompensateOn = []string{events.CompensateForFailure}
	m := newMemShell(t, comp, `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	for len(m.tasks) > 0 && len(m.starts) == 0 && m.state.Status.Active() {
		m.carry(m.report(&events.OperationSucceeded{}))
		m.advance()
	}
	require.Len(t, m.starts, 1, "history: %v", m.types())
	require.Empty(t, m.actions, "a compensation's child runs while it compensates")
	m.carry(m.act(ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionKill, Command: "k"}}))
	require.Len(t, m.actions, 1, "a kill stops it")
	require.Equal(t, m.starts[0].Start.ExecutionID, m.actions[0].Action.ExecutionID)

	par := workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{childStep("call", "")}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
	}}
	w := newMemShell(t, childParent(par), `{"n":1}`)
	w.state.WaitAfterFail = true
	w.catalog[CalledRef{Name: "nap"}] = nap()
	w.advance()
	v2 := childParent(workflow.Step{ID: "outer", Kind: workflow.KindWorkflow, Steps: []workflow.Step{par}})
	v2.Version = 2
	w.catalog[CalledRef{Name: "parent", Version: 2}] = &Called{Name: "parent", Version: 2, Definition: v2}
	d := w.act(resumeOn(2, events.ActionResume))
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "step both/a/call waits for its child execution")
	require.Contains(t, d.Reject.Reason, "the new version moves it to outer/both/a/call")

	stopped := childStep("call", "")
	stopped.OnError = []workflow.Step{{ID: "note", Kind: workflow.KindLet, Vars: map[string]any{"shipped": false}}}
	r := newMemShell(t, childParent(workflow.Step{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
		{ID: "a", Steps: []workflow.Step{stopped}},
		{ID: "b", Steps: []workflow.Step{{ID: "boom", Kind: workflow.KindFail, Message: "boom"}}},
	}}), `{"n":1}`)
	r.catalog[CalledRef{Name: "nap"}] = nap()
	r.advance()
	require.Equal(t, projections.StatusFailed, r.state.Status)
	require.True(t, r.state.Steps[r.state.StepIndex("both/a/call")].Stopped)
	r.carry(r.act(ActionCommand{Key: "res", Record: events.ActionRecord{Action: events.ActionResume, Command: "res"}}))
	r.advance()
	require.Len(t, r.starts, 2, "a new child: %v", r.types())
	require.Negative(t, r.state.StepIndex("both/a/call/on-error1/note"), "not its on-error steps")
}

// TestReplayResumingAtAWaitingChild: a replay resuming (the default)
// finds a step that waits for its child incomplete, and refuses with why.
func TestReplayResumingAtAWaitingChild(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, childParent(childStep("call", "")), `{"n":1}`)
	m.catalog[CalledRef{Name: "nap"}] = nap()
	m.advance()
	for _, force := range []bool{false, true} {
		d := m.act(ActionCommand{Key: "r", Force: force, Record: events.ActionRecord{Action: events.ActionReplay, Command: "r"}})
		require.NotNil(t, d.Reject)
		require.Contains(t, d.Reject.Reason, "step call waits for its child execution "+events.ChildExecutionID("x1", "call", 1))
	}
}
