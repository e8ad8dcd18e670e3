package interp

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Action kinds of locks (numbered apart from decide's).
const (
	actLock        actionKind = 100 + iota // ask for a lock: append LockRequested, enqueue in the bucket
	actUnlock                              // give a lock up: remove from the bucket, append LockReleased
	actLockTimeout                         // a lock_timeout passed: leave the queue (as actUnlock) and fail the step
)

// lockAct is what an actLock or actUnlock is about (the scope is action.path).
type lockAct struct {
	name   string
	limit  int
	reason string
}

// decideLocked is decide with the locks of the workflow and its scopes
// handled first: locks of an execution that stopped running and of scopes
// whose steps are over are released, the workflow's own lock is acquired
// before any step runs, and every lock is released before the execution
// ends. It is pure, like decide.
func decideLocked(d workflow.Definition, s projections.Execution) action {
	return decideLockedIn(d, s, nil)
}

// decideLockedIn is decideLocked with the execution's view (see decideIn).
func decideLockedIn(d workflow.Definition, s projections.Execution, v *view) action {
	if len(s.Locks) == 0 && d.Lock == "" {
		return decideIn(d, s, v)
	}
	if !s.Status.Active() { // ended, or suspended (wait_after_fail): nothing runs
		if l, ok := openLock(s); ok {
			return unlock(l, "the execution is "+string(s.Status))
		}
		return decideIn(d, s, v)
	}
	for _, l := range s.Locks {
		if l.Status.Open() && l.Path != "" && scopeEnded(d, s, l.Path) {
			return unlock(l, "the steps of "+l.Path+" are over")
		}
	}
	a := decideIn(d, s, v)
	switch a.kind {
	case actSucceed, actFail, actCancelled:
		if l, ok := openLock(s); ok {
			return unlock(l, "the execution ends")
		}
		return a
	}
	if d.Lock != "" && s.Status == projections.StatusStarted && !s.DryRun {
		// Nothing runs before the workflow's lock is held (a is ignored).
		switch l, ok := s.LockAt(""); {
		case ok && l.Status == projections.LockHeld:
		case ok && l.Status == projections.LockWaiting:
			return action{kind: actWait} // woken when the bucket lists it as a holder
		case ok && l.Status == projections.LockCleared && !startsAnew(s, a):
			// Cleared while something runs: it asks again only when it
			// next starts something, behind whoever asked meanwhile.
			return a
		default:
			name, err := renderLockName(d.Lock, envOf(s))
			if err != nil {
				return action{kind: actFail, err: "lock: " + err.Error()}
			}
			return action{kind: actLock, lock: lockAct{name: name, limit: max(d.Semaphore, 1)}}
		}
	}
	return a
}

// startsAnew reports whether a starts something inside a lock: a step
// instance not under way yet (one scheduled, or to run again). Waiting,
// and finishing a step already under way when the lock was cleared (a
// wait taking its signal or timing out, a sleep ending, a sending
// recorded), do not: a cleared holder asks for the lock again only for
// what starts anew.
func startsAnew(s projections.Execution, a action) bool {
	if a.kind == actWait {
		return false
	}
	st, ok := instanceOf(s, cmp.Or(a.path, a.step.ID))
	if !ok {
		return true
	}
	switch st.Status {
	case projections.OpWaiting, projections.OpSending, projections.OpSent, projections.OpStarted:
		return false
	}
	return true
}

func unlock(l projections.Lock, reason string) action {
	return action{kind: actUnlock, path: l.Path, lock: lockAct{name: l.Name, reason: reason}}
}

// openLock returns a lock the execution holds or waits for.
func openLock(s projections.Execution) (projections.Lock, bool) {
	for _, l := range s.Locks {
		if l.Status.Open() {
			return l, true
		}
	}
	return projections.Lock{}, false
}

// scopeEnded reports whether the workflow step instance at path is done
// with its lock: it no longer runs, and its on-error steps (which run with
// the lock held) are over. A step waiting for a retry keeps the lock.
func scopeEnded(d workflow.Definition, s projections.Execution, path string) bool {
	st, ok := instanceOf(s, path)
	if !ok || abandonedScope(s, path) {
		return true
	}
	switch st.Status {
	case projections.OpPending, projections.OpRescheduled:
		return false
	case projections.OpFailed:
		f, step, ok := resolveFrame(d, s, path)
		if !ok || len(step.OnError) == 0 {
			return true
		}
		return lookingEngine(d, s).handle(f, step, st).state != running
	}
	return true
}

// abandonedScope reports whether nothing will run again inside the scope
// at path, whatever its own status: the workflow timed out (and path is
// not in its on-error steps), or an enclosing container is over (it
// failed, succeeded, a parallel's first branch won, or it was run again
// as another attempt; its own on-error steps run on) or is a call whose
// timeout fired (but for the call's own on-error steps). Its lock is then
// released, not kept until the execution ends.
func abandonedScope(s projections.Execution, path string) bool {
	comp := lastCompensateSeg(path)
	if timerFired(s, events.TimerWorkflowTimeout, "", s.Resumes) && !strings.HasPrefix(path, workflowOnError) && comp < 0 {
		return true
	}
	// Inside compensate steps only what encloses them there counts: the
	// step they compensate and its containers are over by design.
	for i := max(comp, 0); i < len(path); i++ {
		if path[i] != '/' {
			continue
		}
		key, rest := path[:i], path[i+1:]
		seg, _, _ := strings.Cut(rest, "/")
		if strings.HasPrefix(rest, "on-error") && (seg == "on-error" || isHandlerSeg(seg)) {
			continue // its on-error steps: they run once it failed (or timed out)
		}
		if isCompensateSeg(seg) {
			continue // its compensate steps: they run once it succeeded
		}
		if j := strings.LastIndexByte(key, '['); j > strings.LastIndexByte(key, '/') {
			key = key[:j] // a foreach item: its foreach's instance
		}
		if callTimedOut(s, key) {
			return true
		}
		st, exists, current := s.ContainerAt(key)
		switch {
		case !exists: // a parallel's branch, a switch's case: not an instance
		case !current:
			return true // an earlier attempt of the container: another runs now
		case st.Status != projections.OpPending && st.Status != projections.OpRescheduled:
			return true
		}
	}
	return false
}

// lastCompensateSeg returns where the steps of the last compensate
// segment of path begin (after "<step>/compensate/"), or -1.
func lastCompensateSeg(path string) int {
	at := -1
	for i, start := 0, 0; i <= len(path); i++ {
		if i == len(path) || path[i] == '/' {
			if isCompensateSeg(path[start:i]) && i < len(path) {
				at = i + 1
			}
			start = i + 1
		}
	}
	return at
}

// lockGate decides the lock of a pending workflow step: it lets the step's
// children run if the step holds its lock (or has none, or runs inside a
// scope of the same execution that holds the same lock: locks are
// re-entrant), waits while the lock is asked for, and otherwise asks for it.
func (e *engine) lockGate(step workflow.Step, st projections.Step, env *lazyEnv) (result, bool) {
	if step.Kind != workflow.KindWorkflow || e.s.DryRun {
		return result{}, true
	}
	expr, limit, lockEnv := step.Lock, step.Semaphore, env.get
	if expr == "" && step.Workflow != "" && !step.Child && bytes.Contains(st.Input, []byte(`"lock":`)) { // a child takes its own
		var called struct {
			Definition workflow.Definition `json:"definition"`
			Input      json.RawMessage     `json:"input"`
		}
		if json.Unmarshal(st.Input, &called) == nil && called.Definition.Lock != "" {
			expr, limit = called.Definition.Lock, called.Definition.Semaphore
			lockEnv = func() map[string]any { return with(env.get(), "input", orObject(decode(called.Input))) }
		}
	}
	if expr == "" {
		return result{}, true
	}
	switch l, ok := e.s.LockAt(st.ID); {
	case ok && l.Status == projections.LockHeld:
		return result{}, true
	case ok && l.Status == projections.LockWaiting:
		return result{state: running, act: lockWait(e.s, step, st, l)}, false
	}
	name, err := renderLockName(expr, lockEnv())
	if err != nil {
		return result{state: running, act: action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt,
			err: "lock: " + err.Error(), final: true}}, false
	}
	for _, l := range e.s.Locks {
		if l.Status == projections.LockHeld && l.Name == name &&
			(l.Path == "" || strings.HasPrefix(st.ID, l.Path+"/") || strings.HasPrefix(st.ID, l.Path+"@")) {
			return result{}, true // an enclosing scope holds it
		}
	}
	return result{state: running, act: action{kind: actLock, step: step, path: st.ID,
		lock: lockAct{name: name, limit: max(limit, 1)}}}, false
}

