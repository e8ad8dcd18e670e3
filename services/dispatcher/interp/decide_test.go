package interp

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

var decideT0 = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

// decideDef has three steps of different kinds and queues.
var decideDef = workflow.Definition{Name: "deploy", Steps: []workflow.Step{
	{ID: "build", Kind: workflow.KindExec, Command: "make", Queue: "builders"},
	{ID: "announce", Kind: workflow.KindLog, Message: "built"},
	{ID: "done", Kind: workflow.KindNoop},
}}

func decideStep(t *testing.T, id string) workflow.Step {
	t.Helper()
	s, ok := decideDef.Step(id)
	require.True(t, ok, "step %s", id)
	return s
}

// newEvents wraps ps in real events of execution x1, one second and one
// stream sequence apart.
func newEvents(ps ...events.Payload) []events.Event {
	evs := make([]events.Event, len(ps))
	for i, p := range ps {
		evs[i] = events.New("test", "x1", "deploy", decideT0.Add(time.Duration(i)*time.Second), p)
		evs[i].Seq = uint64(i + 1)
	}
	return evs
}

func fold(t *testing.T, evs []events.Event) projections.Execution {
	t.Helper()
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	return s
}

// foldPayloads folds real events carrying ps into an execution state.
func foldPayloads(t *testing.T, ps ...events.Payload) projections.Execution {
	t.Helper()
	return fold(t, newEvents(ps...))
}

func started(steps ...events.StepRef) events.Payload {
	if steps == nil {
		steps = decideDef.StepRefs()
	}
	return &events.ExecutionStarted{Workflow: "deploy", Version: 1, Input: []byte(`{}`), Steps: steps, Token: "tok"}
}

// through returns the events that take step id at attempt 1 to status to.
func through(id string, to projections.OpStatus) []events.Payload {
	taskID := events.TaskID("x1", id, 1)
	all := []events.Payload{
		&events.StepScheduled{StepID: id, Attempt: 1},
		&events.StepSending{StepID: id, Attempt: 1, TaskID: taskID, Queue: "default"},
		&events.StepSent{StepID: id, Attempt: 1, TaskID: taskID, TaskSeq: 7},
		&events.StepStarted{StepID: id, Attempt: 1, Agent: "a1"},
	}
	switch to {
	case projections.OpPending:
		return all[:1]
	case projections.OpSending:
		return all[:2]
	case projections.OpSent:
		return all[:3]
	case projections.OpStarted:
		return all
	case projections.OpSucceeded:
		return append(all, &events.StepSucceeded{StepID: id, Attempt: 1, Output: []byte(`{"ok":true}`)})
	case projections.OpFailed:
		return append(all, &events.StepFailed{StepID: id, Attempt: 1, Error: "exit status 2"})
	}
	return nil
}

func concat(groups ...[]events.Payload) []events.Payload {
	return slices.Concat(groups...)
}

type decideCase struct {
	name string
	ps   []events.Payload
	want func(t *testing.T) action
}

