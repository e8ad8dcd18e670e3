package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestCompensationReviewCases: what an independent review found, each
// kept by a test.
func TestCompensationReviewCases(t *testing.T) {
	t.Parallel()
	t.Run("InFlightSuccessIsCompensated", func(t *testing.T) {
		t.Parallel()
		// pay fails while car is still out: the compensation waits for
		// car's report, and undoes it too.
		m := payFailsBesideCar(t, withUndo("car"))
		m.settle(m.tasks[0], false, "r2")
		sent := m.runOps(2, nil)
		require.Equal(t, []string{"par/a/car/compensate/undo-car"}, sent, "history: %v", m.types())
		require.Equal(t, projections.StatusFailed, m.state.Status)
	})
	t.Run("GotoRoundsAreEachUndone", func(t *testing.T) {
		t.Parallel()
		book := exec("book")
		book.Compensate = []workflow.Step{{ID: "note", Kind: workflow.KindExec, Command: "echo", Args: []string{"${compensating.output}"}}}
		def := workflow.Definition{Name: "loop", CompensateOn: []string{workflow.CompensateOnFailure}, Steps: []workflow.Step{
			book,
			{ID: "count", Kind: workflow.KindLet, Vars: map[string]any{"n": "${(vars.n ?? 0) + 1}"}},
			{ID: "again", Kind: workflow.KindGoto, Target: "book", Condition: "${vars.n < 2}"},
			exec("pay"),
		}}
		m := newMemShell(t, def, `{}`)
		m.runOps(0, map[string]bool{"pay~1": true}) // after the goto, the later steps are round 1's
		require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
		specs := map[string]string{}
		for _, task := range m.tasks {
			if inCompensation(task.StepID) {
				specs[task.StepID] = string(task.Spec)
			}
		}
		require.Len(t, specs, 2, "both rounds are undone: %v", m.types())
		require.Contains(t, specs["book~1/compensate/note"], `book~1 ok`)
		require.Contains(t, specs["book/compensate/note"], `book ok`, "round 0's undo sees round 0's output")
		require.NotContains(t, specs["book/compensate/note"], `book~1`)
	})
	t.Run("ForceCancelledCompensationGoesOn", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnFailure},
			Steps: []workflow.Step{withUndo("hotel"), withUndo("car"), exec("pay")}}
		m2 := newMemShell(t, def, `{}`)
		m2.advance()
		for range 3 { // hotel, car succeed; pay fails: the compensation begins and sends undo-car
			task := m2.tasks[len(m2.tasks)-1]
			m2.settle(task, task.StepID == "pay", "r"+task.TaskID)
			m2.advance()
		}
		require.Equal(t, "car/compensate/undo-car", m2.tasks[len(m2.tasks)-1].StepID)
		m2.carry(m2.act(ActionCommand{Key: "fc", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "fc"}}))
		require.Equal(t, projections.StatusCancelled, m2.state.Status)
		// Its undo-car reports after the end; then an operator compensates the rest.
		m2.settle(m2.tasks[len(m2.tasks)-1], false, "late")
		d := m2.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionCompensate, Command: "c"}})
		require.Nil(t, d.Reject, "%+v", d.Reject)
		m2.carry(d)
		m2.advance()
		require.Equal(t, projections.StatusStarted, m2.state.Status, "it runs again: history %v", m2.types())
		require.Equal(t, []string{"car", "hotel"}, m2.state.Compensation.Steps, "the same compensation, going on")
		require.Equal(t, 1, m2.state.Compensations, "not a new one")
		require.Equal(t, "car/compensate/undo-car", m2.tasks[len(m2.tasks)-1].StepID, "car's undo is not sent again (its report is taken): history %v", m2.types())
	})
	t.Run("DashIDIsNotASegment", func(t *testing.T) {
		t.Parallel()
		require.True(t, isCompensateSeg("compensate"))
		require.True(t, isCompensateSeg("compensate2"))
		require.False(t, isCompensateSeg("compensate-1"))
		require.False(t, isCompensateSeg("compensatex"))
	})
	t.Run("LockInsideACompensationSettles", func(t *testing.T) {
		t.Parallel()
		book := exec("book")
		book.Compensate = []workflow.Step{{ID: "guarded", Kind: workflow.KindWorkflow, Lock: "db", Steps: []workflow.Step{exec("undo")}}}
		def := workflow.Definition{Name: "fan", CompensateOn: []string{workflow.CompensateOnFailure}, Steps: []workflow.Step{
			{ID: "each", Kind: workflow.KindForeach, Items: []any{1}, Steps: []workflow.Step{book}}, exec("pay")}}
		m := newMemShell(t, def, `{}`)
		sent := m.runOps(0, map[string]bool{"pay": true})
		require.Equal(t, []string{"each[0]/book", "pay", "each[0]/book/compensate/guarded/undo"}, sent, "history: %v", m.types())
		require.Equal(t, projections.StatusFailed, m.state.Status)
	})
}

