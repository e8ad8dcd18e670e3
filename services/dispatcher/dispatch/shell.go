package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/services/dispatcher/interp"
)

// The shell around the interpreter (services/dispatcher/interp): it gives
// the interpreter an execution's state, and carries out what it decides:
// effects before the append, the events (each appended with the expected
// last sequence of the history, the fence against another writer), and
// effects after; an effect's outcome that the history records goes back
// to the interpreter (interp.Recorded). Every effect is performed by one
// switch, perform.

// input is the interpreter's input for x now.
func (d *Dispatcher) input(x *execState) interp.Input {
	in := interp.Input{ID: x.id, Workflow: x.workflow, State: x.state, Memo: x.memo,
		Now: d.cfg.Now(), MaxEvent: d.maxEvent, SplitDispatch: d.cfg.SplitDispatch}
	if x.def != nil {
		in.Def = *x.def // a copy of its top level; what it points to is shared, and read only
	}
	return in
}

// loaded is what one decision asked to be loaded (interp.Need), for that
// decision only: "the latest version" of a called workflow may change and
// results arrive, and a decision nested in carrying out another (a lock
// released after an append, a result caught up with) starts with nothing.
type loaded struct {
	called  map[interp.CalledRef]*interp.Called
	history []events.Event
	stored  map[string]events.Event
	token   string
	claimed *bool
	holders map[string][]events.LockEntry
	checks  map[string]string
}

func (l loaded) into(in interp.Input) interp.Input {
	in.Called, in.History, in.Stored, in.Token, in.Claimed = l.called, l.history, l.stored, l.token, l.claimed
	in.Holders, in.StartChecks = l.holders, l.checks
	return in
}

// decide takes a decision about x and carries it out, loading first what
// it needs. It returns the decision carried out: its Reject, Retry and
// Ignore are the caller's to act on.
func (d *Dispatcher) decide(ctx context.Context, x *execState, decide func(interp.Input) interp.Decision) (interp.Decision, error) {
	var l loaded
	for range 16 { // a decision needs the history, stored results, the workflows a step calls
		dec := decide(l.into(d.input(x)))
		if dec.Need == nil {
			return dec, d.carryOut(ctx, x, dec)
		}
		if err := d.provide(ctx, x, dec.Need, &l); err != nil {
			return interp.Decision{}, err
		}
	}
	return interp.Decision{}, permanentError{fmt.Errorf("execution %s: a decision kept asking for more", x.id)}
}

// command carries out the decision about a command for x, and then
// advances the execution: a rejection is published to the command's
// sender, a command that cannot be decided yet is retried.
func (d *Dispatcher) command(ctx context.Context, cmd events.Event, x *execState, decide func(interp.Input) interp.Decision) error {
	dec, err := d.decide(ctx, x, decide)
	switch {
	case err != nil:
		return err
	case dec.Reject != nil:
		// A rejection is final for its sender and no append fences it: it
		// must not come from a state behind the history (one cached
		// before another dispatcher wrote: a clear-lock routed from
		// another partition, a holder that lost its lease and has not
		// noticed yet). A rejection is rare; one lookup is cheap, and none
		// when the state was read from the history for this message.
		if err := d.ensureCurrent(ctx, x); err != nil {
			return err
		}
		return d.reject(ctx, cmd, x.id, dec.Reject.Code, dec.Reject.Reason)
	case dec.Retry != "":
		return errors.New(dec.Retry)
	case dec.Ignore != "":
		level := zerolog.InfoLevel
		if cmd.Type == events.TypeFireTimer {
			// A timer's schedule that outlives what it timed is routine: the
			// guarantee of one fired from memory (docs/adr/0013), a sleep
			// cut short by a cancel, an execution that ended.
			level = zerolog.DebugLevel
		}
		zerolog.Ctx(ctx).WithLevel(level).Str("reason", dec.Ignore).Msg("command changes nothing")
		return nil
	}
	return d.advance(ctx, x)
}

// advance carries out decisions until the execution has to wait for
// something outside (a result, a timer, a signal, a lock).
func (d *Dispatcher) advance(ctx context.Context, x *execState) error {
	if _, err := d.decide(ctx, x, interp.Waiting); err != nil {
		return err
	}
	// Each decision appends at least one event or performs an effect; the
	// bound grows with the instances (loops and foreach items add them)
	// and only stops a bug.
	for i := 0; i < 16*len(x.state.Steps)+64; i++ {
		dec, err := d.decide(ctx, x, interp.Next)
		if err != nil || dec.Empty() {
			return err
		}
	}
	return permanentError{fmt.Errorf("execution %s did not settle", x.id)}
}

