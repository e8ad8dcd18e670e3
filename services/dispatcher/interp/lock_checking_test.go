package interp

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestLockTimeoutLeavesTheQueueAndFailsTheStep: a workflow step whose lock
// is not acquired within its lock_timeout leaves the queue (lock.released,
// saying why) and fails, so that its on-error steps decide: here a retry
// asks again (a new request, with its own time), and once the lock is
// free the step runs.
func TestLockTimeoutLeavesTheQueueAndFailsTheStep(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "crit", Kind: workflow.KindWorkflow, Lock: "db", LockTimeout: "1m",
			Steps: []workflow.Step{{ID: "work", Kind: workflow.KindExec, Command: "x"}},
			OnError: []workflow.Step{{ID: "again", Kind: workflow.KindRetry,
				Retry: &workflow.Retry{Limit: 2, Backoff: &workflow.Backoff{Initial: "1s"}}}}},
	}}
	m := newMemShell(t, def, `{}`)
	m.busy = map[string]bool{"db": true}
	m.advance()
	l, ok := m.state.LockAt("crit")
	require.True(t, ok)
	require.Equal(t, projections.LockWaiting, l.Status)
	first := timerID("x1", events.TimerLockTimeout, "crit", 1)
	require.Equal(t, l.RequestedAt.Add(time.Minute), m.timers[first], "armed from the request")

	m.fire()
	m.advance()
	l, _ = m.state.LockAt("crit")
	require.Equal(t, projections.LockReleased, l.Status, "it left the queue; history: %v", m.types())
	require.Equal(t, "not acquired within 1m (lock_timeout)", l.Reason)
	crit := m.state.Steps[m.state.StepIndex("crit")]
	require.Equal(t, projections.OpRescheduled, crit.Status, "failed, and its on-error retries it")
	require.Contains(t, m.types(), "step.failed")
	failed := m.evs[indexOfType(m.evs, events.TypeStepFailed)].Data.(*events.StepFailed)
	require.Equal(t, "lock db was not acquired within 1m (lock_timeout)", failed.Error)
	require.Empty(t, m.tasks, "nothing ran without the lock")

	m.fire() // the retry's backoff
	m.advance()
	l, _ = m.state.LockAt("crit")
	require.Equal(t, projections.LockWaiting, l.Status, "attempt 2 asks again; history: %v", m.types())
	require.Equal(t, 2, l.Requests)
	require.Contains(t, m.timers, timerID("x1", events.TimerLockTimeout, "crit", 2), "the new request gets its time")

	m.busy = nil // the holder is gone: the re-enqueue finds it a holder
	m.carry(Waiting(m.input()))
	m.advance()
	require.Len(t, m.tasks, 1, "the step runs once it holds the lock; history: %v", m.types())
	require.Equal(t, "crit@2/work", m.tasks[0].StepID)
}

// TestClearLockStepClearsTheOtherHolders: a clear-lock step records with
// its schedule the holders it clears (the lock's holders then, but its
// own execution's), hands that clear to the dispatchers before it
// succeeds (the same command id after a crash), and gives them as its
// output. With nobody to clear it publishes nothing; in a dry run it is
// skipped.
func TestClearLockStepClearsTheOtherHolders(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "clr", Kind: workflow.KindClearLock, Lock: "db-${input.n}", Reason: "held for ${input.n} minutes"},
	}}
	m := newMemShell(t, def, `{"n":1}`)
	m.holders = map[string][]events.LockEntry{"db-1": {
		{ExecutionID: "x9", Workflow: "other", Request: 3},
		{ExecutionID: "x1", Workflow: "wf", Path: "blk", Request: 1},
	}}
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Len(t, m.clears, 1)
	c := m.clears[0]
	require.Equal(t, clearID("x1", "clr", 1), c.ID)
	require.Equal(t, events.ClearLock{Lock: "db-1", Entries: []events.LockEntry{{ExecutionID: "x9", Workflow: "other", Request: 3}},
		Reason: "held for 1 minutes", RequestedBy: "execution x1 (workflow wf), step clr"}, c.Clear)
	st := m.state.Steps[m.state.StepIndex("clr")]
	require.JSONEq(t, `{"lock":"db-1","cleared":[{"execution_id":"x9","path":""}]}`, string(st.Output))
	require.Equal(t, indexOfType(m.evs, events.TypeStepSucceeded), c.after, "published before the step's success is recorded")
	var rec clearInput
	require.NoError(t, json.Unmarshal(st.Input, &rec))
	require.Len(t, rec.Entries, 1, "whom it clears is recorded with its schedule")

	nobody := newMemShell(t, def, `{"n":2}`)
	nobody.advance()
	require.Equal(t, projections.StatusSucceeded, nobody.state.Status)
	require.Empty(t, nobody.clears)
	require.JSONEq(t, `{"lock":"db-2","cleared":[]}`, string(nobody.state.Steps[0].Output))

	dry := newMemShell(t, def, `{"n":1}`)
	dry.holders = m.holders
	dry.state.DryRun = true
	dry.advance()
	require.Empty(t, dry.clears, "a dry run clears nothing")
	require.Equal(t, projections.OpSkipped, dry.state.Steps[0].Status)
}

