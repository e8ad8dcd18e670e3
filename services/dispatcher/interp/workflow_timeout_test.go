package interp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestWorkflowTimeoutRunsOnError: when the workflow's timeout fires while
// an operation runs, its steps go no further (the next is never
// scheduled) and its on-error steps run, seeing the timeout as the error;
// without a return there, the execution fails with it.
func TestWorkflowTimeoutRunsOnError(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Timeout: "1m",
		OnError: []workflow.Step{{ID: "note", Kind: workflow.KindLet, Vars: map[string]any{"why": "${error.message}"}}},
		Steps: []workflow.Step{
			{ID: "one", Kind: workflow.KindExec, Command: "x"},
			{ID: "two", Kind: workflow.KindExec, Command: "x"},
		}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 1)
	timer := timerID("x1", events.TimerWorkflowTimeout, "", 0)
	require.Contains(t, m.timers, timer, "the workflow's timeout is armed")

	m.carry(Fired(m.input(), timer, m.now))
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
	require.Equal(t, "the workflow timed out after 1m", m.state.Error)
	require.JSONEq(t, `"the workflow timed out after 1m"`, string(m.state.Vars["why"]), "on-error ran and saw the timeout")
	require.Len(t, m.tasks, 1, "two was never sent")
	_, ok := instanceOf(m.state, "two")
	require.True(t, !ok || m.state.Steps[m.state.StepIndex("two")].Status == projections.OpNone, "two never began")
}

// TestCalledWorkflowAppliesItsTimeout: a workflow called by name applies
// its own timeout, counted from the call's start: when it fires, the
// operation under way in the call is terminated, the call's next step is
// never scheduled, the called workflow's on-error steps run seeing the
// timeout, and the calling step fails with it; the caller's on-error
// handles that as any failure of the step.
func TestCalledWorkflowAppliesItsTimeout(t *testing.T) {
	t.Parallel()
	child := workflow.Definition{Name: "child", Timeout: "30s",
		OnError: []workflow.Step{{ID: "note", Kind: workflow.KindLet, Vars: map[string]any{"why": "${error.message}"}}},
		Steps: []workflow.Step{
			{ID: "one", Kind: workflow.KindExec, Command: "x"},
			{ID: "two", Kind: workflow.KindExec, Command: "x"},
		}}
	def := workflow.Definition{Name: "parent", Steps: []workflow.Step{
		{ID: "call", Kind: workflow.KindWorkflow, Workflow: "child",
			OnError: []workflow.Step{{ID: "seen", Kind: workflow.KindLet, Vars: map[string]any{"caller_saw": "${error.message}"}}}},
		{ID: "after", Kind: workflow.KindLet, Vars: map[string]any{"went_on": true}},
	}}
	m := newMemShell(t, def, `{}`)
	m.catalog[CalledRef{Name: "child"}] = &Called{Name: "child", Version: 1, Definition: child}
	m.advance()
	require.Len(t, m.tasks, 1, "call/one is sent")
	require.Equal(t, "call/one", m.tasks[0].StepID)
	timer := timerID("x1", events.TimerCallTimeout, "call", 0) // the call's instance, and no resume yet
	require.Contains(t, m.timers, timer, "the called workflow's timeout is armed")
	call := m.state.Steps[m.state.StepIndex("call")]
	require.Equal(t, call.ScheduledAt.Add(30*time.Second), m.timers[timer], "counted from the call's start")

	m.carry(Fired(m.input(), timer, m.now))
	require.Len(t, m.kills, 1, "the operation under way in the call is terminated")
	require.Equal(t, m.tasks[0].TaskID, m.kills[0].TaskID)
	m.advance()
	require.Len(t, m.tasks, 1, "call/two was never sent")
	require.JSONEq(t, `"the workflow timed out after 30s"`, string(m.state.Vars["why"]), "the called workflow's on-error ran and saw the timeout")
	require.JSONEq(t, `"workflow child: the workflow timed out after 30s"`, string(m.state.Vars["caller_saw"]))
	require.Equal(t, projections.OpFailed, m.state.Steps[m.state.StepIndex("call")].Status)
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "the caller's on-error handled the failure; history: %v", m.types())
	require.JSONEq(t, `true`, string(m.state.Vars["went_on"]))
}

