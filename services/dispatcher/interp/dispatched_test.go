package interp

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

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
	require.Equal(t, []string{"execution.started", "step.dispatched"}, m.types(), "sent is recorded with the step's next event")
	require.Len(t, m.tasks, 1)
	require.Equal(t, projections.OpSent, m.state.Steps[0].Status, "the shell noted the sending")
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

// TestSplitDispatchRecordsSent: in compatibility mode the shell records
// step.sent (older dispatchers do not look a task up), and the step's
// next event carries no sending.
func TestSplitDispatchRecordsSent(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "build", Kind: workflow.KindNoop}}}
	m := newMemShell(t, def, `{}`)
	m.split = true
	m.advance()
	require.Equal(t, []string{"execution.started", "step.scheduled", "step.sending", "step.sent"}, m.types())
	m.carry(m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}))
	done := stepSucceeded(m.evs[len(m.evs)-1].Data)
	require.Zero(t, done.TaskSent, "step.sent recorded it")
}

// TestTheSendingIsRecordedWithTheNextEvent: the task's sequence and time,
// noted by the shell, go with the step's next event, whichever it is; a
// step whose sending the shell did not note (it was read anew) takes them
// from the agent's report.
func TestTheSendingIsRecordedWithTheNextEvent(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "build", Kind: workflow.KindNoop, Timeout: "1m"}}}
	sentAt := decideT0

	t.Run("Start", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, []string{"execution.started", "step.dispatched", "timer.armed"}, m.types(), "the timeout counts from the noted sending")
		m.carry(m.report(&events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}}))
		started := m.evs[len(m.evs)-1].Data.(*events.StepStarted)
		require.Equal(t, events.TaskSent{SentAt: sentAt, TaskSeq: 101}, started.TaskSent)
		st := m.state.Steps[0]
		require.Equal(t, projections.OpStarted, st.Status)
		require.False(t, st.SentUnrecorded())

		t.Log("the success after it carries nothing more")
		m.carry(m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}))
		require.Zero(t, stepSucceeded(m.evs[len(m.evs)-1].Data).TaskSent)
		fold, err := projections.Fold(m.evs)
		require.NoError(t, err)
		require.Equal(t, uint64(101), fold.Steps[0].TaskSeq, "the history alone shows the sending")
		require.True(t, sentAt.Equal(fold.Steps[0].SentAt))
	})

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.advance()
		m.fire()
		m.advance()
		var failed *events.StepFailed
		for _, ev := range m.evs {
			if f, ok := ev.Data.(*events.StepFailed); ok {
				failed = f
			}
		}
		require.NotNil(t, failed, "history: %v", m.types())
		require.Contains(t, failed.Error, "timed out")
		require.Equal(t, events.TaskSent{SentAt: sentAt, TaskSeq: 101}, failed.TaskSent)
	})

	t.Run("ReadAnew", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.advance()
		fresh, err := projections.Fold(m.evs) // another dispatcher reads the history
		require.NoError(t, err)
		require.Equal(t, projections.OpSending, fresh.Steps[0].Status)
		m.state = fresh
		stored := decideT0.Add(time.Millisecond)
		task := m.tasks[0]
		ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: "wf", StepID: "build", Attempt: 1, Token: task.Token,
			Queue: task.Queue, Agent: "a1", TaskSeq: 77, StoredAt: stored}
		d := Result(m.input(), ref, events.Event{ID: "r1", Type: events.TypeOperationSucceeded, Data: &events.OperationSucceeded{TaskRef: ref}})
		require.Len(t, d.Events, 1)
		require.Equal(t, events.TaskSent{SentAt: stored, TaskSeq: 77}, stepSucceeded(d.Events[0]).TaskSent)
	})

	t.Run("Expressions", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, projections.OpSent, m.state.Steps[0].Status)
		env := envOf(m.state)
		require.Equal(t, "sending", env["steps"].(map[string]any)["build"].(map[string]any)["status"],
			"expressions see what the history records: the same after a crash")
	})
}

