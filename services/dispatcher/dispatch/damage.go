package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// Quarantine. A history that holds an event this dispatcher cannot apply
// (undecodable, or illegal where it stands: written by hand, or by a bug)
// folds to a state marked Damaged (projections.FoldQuarantined). The
// dispatcher appends nothing to it and retries nothing for it: commands
// are rejected with the code damaged, results and timers are dropped (the
// results stream keeps the results, and a repair applies them then, and
// fires the timers that came due), and the damage is logged once. An
// admin's repair action records events.ExecutionRepaired, which has folds
// pass over the event; the history itself is never rewritten. See
// docs/operations.md#damaged-executions.

// damagedError is returned for a message about a damaged execution.
type damagedError struct {
	id     string
	damage projections.Damage
}

func (e damagedError) Error() string {
	return events.DamagedMessage(e.id, e.damage.Seq, e.damage.Reason)
}

// damageLog remembers the damages logged, so that each is logged once,
// however many messages arrive for its execution.
type damageLog struct {
	mu   sync.Mutex
	seen map[string]uint64 // execution id → sequence of the damage logged
}

// first reports whether the damage of execution id at seq is new to it.
func (l *damageLog) first(id string, seq uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil || len(l.seen) >= 10000 {
		l.seen = map[string]uint64{} // bounded: at worst a damage is logged again
	}
	if l.seen[id] == seq {
		return false
	}
	l.seen[id] = seq
	return true
}

// refuseDamaged is what withExecution returns for the damaged execution
// x instead of handing it on: a damagedError, or an error that retries for
// an event of an unknown type (a newer dispatcher may know it). A cached
// state is checked against the history first: bus.ErrConflict if another
// dispatcher has repaired it since (x is evicted, to be loaded again).
func (d *Dispatcher) refuseDamaged(ctx context.Context, x *execState, cached bool) error {
	if cached {
		if err := d.checkFresh(ctx, x); err != nil {
			d.evict(x.id)
			return err
		}
	}
	d.noteDamage(ctx, x)
	dmg := x.state.Damaged
	if dmg.Unknown {
		d.evict(x.id)
		return fmt.Errorf("history of %s holds at sequence %d an event of type %s that this dispatcher does not know; waiting for a dispatcher that does (or an admin's repair)",
			x.id, dmg.Seq, dmg.Type)
	}
	return damagedError{id: x.id, damage: *dmg}
}

// noteDamage logs x's damage the first time this dispatcher meets it.
func (d *Dispatcher) noteDamage(ctx context.Context, x *execState) {
	dmg := x.state.Damaged
	if dmg == nil || !d.damages.first(x.id, dmg.Seq) {
		return
	}
	log := zerolog.Ctx(ctx)
	if dmg.Unknown {
		log.Warn().Str("execution_id", x.id).Uint64("seq", dmg.Seq).Str("event_type", string(dmg.Type)).
			Msg("the history holds an event of a type this dispatcher does not know (written by a newer one?): its messages wait for a dispatcher that knows it")
		return
	}
	log.Error().Str("execution_id", x.id).Uint64("seq", dmg.Seq).Str("event_id", dmg.EventID).
		Str("event_type", string(dmg.Type)).Str("reason", dmg.Reason).
		Msg("execution damaged: quarantined until an admin repairs it; its history is left as it is")
}

// damagedMessage handles a message about a damaged execution: a command is
// rejected with the code damaged (its sender learns why and what to do);
// anything else is dropped (logged once by noteDamage), since a repair
// catches up with results and timers. It returns the rejection's error,
// or nil once the message may be terminated.
func (d *Dispatcher) damagedMessage(ctx context.Context, j job, e damagedError) error {
	if !isCommand(j.ev.Type) || j.ev.Type == events.TypeReconcileExecution {
		return nil
	}
	err := d.reject(ctx, j.ev, e.id, events.CodeDamaged, e.Error())
	if errors.As(err, new(rejectedError)) {
		return nil
	}
	return err
}

// repair carries out an admin's repair action: it records that folds pass
// over the damaged event at p.IgnoreSeq, then has the execution go on.
// It refuses a repair that names another event than the one at fault (a
// repair is never blind), or an execution that is not damaged.
func (d *Dispatcher) repair(ctx context.Context, ev events.Event, wf string, p *events.ExecutionAction, rec events.ActionRecord) error {
	return d.withDamagedExecution(ctx, wf, p.ExecutionID, func(x *execState) error {
		// The damage was written behind this dispatcher's back (even while
		// it held the partition): a cached state may not show it yet.
		if err := d.checkFresh(ctx, x); err != nil {
			return err
		}
		cmd := interp.RepairCommand{Key: rec.Command, IgnoreSeq: p.IgnoreSeq, Record: rec, FirstSeq: x.firstSeq}
		dec, err := d.decide(ctx, x, func(in interp.Input) interp.Decision { return interp.Repair(in, cmd) })
		switch {
		case err != nil:
			return err
		case dec.Reject != nil:
			return d.reject(ctx, ev, p.ExecutionID, dec.Reject.Code, dec.Reject.Reason)
		case len(dec.Events) > 0:
			// The fold now passes over the event: fold the history again.
			d.evict(x.id)
			fresh, _, err := d.load(ctx, wf, x.id, loading{})
			if err != nil {
				return err
			}
			*x = *fresh
			x.current = true
		}
		// Recorded now, or before by this command (redelivered): what
		// follows may not have been done.
		return d.afterRepair(ctx, x)
	})
}

// afterRepair has a repaired execution go on: results that arrived while
// it was damaged are applied and timers that came due fire, then it
// advances. A further damaged event stops it again (and is logged): the
// next repair names that one.
func (d *Dispatcher) afterRepair(ctx context.Context, x *execState) error {
	if x.state.Damaged != nil {
		d.noteDamage(ctx, x)
		return nil
	}
	if !x.state.Status.Active() {
		return nil
	}
	if err := d.catchUp(ctx, x); err != nil {
		return err
	}
	return d.advance(ctx, x)
}

// damagedAmong returns the first of the entries' executions that is
// damaged as its history stands, and its damage; nil if none is. Each is
// read from its history, not taken from the cache: another worker may be
// changing its cached state (a clear is rare; reading is not).
func (d *Dispatcher) damagedAmong(ctx context.Context, entries []events.LockEntry) (string, *projections.Damage, error) {
	for _, en := range entries {
		evs, err := d.hist.Read(ctx, bus.ExecutionSubject(en.Workflow, en.ExecutionID), 0)
		if err != nil {
			return "", nil, fmt.Errorf("read history of %s: %w", en.ExecutionID, err)
		}
		if dmg := projections.FoldQuarantined(en.ExecutionID, evs).Damaged; dmg != nil && !dmg.Unknown {
			return en.ExecutionID, dmg, nil
		}
	}
	return "", nil, nil
}
