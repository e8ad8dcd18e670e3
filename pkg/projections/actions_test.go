package projections_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestActionRefused is what an operator is told when an action does not
// apply to an execution's status ("" when it applies).
func TestActionRefused(t *testing.T) {
	t.Parallel()

	const (
		waitThenResume = "is cancelling; wait until it is cancelled (or force-cancel it), then resume"
		waitThenReplay = "is cancelling; wait until it is cancelled (or force-cancel it), then replay"
		notStarted     = "has not started; there is nothing to replay"
	)
	tests := []struct {
		status projections.Status
		action string
		want   string
	}{
		{projections.StatusStarted, events.ActionResume, ""},
		{projections.StatusFailed, events.ActionResume, ""},
		{projections.StatusCancelled, events.ActionForceResume, ""},
		{projections.StatusSuspended, events.ActionResume, ""},
		{projections.StatusCancelling, events.ActionResume, waitThenResume},
		{projections.StatusCancelling, events.ActionForceResume, waitThenResume},
		{projections.StatusSucceeded, events.ActionResume,
			"has already succeeded; only started, failed, suspended and cancelled executions can be resumed"},

		{projections.StatusSucceeded, events.ActionReplay, ""},
		{projections.StatusFailed, events.ActionReplay, ""},
		{projections.StatusCancelled, events.ActionReplay, ""},
		{projections.StatusSuspended, events.ActionReplay, ""},
		{projections.StatusStarted, events.ActionReplay, ""},
		{projections.StatusCancelling, events.ActionReplay, waitThenReplay},
		{projections.StatusNone, events.ActionReplay, notStarted},
		{projections.StatusPending, events.ActionReplay, notStarted},

		{projections.StatusStarted, events.ActionCancel, ""},
		{projections.StatusSuspended, events.ActionCancel, ""},
		{projections.StatusCancelling, events.ActionCancel, "is already cancelling; use force-cancel not to wait for its running steps"},
		{projections.StatusSucceeded, events.ActionCancel, "has already succeeded; cancel applies to a started or cancelling execution"},
		{projections.StatusCancelling, events.ActionForceCancel, ""},
		{projections.StatusFailed, events.ActionForceCancel, "has already failed; force-cancel applies to a started or cancelling execution"},
		{projections.StatusStarted, events.ActionKill, ""},
		{projections.StatusCancelled, events.ActionKill, "has already cancelled; kill applies to a started or cancelling execution"},

		{projections.StatusStarted, events.ActionRepair, ""},
		{projections.StatusSucceeded, events.ActionRepair, ""},
		{projections.StatusCancelling, events.ActionRepair, ""},
		{projections.StatusNone, events.ActionRepair, "has no history to repair"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tc.status.ActionRefused(tc.action), "%s on %q", tc.action, tc.status)
	}
}

