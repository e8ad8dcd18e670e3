package visibility

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/workflow"
)

// Definitions reads workflow versions (a catalog.Store): the feed reads
// each version's search attributes there.
type Definitions interface {
	Get(ctx context.Context, name string, version int) (catalog.Record, error)
}

// Feed keeps a Store up to date with the executions bucket: it watches
// the bucket from the revision the store has reached (each update is a
// read model's latest state; a deletion or purge removes its row) and
// writes what comes in batches, each with the revision it reaches, in one
// transaction.
type Feed struct {
	// BatchMax bounds the updates written in one transaction and
	// BatchWait how long the first of a batch waits for others. Defaults
	// 1000 and 50 ms: under load a transaction carries many updates; alone,
	// an update is listed within BatchWait. Set before Run.
	BatchMax  int
	BatchWait time.Duration

	store Store
	kv    jetstream.KeyValue
	js    jetstream.JetStream
	defs  Definitions
	log   zerolog.Logger

	// live says the index has applied every update there was once since
	// it was last started or reset (the watch's initial values).
	live atomic.Bool
	// resets asks Run to drop the index and feed it again.
	resets chan chan error

	// applied is the revision the store has reached, received the last
	// one the watch delivered, and drained says nothing was pending
	// after it when it was delivered. changed is closed (and made anew)
	// at each write; hurry asks Run to write as soon as it has received
	// a revision (WaitFor).
	applied, received atomic.Uint64
	drained           atomic.Bool
	mu                sync.Mutex
	changed           chan struct{}
	hurry             chan uint64

	// attrs caches each workflow version's search attributes: versions
	// never change. Run's goroutine only.
	attrs map[versionKey][]workflow.SearchAttribute
}

type versionKey struct {
	name    string
	version int
}

// maxCachedVersions bounds the attrs cache: past it, it starts over.
const maxCachedVersions = 4096

// NewFeed returns a feed of store from the executions bucket of js,
// reading search attributes from defs.
func NewFeed(ctx context.Context, store Store, js jetstream.JetStream, defs Definitions, log zerolog.Logger) (*Feed, error) {
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return nil, fmt.Errorf("visibility: open executions bucket: %w", err)
	}
	return &Feed{store: store, kv: kv, js: js, defs: defs, log: log, resets: make(chan chan error),
		changed: make(chan struct{}), hurry: make(chan uint64, 1), attrs: map[versionKey][]workflow.SearchAttribute{}}, nil
}

// Store is the store the feed writes.
func (f *Feed) Store() Store { return f.store }

// Live reports whether the index has caught up with the bucket since it
// was started or last reset: until then it misses executions (or, resumed
// from a stored position, shows them as they were when the api stopped).
func (f *Feed) Live() bool { return f.live.Load() }

// Revision is the bucket revision the index has reached.
func (f *Feed) Revision() uint64 { return f.applied.Load() }

// WaitFor waits until the index has applied bucket revision rev (the
// bucket's last, when a list is asked for), so that a list shows what the
// read models held when it was asked, as a list read from them did. A
// revision the watch will never deliver (a deletion's marker the janitor
// removed since) is not waited for.
func (f *Feed) WaitFor(ctx context.Context, rev uint64) error {
	for {
		f.mu.Lock()
		changed := f.changed
		f.mu.Unlock()
		applied := f.applied.Load()
		if applied >= rev {
			return nil
		}
		if f.drained.Load() && f.received.Load() == applied {
			// Everything delivered is written and nothing was pending:
			// rev is either about to be delivered or gone.
			m, err := bus.LeaderGet(ctx, f.js, bus.BucketStream(bus.BucketExecutions),
				bus.MsgQuery{Seq: applied + 1, NextBySubject: bus.BucketSubject(bus.BucketExecutions, ">")})
			if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Sequence > rev) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		select {
		case f.hurry <- rev:
		default:
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // a delivery may have drained the watch
		}
	}
}

