package dispatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Locks (docs/locks.md). A scope (the workflow, or a workflow step
// instance) with a lock runs none of its steps until its history records
// lock.acquired; decide asks for the lock with actLock and gives it up
// with actUnlock once the scope's steps, and its on-error steps, are over,
// or when the execution stops running. The dispatcher carries these out
// against the lock bucket (compare-and-set only, see pkg/lock) and records
// them:
//
//   - actLock: append lock.requested, then enqueue the scope in the bucket;
//     if it is a holder at once, append lock.acquired.
//   - a scope waiting (lock.requested recorded) is enqueued again on every
//     advance, which is idempotent: a crash between the append and the
//     bucket write is repaired, and a scope the bucket promoted to holder
//     gets lock.acquired recorded.
//   - actUnlock: remove the scope from the bucket (promoting the first
//     waiters), then append lock.released. After a crash in between, the
//     next decision asks for the same release, and the removal is a no-op.
//
// Waiters are woken by a watch on the bucket: when a scope appears among
// a lock's holders, every dispatcher publishes a reconcile command for its
// execution (with one message id per request, so the commands stream keeps
// one), and the reconcile records lock.acquired. A waiting execution holds
// no memory or goroutine anywhere.

// Action kinds of locks (numbered apart from decide's).
const (
	actLock   actionKind = 100 + iota // ask for a lock: append LockRequested, enqueue in the bucket
	actUnlock                         // give a lock up: remove from the bucket, append LockReleased
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
	if !ok {
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

// lockGate decides the lock of a pending workflow step: it lets the step's
// children run if the step holds its lock (or has none, or runs inside a
// scope of the same execution that holds the same lock: locks are
// re-entrant), waits while the lock is asked for, and otherwise asks for it.
func (e *engine) lockGate(step workflow.Step, st projections.Step, env *lazyEnv) (result, bool) {
	if step.Kind != workflow.KindWorkflow || e.s.DryRun {
		return result{}, true
	}
	expr, limit, lockEnv := step.Lock, step.Semaphore, env.get
	if expr == "" && step.Workflow != "" && bytes.Contains(st.Input, []byte(`"lock":`)) {
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
		return result{state: running, act: action{kind: actWait}}, false
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

// lockEntry is the bucket entry of a scope's current request.
func lockEntry(x *execState, path string) lock.Entry {
	l, _ := x.state.LockAt(path)
	return lock.Entry{ExecutionID: x.id, Workflow: x.workflow, Path: path, Request: l.Requests}
}

// actOnLock carries out an actLock or actUnlock.
func (d *Dispatcher) actOnLock(ctx context.Context, x *execState, a action) error {
	log := zerolog.Ctx(ctx).With().Str("lock", a.lock.name).Str("scope", a.path).Logger()
	if a.kind == actLock {
		if err := d.append(ctx, x, &events.LockRequested{Lock: a.lock.name, Path: a.path, Limit: a.lock.limit}); err != nil {
			return err
		}
		log.Debug().Msg("lock requested")
		return d.enqueueLock(ctx, x, a.path)
	}
	l, ok := x.state.LockAt(a.path)
	if !ok || !l.Status.Open() {
		return permanentError{fmt.Errorf("release of lock %s by scope %q, which does not hold it", a.lock.name, a.path)}
	}
	if err := d.ensureCurrent(ctx, x); err != nil {
		return err
	}
	removed, promoted, err := d.locks.Remove(ctx, l.Name, lockEntry(x, a.path))
	if err != nil {
		return err
	}
	for _, p := range promoted {
		log.Debug().Str("to", p.ExecutionID).Str("to_scope", p.Path).Msg("lock handed over")
	}
	log.Debug().Bool("was_listed", removed).Str("reason", a.lock.reason).Msg("lock released")
	return d.append(ctx, x, &events.LockReleased{Lock: l.Name, Path: a.path, Reason: a.lock.reason})
}

// enqueueLock puts the scope's request in the bucket (again: it is
// idempotent) and records lock.acquired if the scope is a holder.
func (d *Dispatcher) enqueueLock(ctx context.Context, x *execState, path string) error {
	if err := d.ensureCurrent(ctx, x); err != nil {
		return err
	}
	l, _ := x.state.LockAt(path)
	held, err := d.locks.Enqueue(ctx, l.Name, l.Limit, lockEntry(x, path))
	if err != nil {
		return err
	}
	if !held {
		return nil
	}
	zerolog.Ctx(ctx).Debug().Str("lock", l.Name).Str("scope", path).Msg("lock acquired")
	return d.append(ctx, x, &events.LockAcquired{Lock: l.Name, Path: path})
}

// syncLocks enqueues again every lock the execution waits for, so that a
// promotion in the bucket is recorded and a request the bucket lost (a
// crash between the append and the write) is made again.
func (d *Dispatcher) syncLocks(ctx context.Context, x *execState) error {
	if !x.state.Status.Active() {
		return nil
	}
	for _, l := range x.state.WaitingLocks() {
		if err := d.enqueueLock(ctx, x, l.Path); err != nil {
			return err
		}
	}
	return nil
}

// releaseEnded gives up the locks of an execution that stopped running
// (force-cancel and kill end it without a decision): the history records
// lock.released after its last event.
func (d *Dispatcher) releaseEnded(ctx context.Context, x *execState) error {
	for !x.state.Status.Active() {
		l, ok := openLock(x.state)
		if !ok {
			return nil
		}
		if err := d.actOnLock(ctx, x, unlock(l, "the execution is "+string(x.state.Status))); err != nil {
			return err
		}
	}
	return nil
}

// clearLock force-clears the entries a clear-lock command names: each is
// removed from the lock (compare-and-set), then lock.cleared is recorded
// in its execution's history with who asked and why, if the history still
// shows that request open. An entry of an execution that does not exist
// is only removed. With OnlyEnded (the janitor), an entry whose execution
// runs and still holds or waits for it is left alone.
func (d *Dispatcher) clearLock(ctx context.Context, ev events.Event, p *events.ClearLock) error {
	reject := func(format string, args ...any) error {
		return d.reject(ctx, ev, "", events.CodeInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case !events.ValidLockName(p.Lock):
		return reject("lock %q is not a lock name: %s", p.Lock, events.LockNameRule)
	case len(p.Entries) == 0:
		return reject("entries: name at least one holder or waiter to clear")
	case len(p.Reason) > events.MaxActionReason || len(p.RequestedBy) > events.MaxRequestedBy:
		return reject("reason is %d bytes and requested_by %d; at most %d and %d are kept",
			len(p.Reason), len(p.RequestedBy), events.MaxActionReason, events.MaxRequestedBy)
	}
	for i, en := range p.Entries {
		if !events.ValidWorkflowName(en.Workflow) || !events.ValidExecutionID(en.ExecutionID) {
			return reject("entries[%d]: workflow %q or execution_id %q is not valid", i, en.Workflow, en.ExecutionID)
		}
	}
	// A damaged execution's history cannot record the clearing: refuse
	// the whole command before clearing any of its entries.
	if id, dmg, err := d.damagedAmong(ctx, p.Entries); err != nil || dmg != nil {
		if err != nil {
			return err
		}
		return d.reject(ctx, ev, id, events.CodeDamaged, events.DamagedMessage(id, dmg.Seq, dmg.Reason)+"; its locks stay held until then")
	}
	rec := events.ActionRecord{Action: "clear-lock", Reason: p.Reason, RequestedBy: p.RequestedBy, Actor: p.Actor,
		Command: events.CommandKey(ev.Source, ev.ID)}
	if rec.RequestedBy == "" {
		rec.RequestedBy = ev.Source
	}
	for _, en := range p.Entries {
		entry := lock.Entry{ExecutionID: en.ExecutionID, Workflow: en.Workflow, Path: en.Path, Request: en.Request}
		err := d.withExecution(ctx, en.Workflow, en.ExecutionID, func(x *execState) error {
			l, ok := x.state.LockAt(en.Path)
			current := ok && l.Name == p.Lock && l.Status.Open() && l.Requests == en.Request && x.state.ExpiredAt.IsZero()
			if current && p.OnlyEnded && x.state.Status.Active() {
				return nil // resumed since the sweep saw it ended
			}
			if err := d.ensureCurrent(ctx, x); err != nil {
				return err // decided from a cached state: decide again on the history
			}
			if _, _, err := d.locks.Remove(ctx, p.Lock, entry); err != nil {
				return err
			}
			if !current {
				// A stale entry (the history does not hold it), or this
				// command again after a dispatcher recorded the clearing
				// and stopped before acting on it: deciding again repairs
				// that, and changes nothing otherwise.
				if x.state.Status.Active() {
					return d.advance(ctx, x)
				}
				return nil
			}
			zerolog.Ctx(ctx).Info().Str("lock", p.Lock).Str("scope", en.Path).Str("requested_by", rec.RequestedBy).
				Str("reason", rec.Reason).Msg("lock cleared")
			if err := d.append(ctx, x, &events.LockCleared{ActionRecord: rec, Lock: p.Lock, Path: en.Path}); err != nil {
				return err
			}
			return d.advance(ctx, x)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// watchLocks wakes waiters: it watches the lock bucket and, for every
// scope that appears among a lock's holders, publishes a reconcile command
// for its execution, which records lock.acquired. At start it sees every
// lock, so holders promoted while no dispatcher ran are woken too. It
// returns when ctx ends.
func (d *Dispatcher) watchLocks(ctx context.Context) {
	woken := map[string]map[string]bool{} // lock -> wake ids of its current holders
	for ctx.Err() == nil {
		w, err := d.locks.KV().WatchAll(ctx)
		if err != nil {
			d.log.Warn().Err(err).Msg("watch locks, will retry")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		d.wakeHolders(ctx, w, woken)
		_ = w.Stop()
	}
}

func (d *Dispatcher) wakeHolders(ctx context.Context, w jetstream.KeyWatcher, woken map[string]map[string]bool) {
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return
		case got, ok := <-w.Updates():
			if !ok {
				return
			}
			e = got
		}
		if e == nil {
			continue // the initial values are all delivered
		}
		name := e.Key()
		if e.Operation() != jetstream.KeyValuePut {
			delete(woken, name)
			continue
		}
		r, err := lock.Decode(e.Value())
		if err != nil {
			d.log.Warn().Err(err).Str("lock", name).Msg("ignore unreadable lock")
			continue
		}
		now := make(map[string]bool, len(r.Holders))
		for _, h := range r.Holders {
			id := wakeID(name, h)
			if woken[name][id] {
				now[id] = true
				continue
			}
			if err := d.wake(ctx, name, h, id); err != nil {
				d.log.Warn().Err(err).Str("lock", name).Str("execution_id", h.ExecutionID).Msg("wake lock holder, will retry on the next change")
				continue
			}
			now[id] = true
		}
		woken[name] = now
	}
}

// wakeID identifies the wake of one request of a scope.
func wakeID(name string, h lock.Entry) string {
	sum := sha256.Sum256([]byte(name + "\x00" + h.ExecutionID + "\x00" + h.Path + "\x00" + strconv.Itoa(h.Request)))
	return "lockwake-" + hex.EncodeToString(sum[:12])
}

func (d *Dispatcher) wake(ctx context.Context, name string, h lock.Entry, id string) error {
	ev := events.New(d.cfg.Source, h.ExecutionID, h.Workflow, d.cfg.Now(), &events.ReconcileExecution{
		ExecutionID: h.ExecutionID, Workflow: h.Workflow, Reason: "holds lock " + name})
	ev.ID = id
	// Straight to the execution's partition: the dispatcher checked it.
	msg, err := bus.Encode(bus.InboxSubject(d.partitionOf(h.ExecutionID), h.ExecutionID), ev)
	if err != nil {
		return err
	}
	// The same id from every dispatcher: the inbox keeps one.
	_, err = d.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
	return err
}