func TestCommandAction(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{
		started("a"),
		stepEvent(&events.ExecutionCancelling{ActionRecord: events.ActionRecord{Action: events.ActionCancel, Command: "cli#1"}}),
		stepEvent(&events.ExecutionCancelled{ActionRecord: events.ActionRecord{Action: events.ActionKill, Command: "cli#2"}}),
		// The dispatcher's own conclusion carries no command: not an operator's.
		stepEvent(&events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2"}),
	})
	require.NoError(t, err)
	require.Equal(t, []projections.ActionCommand{{Command: "cli#1", Action: events.ActionCancel}, {Command: "cli#2", Action: events.ActionKill}}, s.Actions)

	for key, want := range map[string]string{"cli#1": events.ActionCancel, "cli#2": events.ActionKill} {
		got, ok := s.CommandAction(key)
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	got, ok := s.CommandAction("cli#3")
	require.False(t, ok)
	require.Empty(t, got)
}

func TestOpStatusPredicates(t *testing.T) {
	t.Parallel()

	for st, want := range map[projections.OpStatus][3]bool{ // terminal, done, in flight
		projections.OpNone:        {false, false, false},
		projections.OpPending:     {false, false, false},
		projections.OpSending:     {false, false, true},
		projections.OpSent:        {false, false, true},
		projections.OpStarted:     {false, false, true},
		projections.OpWaiting:     {false, false, false},
		projections.OpRescheduled: {false, false, false},
		projections.OpSucceeded:   {true, true, false},
		projections.OpSkipped:     {true, true, false},
		projections.OpFailed:      {true, false, false},
	} {
		require.Equal(t, want[0], st.Terminal(), "terminal %q", st)
		require.Equal(t, want[1], st.Done(), "done %q", st)
		require.Equal(t, want[2], st.InFlight(), "in flight %q", st)
	}
	require.False(t, projections.StatusSuspended.Terminal(), "a suspended execution can be resumed")
	require.False(t, projections.StatusSuspended.Active(), "nothing runs while suspended")
}

// TestRerunListsNameKnownSteps: every list of a resume or a replay names
// step instances of the execution.
func TestRerunListsNameKnownSteps(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{
		started("a", "b"),
		stepEvent(&events.StepScheduled{StepID: "a", Attempt: 1}),
		stepEvent(&events.StepSending{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "q"}),
		stepEvent(&events.StepFailed{StepID: "a", Attempt: 1, Error: "boom"}),
		stepEvent(&events.ExecutionFailed{Error: "step a failed: boom"}),
	})
	require.NoError(t, err)

	tests := []struct {
		name string
		p    events.Payload
	}{
		{"ResumeReset", &events.ExecutionResumed{Token: "t2", Reset: []string{"a", "ghost"}}},
		{"ReplayResume", &events.ExecutionReplayed{Mode: events.ReplayModeResume, Token: "t2", Resume: []string{"ghost"}}},
		{"ReplayReopen", &events.ExecutionReplayed{Mode: events.ReplayModeResume, Token: "t2", Reopen: []string{"ghost"}}},
		{"ReplayReset", &events.ExecutionReplayed{Mode: events.ReplayModeReplay, Token: "t2", Reset: []string{"ghost"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			next, err := projections.Apply(s, stepEvent(tc.p))
			require.ErrorIs(t, err, projections.ErrUnknownStep)
			require.Contains(t, err.Error(), `"ghost"`)
			require.Equal(t, projections.StatusFailed, next.Status, "a refused event changes nothing")
			require.Equal(t, s.Token, next.Token)
		})
	}
}

func TestLockAtUnknownScope(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{started("a"), at(1, &events.LockRequested{Lock: "db", Path: "blk", Limit: 1})})
	require.NoError(t, err)
	_, ok := s.LockAt("")
	require.False(t, ok, "the workflow itself asked for no lock")
	l, ok := s.LockAt("blk")
	require.True(t, ok)
	require.Equal(t, projections.LockWaiting, l.Status)
	require.True(t, l.Status.Open())
}

// TestResultAfterEndIsANote: the final report of an attempt out at the
// end is noted on its step without a transition, once, only after the
// end and only for the current attempt in flight; the step's next
// transition (after a resume) clears the note.
func TestResultAfterEndIsANote(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	base := []events.Event{
		{Type: events.TypeExecutionStarted, Subject: "x1", Time: at, Data: &events.ExecutionStarted{Workflow: "wf", Version: 1,
			Steps: []events.StepRef{{ID: "op", Kind: "exec"}}, Token: "t"}},
		{Type: events.TypeStepDispatched, Subject: "x1", Time: at, Data: &events.StepDispatched{StepID: "op", Attempt: 1, TaskID: "x1.op.1"}},
	}
	late := events.Event{Type: events.TypeResultAfterEnd, Subject: "x1", Time: at.Add(time.Second), Data: &events.ResultAfterEnd{
		ResultType: events.TypeOperationFailed, TaskID: "x1.op.1", StepID: "op", Attempt: 1, Agent: "a1", Error: "terminated"}}

	_, err := projections.Fold(append(slices.Clone(base), late))
	require.Error(t, err, "illegal while the execution runs")

	cancelled := events.Event{Type: events.TypeExecutionCancelled, Subject: "x1", Time: at, Data: &events.ExecutionCancelled{
		ActionRecord: events.ActionRecord{Action: events.ActionKill}}}
	s, err := projections.Fold(append(slices.Clone(base), cancelled, late))
	require.NoError(t, err)
	require.Equal(t, projections.StatusCancelled, s.Status)
	require.Equal(t, projections.OpSending, s.Steps[0].Status)
	require.Equal(t, &projections.AfterEnd{Outcome: projections.OpFailed, Error: "terminated", Agent: "a1", At: at.Add(time.Second)}, s.Steps[0].AfterEnd)

	_, err = projections.Fold(append(slices.Clone(base), cancelled, late, late))
	require.Error(t, err, "once")
	other := late
	other.Data = &events.ResultAfterEnd{ResultType: events.TypeOperationFailed, StepID: "op", Attempt: 2}
	_, err = projections.Fold(append(slices.Clone(base), cancelled, other))
	require.Error(t, err, "not another attempt")

	resumed := events.Event{Type: events.TypeExecutionResumed, Subject: "x1", Time: at, Data: &events.ExecutionResumed{
		ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2", Reset: []string{"op"}}}
	s, err = projections.Fold(append(slices.Clone(base), cancelled, late, resumed))
	require.NoError(t, err)
	require.Nil(t, s.Steps[0].AfterEnd, "the resume runs the step again: the note is gone")
}