// TestASuccessCarriesTheNextDispatch: when the decision after an
// operation's success is to send the next operation, the success carries
// its dispatch (one event for both); not when anything else comes next,
// in compatibility mode, in a large execution, nor with two large payloads.
func TestASuccessCarriesTheNextDispatch(t *testing.T) {
	t.Parallel()
	ops := func(n int) workflow.Definition {
		d := workflow.Definition{Name: "wf"}
		for i := range n {
			d.Steps = append(d.Steps, workflow.Step{ID: fmt.Sprintf("s%d", i), Kind: workflow.KindNoop})
		}
		return d
	}
	succeed := func(m *memShell) *events.StepSucceeded {
		d := m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}, Output: json.RawMessage(`{"ok":true}`)})
		require.Len(m.t, d.Events, 1)
		m.carry(d)
		if end, ok := d.Events[0].(*events.ExecutionSucceeded); ok { // the last, carried by the end
			return end.Step
		}
		return d.Events[0].(*events.StepSucceeded)
	}

	t.Run("NextOperation", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(3), `{}`)
		m.advance()
		ok := succeed(m)
		require.NotNil(t, ok.Then)
		require.Equal(t, "s1", ok.Then.StepID)
		require.Equal(t, events.TaskID("x1", "s1", 1), ok.Then.TaskID)
		st := m.state.Steps[1]
		require.Equal(t, projections.OpSending, st.Status, "dispatched by the success's event")
		require.Equal(t, m.state.Steps[0].EndedAt, st.ScheduledAt)
		require.Equal(t, len(m.evs), st.Entered, "entered with that event")
		m.advance()
		require.Len(t, m.tasks, 2, "and its task is published as after a step.dispatched")
		require.Equal(t, "s1", m.tasks[1].StepID)
		require.NotNil(t, succeed(m).Then)
		m.advance()
		last := succeed(m)
		require.Nil(t, last.Then, "nothing left to send")
		m.advance()
		require.Equal(t, projections.StatusSucceeded, m.state.Status)
		require.Equal(t, []string{"execution.started", "step.dispatched", "step.succeeded", "step.succeeded", "execution.succeeded"}, m.types(),
			"the last success is carried by the end (docs/adr/0015)")
	})

	t.Run("NextIsNoOperation", func(t *testing.T) {
		t.Parallel()
		d := ops(1)
		d.Steps = append(d.Steps, workflow.Step{ID: "nap", Kind: workflow.KindSleep, Duration: "1m"})
		m := newMemShell(t, d, `{}`)
		m.advance()
		require.Nil(t, succeed(m).Then)
	})

	t.Run("SplitDispatch", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(2), `{}`)
		m.split = true
		m.advance()
		require.Nil(t, succeed(m).Then)
	})

	t.Run("LargeExecution", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(SmallExecution+1), `{}`)
		m.advance()
		require.Nil(t, succeed(m).Then, "its view follows one event at a time")
	})

	t.Run("LargePayloads", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(2), `{}`)
		m.advance()
		in := m.input()
		in.MaxEvent = 40 // the output and the next input would not both fit in half
		task := m.tasks[0]
		ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: "wf", StepID: task.StepID, Attempt: 1, Token: task.Token, Queue: task.Queue}
		d := Result(in, ref, events.Event{ID: "r", Type: events.TypeOperationSucceeded,
			Data: &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{"ok":true}`)}})
		require.Len(t, d.Events, 1)
		require.Nil(t, d.Events[0].(*events.StepSucceeded).Then)
	})
}

// TestAStartCarriesTheFirstDispatch: when the first decision of an
// execution is to send an operation, its start carries that dispatch
// (one event for both), and the task is published as after a
// step.dispatched; not when anything else comes first, in compatibility
// mode, nor when the start's input and definition with the first input
// would take more than half of the largest event.
func TestAStartCarriesTheFirstDispatch(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${input.target}"}},
		{ID: "ship", Kind: workflow.KindNoop}}}
	// start decides as the dispatcher does: from nothing but the
	// definition, then records the start (with what it carries).
	start := func(t *testing.T, m *memShell, in Input) *events.ExecutionStarted {
		t.Helper()
		b, err := json.Marshal(m.def)
		require.NoError(t, err)
		in.State = projections.Execution{}
		d := Start(in, &events.ExecutionStarted{Workflow: m.def.Name, Version: 1, Input: json.RawMessage(`{"target":"all"}`),
			Steps: m.def.StepRefs(), Definition: b, Token: "tok"})
		require.Len(t, d.Events, 1)
		require.Empty(t, d.Before)
		require.Empty(t, d.After, "nothing is published before the start is recorded")
		require.Equal(t, in.Now, d.At, "recorded at the time its first input was rendered with")
		started := d.Events[0].(*events.ExecutionStarted)
		*m = memShell{t: t, def: m.def, memo: &Memo{}, now: decideT0, timers: map[string]time.Time{}, catalog: map[CalledRef]*Called{}, split: m.split}
		m.append(started)
		return started
	}

	t.Run("FirstOperation", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		started := start(t, m, m.input())
		require.NotNil(t, started.Then)
		require.Equal(t, "build", started.Then.StepID)
		require.Equal(t, events.TaskID("x1", "build", 1), started.Then.TaskID)
		require.Contains(t, string(started.Then.Input), `"all"`, "rendered from the start's input")
		require.Equal(t, 2, events.SchemaOf(started), "an older dispatcher would dispatch it again: it must wait")
		st := m.state.Steps[0]
		require.Equal(t, projections.OpSending, st.Status, "dispatched by the start's event")
		require.Equal(t, m.state.StartedAt, st.ScheduledAt)
		require.Equal(t, "tok", st.Token)
		m.advance()
		require.Len(t, m.tasks, 1, "its task is published as after a step.dispatched")
		require.Equal(t, started.Then.TaskID, m.tasks[0].TaskID)
		require.Equal(t, []string{"execution.started"}, m.types())
	})

	t.Run("FirstIsNoOperation", func(t *testing.T) {
		t.Parallel()
		d := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "nap", Kind: workflow.KindSleep, Duration: "1m"}}}
		m := newMemShell(t, d, `{}`)
		require.Nil(t, start(t, m, m.input()).Then)
	})

	t.Run("SplitDispatch", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.split = true
		started := start(t, m, m.input())
		require.Nil(t, started.Then)
		require.Equal(t, 1, events.SchemaOf(started))
	})

	t.Run("LargePayloads", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		in := m.input()
		in.MaxEvent = 300 // the definition, the input and the first input would not all fit in half
		require.Nil(t, start(t, m, in).Then)
	})
}

// stepSucceeded is the step's success p records: p itself, or the one an
// execution's end carries (docs/adr/0015); nil for any other event.
func stepSucceeded(p events.Payload) *events.StepSucceeded {
	switch e := p.(type) {
	case *events.StepSucceeded:
		return e
	case *events.ExecutionSucceeded:
		return e.Step
	}
	return nil
}

// TestAnEndCarriesTheLastSuccess: when ending the execution successfully
// is the decision after its last step's success, the end carries that
// success (one event for both, docs/adr/0015), and the fold shows both
// states; not in compatibility mode, nor in a large execution, nor with
// two large outputs.
func TestAnEndCarriesTheLastSuccess(t *testing.T) {
	t.Parallel()
	ops := func(n int) workflow.Definition {
		d := workflow.Definition{Name: "wf", Output: map[string]any{"done": fmt.Sprintf("${steps.s%d.output.ok}", n-1)}}
		for i := range n {
			d.Steps = append(d.Steps, workflow.Step{ID: fmt.Sprintf("s%d", i), Kind: workflow.KindNoop})
		}
		return d
	}
	report := func(m *memShell, in Input) Decision {
		task := m.tasks[len(m.tasks)-1]
		ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: "wf", StepID: task.StepID, Attempt: 1, Token: task.Token, Queue: task.Queue, Agent: "a1"}
		return Result(in, ref, events.Event{ID: "r-" + task.StepID, Type: events.TypeOperationSucceeded,
			Data: &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{"ok":true}`)}})
	}
	run := func(m *memShell, steps int) Decision {
		for range steps - 1 {
			m.advance()
			m.carry(report(m, m.input()))
		}
		m.advance()
		return report(m, m.input())
	}

	t.Run("LastStep", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(2), `{}`)
		d := run(m, 2)
		require.Len(t, d.Events, 1)
		end, ok := d.Events[0].(*events.ExecutionSucceeded)
		require.True(t, ok, "%T", d.Events[0])
		require.NotNil(t, end.Step)
		require.Equal(t, "s1", end.Step.StepID)
		require.Nil(t, end.Step.Then)
		require.JSONEq(t, `{"done": true}`, string(end.Output), "the workflow's output, from the steps as the success leaves them")
		require.Equal(t, 3, events.SchemaOf(end), "an older reader must not pass over the step")
		m.carry(d)
		require.Equal(t, projections.StatusSucceeded, m.state.Status)
		st := m.state.Steps[m.state.StepIndex("s1")]
		require.Equal(t, projections.OpSucceeded, st.Status)
		require.Equal(t, m.state.EndedAt, st.EndedAt, "both at the event's time")
		require.JSONEq(t, `{"ok":true}`, string(st.Output))
		fold, err := projections.Fold(m.evs)
		require.NoError(t, err)
		require.Equal(t, m.state.Status, fold.Status)
		require.Equal(t, m.state.Steps[1].Status, fold.Steps[1].Status)
		require.Equal(t, []string{"execution.started", "step.dispatched", "step.succeeded", "execution.succeeded"}, m.types())
		require.True(t, Next(m.input()).Empty(), "nothing more to decide")
	})

	t.Run("SplitDispatch", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(1), `{}`)
		m.split = true
		d := run(m, 1)
		require.IsType(t, &events.StepSucceeded{}, d.Events[0], "an older dispatcher reads these histories")
	})

	t.Run("LargeExecution", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(SmallExecution+1), `{}`)
		d := run(m, SmallExecution+1)
		require.IsType(t, &events.StepSucceeded{}, d.Events[0], "its view follows one event at a time")
	})

	t.Run("LargeOutputs", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, ops(1), `{}`)
		m.advance()
		in := m.input()
		in.MaxEvent = 40 // the step's output and the execution's would not both fit in half
		d := report(m, in)
		require.IsType(t, &events.StepSucceeded{}, d.Events[0])
	})

	t.Run("NotWithALockToRelease", func(t *testing.T) {
		t.Parallel()
		d := ops(1)
		d.Lock, d.Output = "l", nil
		m := newMemShell(t, d, `{}`)
		m.advance()
		require.Equal(t, projections.LockHeld, m.state.Locks[0].Status)
		res := report(m, m.input())
		require.IsType(t, &events.StepSucceeded{}, res.Events[0], "the lock's release comes between")
		m.carry(res)
		m.advance()
		require.Equal(t, projections.StatusSucceeded, m.state.Status, "%v: %s", m.types(), m.state.Error)
		types := m.types()
		require.Equal(t, []string{"step.succeeded", "lock.released", "execution.succeeded"}, types[len(types)-3:])
	})
}

