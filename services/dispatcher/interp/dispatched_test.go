package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestAnOperationIsScheduledAndSendingInOneEvent: an operation whose
// next decision once pending is to send its task is recorded pending and
// sending in one event, before anything is published; the decision after
// it publishes the task, and so does every decision until step.sent is
// recorded (a crash after the append), never scheduling it again.
func TestAnOperationIsScheduledAndSendingInOneEvent(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${input.target}"}, Queue: "builders"}}}
	m := newMemShell(t, def, `{"target":"all"}`)

	d := Next(m.input())
	require.Empty(t, d.Before)
	require.Empty(t, d.After, "nothing is published before the sending is recorded")
	require.Len(t, d.Events, 1)
	disp, ok := d.Events[0].(*events.StepDispatched)
	require.True(t, ok, "%T", d.Events[0])
	require.Equal(t, "build", disp.StepID)
	require.Equal(t, 1, disp.Attempt)
	require.Equal(t, events.TaskID("x1", "build", 1), disp.TaskID)
	require.Equal(t, "builders", disp.Queue)
	require.Contains(t, string(disp.Input), `"all"`, "the rendered input, as step.scheduled records it")
	m.carry(d)
	st := m.state.Steps[0]
	require.Equal(t, projections.OpSending, st.Status)
	require.Equal(t, decideT0, st.ScheduledAt)
	require.Equal(t, "tok", st.Token)

	for range 2 { // the dispatcher dies after the publish, twice
		again := Next(m.input())
		require.Empty(t, again.Events, "not scheduled again")
		require.Len(t, again.After, 1)
		pub, isPub := again.After[0].(PublishTask)
		require.True(t, isPub, "%T", again.After[0])
		require.Equal(t, disp.TaskID, pub.Task.TaskID)
		require.JSONEq(t, string(disp.Input), string(pub.Task.Spec), "the recorded input, exactly")
	}
	m.advance()
	require.Equal(t, []string{"execution.started", "step.dispatched", "step.sent"}, m.types())
	require.Len(t, m.tasks, 1)
}

// TestADryRunIsScheduledThenSkipped: when the decision after the schedule
// is not to send (a dry run skips the operation), the schedule is its own
// event, as before.
func TestADryRunIsScheduledThenSkipped(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "build", Kind: workflow.KindExec, Command: "make"}}}
	m := newMemShell(t, def, `{}`)
	m.state.DryRun = true // as execution.started with dry_run sets it
	m.advance()
	require.Equal(t, []string{"execution.started", "step.scheduled", "step.skipped", "execution.succeeded"}, m.types())
	require.Empty(t, m.tasks)
}

// TestSplitDispatchKeepsTwoEvents: with SplitDispatch (older dispatchers
// may read the history) the schedule and the sending are two events, as
// before step.dispatched.
func TestSplitDispatchKeepsTwoEvents(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "build", Kind: workflow.KindExec, Command: "make"}}}
	m := newMemShell(t, def, `{}`)
	in := m.input()
	in.SplitDispatch = true
	d := Next(in)
	require.Len(t, d.Events, 1)
	require.IsType(t, &events.StepScheduled{}, d.Events[0])
	m.carry(d)
	in = m.input()
	in.SplitDispatch = true
	d = Next(in)
	require.Len(t, d.Events, 1)
	require.IsType(t, &events.StepSending{}, d.Events[0])
}