// lockWait decides a workflow step waiting for its lock l: with a
// lock_timeout, its timer is armed (from the request; a request made
// again, after a clear, gets its time again) and once it fired the step
// leaves the queue and fails, in one decision (actLockTimeout). Otherwise
// it waits to be woken.
func lockWait(s projections.Execution, step workflow.Step, st projections.Step, l projections.Lock) action {
	dur, err := optionalDuration(step.LockTimeout)
	switch {
	case err != nil || s.DryRun:
		return action{kind: actWait}
	case timerFired(s, events.TimerLockTimeout, st.ID, l.Requests):
		return action{kind: actLockTimeout, step: step, path: st.ID, attempt: st.Attempt,
			lock: lockAct{name: l.Name, reason: fmt.Sprintf("not acquired within %s (lock_timeout)", step.LockTimeout)},
			err:  fmt.Sprintf("lock %s was not acquired within %s (lock_timeout)", l.Name, step.LockTimeout)}
	case !timerArmed(s, events.TimerLockTimeout, st.ID, l.Requests):
		return action{kind: actArmTimer, step: step, path: st.ID, attempt: l.Requests, purpose: events.TimerLockTimeout,
			until: l.RequestedAt.Add(dur)}
	}
	return action{kind: actWait}
}

// renderLockName evaluates a lock expression to a valid lock name.
func renderLockName(expr string, env map[string]any) (string, error) {
	name := expr
	if expression.IsTemplate(expr) {
		var err error
		if name, err = expression.RenderString(expr, env); err != nil {
			return "", err
		}
	}
	if !events.ValidLockName(name) {
		return "", fmt.Errorf("%q is not a lock name: %s", name, events.LockNameRule)
	}
	return name, nil
}

// lockedFrom is when the workflow's time starts: from, or the acquisition
// of the workflow's lock if that came later (the timeout counts from it).
func lockedFrom(s projections.Execution, from time.Time) time.Time {
	if l, ok := s.LockAt(""); ok && l.Status == projections.LockHeld && l.AcquiredAt.After(from) {
		return l.AcquiredAt
	}
	return from
}