// carryOut performs a decision.
func (d *Dispatcher) carryOut(ctx context.Context, x *execState, dec interp.Decision) error {
	if x.torn != nil { // a decision taken from it, its error too
		return x.torn
	}
	if dec.Err != nil {
		return permanentError{fmt.Errorf("execution %s: %w", x.id, dec.Err)}
	}
	for _, e := range dec.Before {
		if _, err := d.perform(ctx, x, e); err != nil {
			return err
		}
	}
	ended := x.state.Status.Terminal()
	for _, p := range dec.Events {
		if err := d.append(ctx, x, p, dec.At); err != nil {
			return err
		}
		logDecided(ctx, p)
	}
	if !ended && x.state.Status.Terminal() && x.state.Parent != nil {
		d.notifyParent(ctx, x)
	}
	for _, e := range dec.After {
		o, err := d.perform(ctx, x, e)
		if err != nil {
			return err
		}
		if noted, ok := interp.Noted(d.input(x), o); ok { // in place: x owns its state (execState.torn)
			// Noted, not appended: the step's next event records it
			// (docs/adr/0007). A state read anew does not know it, and
			// publishes the task again (deduplicated) or looks for it.
			x.state = noted
			continue
		}
		if o != nil {
			if err := d.carryOut(ctx, x, interp.Recorded(d.input(x), o)); err != nil {
				return err
			}
		}
	}
	return nil
}

// provide loads what a decision needs.
func (d *Dispatcher) provide(ctx context.Context, x *execState, need interp.Need, l *loaded) error {
	switch n := need.(type) {
	case interp.NeedWorkflow:
		rec, err := d.defs.Get(ctx, n.Ref.Name, n.Ref.Version)
		var called *interp.Called
		switch {
		case errors.Is(err, catalog.ErrNotFound):
		case err != nil:
			return err
		default:
			called = &interp.Called{Name: rec.Name, Version: rec.Version, Definition: rec.Definition}
		}
		if l.called == nil {
			l.called = map[interp.CalledRef]*interp.Called{}
		}
		l.called[n.Ref] = called
	case interp.NeedToken:
		l.token = newToken()
	case interp.NeedClaim:
		_, err := d.ids.Get(ctx, x.id)
		switch {
		case errors.Is(err, claim.ErrNotFound):
			l.claimed = new(bool)
		case err != nil:
			return fmt.Errorf("look up the claim of %s: %w", x.id, err)
		default:
			claimed := true
			l.claimed = &claimed
		}
	case interp.NeedStoredResults:
		stored, err := d.storedResults(ctx, x)
		if err != nil {
			return err
		}
		l.stored = stored
	case interp.NeedHolders:
		rec, _, _, err := d.locks.Get(ctx, n.Lock)
		if err != nil {
			return fmt.Errorf("read lock %s: %w", n.Lock, err)
		}
		holders := make([]events.LockEntry, 0, len(rec.Holders))
		for _, h := range rec.Holders {
			holders = append(holders, events.LockEntry{ExecutionID: h.ExecutionID, Workflow: h.Workflow, Path: h.Path, Request: h.Request})
		}
		if l.holders == nil {
			l.holders = map[string][]events.LockEntry{}
		}
		l.holders[n.Lock] = holders
	case interp.NeedStartCheck:
		problem, err := d.checkStart(ctx, n)
		if err != nil {
			return err
		}
		if l.checks == nil {
			l.checks = map[string]string{}
		}
		l.checks[n.ID] = problem
	case interp.NeedHistory:
		evs, err := d.hist.Read(ctx, x.subject(), 0)
		if err != nil {
			return fmt.Errorf("read history of %s: %w", x.id, err)
		}
		l.history = evs
	default:
		return permanentError{fmt.Errorf("unknown need %T", need)}
	}
	return nil
}

// taskSubject is where the task of e waits for an agent: its queue's
// bulk lane when its execution already has BulkAfter others in flight
// there (Config.BulkAfter).
func (d *Dispatcher) taskSubject(e interp.PublishTask) string {
	if d.cfg.BulkAfter != NoBulkLane && e.Others >= d.cfg.BulkAfter {
		return bus.BulkTaskSubject(e.Task.Queue)
	}
	return bus.TaskSubject(e.Task.Queue)
}

