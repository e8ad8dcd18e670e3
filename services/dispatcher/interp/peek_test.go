package interp

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

// TestResultLeavesItsInputAsItWas: the decision on an agent's report
// looks ahead in place (projections.Peek: the success applied to the
// input's own steps, then the next step's schedule) to make the success
// carry the next dispatch; the input's state must be as it was once the
// decision is taken.
func TestResultLeavesItsInputAsItWas(t *testing.T) {
	m := tenStepsMidway(t, false)
	m.advance()
	require.Len(t, m.tasks, 7)
	task := m.tasks[6]
	m.reportTask(task, &events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}})
	in := m.input()
	was := in.State
	was.Steps, was.Signals, was.Vars = slices.Clone(in.State.Steps), slices.Clone(in.State.Signals), maps.Clone(in.State.Vars)

	ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
		Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1", Delivery: 1}
	d := Result(in, ref, events.Event{ID: "r", Type: events.TypeOperationSucceeded,
		Data: &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}})
	require.NoError(t, d.Err)
	require.NotEmpty(t, d.Events)
	ok, _ := d.Events[0].(*events.StepSucceeded)
	require.NotNil(t, ok, "the decision records the success: %+v", d.Events[0])
	require.NotNil(t, ok.Then, "the success carries the next dispatch (the look ahead ran)")
	require.Equal(t, "s8", ok.Then.StepID)
	require.Equal(t, was, in.State, "the input's state is as it was")
}