func decideCases() []decideCase {
	wait := func(*testing.T) action { return action{kind: actWait} }
	return []decideCase{
		{name: "NotStarted", ps: nil, want: wait},
		{name: "Succeeded", ps: concat(
			[]events.Payload{started()},
			through("build", projections.OpSucceeded), through("announce", projections.OpSucceeded),
			through("done", projections.OpSucceeded), []events.Payload{&events.ExecutionSucceeded{}},
		), want: wait},
		{name: "Failed", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpFailed),
			[]events.Payload{&events.ExecutionFailed{Error: "step build failed: exit status 2", StepID: "build"}},
		), want: wait},
		{name: "FailedWhilePending", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpPending),
			[]events.Payload{&events.ExecutionFailed{Error: "cancelled"}},
		), want: wait},
		{name: "FirstStepNone", ps: []events.Payload{started()}, want: func(t *testing.T) action {
			return action{kind: actSchedule, step: decideStep(t, "build"), attempt: 1}
		}},
		{name: "Pending", ps: concat([]events.Payload{started()}, through("build", projections.OpPending)),
			want: func(t *testing.T) action { return action{kind: actSend, step: decideStep(t, "build"), attempt: 1} }},
		{name: "Sending", ps: concat([]events.Payload{started()}, through("build", projections.OpSending)),
			want: func(t *testing.T) action { return action{kind: actResend, step: decideStep(t, "build"), attempt: 1} }},
		{name: "Sent", ps: concat([]events.Payload{started()}, through("build", projections.OpSent)), want: wait},
		{name: "Started", ps: concat([]events.Payload{started()}, through("build", projections.OpStarted)), want: wait},
		{name: "SucceededPrefixSchedulesNext", ps: concat([]events.Payload{started()}, through("build", projections.OpSucceeded)),
			want: func(t *testing.T) action {
				return action{kind: actSchedule, step: decideStep(t, "announce"), attempt: 1}
			}},
		{name: "SucceededPrefixSendsNext", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSucceeded), through("announce", projections.OpPending)),
			want: func(t *testing.T) action { return action{kind: actSend, step: decideStep(t, "announce"), attempt: 1} }},
		{name: "SucceededPrefixWaitsForLast", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSucceeded),
			through("announce", projections.OpSucceeded), through("done", projections.OpStarted)),
			want: wait},
		{name: "FailedFirstStep", ps: concat([]events.Payload{started()}, through("build", projections.OpFailed)),
			want: func(t *testing.T) action {
				return action{kind: actFail, step: decideStep(t, "build"), err: "step build failed: exit status 2"}
			}},
		{name: "FailedAfterSucceededPrefix", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSucceeded), through("announce", projections.OpFailed)),
			want: func(t *testing.T) action {
				return action{kind: actFail, step: decideStep(t, "announce"), err: "step announce failed: exit status 2"}
			}},
		{name: "AllSucceeded", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSucceeded),
			through("announce", projections.OpSucceeded), through("done", projections.OpSucceeded)),
			want: func(*testing.T) action { return action{kind: actSucceed} }},
		{name: "StepMissingFromDefinition", ps: []events.Payload{started(
			events.StepRef{ID: "build", Kind: workflow.KindExec}, events.StepRef{ID: "ghost", Kind: workflow.KindNoop})},
			want: func(t *testing.T) action {
				return action{kind: actSchedule, step: decideStep(t, "build"), attempt: 1}
			}},
		// The definition drives: a step the history knows but the pinned
		// definition does not is ignored (TaskFlow: a removed id's result
		// is ignored), and the definition's steps run.
		{name: "StepMissingFromDefinitionReached", ps: concat([]events.Payload{started(
			events.StepRef{ID: "build", Kind: workflow.KindExec}, events.StepRef{ID: "ghost", Kind: workflow.KindNoop})},
			through("build", projections.OpSucceeded)),
			want: func(t *testing.T) action {
				return action{kind: actSchedule, step: decideStep(t, "announce"), attempt: 1}
			}},
		{name: "FirstStepMissingFromDefinition", ps: []events.Payload{started(events.StepRef{ID: "ghost", Kind: workflow.KindNoop})},
			want: func(t *testing.T) action {
				return action{kind: actSchedule, step: decideStep(t, "build"), attempt: 1}
			}},
		{name: "CancellingWaitsForRunningStep", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpStarted), []events.Payload{cancelRequest()}),
			want: wait},
		{name: "CancellingWaitsForSentStep", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSent), []events.Payload{cancelRequest()}),
			want: wait},
		{name: "CancellingStartsNothing", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSucceeded), []events.Payload{cancelRequest()}),
			want: func(*testing.T) action { return action{kind: actCancelled} }},
		{name: "CancellingDoesNotRetry", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpFailed), []events.Payload{cancelRequest()}),
			want: func(*testing.T) action { return action{kind: actCancelled} }},
		{name: "CancellingSkipsATimedOutAttempt", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpStarted), []events.Payload{
				&events.TimerArmed{TimerID: timerID("x1", events.TimerStepTimeout, "build", 1), Purpose: events.TimerStepTimeout, StepID: "build", Attempt: 1, Due: time.Unix(1, 0)},
				&events.TimerFired{TimerID: timerID("x1", events.TimerStepTimeout, "build", 1)}, cancelRequest()}),
			want: func(t *testing.T) action {
				return action{kind: actStepFail, step: decideStep(t, "build"), attempt: 1, err: "attempt 1 timed out after ", terminate: true}
			}},
		{name: "CancellingSendsAHalfSentTask", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpSending), []events.Payload{cancelRequest()}),
			want: func(t *testing.T) action { return action{kind: actResend, step: decideStep(t, "build"), attempt: 1} }},
		{name: "CancellingEndsOnWorkflowTimeout", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpStarted), []events.Payload{
				&events.TimerArmed{TimerID: timerID("x1", events.TimerWorkflowTimeout, "", 0), Purpose: events.TimerWorkflowTimeout, Due: time.Unix(1, 0)},
				&events.TimerFired{TimerID: timerID("x1", events.TimerWorkflowTimeout, "", 0)}, cancelRequest()}),
			want: func(*testing.T) action { return action{kind: actCancelled} }},
		{name: "Cancelled", ps: concat(
			[]events.Payload{started()}, through("build", projections.OpStarted),
			[]events.Payload{&events.ExecutionCancelled{ActionRecord: events.ActionRecord{Action: events.ActionForceCancel}}}),
			want: wait},
		{name: "NoStepsInHistory", ps: []events.Payload{started([]events.StepRef{}...)},
			want: func(t *testing.T) action {
				return action{kind: actSchedule, step: decideStep(t, "build"), attempt: 1}
			}},
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()

	for _, tc := range decideCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			s := foldPayloads(t, tc.ps...)
			got := decide(decideDef, s)
			if got.path == got.step.ID { // top-level steps: the path is the id
				got.path = ""
			}
			if got.kind == actSchedule && workflow.IsOperation(got.step.Kind) {
				// The operation's rendered input is recorded with the schedule.
				var spec workflow.Step
				require.NoError(t, json.Unmarshal(got.input, &spec))
				require.Equal(t, got.step.ID, spec.ID)
				got.input = nil
			}
			require.Equal(t, tc.want(t), got)
		})
	}
}