// perform carries out one effect, and returns what it found that the
// history must record (nil: nothing).
func (d *Dispatcher) perform(ctx context.Context, x *execState, eff interp.Effect) (interp.Outcome, error) {
	if x.torn != nil { // an effect decided from it
		return nil, x.torn
	}
	switch e := eff.(type) {
	case interp.ArmTimer:
		return nil, d.publishSchedule(ctx, x.id, x.workflow, e.TimerID, e.Due, x.state.LastSeq)
	case interp.PublishTask:
		if e.Local {
			return d.runLocal(x, e), nil
		}
		if !e.Since.IsZero() && d.cfg.Now().Sub(e.Since) >= d.lookupAfter {
			// It may have been stored before the dedupe window: published
			// again, it would be stored (and run) twice.
			if found, err := d.findTask(ctx, x, e); err != nil || found != nil {
				if found != nil {
					return *found, nil
				}
				return nil, err
			}
		}
		// The task is stored after this instant and before the ack: taken
		// now, the sending is never recorded after the agent's start.
		at := d.cfg.Now()
		t := e.Task
		if !d.cfg.NoDirectReports {
			t.Partitions = d.parts.n // its agent may hand its reports to the partition's holder
		}
		task := events.New(d.cfg.Source, x.id, x.workflow, at, &t)
		task.ID = e.Task.TaskID
		d.traceTask(x, &task, e.Task.TaskID)
		msg, err := bus.Encode(d.taskSubject(e), task)
		if err != nil {
			return nil, permanentError{err}
		}
		d.keeper.beforeTask(at)
		ack, err := d.publishTask(ctx, msg, e.Task.TaskID)
		if err != nil {
			return nil, fmt.Errorf("publish task %s: %w", e.Task.TaskID, err)
		}
		if ack.Duplicate && !e.Since.IsZero() {
			// Stored by the publish that followed the step's sending, at
			// once (the history may not say when).
			at = e.Since
		}
		return interp.TaskStored{Task: e, Seq: ack.Sequence, At: at}, nil
	case interp.EnqueueLock:
		// The bucket is not fenced by the history's compare-and-set: a
		// write decided from a state another dispatcher has gone past
		// would add back a released request.
		if err := d.ensureCurrent(ctx, x); err != nil {
			return nil, err
		}
		held, err := d.locks.Enqueue(ctx, e.Lock, e.Limit, lockEntry(x, e.Path))
		if err != nil || !held {
			return nil, err
		}
		return interp.LockHeld{Lock: e}, nil
	case interp.ReleaseLock:
		if err := d.ensureCurrent(ctx, x); err != nil { // would remove a live holder
			return nil, err
		}
		removed, promoted, err := d.locks.Remove(ctx, e.Lock, lock.Entry{ExecutionID: x.id, Workflow: x.workflow, Path: e.Path, Request: e.Request})
		if err != nil {
			return nil, err
		}
		log := zerolog.Ctx(ctx).With().Str("lock", e.Lock).Str("scope", e.Path).Logger()
		for _, p := range promoted {
			log.Debug().Str("to", p.ExecutionID).Str("to_scope", p.Path).Msg("lock handed over")
		}
		log.Debug().Bool("was_listed", removed).Str("reason", e.Reason).Msg("lock released")
		return nil, nil
	case interp.PublishKill:
		return nil, d.publishKill(ctx, x, e)
	case interp.PublishClear:
		return nil, d.publishClear(ctx, x, e)
	case interp.PublishStart:
		return nil, d.publishStart(ctx, x, e)
	case interp.PublishAction:
		a := e.Action
		if err := d.publishOwn(ctx, e.ID, a.ExecutionID, e.Workflow, &a); err != nil {
			return nil, fmt.Errorf("execution %s: publish the %s of %s: %w", x.id, a.Action, a.ExecutionID, err)
		}
		return nil, nil
	case interp.CatchUp:
		if !x.state.Status.Active() {
			return nil, nil // ended again since
		}
		return nil, d.reopened(ctx, x)
	}
	return nil, permanentError{fmt.Errorf("unknown effect %T", eff)}
}

// findTask looks for the task of e, which may have been stored before the
// tasks stream's dedupe window: in its queue (both lanes: it waits there,
// or runs, until its agent has reported), then among its execution's
// reports (an agent reports before it acknowledges the task). Nil: in
// neither, so it was never stored (a dispatcher died between the step's
// sending and the publish, and no decision followed for a while), or it
// left its queue without a report (an operator purged it).
func (d *Dispatcher) findTask(ctx context.Context, x *execState, e interp.PublishTask) (*interp.TaskStored, error) {
	id, token := e.Task.TaskID, e.Task.Token
	log := zerolog.Ctx(ctx).With().Str("task_id", id).Logger()
	type place struct {
		name string
		read placeReader
	}
	var places []place
	for _, lane := range []string{bus.TaskSubject(e.Task.Queue), bus.BulkTaskSubject(e.Task.Queue)} {
		places = append(places, place{bus.StreamTasks + " " + lane, queueReader(bus.StreamTasks, lane)})
	}
	for _, filter := range []string{bus.ExecutionResultsBefore(x.id), bus.ExecutionResults(x.id)} {
		places = append(places, place{bus.StreamResults + " " + filter, reportsReader(bus.StreamResults, filter)})
	}
	for _, p := range places {
		t, ok, err := d.seen.find(ctx, d.js, p.name, p.read, id, token)
		switch {
		case err != nil:
			return nil, fmt.Errorf("look for task %s in %s: %w", id, p.name, err)
		case ok:
			log.Info().Str("in", p.name).Msg("task already stored (in its queue, or reported): not published again")
			return &interp.TaskStored{Task: e, Seq: t.seq, At: cmp.Or(t.at, e.Since)}, nil
		}
	}
	log.Info().Msg("task neither in its queue nor reported: published again")
	return nil, nil
}