// TestClearLockStepBadName: a lock name that renders badly fails the step
// with the reason, before anything is read or published.
func TestClearLockStepBadName(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "clr", Kind: workflow.KindClearLock, Lock: "db ${input.n}"},
	}}
	m := newMemShell(t, def, `{"n":1}`)
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Contains(t, m.state.Error, `lock: "db 1" is not a lock name`)
	require.Empty(t, m.clears)
}

func indexOfType(evs []events.Event, t events.Type) int {
	for i, ev := range evs {
		if ev.Type == t {
			return i
		}
	}
	return -1
}

// TestResumedLockTimeoutStepAsksAgain: a step failed by its lock_timeout
// asks for the lock again when the execution is resumed (it is not
// failed again at once), and so does a step that got its lock, saw its
// lock_timeout timer fire while it held it, and then failed otherwise.
func TestResumedLockTimeoutStepAsksAgain(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "crit", Kind: workflow.KindWorkflow, Lock: "db", LockTimeout: "1m",
			Steps: []workflow.Step{{ID: "work", Kind: workflow.KindExec, Command: "x"}}},
	}}
	resume := func(m *memShell, key string) {
		m.carry(m.act(ActionCommand{Key: key, Record: events.ActionRecord{Action: events.ActionResume, Command: key}}))
		m.advance()
	}
	t.Run("TimedOut", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.busy = map[string]bool{"db": true}
		m.advance()
		m.fire()
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
		require.Contains(t, m.state.Error, "lock db was not acquired within 1m (lock_timeout)")
		m.busy = nil
		resume(m, "r1")
		require.Equal(t, projections.StatusStarted, m.state.Status, "history: %v", m.types())
		require.Len(t, m.tasks, 1, "it asked again, got the lock and runs; history: %v", m.types())
	})
	t.Run("TimerFiredWhileHeld", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, def, `{}`)
		m.busy = map[string]bool{"db": true}
		m.advance()
		m.busy = nil
		m.carry(Waiting(m.input()))
		m.advance()
		require.Len(t, m.tasks, 1, "history: %v", m.types())
		m.fire() // the lock timer, due while it holds the lock: nothing
		m.advance()
		m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
		require.Contains(t, m.state.Error, "exit status 1")
		resume(m, "r2")
		require.Equal(t, projections.StatusStarted, m.state.Status, "history: %v", m.types())
		require.Len(t, m.tasks, 2, "it asked again and runs its step again; history: %v", m.types())
	})
}

// TestClearRequestedByFitsACommand: a clear-lock step deep in long names
// still names itself within the bound a clear command's requested_by has
// (the dispatcher would refuse a longer one, and the clear would be lost).
func TestClearRequestedByFitsACommand(t *testing.T) {
	t.Parallel()
	id := strings.Repeat("x", 128)
	wf := strings.Repeat("w", 64)
	path := strings.Repeat("blk-with-a-long-name/", 6) + "clear"
	by := stepRequestedBy(id, wf, path)
	require.LessOrEqual(t, len(by), events.MaxRequestedBy)
	require.True(t, strings.HasPrefix(by, "execution "+id+" (workflow "+wf+"), step blk-with"), by)
	require.True(t, strings.HasSuffix(by, "/clear"), by)
	require.Contains(t, by, "...")
	require.Equal(t, "execution x1 (workflow wf), step a/clear", stepRequestedBy("x1", "wf", "a/clear"))
}