// TestASuccessTheDispatcherDecidesCarriesWhatFollows: the success of a
// step the dispatcher runs itself (a let, a return, a sleep, a wait) is
// decided by Next, and carries what follows it as an operation's does:
// the next operation's dispatch, or the execution's end.
func TestASuccessTheDispatcherDecidesCarriesWhatFollows(t *testing.T) {
	t.Parallel()
	folded := func(t *testing.T, m *memShell) {
		t.Helper()
		fold, err := projections.Fold(m.evs)
		require.NoError(t, err)
		require.Equal(t, m.state.Status, fold.Status)
		require.Equal(t, m.state.Output, fold.Output)
		require.Equal(t, m.state.Vars, fold.Vars)
		require.Len(t, fold.Steps, len(m.state.Steps))
		for i, st := range m.state.Steps {
			require.Equal(t, st.RecordedStatus(), fold.Steps[i].Status, "step %s, as the history records it", st.ID)
		}
	}

	t.Run("ASleepCarriesTheNextDispatch", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "rest", Kind: workflow.KindSleep, Duration: "90s"},
			{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${steps.rest.status}"}},
		}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		m.fire()
		m.advance()
		types := m.types()
		require.Equal(t, []string{"step.waiting", "step.succeeded"}, types[len(types)-2:], "the dispatch is carried by the sleep's success, which records the firing")
		ok, isOK := m.evs[len(m.evs)-1].Data.(*events.StepSucceeded)
		require.True(t, isOK)
		require.Equal(t, "rest", ok.StepID)
		require.NotEmpty(t, ok.Fired)
		require.Equal(t, 4, events.SchemaOf(ok))
		require.NotNil(t, ok.Then)
		require.Equal(t, "build", ok.Then.StepID)
		require.JSONEq(t, `{"id":"build","kind":"exec","command":"make","args":["succeeded"]}`, string(ok.Then.Input), "rendered from the state after the success")
		require.Len(t, m.tasks, 1, "and the task is sent")
		require.Equal(t, projections.OpSent, m.state.Steps[m.state.StepIndex("build")].Status)
		folded(t, m)
	})

	t.Run("ALetCarriesNoDispatch", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "count", Kind: workflow.KindLet, Vars: map[string]any{"n": 3}},
			{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${vars.n}"}},
		}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, []string{"execution.started", "step.scheduled", "step.succeeded", "step.dispatched"}, m.types(),
			"build is entered after the let's event: a replay from it restores the variables the let set")
		require.Nil(t, m.evs[2].Data.(*events.StepSucceeded).Then)
		st := m.state.Steps[m.state.StepIndex("build")]
		require.Equal(t, 4, st.Entered)
		require.Len(t, m.tasks, 1)
		require.Contains(t, string(m.tasks[0].Spec), `"3"`)
		folded(t, m)
	})

	t.Run("ALetBeforeALetCarriesNothing", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Output: map[string]any{"m": "${vars.m}"}, Steps: []workflow.Step{
			{ID: "a", Kind: workflow.KindLet, Vars: map[string]any{"n": 3}},
			{ID: "b", Kind: workflow.KindLet, Vars: map[string]any{"m": "${vars.n}"}},
		}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, []string{"execution.started", "step.scheduled", "step.succeeded", "step.scheduled", "execution.succeeded"}, m.types(),
			"a's success carries nothing (what follows it is no dispatch); b's is carried by the end")
		require.Nil(t, m.evs[2].Data.(*events.StepSucceeded).Then)
		end := m.evs[4].Data.(*events.ExecutionSucceeded)
		require.Equal(t, "b", end.Step.StepID)
		require.JSONEq(t, `{"m":3}`, string(end.Output))
		folded(t, m)
	})

	t.Run("AReturnIsCarriedByTheEnd", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "done", Kind: workflow.KindReturn, Output: map[string]any{"x": "${input.x}"}},
			{ID: "never", Kind: workflow.KindExec, Command: "x"},
		}}
		m := newMemShell(t, def, `{"x":7}`)
		m.advance()
		require.Equal(t, []string{"execution.started", "step.scheduled", "execution.succeeded"}, m.types())
		end := m.evs[2].Data.(*events.ExecutionSucceeded)
		require.Equal(t, "done", end.Step.StepID)
		require.JSONEq(t, `{"x":7}`, string(end.Output))
		require.Equal(t, projections.StatusSucceeded, m.state.Status)
		require.Equal(t, projections.OpSucceeded, m.state.Steps[0].Status)
		require.Empty(t, m.tasks)
		folded(t, m)
	})

	t.Run("ATakenSignalIsCarriedByTheEnd", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Output: map[string]any{"got": "${steps.w.output.name}"}, Steps: []workflow.Step{
			{ID: "w", Kind: workflow.KindWait, Signal: "go"},
		}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, projections.OpWaiting, m.state.Steps[0].Status)
		m.carry(Signal(m.input(), SignalCommand{ID: "s1", Name: "go", Sender: "test", SentAt: m.now}))
		m.advance()
		types := m.types()
		require.Equal(t, []string{"signal.received", "execution.succeeded"}, types[len(types)-2:])
		end := m.evs[len(m.evs)-1].Data.(*events.ExecutionSucceeded)
		require.Equal(t, "s1", end.Step.SignalID, "the signal it took, with the success")
		require.JSONEq(t, `{"got":"go"}`, string(end.Output))
		require.Equal(t, projections.StatusSucceeded, m.state.Status)
		require.Equal(t, projections.OpSucceeded, m.state.Steps[0].Status)
		require.True(t, Next(m.input()).Empty(), "nothing more to decide")
		folded(t, m)
	})

	t.Run("NotWithALockToRelease", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{
			{ID: "count", Kind: workflow.KindLet, Vars: map[string]any{"n": 3}},
		}}
		m := newMemShell(t, def, `{}`)
		m.advance()
		require.Equal(t, projections.StatusSucceeded, m.state.Status, "%v: %s", m.types(), m.state.Error)
		types := m.types()
		require.Equal(t, []string{"step.succeeded", "lock.released", "execution.succeeded"}, types[len(types)-3:], "the lock's release comes between")
		require.Nil(t, m.evs[len(m.evs)-1].Data.(*events.ExecutionSucceeded).Step)
		folded(t, m)
	})

	t.Run("SplitDispatch", func(t *testing.T) {
		t.Parallel()
		def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "count", Kind: workflow.KindLet, Vars: map[string]any{"n": 3}}}}
		m := newMemShell(t, def, `{}`)
		m.split = true
		m.advance()
		require.Equal(t, []string{"execution.started", "step.scheduled", "step.succeeded", "execution.succeeded"}, m.types(), "an older dispatcher reads these histories")
	})
}
