package interp

import (
	"testing"

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