// wrote records that the store has reached rev, for WaitFor.
func (f *Feed) wrote(rev uint64) {
	f.applied.Store(rev)
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// resumeWithin is how recently the index must have been live to resume
// from its stored revision: the janitor removes the markers of deleted
// read models once they are 30 minutes old (markerAge), and an index
// that was away longer may have missed a deletion whose marker is gone.
const resumeWithin = 20 * time.Minute

// liveAhead is how far in the future (by this clock) the time an index
// was last live may be for it to be resumed: clocks differ a little.
const liveAhead = time.Minute

// liveEvery is how often a live index records that it is, when nothing
// else is written.
const liveEvery = time.Minute

// errReset ends a watch that Rebuild dropped the index under.
var errReset = errors.New("visibility: index reset")

// Run feeds the store until ctx ends. A watch that ends (NATS away, the
// bucket gone) is started again from the stored revision.
func (f *Feed) Run(ctx context.Context) error {
	for {
		err := f.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errReset) {
			continue
		}
		if errors.Is(err, ErrReset) {
			// Another api sharing the store dropped the index: go on from
			// the position it has now.
			f.log.Info().Msg("visibility: another api reset the shared index; feeding it from where it stands now")
			f.live.Store(false)
			continue
		}
		f.log.Warn().Err(err).Msg("visibility: feeding the index stopped; starting again from the stored revision in a second")
		select {
		case <-ctx.Done():
			return nil
		case done := <-f.resets:
			done <- f.reset(ctx)
		case <-time.After(time.Second):
		}
	}
}

// Rebuild drops the index and has Run feed it again from the bucket's
// start. It returns once the index is empty; Live is false until it has
// caught up again.
func (f *Feed) Rebuild(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case f.resets <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *Feed) reset(ctx context.Context) error {
	f.live.Store(false)
	f.drained.Store(false)
	f.received.Store(0)
	f.wrote(0)
	if err := f.store.Reset(ctx); err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	f.log.Info().Msg("visibility: index dropped; feeding it again from the read models")
	return nil
}

