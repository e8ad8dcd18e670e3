package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestClearedHolderAsksAgainWhenItNextNeedsTheLock: a holder cleared while
// its operation runs does not ask for the lock again at once (the waiters,
// or whoever cleared it, get it first); it asks when its next step inside
// the lock is to run, and that step waits until it holds the lock again.
// The same for a workflow's lock and a workflow step's.
func TestClearedHolderAsksAgainWhenItNextNeedsTheLock(t *testing.T) {
	t.Parallel()
	ops := []workflow.Step{
		{ID: "one", Kind: workflow.KindExec, Command: "x"},
		{ID: "two", Kind: workflow.KindExec, Command: "x"},
	}
	for name, c := range map[string]struct {
		def   workflow.Definition
		scope string // the cleared scope's path
		next  string // the step that runs after one
	}{
		"Workflow": {def: workflow.Definition{Name: "wf", Lock: "l", Steps: ops}, next: "two"},
		"Step": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "blk", Kind: workflow.KindWorkflow, Lock: "l", Steps: ops}}}, scope: "blk", next: "blk/two"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := newMemShell(t, c.def, `{}`)
			m.advance() // asks, holds (no contention in memory), sends one
			require.Len(t, m.tasks, 1)
			l, ok := m.state.LockAt(c.scope)
			require.True(t, ok)
			require.Equal(t, projections.LockHeld, l.Status)

			rec := events.ActionRecord{Action: "clear", RequestedBy: "ops", Command: "c1"}
			m.carry(Clear(m.input(), ClearCommand{Lock: "l", Path: c.scope, Request: l.Requests, Record: rec}))
			m.advance()
			l, _ = m.state.LockAt(c.scope)
			require.Equal(t, projections.LockCleared, l.Status, "not asked again while one runs: %v", m.types())
			require.Equal(t, 1, l.Requests)

			m.carry(m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}))
			d := Next(m.input())
			require.Len(t, d.Events, 1, "the next step asks for the lock first, and nothing else")
			req, ok := d.Events[0].(*events.LockRequested)
			require.True(t, ok, "%T", d.Events[0])
			require.Equal(t, c.scope, req.Path)
			m.carry(d)
			m.advance()
			l, _ = m.state.LockAt(c.scope)
			require.Equal(t, projections.LockHeld, l.Status)
			require.Equal(t, 2, l.Requests)
			require.Len(t, m.tasks, 2)
			require.Equal(t, c.next, m.tasks[1].StepID, "two runs once the lock is held again")
		})
	}
}

// TestClearedHolderFinishesItsWait: a wait under way when its holder was
// cleared takes its signal without the lock; the step after it asks for
// the lock first.
func TestClearedHolderFinishesItsWait(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{
		{ID: "w", Kind: workflow.KindWait, Signal: "go"},
		{ID: "op", Kind: workflow.KindExec, Command: "x"},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	l, _ := m.state.LockAt("")
	require.Equal(t, projections.LockHeld, l.Status)
	m.carry(Clear(m.input(), ClearCommand{Lock: "l", Request: l.Requests, Record: events.ActionRecord{Action: "clear", Command: "c1"}}))
	m.advance()
	m.carry(Signal(m.input(), SignalCommand{ID: "s1", Name: "go", SentAt: m.now}))
	d := Next(m.input())
	require.Len(t, d.Events, 1)
	_, took := d.Events[0].(*events.StepSucceeded)
	require.True(t, took, "the wait takes its signal without asking for the lock: %T", d.Events[0])
	m.carry(d)
	d = Next(m.input())
	require.Len(t, d.Events, 1)
	_, asks := d.Events[0].(*events.LockRequested)
	require.True(t, asks, "the operation after it asks for the lock first: %T", d.Events[0])
}
