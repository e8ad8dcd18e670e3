package dispatch_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// lockStatus waits until the scope's lock has status want in the history.
func lockStatus(t *testing.T, js jetstream.JetStream, wf, id, path string, want projections.LockStatus) projections.Execution {
	t.Helper()
	var s projections.Execution
	waitHistory(t, js, wf, id, "lock of scope "+path+" "+string(want), func(evs []events.Event) bool {
		var err error
		s, err = projections.Fold(evs)
		require.NoError(t, err)
		l, ok := s.LockAt(path)
		return ok && l.Status == want
	})
	return s
}

// lockRecord reads a lock's bucket entry.
func lockRecord(t *testing.T, js jetstream.JetStream, name string) (lock.Record, bool) {
	t.Helper()
	tb, err := lock.Open(t.Context(), js, nil)
	require.NoError(t, err)
	r, _, found, err := tb.Get(t.Context(), name)
	require.NoError(t, err)
	return r, found
}

// finishTask reports the task started and succeeded.
func (b *testBundle) finishTask(t *testing.T, task fetchedTask) {
	t.Helper()
	b.report(t, &events.OperationStarted{TaskRef: task.task.Ref("test-agent", 1)})
	b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
}

// TestLockWaitersInOrder: three executions of a workflow with a lock; the
// first runs, the others wait (running no step) and acquire one after the
// other, in the order they asked.
func TestLockWaitersInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, "name: m\nlock: db-${input.who}\nsteps:\n  - id: work\n    kind: noop\n")
	b.start(t, "m", "m1")
	first := b.nextTask(t)
	require.Equal(t, "m1", first.task.ExecutionID)
	for _, id := range []string{"m2", "m3"} {
		b.start(t, "m", id)
		s := lockStatus(t, b.js, "m", id, "", projections.LockWaiting)
		require.Equal(t, projections.OpNone, s.Steps[0].Status, "a waiter runs no step")
		require.Equal(t, "db-test", s.Locks[0].Name, "the lock's name is rendered from the input")
	}
	r := eventuallyWaiters(t, b.js, "db-test", "m2", "m3")
	require.Equal(t, []string{"m1"}, execIDs(r.Holders))

	b.finishTask(t, first)
	_, evs := waitStatus(t, b.js, "m", "m1", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)
	require.Equal(t, []events.Type{events.TypeExecutionStarted, events.TypeLockRequested, events.TypeLockAcquired,
		events.TypeStepDispatched, events.TypeStepStarted, events.TypeStepSucceeded,
		events.TypeLockReleased, events.TypeExecutionSucceeded}, typesOf(evs), "the lock is released before the execution ends")

	second := b.nextTask(t)
	require.Equal(t, "m2", second.task.ExecutionID, "the first waiter goes next")
	s := lockStatus(t, b.js, "m", "m3", "", projections.LockWaiting)
	require.Equal(t, projections.OpNone, s.Steps[0].Status)
	b.finishTask(t, second)
	third := b.nextTask(t)
	require.Equal(t, "m3", third.task.ExecutionID)
	b.finishTask(t, third)
	waitStatus(t, b.js, "m", "m3", projections.StatusSucceeded)
	eventuallyFree(t, b.js, "db-test")
}

func eventuallyFree(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	tb, err := lock.Open(t.Context(), js, nil)
	require.NoError(t, err)
	natstest.Eventually(t, waitFor, func() bool {
		_, _, found, err := tb.Get(t.Context(), name)
		return err == nil && !found
	}, "lock %s is still listed", name)
}

// eventuallyWaiters waits until the lock's entry lists exactly these
// waiters: the entry is written as an effect of the decision, a moment
// after the event the read models show.
func eventuallyWaiters(t *testing.T, js jetstream.JetStream, name string, want ...string) lock.Record {
	t.Helper()
	tb, err := lock.Open(t.Context(), js, nil)
	require.NoError(t, err)
	var r lock.Record
	natstest.Eventually(t, waitFor, func() bool {
		rec, _, found, err := tb.Get(t.Context(), name)
		r = rec
		return err == nil && found && slices.Equal(execIDs(rec.Waiters), want)
	}, "lock %s's waiters are %v", name, want)
	return r
}

func execIDs(es []lock.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ExecutionID
	}
	return out
}

// TestSemaphore: with semaphore 2, two executions run at once and the third waits.
func TestSemaphore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, "name: pool\nlock: pool\nsemaphore: 2\nsteps:\n  - id: work\n    kind: noop\n")
	for _, id := range []string{"p1", "p2", "p3"} {
		b.start(t, "pool", id)
		lockStatus(t, b.js, "pool", id, "", map[bool]projections.LockStatus{true: projections.LockHeld, false: projections.LockWaiting}[id != "p3"])
	}
	a, c := b.nextTask(t), b.nextTask(t)
	require.ElementsMatch(t, []string{"p1", "p2"}, []string{a.task.ExecutionID, c.task.ExecutionID})
	r, _ := lockRecord(t, b.js, "pool")
	require.Equal(t, 2, r.Limit)
	b.finishTask(t, c)
	third := b.nextTask(t)
	require.Equal(t, "p3", third.task.ExecutionID)
	b.finishTask(t, a)
	b.finishTask(t, third)
	for _, id := range []string{"p1", "p2", "p3"} {
		waitStatus(t, b.js, "pool", id, projections.StatusSucceeded)
	}
	eventuallyFree(t, b.js, "pool")
}

