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

// reportOf hands the interpreter agent a1's report about a delivery of
// the last task, made by mk from the task's reference as agents do.
func (m *memShell) reportOf(delivery int, mk func(events.TaskRef) events.Payload) Decision {
	m.t.Helper()
	require.NotEmpty(m.t, m.tasks)
	ref := m.tasks[len(m.tasks)-1].Ref("a1", delivery)
	p := mk(ref)
	ev := events.Event{ID: fmt.Sprintf("r%d-%d", len(m.evs), delivery), Type: p.EventType(), Data: p}
	return Result(m.input(), ref, ev)
}

func opStarted(ref events.TaskRef) events.Payload { return &events.OperationStarted{TaskRef: ref} }

func opSucceeded(at time.Time) func(events.TaskRef) events.Payload {
	return func(ref events.TaskRef) events.Payload {
		return &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`1`), StartedAt: at}
	}
}

// TestAStartCarriedByTheResultIsOneEvent: an agent that reports a short
// operation's start only with its result has the step's success record
// both, in one event; the fold then shows when the step started, on which
// agent and delivery, as a step.started would. A start report that comes
// after the result records nothing.
func TestAStartCarriedByTheResultIsOneEvent(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	began := decideT0.Add(3 * time.Millisecond)
	d := m.reportOf(1, opSucceeded(began))
	require.Len(t, d.Events, 1)
	ok := stepSucceeded(d.Events[0])
	isOK := ok != nil
	require.True(t, isOK, "%T", d.Events[0])
	require.Equal(t, events.OperationStart{StartedAt: began, Delivery: 1}, ok.OperationStart)
	m.now = began.Add(time.Millisecond)
	m.carry(d)
	st := m.state.Steps[m.state.StepIndex("op")]
	require.Equal(t, projections.OpSucceeded, st.Status)
	require.True(t, began.Equal(st.StartedAt), "started at %s", st.StartedAt)
	require.Equal(t, "a1", st.Agent)
	require.Equal(t, 1, st.Delivery)
	require.Equal(t, []string{"execution.started", "step.dispatched", "execution.succeeded"}, m.types(), "the end carries the success")

	late := m.reportOf(1, opStarted)
	require.True(t, late.Empty(), "a start report after the result records nothing: %+v", late)
	require.Empty(t, late.Stale)
}

// TestARecordedStartIsNotRecordedAgain: a start recorded by step.started
// (the operation ran past the agent's grace, or an older agent reported
// it) is not carried by the result of the same delivery; a later
// delivery's result carries its own start; an older agent's result
// carries none.
func TestARecordedStartIsNotRecordedAgain(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "a", Kind: workflow.KindExec, Command: "x"},
		{ID: "b", Kind: workflow.KindExec, Command: "x"},
		{ID: "c", Kind: workflow.KindExec, Command: "x"},
	}}
	m := newMemShell(t, def, `{}`)
	began := decideT0.Add(time.Millisecond)

	m.advance() // a: started, then its result from the same delivery
	m.carry(m.reportOf(1, opStarted))
	d := m.reportOf(1, func(ref events.TaskRef) events.Payload {
		return &events.OperationFailed{TaskRef: ref, Error: "boom", StartedAt: began}
	})
	require.Len(t, d.Events, 1)
	failed, isFailed := d.Events[0].(*events.StepFailed)
	require.True(t, isFailed, "%T", d.Events[0])
	require.Zero(t, failed.OperationStart, "recorded by step.started already")

	m2 := newMemShell(t, def, `{}`) // b: started in delivery 1, ran again in delivery 2
	m2.advance()
	m2.carry(m2.reportOf(1, opStarted))
	d = m2.reportOf(2, opSucceeded(began))
	require.Len(t, d.Events, 1)
	succeeded := stepSucceeded(d.Events[0])
	isOK := succeeded != nil
	require.True(t, isOK, "%T", d.Events[0])
	require.Equal(t, events.OperationStart{StartedAt: began, Delivery: 2}, succeeded.OperationStart)

	m3 := newMemShell(t, def, `{}`) // an older agent: no start in its result
	m3.advance()
	d = m3.reportOf(1, opSucceeded(time.Time{}))
	require.Len(t, d.Events, 1)
	succeeded = stepSucceeded(d.Events[0])
	isOK = succeeded != nil
	require.True(t, isOK, "%T", d.Events[0])
	require.Zero(t, succeeded.OperationStart)
}

// TestAnOutputTooLargeKeepsTheStart: the failure that replaces a success
// too large to record still records who ran the operation and when.
func TestAnOutputTooLargeKeepsTheStart(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "big", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	in := m.input()
	in.MaxEvent = 10
	began := decideT0.Add(time.Millisecond)
	ref := m.tasks[0].Ref("a1", 1)
	d := Result(in, ref, events.Event{ID: "r1", Type: events.TypeOperationSucceeded,
		Data: &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`"0123456789abcdef"`), StartedAt: began}})
	require.Len(t, d.Events, 1)
	failed, isFailed := d.Events[0].(*events.StepFailed)
	require.True(t, isFailed, "%T", d.Events[0])
	require.Equal(t, "a1", failed.Agent)
	require.Equal(t, events.OperationStart{StartedAt: began, Delivery: 1}, failed.OperationStart)
}
