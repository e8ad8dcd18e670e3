package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestStepTimeoutTerminatesItsAttempt: when a step's timeout fires with
// its attempt with the agents, the agents are told to terminate that
// attempt (by its task id), before its failure is recorded, so that a
// crash in between publishes the notice again; the next attempt is not
// named.
func TestStepTimeoutTerminatesItsAttempt(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "op", Kind: workflow.KindExec, Command: "x", Timeout: "10s", Retry: &workflow.Retry{Limit: 2}},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 1)
	m.carry(m.report(&events.OperationStarted{}))
	m.advance()
	require.Empty(t, m.kills, "nothing is terminated while the attempt is within its time")

	m.fire() // the attempt's timeout
	d := Next(m.input())
	require.Len(t, d.Before, 1, "the notice goes before the failure's append: %+v", d)
	require.Equal(t, PublishKill{TaskID: m.tasks[0].TaskID, Reason: "attempt 1 timed out after 10s"}, d.Before[0])
	m.carry(d)
	require.Equal(t, projections.OpFailed, m.state.Steps[0].Status)
	require.Len(t, m.kills, 1)
	require.Equal(t, len(m.evs)-1, m.kills[0].after, "published before the step.failed event")

	t.Log("the agent's report of the terminated attempt is recorded ignored, once, saying why")
	terminated := &events.OperationFailed{Error: "terminated: the step gave up on this attempt (attempt 1 timed out after 10s) after running 10s"}
	late := m.report(terminated)
	require.Len(t, late.Events, 1)
	ignored, ok := late.Events[0].(*events.ResultIgnored)
	require.True(t, ok, "%T", late.Events[0])
	require.Equal(t, "attempt 1 was over (attempt 1 timed out after 10s) when this report came; it says: "+terminated.Error, ignored.Reason)
	m.carry(late)
	require.Empty(t, Result(m.input(), events.TaskRef{TaskID: m.tasks[0].TaskID, ExecutionID: "x1", Workflow: "wf", StepID: "op",
		Attempt: 1, Token: m.tasks[0].Token, Queue: m.tasks[0].Queue, Agent: "a1"},
		events.Event{ID: ignored.ResultID, Type: events.TypeOperationFailed, Data: terminated}).Events, "delivered again: nothing more")

	t.Log("the retry's attempt runs; its timeout terminates it in turn")
	m.advance()
	m.fire() // the retry's backoff
	m.advance()
	require.Len(t, m.tasks, 2)
	m.fire()
	m.advance()
	require.Len(t, m.kills, 2)
	require.Equal(t, m.tasks[1].TaskID, m.kills[1].TaskID)
	require.NotEqual(t, m.tasks[0].TaskID, m.tasks[1].TaskID)
}