// TestCalledWorkflowTimeoutCountsFromItsLock: a called workflow with a
// lock counts its timeout from the lock's acquisition (here 5 s after the
// call started), and a call that ends in time leaves its timer unfired
// and changes nothing.
func TestCalledWorkflowTimeoutCountsFromItsLock(t *testing.T) {
	t.Parallel()
	child := workflow.Definition{Name: "child", Timeout: "30s", Lock: "db",
		Steps: []workflow.Step{{ID: "one", Kind: workflow.KindExec, Command: "x"}}}
	def := workflow.Definition{Name: "parent", Steps: []workflow.Step{
		{ID: "call", Kind: workflow.KindWorkflow, Workflow: "child"},
	}}
	m := newMemShell(t, def, `{}`)
	m.catalog[CalledRef{Name: "child"}] = &Called{Name: "child", Version: 1, Definition: child}
	m.busy = map[string]bool{"db": true}
	m.advance()
	require.Empty(t, m.tasks, "it waits for the lock")
	m.now = m.now.Add(5 * time.Second)
	m.busy = nil
	m.carry(Waiting(m.input()))
	m.advance()
	require.Len(t, m.tasks, 1)
	l, ok := m.state.LockAt("call")
	require.True(t, ok)
	require.Equal(t, projections.LockHeld, l.Status)
	timer := timerID("x1", events.TimerCallTimeout, "call", 0)
	call := m.state.Steps[m.state.StepIndex("call")]
	require.Equal(t, call.ScheduledAt.Add(35*time.Second), m.timers[timer], "30 s from the acquisition, 5 s after the start")

	m.carry(m.report(&events.OperationSucceeded{Output: []byte(`1`)}))
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.False(t, m.state.Timers[timer].Fired)
}

// TestResumedCallGetsItsTimeAgain: a call still under way when its
// execution ended (another branch failed) gets its time again when the
// execution is resumed, as a workflow's timeout does: its old timer,
// overdue meanwhile, does not fail it.
func TestResumedCallGetsItsTimeAgain(t *testing.T) {
	t.Parallel()
	child := workflow.Definition{Name: "child", Timeout: "30s",
		Steps: []workflow.Step{{ID: "one", Kind: workflow.KindExec, Command: "x"}}}
	def := workflow.Definition{Name: "parent", Steps: []workflow.Step{
		{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{{ID: "call", Kind: workflow.KindWorkflow, Workflow: "child"}}},
			{ID: "b", Steps: []workflow.Step{{ID: "bad", Kind: workflow.KindExec, Command: "x"}}},
		}},
	}}
	m := newMemShell(t, def, `{}`)
	m.catalog[CalledRef{Name: "child"}] = &Called{Name: "child", Version: 1, Definition: child}
	m.advance()
	require.Len(t, m.tasks, 2)
	m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())

	m.now = m.now.Add(time.Hour) // the first timer is long overdue
	m.carry(m.act(ActionCommand{Key: "r", Record: events.ActionRecord{Action: events.ActionResume, Command: "r"}}))
	m.advance()
	require.Equal(t, projections.StatusStarted, m.state.Status, "history: %v", m.types())
	again := timerID("x1", events.TimerCallTimeout, "par/a/call", 1)
	require.Equal(t, m.now.Add(30*time.Second), m.timers[again], "30 s from the resume")
	call := m.state.Steps[m.state.StepIndex("par/a/call")]
	require.Equal(t, projections.OpPending, call.Status, "the call runs on")
}

// TestTimedOutCallReleasesLocksInside: when a called workflow times out,
// a lock held inside it is released at once, not kept while the caller
// goes on.
func TestTimedOutCallReleasesLocksInside(t *testing.T) {
	t.Parallel()
	child := workflow.Definition{Name: "child", Timeout: "30s", Steps: []workflow.Step{
		{ID: "inner", Kind: workflow.KindWorkflow, Lock: "db", Steps: []workflow.Step{{ID: "one", Kind: workflow.KindExec, Command: "x"}}}}}
	def := workflow.Definition{Name: "parent", Steps: []workflow.Step{
		{ID: "call", Kind: workflow.KindWorkflow, Workflow: "child",
			OnError: []workflow.Step{{ID: "go-on", Kind: workflow.KindLet, Vars: map[string]any{"x": 1}}}},
		{ID: "nap", Kind: workflow.KindSleep, Duration: "1h"},
	}}
	m := newMemShell(t, def, `{}`)
	m.catalog[CalledRef{Name: "child"}] = &Called{Name: "child", Version: 1, Definition: child}
	m.advance()
	l, _ := m.state.LockAt("call/inner")
	require.Equal(t, projections.LockHeld, l.Status)
	m.carry(Fired(m.input(), timerID("x1", events.TimerCallTimeout, "call", 0), m.now))
	m.advance()
	require.Equal(t, projections.OpWaiting, m.state.Steps[m.state.StepIndex("nap")].Status, "the caller went on; history: %v", m.types())
	l, _ = m.state.LockAt("call/inner")
	require.Equal(t, projections.LockReleased, l.Status, "history: %v", m.types())
}
