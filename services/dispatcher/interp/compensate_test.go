package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

func withUndo(id string) workflow.Step {
	s := exec(id)
	s.Compensate = []workflow.Step{exec("undo-" + id)}
	return s
}

// runOps reports on the tasks sent from index from on, in order, until
// the execution waits with nothing new sent: fail names the steps whose
// task fails (final). It returns the steps of the tasks sent.
func (m *memShell) runOps(from int, fail map[string]bool) []string {
	m.t.Helper()
	var sent []string
	for range 100 {
		m.advance()
		if len(m.tasks) <= from || !m.state.Status.Active() {
			return sent
		}
		task := m.tasks[from]
		from++
		sent = append(sent, task.StepID)
		m.settle(task, fail[task.StepID], "r-"+task.TaskID)
	}
	return sent
}

// settle reports an agent's final report on task (its success with the
// output "<step> ok", or with failed its final failure "boom"), as the
// result eventID, and records it.
func (m *memShell) settle(task events.Task, failed bool, eventID string) {
	m.t.Helper()
	ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
		Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1"}
	var p events.Payload = &events.OperationSucceeded{TaskRef: ref, Output: []byte(`"` + task.StepID + ` ok"`)}
	if failed {
		p = &events.OperationFailed{TaskRef: ref, Error: "boom", Final: true}
	}
	m.carry(Result(m.input(), ref, events.Event{ID: eventID, Type: p.EventType(), Data: p}))
}

// TestCompensationOnFailure: when the workflow fails and compensates on
// failure, the compensate steps of the steps that succeeded run in
// reverse order of completion, recorded from compensation.started to
// .finished, and the execution then fails with its failure.
func TestCompensationOnFailure(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnFailure},
		Steps: []workflow.Step{withUndo("hotel"), withUndo("car"), exec("pay")}}
	m := newMemShell(t, def, `{}`)
	sent := m.runOps(0, map[string]bool{"pay": true})
	require.Equal(t, []string{"hotel", "car", "pay", "car/compensate/undo-car", "hotel/compensate/undo-hotel"}, sent, "history: %v", m.types())
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Equal(t, "step pay failed: boom", m.state.Error)
	c := m.state.Compensation
	require.NotNil(t, c)
	require.Equal(t, events.CompensateForFailure, c.Cause)
	require.Equal(t, []string{"car", "hotel"}, c.Steps)
	require.Equal(t, projections.CompensationFinished, c.Status)
	types := m.types()
	require.Contains(t, types, "compensation.started")
	require.Equal(t, "execution.failed", types[len(types)-1])
	require.Equal(t, "compensation.finished", types[len(types)-2])
}

// TestCompensationOrderIsCompletionOrder: inside a foreach whose items
// complete out of order, compensation follows the recorded completions
// backwards, not the items' order.
func TestCompensationOrderIsCompletionOrder(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "fan", CompensateOn: []string{workflow.CompensateOnFailure}, Steps: []workflow.Step{
		{ID: "each", Kind: workflow.KindForeach, Items: []any{"a", "b", "c"}, Concurrency: 3, Steps: []workflow.Step{withUndo("book")}},
		exec("pay"),
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 3)
	for _, i := range []int{1, 0, 2} { // b, then a, then c complete
		m.settle(m.tasks[i], false, "r"+m.tasks[i].TaskID)
	}
	sent := m.runOps(3, map[string]bool{"pay": true})
	require.Equal(t, []string{"pay", "each[2]/book/compensate/undo-book", "each[0]/book/compensate/undo-book", "each[1]/book/compensate/undo-book"},
		sent, "history: %v", m.types())
	require.Equal(t, projections.StatusFailed, m.state.Status)
}

// TestCompensationFails: a compensation that fails stops the others, is
// recorded (compensation.failed) and named in the execution's error.
func TestCompensationFails(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnFailure},
		Steps: []workflow.Step{withUndo("hotel"), withUndo("car"), exec("pay")}}
	m := newMemShell(t, def, `{}`)
	sent := m.runOps(0, map[string]bool{"pay": true, "car/compensate/undo-car": true})
	require.Equal(t, []string{"hotel", "car", "pay", "car/compensate/undo-car"}, sent, "hotel is not undone after car's undo failed")
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Equal(t, projections.CompensationFailed, m.state.Compensation.Status)
	require.Contains(t, m.state.Error, "step pay failed: boom; then compensation: step car could not be compensated: step car/compensate/undo-car failed: boom")
}

// TestCompensationOnCancel: a cancel of a workflow that compensates on
// cancel runs the compensations once nothing runs, then the execution is
// cancelled.
func TestCompensationOnCancel(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnCancel},
		Steps: []workflow.Step{withUndo("hotel"), {ID: "nap", Kind: workflow.KindSleep, Duration: "1h"}}}
	m := newMemShell(t, def, `{}`)
	m.runOps(0, nil)
	require.Equal(t, projections.OpWaiting, m.state.Steps[m.state.StepIndex("nap")].Status)
	m.carry(m.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionCancel, Command: "c"}}))
	sent := m.runOps(1, nil)
	require.Equal(t, []string{"hotel/compensate/undo-hotel"}, sent, "history: %v", m.types())
	require.Equal(t, projections.StatusCancelled, m.state.Status)
	require.Equal(t, events.CompensateForCancel, m.state.Compensation.Cause)
}

// TestCompensateAction: an operator compensates an execution that is
// over (its workflow does not compensate by itself): it runs again with
// a new token until its compensations are done, then ends as it was. It
// is not compensated twice, nor resumed afterwards; nothing to undo, or
// an execution still running, is refused.
func TestCompensateAction(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "trip", Steps: []workflow.Step{withUndo("hotel"), exec("pay")}}
	m := newMemShell(t, def, `{}`)
	m.runOps(0, map[string]bool{"pay": true})
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Nil(t, m.state.Compensation, "the workflow does not compensate by itself")
	token := m.state.Token

	act := func(key, action string) Decision {
		return m.act(ActionCommand{Key: key, Record: events.ActionRecord{Action: action, RequestedBy: "alice", Command: key}})
	}
	m.carry(act("k1", events.ActionCompensate))
	require.Equal(t, projections.StatusStarted, m.state.Status)
	require.NotEqual(t, token, m.state.Token, "a new token")
	sent := m.runOps(2, nil)
	require.Equal(t, []string{"hotel/compensate/undo-hotel"}, sent, "history: %v", m.types())
	require.Equal(t, projections.StatusFailed, m.state.Status, "it ends as it was")
	require.Equal(t, "step pay failed: boom", m.state.Error)
	require.Equal(t, events.CompensateForOperator, m.state.Compensation.Cause)
	require.Equal(t, "alice", m.state.Compensation.RequestedBy)

	d := act("k2", events.ActionCompensate)
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "was compensated already")
	d = act("k3", events.ActionResume)
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "replay it instead of resuming it")

	none := newMemShell(t, workflow.Definition{Name: "plain", Steps: []workflow.Step{exec("a"), exec("b")}}, `{}`)
	none.runOps(0, map[string]bool{"b": true})
	d = none.act(ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionCompensate, Command: "k"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "has nothing to compensate")

	running := newMemShell(t, def, `{}`)
	running.advance()
	d = running.act(ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionCompensate, Command: "k"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "compensate applies to an execution that is over")
}