// TestEndWithOperationsOutRefusesTheirTasks: an execution that ends
// while operations are with the agents publishes, after its end, the
// notice that refuses its tasks not yet started; one that ends with
// nothing out publishes none.
func TestEndWithOperationsOutRefusesTheirTasks(t *testing.T) {
	t.Parallel()
	t.Run("a failure while another branch runs", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{{ID: "fast", Kind: workflow.KindExec, Command: "x"}}},
			{ID: "b", Steps: []workflow.Step{{ID: "slow", Kind: workflow.KindExec, Command: "x"}}},
		}}}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Len(t, m.tasks, 2)
		fast := m.tasks[0]
		ev := events.Event{ID: "r-fast", Type: events.TypeOperationFailed}
		ref := events.TaskRef{TaskID: fast.TaskID, ExecutionID: "x1", Workflow: "wf", StepID: fast.StepID, Attempt: fast.Attempt, Token: fast.Token, Queue: fast.Queue}
		ev.Data = &events.OperationFailed{TaskRef: ref, Error: "boom", Final: true}
		d := Result(m.input(), ref, ev)
		require.Empty(t, d.Stale)
		m.carry(d)
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
		require.Len(t, m.kills, 1)
		require.Equal(t, PublishKill{Ended: true, Tokens: []string{"tok"}}, m.kills[0].PublishKill, "for the run that ended: its token")
		require.Equal(t, len(m.evs), m.kills[0].after, "published after the end was recorded")
	})
	t.Run("a success with nothing out", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		m.carry(m.report(&events.OperationSucceeded{}))
		m.advance()
		require.Equal(t, projections.StatusSucceeded, m.state.Status)
		require.Empty(t, m.kills)
	})
	t.Run("a force-cancel, decided again, and after a resume", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		force := ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "k"}}
		m.carry(Action(m.input(), force))
		require.Equal(t, projections.StatusCancelled, m.state.Status)
		require.Equal(t, []killPublished{{PublishKill{Ended: true, Command: "k", Tokens: []string{"tok"}}, len(m.evs)}}, m.kills)

		t.Log("the command redelivered (a crash before the notice): published again")
		require.Equal(t, []Effect{PublishKill{Ended: true, Command: "k", Tokens: []string{"tok"}}}, Action(m.input(), force).After)

		resume := ActionCommand{Key: "r", Record: events.ActionRecord{Action: events.ActionResume, Command: "r"}}
		for m.carry(Action(m.input(), resume)) && m.state.Status != projections.StatusStarted {
		}
		require.Equal(t, projections.StatusStarted, m.state.Status)
		require.Empty(t, Action(m.input(), force).After, "redelivered after a resume, it refuses nothing")
		kill := ActionCommand{Key: "kk", Record: events.ActionRecord{Action: events.ActionKill, Command: "kk"}}
		m.carry(Action(m.input(), kill))
		killed := PublishKill{Command: "kk"}
		require.Equal(t, killed, m.kills[len(m.kills)-1].PublishKill)
		require.NotEqual(t, "tok", m.state.Token)
		require.Equal(t, []Effect{killed}, Action(m.input(), kill).After, "the kill redelivered: published again")
		resume2 := ActionCommand{Key: "r2", Record: events.ActionRecord{Action: events.ActionResume, Command: "r2"}}
		for m.carry(Action(m.input(), resume2)) && m.state.Status != projections.StatusStarted {
		}
		require.Empty(t, Action(m.input(), kill).After, "the kill redelivered after a resume kills nothing")
		cancel := ActionCommand{Key: "fc", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "fc"}}
		m.carry(Action(m.input(), cancel))
		require.Equal(t, projections.StatusCancelled, m.state.Status)
		require.Empty(t, Action(m.input(), kill).After, "nor after a resume and another end: it is not the last action")
	})
}

// TestWorkflowTimeoutTerminatesWhatItAbandons: when the workflow's
// timeout fires, the operations it leaves behind are terminated (before
// the firing is recorded); its own on-error steps, which run after it,
// are not.
func TestWorkflowTimeoutTerminatesWhatItAbandons(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Timeout: "1m",
		OnError: []workflow.Step{{ID: "cleanup", Kind: workflow.KindExec, Command: "x"}},
		Steps: []workflow.Step{{ID: "both", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{{ID: "one", Kind: workflow.KindExec, Command: "x"}}},
			{ID: "b", Steps: []workflow.Step{{ID: "two", Kind: workflow.KindExec, Command: "x"}}},
		}}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 2)
	timer := timerID("x1", events.TimerWorkflowTimeout, "", 0)
	d := Fired(m.input(), timer, m.now)
	require.ElementsMatch(t, []Effect{
		PublishKill{TaskID: m.tasks[0].TaskID, Reason: "the workflow timed out after 1m"},
		PublishKill{TaskID: m.tasks[1].TaskID, Reason: "the workflow timed out after 1m"},
	}, d.Before)
	m.carry(d)
	m.advance()
	require.Len(t, m.tasks, 3, "the on-error step was sent")
	require.Equal(t, "on-error/cleanup", m.tasks[2].StepID)
	require.Len(t, m.kills, 2, "the on-error step is not terminated")

	t.Log("the firing delivered again, once recorded: nothing more")
	require.Empty(t, Fired(m.input(), timer, m.now).Before)
}

// TestResumeRunsAgainWhatFailedAfterTheEnd: an operation whose failure
// was noted after the end runs again on resume, even once the results
// stream no longer keeps the report; one whose success was noted, its
// report gone with its output, is not run again by a plain resume (it
// is not known to be idempotent), and a force-resume runs it.
func TestResumeRunsAgainWhatFailedAfterTheEnd(t *testing.T) {
	t.Parallel()
	for _, outcome := range []events.Payload{&events.OperationFailed{Error: "terminated"}, &events.OperationSucceeded{}} {
		_, failed := outcome.(*events.OperationFailed)
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		m.carry(Action(m.input(), ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionKill, Command: "k"}}))
		require.Equal(t, projections.StatusCancelled, m.state.Status)
		d := m.report(outcome)
		require.Len(t, d.Events, 1)
		require.IsType(t, &events.ResultAfterEnd{}, d.Events[0])
		m.carry(d)
		require.NotNil(t, m.state.Steps[0].AfterEnd)
		require.Empty(t, m.report(outcome).Events, "noted once")

		action := events.ActionResume
		if !failed {
			action = events.ActionForceResume
			plain := ActionCommand{Key: "p", Record: events.ActionRecord{Action: events.ActionResume, Command: "p"}}
			m2 := *m
			for m2.carry(Action(m2.input(), plain)) && m2.state.Status != projections.StatusStarted {
			}
			require.Equal(t, 1, m2.state.Steps[0].Attempt, "a plain resume does not run a success again")
		}
		resume := ActionCommand{Key: "r", Record: events.ActionRecord{Action: action, Command: "r"}}
		for m.carry(Action(m.input(), resume)) && m.state.Status != projections.StatusStarted {
		}
		st := m.state.Steps[0]
		require.Equal(t, 2, st.Attempt, "%T after the end, %s: the step runs again", outcome, action)
		require.Equal(t, projections.OpPending, st.Status)
		require.Nil(t, st.AfterEnd, "the note goes with the run it was about")
	}
}