func TestDecideFailureNamesStepAndError(t *testing.T) {
	t.Parallel()

	s := foldPayloads(t, concat([]events.Payload{started()}, through("build", projections.OpSucceeded),
		through("announce", projections.OpFailed))...)
	a := decide(decideDef, s)
	require.Equal(t, actFail, a.kind)
	require.Equal(t, "announce", a.step.ID)
	require.Contains(t, a.err, "announce")
	require.Contains(t, a.err, "exit status 2")
}

func TestDecideScheduleUsesNextAttempt(t *testing.T) {
	t.Parallel()

	// A state whose step was reset to none after attempts (not produced by
	// today's fold, but decide must not reuse an attempt number).
	s := foldPayloads(t, started())
	s.Steps[0].Attempt = 2
	a := decide(decideDef, s)
	require.Equal(t, actSchedule, a.kind)
	require.Equal(t, 3, a.attempt)
}

func TestDecideIsDeterministic(t *testing.T) {
	t.Parallel()

	for _, tc := range decideCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			evs := newEvents(tc.ps...)
			s, before := fold(t, evs), fold(t, evs)
			require.Equal(t, before, s, "folding the same events twice gives the same state")
			first := decide(decideDef, s)
			for range 20 {
				require.Equal(t, first, decide(decideDef, s))
			}
			require.Equal(t, before, s, "decide does not modify the state")
			// A state folded separately from equal events decides the same.
			require.Equal(t, first, decide(decideDef, before))
		})
	}
}

func cancelRequest() events.Payload {
	return &events.ExecutionCancelling{ActionRecord: events.ActionRecord{Action: events.ActionCancel, Command: "ops#1"}}
}