// lockEntry is the bucket entry of a scope's current request.
func lockEntry(x *execState, path string) lock.Entry {
	l, _ := x.state.LockAt(path)
	return lock.Entry{ExecutionID: x.id, Workflow: x.workflow, Path: path, Request: l.Requests}
}

// releaseEnded gives up the locks of an execution that stopped running
// (force-cancel and kill end it without a decision): the history records
// lock.released after its last event.
func (d *Dispatcher) releaseEnded(ctx context.Context, x *execState) error {
	for {
		dec, err := d.decide(ctx, x, interp.Unlocking)
		if err != nil || dec.Empty() {
			return err
		}
	}
}

// applyResult records an agent's report about a task, if it is about the
// step's current attempt and new; a stale or repeated report changes nothing.
func (d *Dispatcher) applyResult(ctx context.Context, x *execState, ref events.TaskRef, ev events.Event) error {
	dec := interp.Result(d.input(x), ref, ev)
	log := zerolog.Ctx(ctx).With().Str("step_id", ref.StepID).Int("attempt", ref.Attempt).Logger()
	switch {
	case dec.Stale != "":
		// Stale as the history stands, not as a cached state that is
		// behind it says (that one is reloaded and decides again).
		if err := d.ensureCurrent(ctx, x); err != nil {
			return err
		}
		log.Info().Str("reason", dec.Stale).Msg("ignore result of a stale attempt")
	case dec.Empty():
		log.Debug().Str("status", string(x.state.Status)).Msg("ignore a repeated result, or one for an ended execution")
	}
	return d.carryOut(ctx, x, dec)
}

// logDecided logs what an event decided means for people reading the logs.
func logDecided(ctx context.Context, p events.Payload) {
	log := zerolog.Ctx(ctx)
	switch e := p.(type) {
	case *events.ExecutionSucceeded:
		log.Info().Msg("execution succeeded")
	case *events.ExecutionFailed:
		log.Info().Str("error", e.Error).Msg("execution failed")
	case *events.ExecutionCancelled:
		log.Info().Msg("execution cancelled")
	case *events.ExecutionSuspended:
		log.Info().Str("error", e.Error).Msg("execution suspended: it waits to be resumed")
	case *events.StepRescheduled:
		log.Info().Str("step_id", e.StepID).Int("attempt", e.Attempt).Time("due", e.Due).Msg("retry scheduled")
	case *events.ExecutionReplayed:
		log.Info().Str("from", e.From).Str("point", e.Point).Str("mode", e.Mode).Str("cause", e.Cause).
			Bool("automatic", e.Automatic).Int("reset", len(e.Reset)).Msg("execution replayed")
	case *events.LockRequested:
		log.Debug().Str("lock", e.Lock).Str("scope", e.Path).Msg("lock requested")
	case *events.LockAcquired:
		log.Debug().Str("lock", e.Lock).Str("scope", e.Path).Msg("lock acquired")
	case *events.LockCleared:
		log.Info().Str("lock", e.Lock).Str("scope", e.Path).Str("requested_by", e.RequestedBy).Str("reason", e.Reason).Msg("lock cleared")
	case *events.ExecutionExpired:
		log.Info().Str("rule", e.Rule).Msg("execution expired under its retention rule")
	case *events.ExecutionRepaired:
		log.Warn().Uint64("ignore_seq", e.IgnoreSeq).Str("reason", e.Reason).Str("actor", e.Actor.String()).
			Msg("execution repaired: folds pass over the damaged event")
	}
}

// publishTask publishes msg, the task id, to its queue: with group
// commit in the committer's next batch. A batch that failed says nothing
// of this task alone (a task published again is a duplicate, which fails
// its whole batch, where alone it is acknowledged as one): it is then
// published on its own, which decides it as without group commit.
func (d *Dispatcher) publishTask(ctx context.Context, msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	if d.taskCommit != nil {
		// A copy of the headers: the batch's are set on it (Set replaces a
		// key's values), and msg goes alone as it was should the batch fail.
		grouped := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: maps.Clone(msg.Header)}
		grouped.Header.Set(jetstream.MsgIDHeader, id)
		r := d.taskCommit.PublishResult(ctx, grouped)
		if r.Err == nil {
			return &jetstream.PubAck{Stream: bus.StreamTasks, Sequence: r.Seq, Duplicate: r.Duplicate}, nil
		}
		if ctx.Err() != nil {
			return nil, r.Err
		}
	}
	return d.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
}