// TestForceResumeTerminatesTheAttemptsItRunsAgain: a force-resume runs
// again the operations the agents may still have: their old attempts are
// terminated, after the resume is recorded; a plain resume waits for them.
func TestForceResumeTerminatesTheAttemptsItRunsAgain(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	old := m.tasks[0].TaskID
	m.carry(Action(m.input(), ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "c"}}))
	resume := ActionCommand{Key: "r", Record: events.ActionRecord{Action: events.ActionResume, Command: "r"}}
	for m.carry(Action(m.input(), resume)) && m.state.Status != projections.StatusStarted {
	}
	require.Len(t, m.kills, 1, "a plain resume terminates nothing: %+v", m.kills)
	m.carry(Action(m.input(), ActionCommand{Key: "c2", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "c2"}}))
	before := len(m.kills)
	force := ActionCommand{Key: "f", Record: events.ActionRecord{Action: events.ActionForceResume, Command: "f"}}
	for m.carry(Action(m.input(), force)) && m.state.Status != projections.StatusStarted {
	}
	require.Len(t, m.kills, before+1)
	require.Equal(t, PublishKill{TaskID: old, Reason: "a force-resume runs the step again"}, m.kills[before].PublishKill)
	require.Equal(t, len(m.evs), m.kills[before].after, "after the resume is recorded")
	require.Equal(t, 2, m.state.Steps[0].Attempt)
}

// TestTimeoutThatEndedTheExecutionNotesTheTermination: when a step's
// timeout fails the execution, the report of the attempt its agent then
// terminated is noted after the end, once.
func TestTimeoutThatEndedTheExecutionNotesTheTermination(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x", Timeout: "10s"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	m.fire()
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	terminated := &events.OperationFailed{Error: "terminated: the step gave up on this attempt (attempt 1 timed out after 10s)"}
	d := m.report(terminated)
	require.Len(t, d.Events, 1)
	noted, ok := d.Events[0].(*events.ResultAfterEnd)
	require.True(t, ok, "%T", d.Events[0])
	require.Equal(t, terminated.Error, noted.Error)
	m.carry(d)
	require.Equal(t, projections.OpFailed, m.state.Steps[0].AfterEnd.Outcome)
	require.Empty(t, m.report(terminated).Events, "once")
}

// TestReplayRunsAgainWhatWasRefusedAfterTheEnd: a replay of an execution
// force-cancelled while its task waited, refused since by its agent (noted
// after the end, its report no longer kept), runs that operation again
// rather than refusing the replay because it would still be running.
func TestReplayRunsAgainWhatWasRefusedAfterTheEnd(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "first", Kind: workflow.KindExec, Command: "x", Idempotent: "yes"},
		{ID: "second", Kind: workflow.KindExec, Command: "x", Idempotent: "yes"},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	m.carry(m.report(&events.OperationSucceeded{}))
	m.advance()
	require.Len(t, m.tasks, 2)
	m.carry(Action(m.input(), ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "c"}}))
	m.carry(m.report(&events.OperationFailed{Error: "refused: the execution ended before this task started"}))
	require.NotNil(t, m.state.Steps[1].AfterEnd)

	d := askReplay(t, m, events.ReplayResume, false)
	require.Nil(t, d.Reject, "a refused task's step is not still running")
	require.NotEmpty(t, d.Events)
	m.carry(d)
	m.advance()
	require.Equal(t, projections.StatusStarted, m.state.Status, "history: %v", m.types())
	require.Len(t, m.tasks, 3, "the refused operation was sent again")
	require.Equal(t, "second", m.tasks[2].StepID)
}
