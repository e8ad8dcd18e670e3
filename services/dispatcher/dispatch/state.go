package dispatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/interp"
)

// An execution's state in the shell: loaded from the cache or folded
// from its history, handed to one handler at a time, and appended to
// with the expected last subject sequence (the fence against another
// writer).

// keyedMutex is a mutex per key, for the keys in use.
type keyedMutex struct {
	mu    sync.Mutex // guards locks
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int // holders and waiters; guarded by keyedMutex.mu
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return k.unlocker(key, l)
}

// unlocker returns the unlock of key, held with l.
func (k *keyedMutex) unlocker(key string, l *keyLock) func() {
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// tryLock locks key if nobody holds or waits for it, and returns its
// unlock; ok is false (and nothing is locked) otherwise.
func (k *keyedMutex) tryLock(key string) (unlock func(), ok bool) {
	k.mu.Lock()
	if k.locks[key] != nil {
		k.mu.Unlock()
		return nil, false
	}
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := &keyLock{users: 1}
	l.Lock()
	k.locks[key] = l
	k.mu.Unlock()
	return k.unlocker(key, l), true
}

// execState is the dispatcher's view of one execution.
type execState struct {
	id, workflow string
	state        projections.Execution
	// def is the definition the execution is pinned to, shared with every
	// other execution of it (pinnedDefs): never change it. Nil until the
	// execution has started.
	def *workflow.Definition
	// current: state is known to be the whole history (just read from the
	// stream, or just appended to), not a cached copy that another
	// dispatcher may have gone past. See ensureCurrent.
	current bool
	// firstSeq is the stream sequence of the history's first event (its
	// start), 0 while there is none.
	firstSeq uint64
	// epoch is the holding of the execution's partition in which the state
	// was read, or last found to be the whole history (0: not held then).
	// A state cached in an earlier holding is read again: another
	// dispatcher may have written in between. One cached in a holding
	// that this one goes on from by retakes is used once its history is
	// found not to have moved (load).
	epoch uint64
	// memo is what the interpreter's decisions learned from state so far.
	memo *interp.Memo
	// startTrace is the trace context (traceparent, tracestate) of the
	// start command being applied, for its ExecutionStarted.
	startTrace [2]string
	// torn, when set, says an event was applied to state in place and
	// then not appended (the fold refused it part-way, or the append
	// failed), so state is not the history: it is the error for anything
	// done from it (errTorn, or the fold's refusal, permanent: reading the
	// history again would not change it), and state is not cached but
	// read again. state is x's own: the dispatcher holds an execution (handling.lock)
	// while it changes it; the interpreter's Input shares its steps only
	// while it takes a decision (Noted writes them), and what is kept of
	// it are copies of its members, never its steps.
	torn error
}

func (x *execState) subject() string { return bus.ExecutionSubject(x.workflow, x.id) }

// errTorn is execState.torn while an append is written, and after the
// write failed: a conflict, which makes the execution's handling read its
// history again. One value, not made at each append.
var errTorn = fmt.Errorf("a failed append left the execution's state apart from its history: %w", bus.ErrConflict)

// withExecution loads an execution (cache or stream) and runs fn; on a
// write conflict it drops what it knew, reloads and runs fn again. A
// damaged execution is not handed to fn: it returns a damagedError (see
// damage.go), or, for an event of a type this dispatcher does not know, an
// error that retries (a newer dispatcher may know it).
func (d *Dispatcher) withExecution(ctx context.Context, wf, id string, fn func(*execState) error) error {
	return d.withExecutionAs(ctx, wf, id, loading{}, fn)
}

// withDamagedExecution is withExecution that hands fn a damaged execution
// too (the repair action).
func (d *Dispatcher) withDamagedExecution(ctx context.Context, wf, id string, fn func(*execState) error) error {
	return d.withExecutionAs(ctx, wf, id, loading{damagedToo: true}, fn)
}

// loading says how withExecutionAs loads an execution.
type loading struct {
	// damagedToo hands fn a damaged execution too.
	damagedToo bool
	// probablyNew: the history is most likely empty, so the stream's
	// leader is asked for its last event before it is read (one small
	// request; a read asks for the first batch as well, which for an
	// empty history only costs).
	probablyNew bool
	// empty: the history is known to be empty (its id was just claimed),
	// so it is not read at all. Only for the first attempt (as
	// probablyNew): one that conflicts reads the history.
	empty bool
}

func (d *Dispatcher) withExecutionAs(ctx context.Context, wf, id string, how loading, fn func(*execState) error) error {
	if !events.ValidWorkflowName(wf) || !events.ValidExecutionID(id) {
		return permanentError{fmt.Errorf("invalid workflow %q or execution id %q", wf, id)}
	}
	defer d.handling.lock(id)()
	for attempt := 0; ; attempt++ {
		first := how
		if attempt > 0 { // the history changed underneath: read it
			first = loading{}
		}
		x, cached, err := d.load(ctx, wf, id, first)
		if err != nil {
			return err
		}
		x.current = !cached
		if x.state.Damaged != nil && !how.damagedToo {
			err := d.refuseDamaged(ctx, x, cached)
			if errors.Is(err, bus.ErrConflict) && attempt < 8 {
				d.cfg.Metrics.conflict()
				continue // repaired by another dispatcher since it was cached
			}
			return err
		}
		before := x.state.LastSeq
		err = fn(x)
		if err == nil && x.torn != nil { // fn went past a failed append: read the history and run it again
			err = x.torn
		}
		if err == nil && x.state.LastSeq > 0 && (!cached || x.state.LastSeq != before) {
			// Keep what fn built (a new execution's first events), so the
			// next message for it does not read its history again; a cached
			// state that changed is put again, for its size.
			d.mu.Lock()
			d.cache.put(id, x)
			d.mu.Unlock()
		}
		if err == nil && cached && x.state.LastSeq == before {
			// fn decided to change nothing (a stale or duplicate result, or
			// nothing to do) on the strength of a cached state. Another
			// dispatcher may have written since, even while this one holds
			// the execution's partition (a clear-lock routed by its own id,
			// a report or timer from a shared consumer, a holder that lost
			// its lease and has not noticed yet): the decision stands only
			// if the history has not moved.
			err = d.checkFresh(ctx, x)
		}
		if err == nil {
			if x.state.Status.Terminal() || (projections.Dormant(&x.state, projections.HibernateAfter) && !d.soon.keeps(id, x.state.Timers)) {
				// Ended: what may still come (a late report, a resume, the
				// expiry) is rare and reads the history again; keeping it
				// would hold its memory until 10,000 newer ones push it out.
				// Asleep for a while (hibernating): its timer, or a signal,
				// reads the history again; a sleeping execution holds no
				// memory, unless its timer is kept here to fire from
				// memory (brought by its notice: docs/adr/0019).
				d.evict(id)
			}
			return nil
		}
		d.evict(id) // whatever happened, the stream is the truth: reload next time
		if !errors.Is(err, bus.ErrConflict) || attempt >= 8 {
			return err
		}
		d.cfg.Metrics.conflict()
		zerolog.Ctx(ctx).Debug().Err(err).Msg("history changed underneath, reloading")
	}
}

// ensureCurrent makes sure x's state is the whole history before a write
// that the history's compare-and-set does not fence: a lock bucket write
// decided from a cached state that another dispatcher has gone past (the
// execution resumed meanwhile, say) would remove a live holder or add back
// a released request. A stale state returns bus.ErrConflict, and
// withExecution reloads and decides again. It costs one request, only
// when the state comes from the cache and nothing was appended since.
func (d *Dispatcher) ensureCurrent(ctx context.Context, x *execState) error {
	if x.current {
		return nil
	}
	if err := d.checkFresh(ctx, x); err != nil {
		return err
	}
	x.current = true
	return nil
}

// checkFresh returns bus.ErrConflict if the execution's history has events
// beyond the state x holds.
func (d *Dispatcher) checkFresh(ctx context.Context, x *execState) error {
	last, err := d.hist.LastSeq(ctx, x.subject())
	switch {
	case err != nil:
		return fmt.Errorf("check history of %s: %w", x.id, err)
	case last == x.state.LastSeq:
		return nil
	}
	return fmt.Errorf("cached state of %s is behind its history: %w", x.id, bus.ErrConflict)
}

// load returns the execution's state from the cache (cached = true) or
// folded from its history. Only executions that exist are cached, and a
// cached state is used only for the workflow it belongs to. how says
// whether the history is probably, or known to be, empty (loading).
func (d *Dispatcher) load(ctx context.Context, wf, id string, how loading) (x *execState, cached bool, err error) {
	x, epoch, ok, verify := d.cached(wf, id)
	switch {
	case ok && !verify:
		return x, true, nil
	case ok:
		// Cached before a retake: as good as a read if the history has not
		// moved since, read again if it has.
		err := d.checkFresh(ctx, x)
		if err == nil {
			x.epoch = epoch
			return x, false, nil
		}
		if !errors.Is(err, bus.ErrConflict) {
			return nil, false, err
		}
	}
	// Not cached, cached before this holding of its partition began
	// (another dispatcher may have written it in between), or cached
	// before a retake and behind the history.
	subject := bus.ExecutionSubject(wf, id)
	if how.probablyNew || how.empty {
		last := uint64(0)
		if !how.empty {
			if last, err = d.hist.LastSeq(ctx, subject); err != nil {
				return nil, false, err
			}
		}
		if last == 0 { // as a read would fold it
			return &execState{id: id, workflow: wf, state: projections.FoldQuarantined(id, nil), epoch: epoch, memo: &interp.Memo{}}, false, nil
		}
	}
	evs, err := d.hist.Read(ctx, subject, 0)
	if err != nil {
		return nil, false, err
	}
	// An event that does not fold marks the state damaged (damage.go).
	x = &execState{id: id, workflow: wf, state: projections.FoldQuarantined(id, evs), epoch: epoch, memo: &interp.Memo{}}
	if len(evs) == 0 {
		return x, false, nil
	}
	x.firstSeq = evs[0].Seq
	if x.state.Status != projections.StatusNone {
		// The fold began with the start (a damaged one is passed over, or
		// leaves the status none).
		// The definition of its start, or of the last move to another
		// version (definition_changed).
		for _, ev := range evs {
			var version int
			var raw json.RawMessage
			switch p := ev.Data.(type) {
			case *events.ExecutionStarted:
				version, raw = p.Version, p.Definition
			case *events.DefinitionChanged:
				version, raw = p.Version, p.Definition
			default:
				continue
			}
			def, err := d.pinned.get(wf, version, raw)
			if err != nil && x.state.Damaged == nil {
				x.state.Damaged = &projections.Damage{Seq: ev.Seq, EventID: ev.ID, Type: ev.Type,
					Reason: fmt.Sprintf("the pinned definition cannot be decoded: %v", errors.Unwrap(err))}
			}
			x.def = def
		}
	}
	d.mu.Lock()
	d.cache.put(id, x)
	d.mu.Unlock()
	return x, false, nil
}

// cached returns the execution's state if the cache holds it for
// workflow wf and the current holding of its partition (ok), and the
// epoch of that holding. verify says that the state was cached in a
// holding that the current one goes on from by retakes: it is good once
// its history is found not to have moved since (load does that).
//
// A retake (the lease expired under this dispatcher, starved or paused,
// and nobody held it) cannot tell whether another dispatcher held the
// partition in the stall, so what was cached may be behind; but reading
// every cached execution of the partition again at each retake made a
// dispatcher starved by executions of thousands of events spend its time
// reading them, renew later still, and retake more. One request for the
// history's last sequence settles it instead.
func (d *Dispatcher) cached(wf, id string) (x *execState, epoch uint64, ok, verify bool) {
	d.mu.Lock()
	x, ok = d.cache.get(id)
	d.mu.Unlock()
	epoch, since, held := d.holdsSince(id)
	switch {
	case !ok || x.workflow != wf:
		return x, epoch, false, false
	case !held || x.epoch == epoch:
		return x, epoch, true, false
	case since <= x.epoch && x.epoch < epoch:
		return x, epoch, true, true
	}
	return x, epoch, false, false
}

func (d *Dispatcher) evict(id string) {
	d.mu.Lock()
	d.cache.remove(id)
	d.mu.Unlock()
}

// append validates p against the fold, then appends it, recorded at at
// (zero: now), with the expected last subject sequence. p is final: the
// interpreter decided its content.
//
// The event is applied to x's state in place (x owns it: see torn), not
// to a copy: a copy of the steps per append made a step of a large
// execution cost more the more steps it had. An append that fails leaves
// x torn.
func (d *Dispatcher) append(ctx context.Context, x *execState, p events.Payload, at time.Time) error {
	if x.torn != nil {
		return x.torn
	}
	ev := d.event(x, p, at)
	before := x.state // its steps are next's: only its other members tell what was
	x.torn = errTorn  // until the append is done
	next, err := projections.ApplyOwned(x.state, ev)
	if err != nil {
		x.torn = permanentError{fmt.Errorf("refusing to append illegal event: %w", err)}
		return x.torn
	}
	seq, err := d.hist.Append(ctx, x.subject(), before.LastSeq, ev)
	d.cfg.Metrics.appendResult(err)
	if err != nil {
		return err
	}
	next.LastSeq = seq
	d.cfg.Metrics.appended(&before, &next, &ev, d.cfg.Now)
	d.traced(&before, &next, &ev)
	x.state, x.current, x.torn = next, true, nil
	if c, ok := p.(*events.DefinitionChanged); ok { // what follows runs the new version
		def, err := d.pinned.get(x.workflow, c.Version, c.Definition)
		if err != nil {
			return permanentError{err}
		}
		x.def, x.memo = def, &interp.Memo{}
	}
	if x.firstSeq == 0 {
		x.firstSeq = seq
	}
	if len(next.Locks) > 0 && !next.Status.Active() {
		return d.releaseEnded(ctx, x) // e.g. a force-cancel: its locks go with it
	}
	return nil
}

// event is the event that appends p to x's history, recorded at at
// (zero: now), conditioned on its last event.
func (d *Dispatcher) event(x *execState, p events.Payload, at time.Time) events.Event {
	if at.IsZero() {
		at = d.cfg.Now()
	}
	ev := events.New(d.cfg.Source, x.id, x.workflow, at, p)
	ev.PrevSeq = x.state.LastSeq
	d.traceEvent(x, &ev)
	return ev
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