// start decides where to watch from: the stored position, or, when that
// cannot be trusted, the bucket's start (after dropping the index).
func (f *Feed) start(ctx context.Context) (Position, error) {
	pos, err := f.store.Position(ctx)
	if err != nil {
		return pos, err
	}
	st, err := f.kv.Status(ctx)
	if err != nil {
		return pos, fmt.Errorf("visibility: read the bucket's state: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return pos, fmt.Errorf("visibility: unexpected bucket status %T", st)
	}
	info := bs.StreamInfo()
	created, last := info.Created.UTC(), info.State.LastSeq
	why := ""
	switch {
	case pos.Revision == 0:
		n, err := f.store.Count(ctx)
		if err != nil {
			return pos, err
		}
		if n == 0 {
			return Position{Stream: created}, nil // empty: nothing to drop
		}
		why = "rows without a position"
	case !pos.Stream.Equal(created):
		why = "the bucket was made again"
	case pos.Revision > last:
		why = "the bucket is behind the index (restored from a backup?)"
	case time.Until(pos.LiveAt) > liveAhead:
		// Written by a clock ahead of this one (since set right, or
		// another api's): it never goes back, so it says nothing of how
		// long the index was away.
		why = "last live " + time.Until(pos.LiveAt).Round(time.Second).String() + " in the future (a clock ahead?)"
	case time.Since(pos.LiveAt) > resumeWithin:
		why = "not live for " + time.Since(pos.LiveAt).Round(time.Second).String() + ": deletions may have been missed"
	default:
		f.log.Info().Uint64("revision", pos.Revision).Uint64("bucket_revision", last).Msg("visibility: resuming the index")
		return pos, nil
	}
	f.log.Info().Str("reason", why).Uint64("revision", pos.Revision).Uint64("bucket_revision", last).
		Msg("visibility: feeding the index again from the read models")
	if err := f.store.Reset(ctx); err != nil {
		return pos, fmt.Errorf("visibility: reset: %w", err)
	}
	return Position{Stream: created}, nil
}

// follow watches the bucket from where the store stands and writes what
// comes, until the watch ends, ctx ends or Rebuild resets the index.
func (f *Feed) follow(ctx context.Context) error {
	pos, err := f.start(ctx)
	if err != nil {
		return err
	}
	f.drained.Store(false)
	f.received.Store(pos.Revision)
	f.wrote(pos.Revision)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opts []jetstream.WatchOpt
	if pos.Revision > 0 {
		opts = append(opts, jetstream.ResumeFromRevision(pos.Revision+1))
	}
	w, err := f.kv.WatchAll(wctx, opts...)
	if err != nil {
		return fmt.Errorf("visibility: watch the read models: %w", err)
	}
	defer func() { _ = w.Stop() }()

	batchMax, batchWait := f.BatchMax, f.BatchWait
	if batchMax <= 0 {
		batchMax = 1000
	}
	if batchWait <= 0 {
		batchWait = 50 * time.Millisecond
	}
	var b Batch
	pending := false // b holds updates, or a position to record
	var hurry uint64 // a list waits for this revision: write it once received
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	defer wait.Stop()
	tick := time.NewTicker(liveEvery)
	defer tick.Stop()
	began := time.Now()
	flush := func() error {
		wait.Stop()
		if !pending {
			return nil
		}
		b.Position = pos
		if err := f.store.Apply(ctx, b); err != nil {
			return fmt.Errorf("visibility: write %d rows: %w", len(b.Puts)+len(b.Deletes), err)
		}
		b, pending = Batch{}, false
		f.wrote(pos.Revision)
		if hurry <= pos.Revision {
			hurry = 0
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case done := <-f.resets:
			cancel()
			done <- f.reset(ctx)
			return errReset
		case <-tick.C:
			if f.live.Load() {
				pos.LiveAt, pending = time.Now(), true
				if err := flush(); err != nil {
					return err
				}
			}
		case <-wait.C:
			if err := flush(); err != nil {
				return err
			}
		case rev := <-f.hurry:
			hurry = max(hurry, rev)
			if pending && pos.Revision >= hurry {
				if err := flush(); err != nil {
					return err
				}
			}
		case e, ok := <-w.Updates():
			if !ok {
				_ = flush()
				return errors.New("visibility: the watch was closed")
			}
			if e == nil { // every update there was is in: the index is live once they are written
				f.drained.Store(true)
				pos.LiveAt, pending = time.Now(), true
				if err := flush(); err != nil {
					return err
				}
				if !f.live.Swap(true) {
					n, _ := f.store.Count(ctx)
					f.log.Info().Int("rows", n).Uint64("revision", pos.Revision).Dur("took", time.Since(began)).Msg("visibility: index live")
				}
				continue
			}
			if err := f.add(ctx, &b, e); err != nil {
				return err
			}
			pos.Revision = e.Revision()
			f.received.Store(pos.Revision)
			f.drained.Store(e.Delta() == 0)
			if f.live.Load() {
				pos.LiveAt = time.Now()
			}
			if !pending {
				wait.Reset(batchWait)
			}
			pending = true
			if len(b.Puts)+len(b.Deletes) >= batchMax || (hurry > 0 && pos.Revision >= hurry) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
}

// add puts the row of an update in b (or its deletion).
func (f *Feed) add(ctx context.Context, b *Batch, e jetstream.KeyValueEntry) error {
	if e.Operation() != jetstream.KeyValuePut {
		b.Deletes = append(b.Deletes, Delete{ID: e.Key(), Rev: e.Revision()})
		return nil
	}
	m, err := decodeModel(e.Value())
	if err != nil {
		// The list never showed a read model it cannot read either.
		f.log.Warn().Err(err).Str("execution_id", e.Key()).Uint64("revision", e.Revision()).Msg("visibility: read model left out")
		b.Deletes = append(b.Deletes, Delete{ID: e.Key(), Rev: e.Revision()})
		return nil
	}
	m.ID = e.Key() // the key is the id, whatever a hand-written model says
	attrs, err := f.searchAttributes(ctx, m.Workflow, m.Version)
	if err != nil {
		return err
	}
	r := m.row(attrs)
	r.Rev = e.Revision()
	b.Puts = append(b.Puts, r)
	return nil
}

// searchAttributes returns the search attributes of a workflow version
// (none for one that is not registered: a read model written by hand).
func (f *Feed) searchAttributes(ctx context.Context, name string, version int) ([]workflow.SearchAttribute, error) {
	k := versionKey{name, version}
	if a, ok := f.attrs[k]; ok {
		return a, nil
	}
	var attrs []workflow.SearchAttribute
	if name != "" && version > 0 {
		rec, err := f.defs.Get(ctx, name, version)
		switch {
		case errors.Is(err, catalog.ErrNotFound):
		case err != nil:
			return nil, fmt.Errorf("visibility: read the search attributes of %s v%d: %w", name, version, err)
		default:
			attrs = rec.Definition.SearchAttributeList()
		}
	}
	if len(f.attrs) >= maxCachedVersions {
		clear(f.attrs)
	}
	f.attrs[k] = attrs
	return attrs, nil
}