// TestBlockLockHeldThroughOnError: a workflow step's lock is taken before
// its steps run, held while the step's on-error steps run, and released
// once they are over; the workflow's other steps run without it.
func TestBlockLockHeldThroughOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, `
name: blk
steps:
  - id: before
    kind: noop
  - id: guarded
    kind: workflow
    lock: dpkg
    steps:
      - id: install
        kind: noop
    on-error:
      - id: cleanup
        kind: noop
  - id: after
    kind: noop
`)
	b.start(t, "blk", "b1")
	b.finishTask(t, b.nextTask(t)) // before
	install := b.nextTask(t)
	require.Equal(t, "guarded/install", install.task.StepID)
	s := lockStatus(t, b.js, "blk", "b1", "guarded", projections.LockHeld)
	require.Equal(t, "dpkg", s.Locks[0].Name)

	b.start(t, "blk", "b2")
	b.finishTask(t, b.nextTask(t)) // b2's before
	lockStatus(t, b.js, "blk", "b2", "guarded", projections.LockWaiting)

	ref := install.task.Ref("test-agent", 1)
	b.report(t, &events.OperationStarted{TaskRef: ref})
	b.report(t, &events.OperationFailed{TaskRef: ref, Error: "dpkg was interrupted"})
	cleanup := b.nextTask(t)
	require.Equal(t, "guarded/on-error1/cleanup", cleanup.task.StepID)
	require.Equal(t, "b1", cleanup.task.ExecutionID)
	lockStatus(t, b.js, "blk", "b1", "guarded", projections.LockHeld) // still held while on-error runs
	s = lockStatus(t, b.js, "blk", "b2", "guarded", projections.LockWaiting)
	require.Equal(t, projections.OpPending, stepNamed(s, "guarded").Status)

	b.finishTask(t, cleanup)
	s = lockStatus(t, b.js, "blk", "b1", "guarded", projections.LockReleased)
	require.Contains(t, s.Locks[0].Reason, "guarded")
	next := b.nextTask(t) // b1's after and b2's install, in either order
	other := b.nextTask(t)
	got := map[string]string{next.task.ExecutionID: next.task.StepID, other.task.ExecutionID: other.task.StepID}
	require.Equal(t, map[string]string{"b1": "after", "b2": "guarded/install"}, got)
}

// TestLockReleasedWhenTheHolderEnds: a force-cancelled holder gives its
// lock to the waiter; a cancelled waiter leaves the queue; a resumed
// execution asks for its lock again before it runs a step.
func TestLockReleasedWhenTheHolderEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, "name: c\nlock: one\nsteps:\n  - id: work\n    kind: noop\n  - id: more\n    kind: noop\n")
	b.start(t, "c", "c1")
	first := b.nextTask(t)
	b.start(t, "c", "c2")
	lockStatus(t, b.js, "c", "c2", "", projections.LockWaiting)
	b.start(t, "c", "c3")
	lockStatus(t, b.js, "c", "c3", "", projections.LockWaiting)

	t.Log("a waiter cancelled leaves the queue")
	b.act(t, "c3", events.ActionCancel, "not needed")
	s, evs := waitStatus(t, b.js, "c", "c3", projections.StatusCancelled)
	require.Equal(t, projections.LockReleased, s.Locks[0].Status)
	require.Equal(t, events.TypeExecutionCancelled, evs[len(evs)-1].Type)
	eventuallyWaiters(t, b.js, "one", "c2")

	t.Log("a holder force-cancelled hands the lock on")
	b.act(t, "c1", events.ActionForceCancel, "stuck")
	s = lockStatus(t, b.js, "c", "c1", "", projections.LockReleased)
	require.Equal(t, projections.StatusCancelled, s.Status)
	second := b.nextTask(t)
	require.Equal(t, "c2", second.task.ExecutionID)

	t.Log("resumed, c1 asks again and waits behind c2")
	b.act(t, "c1", events.ActionForceResume, "try again")
	s = lockStatus(t, b.js, "c", "c1", "", projections.LockWaiting)
	require.Equal(t, 2, s.Locks[0].Requests)
	require.Equal(t, projections.StatusStarted, s.Status)
	b.finishTask(t, second)
	b.finishTask(t, b.nextTask(t)) // c2's more
	waitStatus(t, b.js, "c", "c2", projections.StatusSucceeded)
	resumed := b.nextTask(t)
	require.Equal(t, "c1", resumed.task.ExecutionID)
	require.Equal(t, 2, resumed.task.Attempt, "the force-resume runs the step again")
	lockStatus(t, b.js, "c", "c1", "", projections.LockHeld)
	b.report(t, &events.OperationSucceeded{TaskRef: first.task.Ref("test-agent", 1)}) // the old attempt: ignored
	b.finishTask(t, resumed)
	b.finishTask(t, b.nextTask(t))
	waitStatus(t, b.js, "c", "c1", projections.StatusSucceeded)
	eventuallyFree(t, b.js, "one")
}