// TestReplayAfterACompensation: a replay of a compensated execution is
// decided (compensate steps are not the run's: no replay point, nowhere
// to resume), the steps run again, and a second failure undoes them again
// at compensate2, since they ran again.
func TestReplayAfterACompensation(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "trip", Replayable: "from start", CompensateOn: []string{workflow.CompensateOnFailure},
		Steps: []workflow.Step{withUndo("hotel"), withUndo("car"), exec("pay")}}
	m := newMemShell(t, def, `{}`)
	m.runOps(0, map[string]bool{"pay": true, "car/compensate/undo-car": true})
	require.Equal(t, projections.CompensationFailed, m.state.Compensation.Status)
	n := len(m.tasks)
	d := m.act(ActionCommand{Key: "r", From: events.ReplayStart, Record: events.ActionRecord{Action: events.ActionReplay, Command: "r"}})
	require.Nil(t, d.Reject, "%+v", d.Reject)
	require.NoError(t, d.Err)
	m.carry(d)
	require.Nil(t, m.state.Compensation, "a new run")
	sent := m.runOps(n, map[string]bool{"pay": true})
	require.Equal(t, []string{"hotel", "car", "pay", "car/compensate2/undo-car", "hotel/compensate2/undo-hotel"}, sent, "history: %v", m.types())
	require.Equal(t, projections.CompensationFinished, m.state.Compensation.Status)
	require.Equal(t, 2, m.state.Compensation.Round)
}

// payFailsBesideCar runs a trip that compensates on failure, whose pay
// fails while car (in another branch) is still out.
func payFailsBesideCar(t *testing.T, car workflow.Step) *memShell {
	t.Helper()
	def := workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnFailure}, Steps: []workflow.Step{
		{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{car}}, {ID: "b", Steps: []workflow.Step{exec("pay")}}}}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 2)
	m.settle(m.tasks[1], true, "r1")
	m.advance()
	require.Nil(t, m.state.Compensation, "it waits for car")
	return m
}

// TestCompensationWaitReviewCases: the second review's cases. While a
// failure's compensation waits for a compensable operation still out,
// that operation's timeout is honoured and a cancel is refused; a failed
// compensation leaves the steps after the failed one not undone.
func TestCompensationWaitReviewCases(t *testing.T) {
	t.Parallel()
	slowCar := withUndo("car")
	slowCar.Timeout = "1m"
	m := payFailsBesideCar(t, slowCar)
	d := m.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionCancel, Command: "c"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "its compensation waits for operations still out; force-cancel it to stop now")

	m.fire() // car's step timeout
	m.advance()
	car := m.state.Steps[m.state.StepIndex("par/a/car")]
	require.Equal(t, projections.OpFailed, car.Status, "its timeout is honoured: history %v", m.types())
	require.Equal(t, projections.StatusFailed, m.state.Status, "nothing succeeded to undo")

	// A failed compensation leaves those after the failed one not undone.
	f := newMemShell(t, workflow.Definition{Name: "trip", CompensateOn: []string{workflow.CompensateOnFailure},
		Steps: []workflow.Step{withUndo("hotel"), withUndo("car"), exec("pay")}}, `{}`)
	f.runOps(0, map[string]bool{"pay": true, "car/compensate/undo-car": true})
	require.Equal(t, projections.CompensationFailed, f.state.Compensation.Status)
	require.NotContains(t, f.state.Compensated, "car")
	require.NotContains(t, f.state.Compensated, "hotel")

	_, err := workflow.Parse([]byte("name: wf\nsteps:\n  - id: par\n    kind: parallel\n    branches:\n      - id: compensate\n        steps: [{id: a, kind: noop}]\n"))
	require.ErrorContains(t, err, `"compensate" is reserved`)
}
