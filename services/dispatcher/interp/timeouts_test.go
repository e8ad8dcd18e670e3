package interp

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestDecideArmsMissingTimeouts: a workflow timeout and an attempt's
// timeout that are due to exist but are not recorded (the dispatcher died
// between two appends) are armed by the next decision.
func TestDecideArmsMissingTimeouts(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Timeout: "1m", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x", Timeout: "10s"}}}
	b, _ := json.Marshal(def)
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	evs := []events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: at, Data: &events.ExecutionStarted{Workflow: "wf", Version: 1,
			Steps: []events.StepRef{{ID: "op", Kind: workflow.KindExec}}, Definition: b, Token: "t"}},
	}
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	a := decide(def, s)
	require.Equal(t, actArmTimer, a.kind)
	require.Equal(t, events.TimerWorkflowTimeout, a.purpose)
	require.Equal(t, at.Add(time.Minute), a.until)

	id := timerID("x1", events.TimerWorkflowTimeout, "", 0)
	evs = append(evs,
		events.Event{ID: "2", Subject: "x1", Type: events.TypeTimerArmed, Time: at, Data: &events.TimerArmed{TimerID: id, Purpose: events.TimerWorkflowTimeout, Due: at.Add(time.Minute)}},
		events.Event{ID: "3", Subject: "x1", Type: events.TypeStepScheduled, Time: at, Data: &events.StepScheduled{StepID: "op", Attempt: 1}},
		events.Event{ID: "4", Subject: "x1", Type: events.TypeStepSending, Time: at, Data: &events.StepSending{StepID: "op", Attempt: 1, TaskID: "x1.op.1"}},
		events.Event{ID: "5", Subject: "x1", Type: events.TypeStepSent, Time: at, Data: &events.StepSent{StepID: "op", Attempt: 1, TaskID: "x1.op.1"}},
	)
	s, err = projections.Fold(evs)
	require.NoError(t, err)
	a = decide(def, s)
	require.Equal(t, actArmTimer, a.kind)
	require.Equal(t, events.TimerStepTimeout, a.purpose)
	require.Equal(t, "op", a.path)
	require.Equal(t, 1, a.attempt)
}

// TestAttemptTimeoutCountsFromSent: an attempt's timeout counts from the
// moment its task is stored (step.sent), as documented, not from when the
// step was scheduled. Found by the chaos suite: a stream leader killed
// while the dispatcher appended step.sending held the task back 10 s, and
// an http step with a 10 s timeout failed 2.4 s after its task was sent.
func TestAttemptTimeoutCountsFromSent(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindHTTP, URL: "http://x", Timeout: "10s"}}}
	b, _ := json.Marshal(def)
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	sent := at.Add(8 * time.Second)
	evs := []events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: at, Data: &events.ExecutionStarted{Workflow: "wf", Version: 1,
			Steps: []events.StepRef{{ID: "op", Kind: workflow.KindHTTP}}, Definition: b, Token: "t"}},
		{ID: "2", Subject: "x1", Type: events.TypeStepScheduled, Time: at, Data: &events.StepScheduled{StepID: "op", Attempt: 1}},
		{ID: "3", Subject: "x1", Type: events.TypeStepSending, Time: at, Data: &events.StepSending{StepID: "op", Attempt: 1, TaskID: "x1.op.1"}},
		{ID: "4", Subject: "x1", Type: events.TypeStepSent, Time: sent, Data: &events.StepSent{StepID: "op", Attempt: 1, TaskID: "x1.op.1"}},
	}
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, sent, s.Steps[0].SentAt)
	a := decide(def, s)
	require.Equal(t, actArmTimer, a.kind)
	require.Equal(t, events.TimerStepTimeout, a.purpose)
	require.Equal(t, sent.Add(10*time.Second), a.until)
}