// TestWorkflowTimeoutCountsFromAcquisition: the workflow timeout of a
// waiter is armed when it acquires the lock, not when it started.
func TestWorkflowTimeoutCountsFromAcquisition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, "name: tmo\nlock: t\ntimeout: 1h\nsteps:\n  - id: work\n    kind: noop\n")
	b.start(t, "tmo", "t1")
	first := b.nextTask(t)
	b.start(t, "tmo", "t2")
	s := lockStatus(t, b.js, "tmo", "t2", "", projections.LockWaiting)
	require.Empty(t, s.Timers, "no timeout is armed while waiting")
	time.Sleep(300 * time.Millisecond)
	b.finishTask(t, first)
	s = lockStatus(t, b.js, "tmo", "t2", "", projections.LockHeld)
	waitHistory(t, b.js, "tmo", "t2", "timer armed", func(evs []events.Event) bool { return countType(evs, events.TypeTimerArmed) == 1 })
	s = foldOf(t, b.js, "tmo", "t2")
	require.Len(t, s.Timers, 1)
	for _, tm := range s.Timers {
		require.Equal(t, s.Locks[0].AcquiredAt.Add(time.Hour), tm.Due)
		require.GreaterOrEqual(t, tm.Due.Sub(s.StartedAt), time.Hour+300*time.Millisecond)
	}
}

// TestClearLockCommand: an operator force-clears the holder; the holder's
// history records who and why, the waiter acquires, and the cleared holder
// asks again before its next step.
func TestClearLockCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.applyYAML(t, "name: cl\nlock: stuck\nsteps:\n  - id: work\n    kind: noop\n  - id: more\n    kind: noop\n")
	b.start(t, "cl", "h1")
	first := b.nextTask(t)
	b.start(t, "cl", "h2")
	lockStatus(t, b.js, "cl", "h2", "", projections.LockWaiting)

	bad := events.New("test-operator", "", "", time.Now(), &events.ClearLock{Lock: "a..b", Entries: []events.LockEntry{{ExecutionID: "h1", Workflow: "cl", Request: 1}}})
	publishClear(t, b.js, bad)
	rej := readRejection(t, b.js, events.CommandKey(bad.Source, bad.ID))
	require.Equal(t, events.CodeInvalid, rej.Code)
	require.Contains(t, rej.Reason, "not a lock name")

	clear := events.New("test-operator", "", "", time.Now(), &events.ClearLock{Lock: "stuck", Reason: "agent host died", RequestedBy: "alice",
		Entries: []events.LockEntry{{ExecutionID: "h1", Workflow: "cl", Request: 1}}})
	publishClear(t, b.js, clear)
	evs := waitHistory(t, b.js, "cl", "h1", "lock cleared", func(evs []events.Event) bool { return countType(evs, events.TypeLockCleared) == 1 })
	cleared := evs[indexOfType(evs, events.TypeLockCleared)].Data.(*events.LockCleared)
	require.Equal(t, "alice", cleared.RequestedBy)
	require.Equal(t, "agent host died", cleared.Reason)
	require.Equal(t, events.CommandKey(clear.Source, clear.ID), cleared.Command)
	second := b.nextTask(t)
	require.Equal(t, "h2", second.task.ExecutionID, "the waiter acquires the cleared lock")

	b.finishTask(t, first) // h1's step was already running; its next step waits for the lock again
	s := lockStatus(t, b.js, "cl", "h1", "", projections.LockWaiting)
	require.Equal(t, 2, s.Locks[0].Requests)
	require.Equal(t, projections.OpNone, stepNamed(s, "more").Status)
	b.finishTask(t, second)
	b.finishTask(t, b.nextTask(t))
	more := b.nextTask(t)
	require.Equal(t, "h1", more.task.ExecutionID)
	b.finishTask(t, more)
	waitStatus(t, b.js, "cl", "h1", projections.StatusSucceeded)
	eventuallyFree(t, b.js, "stuck")
}

func publishClear(t *testing.T, js jetstream.JetStream, ev events.Event) {
	t.Helper()
	msg, err := bus.Encode(bus.SubjectClearLock, ev)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
}

// TestLockNameFromBadInput: a lock name rendered to something that is not
// a lock name fails the execution with the reason, and locks nothing.
func TestLockNameFromBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: bad\nlock: x-${input.who}\nsteps:\n  - id: work\n    kind: noop\n")
	b.startWith(t, &events.StartExecution{Workflow: "bad", ExecutionID: "bad1", Input: json.RawMessage(`{"who":"a b"}`)})
	s, _ := waitStatus(t, b.js, "bad", "bad1", projections.StatusFailed)
	require.Contains(t, s.Error, `"x-a b" is not a lock name`)
	require.Empty(t, s.Locks)
}
