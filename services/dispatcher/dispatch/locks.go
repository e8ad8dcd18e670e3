package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/services/dispatcher/interp"
)

// Locks (docs/locks.md). A scope (the workflow, or a workflow step
// instance) with a lock runs none of its steps until its history records
// lock.acquired; the interpreter (interp/locks.go) asks for the lock and
// gives it up once the scope's steps, and its on-error steps, are over, or
// when the execution stops running. The shell carries these out against
// the lock bucket (compare-and-set only, see pkg/lock; shell.go perform)
// and records them:
//
//   - asking: append lock.requested, then enqueue the scope in the bucket
//     (interp.EnqueueLock); if it is a holder at once, append lock.acquired
//     (interp.LockHeld, interp.Recorded).
//   - a scope waiting (lock.requested recorded) is enqueued again on every
//     advance (interp.Waiting), which is idempotent: a crash between the
//     append and the bucket write is repaired, and a scope the bucket
//     promoted to holder gets lock.acquired recorded.
//   - giving up: remove the scope from the bucket (interp.ReleaseLock,
//     promoting the first waiters), then append lock.released. After a
//     crash in between, the next decision asks for the same release, and
//     the removal is a no-op.
//
// Waiters are woken by a watch on the bucket: when a scope appears among
// a lock's holders, every dispatcher publishes a reconcile command for its
// execution (with one message id per request, so the commands stream keeps
// one), and the reconcile records lock.acquired. A waiting execution holds
// no memory or goroutine anywhere.

// clearLock force-clears the entries a clear-lock command names: each is
// removed from the lock (compare-and-set), then lock.cleared is recorded
// in its execution's history with who asked and why, if the history still
// shows that request open. An entry of an execution that does not exist
// is only removed. With OnlyEnded (the janitor), an entry whose execution
// runs and still holds or waits for it is left alone.
func (d *Dispatcher) clearLock(ctx context.Context, ev events.Event, p *events.ClearLock) error {
	if r := vetClearLock(p); r != nil {
		return d.reject(ctx, ev, "", r.Code, r.Reason)
	}
	// A damaged execution's history cannot record the clearing: refuse
	// the whole command before clearing any of its entries.
	if id, dmg, err := d.damagedAmong(ctx, p.Entries); err != nil || dmg != nil {
		if err != nil {
			return err
		}
		return d.reject(ctx, ev, id, events.CodeDamaged, events.DamagedMessage(id, dmg.Seq, dmg.Reason)+"; its locks stay held until then")
	}
	rec := clearRecord(ev, p)
	for _, en := range p.Entries {
		cmd := interp.ClearCommand{Lock: p.Lock, Path: en.Path, Request: en.Request, Record: rec, OnlyEnded: p.OnlyEnded}
		err := d.withExecution(ctx, en.Workflow, en.ExecutionID, func(x *execState) error {
			return d.command(ctx, ev, x, func(in interp.Input) interp.Decision { return interp.Clear(in, cmd) })
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// publishClear hands a clear-lock step's clear to the dispatchers: into
// the inbox, on the partition its id routes it to (it names several
// executions; the handler takes each in turn), with its id as message id
// so that publishing it again after a crash stores nothing new. It is the
// dispatcher's own command: it carries no actor, and the cleared
// holders' histories record the step that asked (requested_by).
func (d *Dispatcher) publishClear(ctx context.Context, x *execState, e interp.PublishClear) error {
	clear := e.Clear
	if err := d.publishOwn(ctx, e.ID, "", "", &clear); err != nil {
		return fmt.Errorf("execution %s: publish the clear of lock %s: %w", x.id, clear.Lock, err)
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
	for tries := 1; ctx.Err() == nil; {
		w, err := d.locks.KV().WatchAll(ctx)
		if err != nil {
			d.log.Warn().Err(err).Dur("retry_in", retryDelay(tries)).Msg("watch locks, will retry")
			retryWait(ctx, tries)
			tries++
			continue
		}
		tries = 1
		d.wakeHolders(ctx, w, woken)
		bus.StopWatch(w)
	}
}

func (d *Dispatcher) wakeHolders(ctx context.Context, w jetstream.KeyWatcher, woken map[string]map[string]bool) {
	// The lock gauges count what this watch sees: it starts with every
	// lock, so a watch begun again starts them afresh.
	table, synced := newLockTable(), false
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
		if e == nil { // the initial values are all delivered
			synced = true
			d.cfg.Metrics.publishLocks(table)
			continue
		}
		name := e.Key()
		if e.Operation() != jetstream.KeyValuePut {
			delete(woken, name)
			d.cfg.Metrics.setLock(table, name, 0, 0, synced)
			continue
		}
		r, err := lock.Decode(e.Value())
		if err != nil {
			d.log.Warn().Err(err).Str("lock", name).Msg("ignore unreadable lock")
			continue
		}
		d.cfg.Metrics.setLock(table, name, len(r.Holders), len(r.Waiters), synced)
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
