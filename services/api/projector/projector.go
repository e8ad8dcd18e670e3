// Package projector keeps the execution read models: it folds the events
// stream into one KV entry per execution with revision checks. One durable
// consumer is shared by all api replicas; a pinned priority group makes
// one replica at a time receive events, in stream order. Read models can
// be rebuilt from any stream sequence with [Rebuild]. Input members the
// workflow's input schema marks writeOnly, and their values wherever they
// appear, are stored redacted (package redact).
package projector

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
)

// Consumer is the projector's durable consumer; Group its pinned priority group.
const (
	Consumer = bus.ConsumerProjector
	Group    = bus.ProjectorGroup
)

// Projector folds events into read models.
type Projector struct {
	// BindOnly: the consumer exists (made by the bootstrap) and this
	// projector may not create or change it. Set before Run.
	BindOnly bool
	// MaxModel is the largest read model it stores, in bytes (0: 900 KiB;
	// never more than the server's message size allows). Set before Run.
	MaxModel int
	// MaxCache bounds the bytes of the execution states it keeps between
	// batches, as estimated from their content (0: DefaultCacheBytes).
	// Set before Run.
	MaxCache int
	// Coalesce is how long, under load, the projector gathers events
	// before it projects them, so that a read model is written once for
	// several of its execution's events: what it saves is a write, and
	// its marshalling, per event; the read models lag that much more
	// behind the events while it lasts. It gathers while events come at
	// busyBatch a Coalesce or more, or their models weigh busyBytes (a
	// busy system, one execution's steps back to back, a large model
	// rewritten often: pace), and after a batch that found busyBatch
	// events waiting or whose models took busyBytes (a backlog, a
	// fan-out's burst) until the pace is next judged; otherwise (a few
	// executions now and then) events are gathered for Gather.
	// 0: DefaultCoalesce; negative: never. Set before Run.
	Coalesce time.Duration
	// Gather is how long, when not under load (events come slower than
	// Coalesce gathers at), the projector waits after an event for the
	// next ones before it projects them: an execution's steps a moment
	// apart are then one read model written, encoded and indexed, not
	// one each beside the work of the next step. The read models lag
	// that much more, and the time a batch of what came takes to
	// project. The events it brings are no backlog (see next). 0:
	// DefaultGather; negative: never (every event projected as it comes).
	// Set before Run.
	Gather time.Duration
	// OnWrite, when set, is told, for each read model written with new
	// events, how long the oldest of them waited for it: now minus that
	// event's time (the recording dispatcher's clock; 0 if that is ahead
	// of this one's). Set before Run.
	OnWrite func(lag time.Duration)

	// events and writes count the events projected and the read models
	// written since the projector started (Stats), wrote their bytes;
	// weighed is, for each model written, its size times the events it
	// was written for: what writing it at every event would have taken,
	// whether it was or not (pace).
	events, writes, wrote, weighed atomic.Uint64
	// bound says Run consumes the events (Bound); gathering that it
	// gathers the events of a Coalesce for its next batch, lastBatch
	// (Unix nanoseconds) when its last batch ended (Stats).
	bound, gathering atomic.Bool
	lastBatch        atomic.Int64

	js   jetstream.JetStream
	hist *history.Store
	kv   jetstream.KeyValue
	ids  *claim.Store
	log  zerolog.Logger
	// cacheMu guards cache and cacheBytes: a batch projects several
	// executions at once.
	cacheMu sync.Mutex
	cache   map[string]entry
	// cacheBytes is the sum of the cached entries' sizes.
	cacheBytes int
	// failures counts the consecutive failed projections of executions
	// (Run's goroutine only); parked are the executions set aside, tried
	// again by Run's retrying goroutine.
	failures map[string]int
	mu       sync.Mutex // guards parked
	parked   map[string]*Parked
	// refolds bounds the histories read at once to fold an execution
	// again (maxRefolds): the projections of a batch run several at once,
	// and each such read holds a whole history.
	refolds chan struct{}
}

const maxRefolds = 2

// Parked is an execution whose read model could not be written: its
// events are acknowledged (so they do not hold up every other
// execution's), and it is projected again from its history, on its own,
// with a growing delay, until it can be.
type Parked struct {
	apiv1.Parked
	subject string
}

// parkAfter is how many failed projections in a row park an execution
// (one, if the read model cannot fit in a message; never while NATS is
// away). retriesPerTick bounds the parked projections tried a second.
const (
	parkAfter      = 5
	retriesPerTick = 2
)

type entry struct {
	state projections.Execution
	rev   uint64
	// inputs hides the execution's writeOnly input values in the stored
	// read model (state keeps them: it is only ever in memory); known
	// says it was read from the execution's start.
	inputs redact.Inputs
	known  bool
	// enc is the encoding of the stored model's step table, instance by
	// instance (encode.go).
	enc *stepCache
	// size estimates the bytes the entry holds (projections.SizeEstimate).
	size int
}

// cacheMax bounds the states kept between batches by count, and
// MaxCache by bytes: past either, the cache lets go of states until it
// is down to three quarters of both.
const cacheMax = 20000

// DefaultCacheBytes is the default MaxCache, 64 MiB: twice what the
// 20,000 states of small executions that were its only bound held, since
// the state of a large execution (more than cacheStepsOver steps) holds
// its steps' encodings too: 200 running executions of 200 steps held
// about 34 MiB, and a cache too small for them reads and decodes a model
// at every batch.
const DefaultCacheBytes = 64 << 20

// entryOverhead is what a cache entry costs besides its state: the map
// slot with the key, the revision and the redaction rules.
const entryOverhead = 96

// Stats are what a projector has done since it started.
type Stats struct {
	// Events counts the events projected (each delivery of one: an event
	// delivered again counts again); Writes the read models written.
	Events, Writes uint64
	// Gathering: the projector gathers the events of a Coalesce for its
	// next batch (under load; otherwise it waits a Gather), from the batch
	// that found the events coming fast to the one that found them slow
	// or came after a Coalesce with nothing to project (not while it
	// waits that long for events: a gathering's batches end a Coalesce
	// apart, or a little more).
	Gathering bool
}

// Bound reports whether Run consumes the events: its consumer is bound
// (whether this api or another projects them, one at a time).
func (p *Projector) Bound() bool { return p.bound.Load() }

// Stats returns what p has done so far.
func (p *Projector) Stats() Stats {
	gathering := p.gathering.Load() && time.Since(time.Unix(0, p.lastBatch.Load())) < 2*p.coalesce()
	return Stats{Events: p.events.Load(), Writes: p.writes.Load(), Gathering: gathering}
}

// take returns id's cached state, if any, and drops it from the cache:
// its caller owns it (and applies events to it in place) until it
// remembers a state for id again. One execution is projected by one
// goroutine at a time (projectAll), so nothing else wants it meanwhile.
func (p *Projector) take(id string) (entry, bool) {
	p.cacheMu.Lock()
	defer p.cacheMu.Unlock()
	e, ok := p.cache[id]
	if ok {
		p.forgetLocked(id)
	}
	return e, ok
}

// remember keeps e as id's cached state, and lets other states go while
// the cache is over its bounds. Which ones is the map's order: any state
// let go is read again from the read model when its next event comes, so
// that costs one read, not correctness.
func (p *Projector) remember(id string, e entry) {
	p.cacheMu.Lock()
	defer p.cacheMu.Unlock()
	p.forgetLocked(id)
	e.size = entryOverhead + len(id) + projections.SizeEstimate(&e.state) + e.enc.size()
	p.cache[id] = e
	p.cacheBytes += e.size
	maxBytes := cmp.Or(p.MaxCache, DefaultCacheBytes)
	if len(p.cache) <= cacheMax && p.cacheBytes <= maxBytes {
		return
	}
	for k := range p.cache {
		if len(p.cache) <= cacheMax*3/4 && p.cacheBytes <= maxBytes/4*3 {
			break
		}
		if k != id {
			p.forgetLocked(k)
		}
	}
}

// forget drops id's cached state, if any.
func (p *Projector) forget(id string) {
	p.cacheMu.Lock()
	defer p.cacheMu.Unlock()
	p.forgetLocked(id)
}

func (p *Projector) forgetLocked(id string) {
	if e, ok := p.cache[id]; ok {
		p.cacheBytes -= e.size
		delete(p.cache, id)
	}
}

// New binds to the read-model bucket.
func New(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*Projector, error) {
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return nil, fmt.Errorf("open executions bucket: %w", err)
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	hist, err := history.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	return &Projector{js: js, hist: hist, kv: kv, ids: ids, log: log, cache: map[string]entry{},
		failures: map[string]int{}, parked: map[string]*Parked{}, refolds: make(chan struct{}, maxRefolds)}, nil
}

// Run projects events until ctx ends. Messages are handed from the
// consumer to one batching goroutine, which takes whatever has arrived
// (up to gatherMax events and gatherBytes; under load, what arrives
// within Coalesce) and projects
// the batch's executions several at once, writing each one's read model
// once per batch, so the cost per event falls as load rises.
func (p *Projector) Run(ctx context.Context) error {
	// Parked projections are tried again beside the events of the others,
	// not between them: each reads a whole history.
	retrying := make(chan struct{})
	defer func() { <-retrying }()
	go func() {
		defer close(retrying)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				p.retryParked(ctx)
			}
		}
	}()
	for {
		err := p.consume(ctx)
		if !errors.Is(err, errConsumerGone) || ctx.Err() != nil {
			return err
		}
		// Deleted (by hand, or with its stream), or stopped by the
		// server: bound again (made again unless BindOnly, as at start;
		// with BindOnly, waiting for the bootstrap, with a warning), not
		// left to wait for events that never come while /readyz says the
		// projector runs.
		p.log.Warn().Str("consumer", bus.ConsumerProjector).Msg("the projector's consumer stopped delivering (deleted?): binding it again")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// errConsumerGone: the projector's consumer stopped delivering for good
// (nats.go ends a Consume whose consumer was deleted).
var errConsumerGone = errors.New("projector: the events consumer is gone")

// consume binds the projector's consumer and projects what it delivers
// until ctx ends (nil) or the consumer stops delivering (errConsumerGone).
func (p *Projector) consume(ctx context.Context) error {
	cons, err := bus.Bind(ctx, p.js, !p.BindOnly, bus.ProjectorConsumerSpec(), func(err error) {
		p.log.Warn().Err(err).Msg("waiting for the bootstrap")
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not an error
		}
		return err
	}
	inbox := make(chan jetstream.Msg, 2*batchMax)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case inbox <- m:
		case <-ctx.Done():
			_ = m.Nak()
		}
	}, bus.Consume(jetstream.PullPriorityGroup(Group), jetstream.PullMaxMessages(batchMax),
		// The server keeps the pin only while pulls come: an idle pull
		// must be renewed well within the pin's TTL (5 s), or the pin
		// moves to another api between two pulls.
		jetstream.PullExpiry(bus.ProjectorPinnedTTL/2),
		// Deleted between two pulls, it would be pulled from for ever.
		bus.StopIfGone(p.js, bus.ProjectorConsumerSpec(), nil))...)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not an error
		}
		return fmt.Errorf("consume events: %w", err)
	}
	p.bound.Store(true)
	defer func() {
		p.bound.Store(false)
		p.gathering.Store(false)
		cc.Stop()
		<-cc.Closed()
		// Handed back, so that the next projector has them at once rather
		// than after the ack wait.
		for {
			select {
			case m := <-inbox:
				_ = m.Nak()
			default:
				return
			}
		}
	}()
	batch := make([]jetstream.Msg, 0, gatherMax)
	g := newGatherer()
	var began time.Time
	busy := false
	var judged pace
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-cc.Closed():
			return errConsumerGone
		case m := <-inbox:
			batch = append(batch[:0], m)
		}
		if judged.idle(time.Now(), p.coalesce()) {
			busy = false // nothing came for a Coalesce: whatever came before, not fast
		}
		var queued int
		batch, queued = p.next(ctx, g, inbox, batch, busy, began)
		began = time.Now()
		wrote, weighed := p.wrote.Load(), p.weighed.Load()
		p.projectBatch(ctx, batch)
		wrote, weighed = p.wrote.Load()-wrote, p.weighed.Load()-weighed
		ended := judged.add(time.Now(), p.coalesce(), len(batch), weighed)
		busy = nextBusy(busy, ended, judged.fast, queued, len(batch), wrote)
		p.gathering.Store(busy && p.coalesce() > 0)
		p.lastBatch.Store(time.Now().UnixNano())
		clear(batch) // projected: not kept alive by the array until overwritten
	}
}

// next gathers the batch that begins with batch's one message: what is
// queued, then, under load (busy), what comes until a Coalesce after
// began (when the last batch began), so that each read model is written
// once for several of its events; otherwise what comes within a Gather
// (an execution's next steps, a moment apart). queued is how many of them
// were there without waiting: what came while the last batch was
// projected.
func (p *Projector) next(ctx context.Context, g *gatherer, inbox <-chan jetstream.Msg, batch []jetstream.Msg,
	busy bool, began time.Time) (_ []jetstream.Msg, queued int) {
	batch = g.fill(ctx, inbox, batch, time.Time{})
	queued = len(batch)
	if busy {
		return g.fill(ctx, inbox, batch, began.Add(p.coalesce())), queued
	}
	if d := p.gather(); d > 0 {
		batch = g.fill(ctx, inbox, batch, time.Now().Add(d))
	}
	return batch, queued
}

// gatherer fills batches from the consumer's inbox.
type gatherer struct {
	timer *time.Timer
	// max and bytes bound a batch (gatherMax and gatherBytes).
	max, bytes int
	// waiting, when set (tests), is called as fill begins to wait for
	// the next message.
	waiting func()
}

func newGatherer() *gatherer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &gatherer{timer: t, max: gatherMax, bytes: gatherBytes}
}

// fill adds to batch (which holds one message or more) what inbox has,
// and what it brings until until (none: what it has now), to at most
// g.max messages or g.bytes; the last message may pass the bytes.
func (g *gatherer) fill(ctx context.Context, inbox <-chan jetstream.Msg, batch []jetstream.Msg, until time.Time) []jetstream.Msg {
	size := 0
	for _, m := range batch {
		size += msgSize(m)
	}
	for len(batch) < g.max && size < g.bytes {
		select {
		case m := <-inbox:
			batch, size = append(batch, m), size+msgSize(m)
			continue
		default:
		}
		wait := time.Until(until)
		if wait <= 0 {
			return batch
		}
		if g.waiting != nil {
			g.waiting()
		}
		g.timer.Reset(wait)
		select {
		case m := <-inbox:
			batch, size = append(batch, m), size+msgSize(m)
			if !g.timer.Stop() {
				<-g.timer.C
			}
		case <-g.timer.C:
			return batch
		case <-ctx.Done():
			g.timer.Stop()
			return batch
		}
	}
	return batch
}

// busyBatch is the batch, and busyBytes the bytes of read models its
// writes took, either of which makes the projector gather the events of
// Coalesce before its next one. The bytes are what large executions
// cost: a model is written whole, and a step of an execution of 3,000
// instances (a goto loop of 1,000 rounds) rewrote its 850 KiB model with
// each batch of a few events, for every few milliseconds of the loop.
const (
	busyBatch = 64
	busyBytes = 256 << 10
)

// isBusy says whether a batch of this many events, whose read models
// took wrote bytes, makes the projector gather the next one.
func isBusy(events int, wrote uint64) bool {
	return events >= busyBatch || wrote >= busyBytes
}

// busyAfter says whether a batch of n events, queued of which were
// waiting when it began, whose read models took wrote bytes, makes the
// projector gather the next one for a Coalesce whatever the pace: a
// backlog (the projector falling behind) or large models. It is judged on
// the queued events and their share of the bytes: the events a Gather
// brought are no load (a few executions at once would otherwise make
// batches of 64 and hold every model for a Coalesce).
func busyAfter(queued, n int, wrote uint64) bool {
	return isBusy(queued, wrote*uint64(queued)/uint64(max(n, 1)))
}

// nextBusy says whether the projector gathers a Coalesce for its next
// batch, after one of n events (queued of them waiting when it began)
// whose models took wrote bytes, gathered or not (busy); judged says
// whether the batch ended a period of pace, and fast how that was
// judged. Gathering, it goes on until a period is judged slow: what came
// while its batch was projected is no backlog, the batch being a
// Coalesce's, and a batch that ended early (gatherMax) or a backlog's
// first Coalesce is not a judgment. Not gathering, it begins when the
// pace is judged fast, or on a backlog or large models (busyAfter).
func nextBusy(busy, judged, fast bool, queued, n int, wrote uint64) bool {
	if busy {
		return !judged || fast
	}
	return fast || busyAfter(queued, n, wrote)
}

// pace judges, a Coalesce at a time, whether the events come fast
// enough for gathering them a Coalesce at a time to be worth the read
// models' lag: busyBatch events in a Coalesce, or events whose models
// weigh busyBytes (a model's size once for each of its events: a large
// model rewritten often), scaled to a Coalesce (a batch after an idle
// while is not a period's); it stays so down to three quarters of
// either, and a Coalesce with nothing projected ends it (idle). Measured
// (docs/benchmarks.md), gathering at such a pace saves writes where an
// execution has several events in a Coalesce, and even where it has one
// (each model written once either way) it gathers the read side's work
// into one burst a Coalesce instead of a batch every few milliseconds
// beside the steps' own: one-step executions one at a time took 20%
// longer from start to end with the projector waiting only a Gather.
// Judged on the pace in either mode, so that the mode does not depend on
// history: before, only a backlog began gathering (a fan-out, a moment's
// pause of a busy machine), and the pace then kept it on, so the same
// load had its models 5 ms or 200 ms behind depending on what had come
// before.
type pace struct {
	// since is when the period began, last when the last batch counted
	// ended.
	since, last time.Time
	events      int
	weighed     uint64
	// fast: the last period's pace was worth a Coalesce.
	fast bool
}

// idle says whether nothing was projected for a period before now (a
// batch begins), and if so forgets the period's events and is no longer
// fast: what came before the pause, however much (a backlog projected
// at once, then nothing), is not the pace.
func (s *pace) idle(now time.Time, period time.Duration) bool {
	if s.last.IsZero() || now.Sub(s.last) < period {
		return false
	}
	*s = pace{}
	return true
}

// add counts a batch of events whose models weighed weighed bytes
// (each model's size once for each of its events: the same whether they
// were gathered or not, where the bytes written are not), projected by
// now, and judges the period once it is period long; it says whether it
// judged.
func (s *pace) add(now time.Time, period time.Duration, events int, weighed uint64) bool {
	if period <= 0 {
		s.fast = false
		return true
	}
	if s.since.IsZero() {
		s.since = now
	}
	s.last = now
	s.events += events
	s.weighed += weighed
	elapsed := now.Sub(s.since)
	if elapsed < period {
		return false
	}
	scale := float64(period) / float64(elapsed)
	n, b := float64(s.events)*scale, float64(s.weighed)*scale
	enough := func(part float64) bool {
		return n >= part*busyBatch || b >= part*busyBytes
	}
	s.fast = enough(1) || (s.fast && enough(0.75))
	s.since, s.events, s.weighed = now, 0, 0
	return true
}

// DefaultCoalesce is the default Coalesce.
const DefaultCoalesce = 200 * time.Millisecond

// DefaultGather is the default Gather.
const DefaultGather = 5 * time.Millisecond

func (p *Projector) gather() time.Duration {
	if p.Gather < 0 {
		return 0
	}
	return cmp.Or(p.Gather, DefaultGather)
}

func (p *Projector) coalesce() time.Duration {
	if p.Coalesce < 0 {
		return 0
	}
	return cmp.Or(p.Coalesce, DefaultCoalesce)
}

// batchMax is the most events one pull asks for.
const batchMax = 1024

// gatherMax and gatherBytes bound a batch (several pulls', under load):
// the events of 200 ms under load were more than one pull's 1,024 at
// 9,000 steps a second (about 2,000), so a read model was written for
// fewer of its events than Coalesce allows. gatherMax stays below the
// consumer's MaxAckPending (4,096), so that the next events are on
// their way while a full batch is projected; the bytes bound what a
// batch of large events holds in memory (the message that passes them
// is the last taken).
const (
	gatherMax   = 3072
	gatherBytes = 16 << 20
)

// msgSize is what a message holds in memory, near enough.
func msgSize(m jetstream.Msg) int {
	n := len(m.Data()) + len(m.Subject())
	for k, vs := range m.Headers() {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

// group is one execution's events within a batch, in stream order (see
// inOrder).
type group struct {
	subject      string
	workflow, id string // of the subject
	msgs         []jetstream.Msg
	evs          []events.Event
}

// inOrder sorts g's events, and their messages with them, by stream
// sequence. A batch holds them in the order they were delivered, and
// messages redelivered after a projector died can come back in another
// order than the stream's: folded as they came, the last one delivered
// (not the last of the history) would end the fold, and the events after
// it, acknowledged with it, would never be projected.
func (g *group) inOrder() { sort.Stable(byStreamSeq{g}) }

type byStreamSeq struct{ *group }

func (s byStreamSeq) Len() int           { return len(s.evs) }
func (s byStreamSeq) Less(i, j int) bool { return s.evs[i].Seq < s.evs[j].Seq }
func (s byStreamSeq) Swap(i, j int) {
	s.evs[i], s.evs[j] = s.evs[j], s.evs[i]
	s.msgs[i], s.msgs[j] = s.msgs[j], s.msgs[i]
}

func (p *Projector) projectBatch(ctx context.Context, batch []jetstream.Msg) {
	groups := map[string]*group{}
	var order []string
	for _, m := range batch {
		md, err := m.Metadata()
		if err != nil {
			_ = m.Term()
			continue
		}
		ev, err := bus.Decode(m.Headers(), m.Data())
		if err != nil && !errors.Is(err, events.ErrUnknownType) {
			// No valid event: its execution's read model shows the damage.
			ev = bus.InvalidEvent(m.Subject(), m.Headers(), err)
		}
		// Grouped by the history the message is in, whatever it says of
		// itself: an event naming another execution damages this one.
		wf, id, ok := bus.ParseExecutionSubject(m.Subject())
		if !ok {
			p.log.Error().Uint64("seq", md.Sequence.Stream).Str("subject", m.Subject()).
				Msg("skip a message that is in no execution's history")
			_ = m.Ack()
			continue
		}
		ev.Seq = md.Sequence.Stream
		g, ok := groups[m.Subject()]
		if !ok {
			g = &group{subject: m.Subject(), workflow: wf, id: id}
			groups[m.Subject()] = g
			order = append(order, m.Subject())
		}
		g.msgs, g.evs = append(g.msgs, m), append(g.evs, ev)
	}
	var jobs []*projection
	for _, subject := range order {
		g := groups[subject]
		if ctx.Err() != nil { // stopping: the rest is delivered again, to whoever projects next
			for _, m := range g.msgs {
				_ = m.Nak()
			}
			continue
		}
		g.inOrder()
		if p.isParked(g.id) {
			// Projected again from its history when its turn comes.
			for _, m := range g.msgs {
				_ = m.Ack()
			}
			continue
		}
		jobs = append(jobs, &projection{g: g})
	}
	p.projectAll(ctx, jobs)
	for _, j := range jobs {
		g, id, err := j.g, j.g.id, j.err
		switch {
		case err == nil:
			delete(p.failures, id)
			continue // acknowledged as soon as projected
		case ctx.Err() != nil:
		default:
			p.failures[id]++
			if errors.Is(err, nats.ErrMaxPayload) || (p.failures[id] >= parkAfter && !bus.Transient(err)) {
				p.park(ctx, g, err)
				err = nil // acknowledged: the other executions' events go on (an outage, transient, parks nothing)
			} else {
				p.log.Warn().Err(err).Str("execution_id", id).Msg("project events, will be redelivered")
			}
		}
		for _, m := range g.msgs {
			if err == nil {
				_ = m.Ack()
			} else {
				_ = m.NakWithDelay(500 * time.Millisecond)
			}
		}
	}
}

// projection is one group of a batch to project, and how that went.
type projection struct {
	g   *group
	err error
}

// projectWorkers bounds the executions a batch projects at once. Each
// projection waits for the server at least once (its read model's write,
// a read when it is not cached): one after another, under load, they
// left the read models seconds behind the events, with the projector's
// CPU mostly idle. Eight round trips in flight (0.1-0.3 ms each) cover
// far more executions a second than a busy system has; more only take
// the CPU from the dispatcher sooner in a burst.
const projectWorkers = 8

// projectAll projects the jobs, several executions at once; the groups of
// one execution (its events on more than one subject) one after another,
// in order.
func (p *Projector) projectAll(ctx context.Context, jobs []*projection) {
	run := func(j *projection) {
		j.err = p.project(ctx, j.g)
		if j.err == nil { // at once: the batch's slowest projection does not hold up the others' acknowledgements
			p.events.Add(uint64(len(j.g.msgs)))
			for _, m := range j.g.msgs {
				_ = m.Ack()
			}
		}
	}
	byID := map[string][]*projection{}
	var ids []string
	for _, j := range jobs {
		if _, ok := byID[j.g.id]; !ok {
			ids = append(ids, j.g.id)
		}
		byID[j.g.id] = append(byID[j.g.id], j)
	}
	runID := func(id string) {
		for _, j := range byID[id] {
			run(j)
		}
	}
	if len(ids) == 1 { // one execution (one at a time): no goroutine to start and wake
		runID(ids[0])
		return
	}
	// projectWorkers goroutines take the executions in turn: not one
	// goroutine each (a batch under load holds hundreds).
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(projectWorkers, len(ids)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(ids); i = int(next.Add(1) - 1) {
				runID(ids[i])
			}
		})
	}
	wg.Wait()
}

// park (Run's goroutine) sets g's execution aside after err, and stores what can be
// stored of it: a summary without its steps (GET .../steps folds them from
// the history), or no read model at all (the api then folds the history),
// so that nobody is shown a state the history has gone past.
func (p *Projector) park(ctx context.Context, g *group, err error) {
	p.writeSummary(ctx, g.id, g.subject)
	delete(p.failures, g.id)
	p.forget(g.id)
	now := time.Now()
	p.mu.Lock()
	p.parked[g.id] = &Parked{Parked: apiv1.Parked{ID: g.id, Workflow: g.workflow, Reason: err.Error(), Since: now, Tries: 1,
		NextTry: now.Add(parkedDelay(1))}, subject: g.subject}
	n := len(p.parked)
	p.mu.Unlock()
	p.log.Error().Err(err).Str("execution_id", g.id).Int("parked", n).
		Msg("projection parked: its read model is projected again on its own; every other execution goes on")
}

func (p *Projector) isParked(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.parked[id]
	return ok
}

// parkedDelay is the wait before the nth retry of a parked projection:
// a second, doubling, at most five minutes.
func parkedDelay(n int) time.Duration {
	d := time.Second
	for i := 1; i < n && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

// Parked returns the executions whose projection is parked, by id.
func (p *Projector) Parked() []Parked {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Parked, 0, len(p.parked))
	for _, pk := range p.parked {
		out = append(out, *pk)
	}
	slices.SortFunc(out, func(a, b Parked) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// retryParked projects again, from their histories, the parked
// executions whose turn has come.
func (p *Projector) retryParked(ctx context.Context) {
	now := time.Now()
	tried := 0
	for _, pk := range p.Parked() {
		// A few a tick: each reads a whole history, and the events of every
		// other execution wait meanwhile.
		if pk.NextTry.After(now) || ctx.Err() != nil || tried == retriesPerTick {
			continue
		}
		tried++
		err := p.reproject(ctx, pk.ID, pk.subject)
		p.mu.Lock()
		cur := p.parked[pk.ID]
		if err == nil {
			delete(p.parked, pk.ID)
		} else if cur != nil {
			cur.Tries++
			cur.Reason, cur.NextTry = err.Error(), now.Add(parkedDelay(cur.Tries))
		}
		p.mu.Unlock()
		if err == nil {
			p.log.Info().Str("execution_id", pk.ID).Int("tries", pk.Tries+1).Msg("parked projection written")
		} else {
			p.log.Warn().Err(err).Str("execution_id", pk.ID).Msg("parked projection still cannot be written")
		}
	}
}

// writeSummary stores id's read model without its steps, or deletes it if
// even that cannot be stored.
func (p *Projector) writeSummary(ctx context.Context, id, subject string) {
	cur, err := p.read(ctx, id)
	if err != nil {
		return
	}
	evs, err := p.hist.Read(ctx, subject, 0)
	if err != nil {
		return
	}
	p.storeSummary(ctx, id, redact.FromHistory(evs).Execution(projections.FoldQuarantined(id, evs)), cur)
}

// storeSummary stores x without its steps over cur, unless cur is as far
// already; or deletes cur if even that cannot be stored.
func (p *Projector) storeSummary(ctx context.Context, id string, x projections.Execution, cur entry) {
	if cur.rev != 0 && cur.state.LastSeq >= x.LastSeq && cur.state.Truncated != nil {
		return
	}
	x.Truncated = &projections.Truncation{Steps: len(x.Steps), Retired: len(x.RetiredSteps), Summary: true}
	x.Steps, x.RetiredSteps = []projections.Step{}, nil
	if _, _, err := p.write(ctx, id, x, cur.rev, nil); err != nil && cur.rev != 0 {
		_ = p.kv.Delete(ctx, id, jetstream.LastRevision(cur.rev))
	}
}

// reproject writes id's read model from its whole history.
func (p *Projector) reproject(ctx context.Context, id, subject string) error {
	cur, err := p.read(ctx, id)
	if err != nil {
		return err
	}
	evs, err := p.hist.Read(ctx, subject, 0)
	if err != nil {
		return err
	}
	x := redact.FromHistory(evs).Execution(projections.FoldQuarantined(id, evs))
	if x.LastSeq <= cur.state.LastSeq && cur.state.Truncated == nil && cur.rev != 0 {
		return nil // written meanwhile (another replica's projector)
	}
	if _, _, err = p.write(ctx, id, x, cur.rev, nil); err != nil {
		p.storeSummary(ctx, id, x, cur) // its status stays current meanwhile
	}
	return err
}

// project folds a group's events onto the stored read model and writes it
// once. A gap (an event whose prevseq is not the model's last sequence, as
// after a redelivery) or an illegal transition re-folds the execution from
// its history instead.
func (p *Projector) project(ctx context.Context, g *group) error {
	id := g.id
	// The state is this projection's own: taken out of the cache, or read
	// and decoded here. The group's events apply onto it in place, so
	// after an event that fails to apply cur.state is torn (it is folded
	// again from the history, and not cached).
	cur, ok := p.take(id)
	if !ok {
		var err error
		if cur, err = p.read(ctx, id); err != nil {
			return err
		}
	}
	if owns, err := p.owns(ctx, g, cur.state); err != nil || !owns {
		if ok {
			p.remember(id, cur) // untouched
		}
		return err
	}
	next, inputs, known := cur.state, cur.inputs, cur.known
	applied := false // whether cur.state may have changed in place
	for _, ev := range g.evs {
		if ev.Seq <= next.LastSeq {
			continue // already projected
		}
		var err error
		gap := ev.PrevSeq != 0 && ev.PrevSeq != next.LastSeq // events without prevseq are applied as they come
		// A repair changes how the events before it fold: fold again.
		_, repair := ev.Data.(*events.ExecutionRepaired)
		switch {
		case gap || repair || next.Truncated != nil: // a truncated model is not the whole state
		case next.Damaged != nil:
			next = projections.PassOver(next, ev) // nothing applies after a damage until a repair
			continue
		default:
			applied = true
			next, err = projections.ApplyOwned(next, ev) // after an error, folded again from the history
			if start, ok := ev.Data.(*events.ExecutionStarted); ok && err == nil {
				inputs, known = redact.ForStart(start), true
			}
			if err == nil {
				continue
			}
		}
		p.log.Debug().Err(err).Bool("gap", gap).Str("execution_id", id).Msg("re-fold execution from its history")
		if next, inputs, err = p.refold(ctx, g, cur.state); err != nil {
			return err
		}
		known = true
		break // the fold covers the group's events
	}
	if next.LastSeq == cur.state.LastSeq {
		if ok && !applied {
			p.remember(id, cur) // every event was projected already (delivered again)
		}
		return nil
	}
	if !known { // a stored read model, redacted: its start tells what to hide
		var err error
		if inputs, err = startInputs(ctx, p.hist, g.subject); err != nil {
			return err
		}
		known = true
	}
	enc := cur.enc
	if enc == nil {
		enc = &stepCache{}
	}
	rev, size, err := p.write(ctx, id, inputs.Execution(next), cur.rev, enc)
	if err != nil {
		return err // not cached (taken): read again next time
	}
	// The events this write brings (g's are in order): not those of a
	// redelivery the model held already.
	fresh := g.evs[sort.Search(len(g.evs), func(i int) bool { return g.evs[i].Seq > cur.state.LastSeq }):]
	p.weighed.Add(uint64(size) * uint64(len(fresh)))
	if p.OnWrite != nil {
		// How long the oldest of them waited for it.
		for _, ev := range fresh {
			if !ev.Time.IsZero() {
				p.OnWrite(max(0, time.Since(ev.Time))) // a recorder's clock ahead of this one's: 0
				break
			}
		}
	}
	if next.Status.Terminal() || projections.Dormant(&next, projections.HibernateAfter) {
		// Finished executions rarely change again; sleeping ones not for a
		// while (their next event reads the read model again).
		p.forget(id)
	} else {
		p.remember(id, entry{state: next, rev: rev, inputs: inputs, known: known, enc: enc})
	}
	return nil
}

// refold folds g's execution from its history, up to the group's last
// event. An event that does not fold marks the model damaged; a damage
// that was not in the model before (was) is logged.
func (p *Projector) refold(ctx context.Context, g *group, was projections.Execution) (projections.Execution, redact.Inputs, error) {
	select { // each reads a whole history: a few at a time
	case p.refolds <- struct{}{}:
		defer func() { <-p.refolds }()
	case <-ctx.Done():
		return was, redact.Inputs{}, ctx.Err()
	}
	evs, err := history.ReadUntil(ctx, p.js, g.subject, 0, g.evs[len(g.evs)-1].Seq)
	if err != nil {
		return was, redact.Inputs{}, err
	}
	x := projections.FoldQuarantined(g.id, evs)
	if d := x.Damaged; d != nil && (was.Damaged == nil || was.Damaged.Seq != d.Seq) {
		p.log.Error().Str("execution_id", g.id).Uint64("seq", d.Seq).Str("reason", d.Reason).
			Msg("execution damaged: its read model shows where")
	}
	return x, redact.FromHistory(evs), nil
}

// owns reports whether g's subject holds the history of execution g.id
// (see ownerOf). A message on another workflow's subject with the same
// execution id (written by hand) is logged and passed over: it must not
// replace the execution's model.
func (p *Projector) owns(ctx context.Context, g *group, model projections.Execution) (bool, error) {
	owner, err := ownerOf(ctx, p.ids, g.id, g.workflow, g.evs[0], model)
	if err != nil || owner == g.workflow {
		return err == nil, err
	}
	p.log.Error().Str("execution_id", g.id).Str("subject", g.subject).Str("workflow", owner).Uint64("seq", g.evs[0].Seq).
		Msg("skip messages on a subject that is not the execution's history (it belongs to another workflow)")
	return false, nil
}

// ownerOf returns the workflow whose subject holds the history of
// execution id, given its read model (model) and the first event met on
// the subject of workflow wf: the model's workflow; for a new model, wf if
// that event is the execution's start; else the workflow its claim names
// (with no claim, wf: the subject is taken as it is, to show what is there).
func ownerOf(ctx context.Context, ids *claim.Store, id, wf string, first events.Event, model projections.Execution) (string, error) {
	if model.Workflow != "" {
		return model.Workflow, nil
	}
	if st, ok := first.Data.(*events.ExecutionStarted); ok && first.Subject == id && st.Workflow == wf {
		return wf, nil
	}
	c, err := ids.Get(ctx, id)
	switch {
	case errors.Is(err, claim.ErrNotFound):
		return wf, nil
	case err != nil:
		return "", fmt.Errorf("read claim of %s: %w", id, err)
	}
	return c.Workflow, nil
}

// startInputs reads the first event on subject (the execution's start)
// for what to hide in its read model.
func startInputs(ctx context.Context, hist *history.Store, subject string) (redact.Inputs, error) {
	ev, err := hist.First(ctx, subject)
	if errors.Is(err, history.ErrNoEvent) {
		return redact.Inputs{}, nil
	}
	if err != nil {
		return redact.Inputs{}, err
	}
	return redact.FromHistory([]events.Event{ev}), nil
}

func (p *Projector) read(ctx context.Context, id string) (entry, error) {
	e, err := p.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("read model %s: %w", id, err)
	}
	var x projections.Execution
	if err := json.Unmarshal(e.Value(), &x); err != nil {
		// Unreadable: start from nothing (the next event's prevseq then
		// forces a re-fold) but keep the revision, to overwrite it.
		return entry{rev: e.Revision()}, nil
	}
	// A model that hides nothing needs nothing hidden; one that does must
	// learn the values again from the execution's start.
	return entry{state: x, rev: e.Revision(), known: !x.Redacted}, nil
}

// modelLimit is the largest read model: configured (0: maxModel), and no
// more than a message to the server may hold, less room for headers.
func modelLimit(nc *nats.Conn, configured int) int {
	limit := cmp.Or(configured, maxModel)
	if mp := int(nc.MaxPayload()) - 64<<10; mp > 0 && mp < limit {
		limit = mp
	}
	return limit
}

func (p *Projector) maxModel() int { return modelLimit(p.js.Conn(), p.MaxModel) }

func (p *Projector) write(ctx context.Context, id string, x projections.Execution, rev uint64, c *stepCache) (_ uint64, size int, _ error) {
	b, err := marshalModel(x, p.maxModel(), c)
	if err != nil {
		return 0, 0, err
	}
	if rev == 0 {
		rev, err = p.kv.Create(ctx, id, b)
	} else {
		rev, err = p.kv.Update(ctx, id, b, rev)
	}
	if err == nil {
		p.writes.Add(1)
		p.wrote.Add(uint64(len(b)))
	}
	return rev, len(b), err
}

// RebuildResult tells what a rebuild did.
type RebuildResult struct {
	// Written counts read models stored; Unchanged those already right or
	// newer (written meanwhile by the live projector).
	Written, Unchanged int
	// Damaged maps the executions whose history holds an event that does
	// not fold to where and why (their read models show it too).
	Damaged map[string]projections.Damage
	// Failed are the executions whose read model could not be written.
	Failed []string
}

// Rebuild re-projects every execution from stream sequence fromSeq (0 =
// everything) with an ordered consumer, streaming the events, without
// running any step. An execution whose first event comes before fromSeq is
// folded onto its stored read model; if an event does not follow that
// model (its prevseq is not the model's last sequence) the execution is
// re-folded from its own history instead. Read models are written with
// compare-and-set: one the live projector has brought further is left
// alone, one with the same last sequence but different content is
// corrected. So a rebuild can run beside the live system.
func Rebuild(ctx context.Context, js jetstream.JetStream, fromSeq uint64, maxModel int) (RebuildResult, error) {
	res := RebuildResult{Damaged: map[string]projections.Damage{}}
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return res, fmt.Errorf("open executions bucket: %w", err)
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return res, err
	}
	hist, err := history.Open(ctx, js)
	if err != nil {
		return res, err
	}
	type item struct {
		state   projections.Execution
		subject string // the execution's history (ownerOf)
		inputs  redact.Inputs
		known   bool
	}
	states := map[string]*item{}
	err = history.ScanStored(ctx, js, bus.StreamEvents, bus.EventsPrefix+".>", fromSeq, 0, func(subject string, ev events.Event) error {
		wf, id, ok := bus.ParseExecutionSubject(subject) // the history it is in, whatever it says
		if !ok {
			return nil
		}
		it, seen := states[id]
		if !seen {
			it = &item{}
			if fromSeq > 1 {
				if e, err := kv.Get(ctx, id); err == nil && json.Unmarshal(e.Value(), &it.state) == nil {
					it.known = !it.state.Redacted // see read
				}
			}
			owner, err := ownerOf(ctx, ids, id, wf, ev, it.state)
			if err != nil {
				return err
			}
			it.subject = bus.ExecutionSubject(owner, id)
			states[id] = it
		}
		if subject != it.subject || ev.Seq <= it.state.LastSeq {
			return nil // another workflow's subject with this id (written by hand), or folded already
		}
		_, repair := ev.Data.(*events.ExecutionRepaired)
		// A gap, or a stored model that is not the whole state (truncated):
		// fold the history instead.
		gap := (ev.PrevSeq != 0 && ev.PrevSeq != it.state.LastSeq) || it.state.Truncated != nil
		if it.state.Damaged != nil && !repair && !gap {
			it.state = projections.PassOver(it.state, ev) // nothing applies after a damage until a repair
			return nil
		}
		var next projections.Execution
		var err error
		if !repair && !gap {
			// it.state is the rebuild's own: applied onto in place (after
			// an error it is folded again from the history).
			next, err = projections.ApplyOwned(it.state, ev)
			if start, ok := ev.Data.(*events.ExecutionStarted); ok && err == nil {
				it.inputs, it.known = redact.ForStart(start), true
			}
		}
		if repair || gap || err != nil {
			evs, rerr := history.ReadUntil(ctx, js, it.subject, 0, ev.Seq)
			if rerr != nil {
				return rerr
			}
			next, it.inputs, it.known = projections.FoldQuarantined(id, evs), redact.FromHistory(evs), true
		}
		it.state = next
		return nil
	})
	if err != nil {
		return res, err
	}
	for id, it := range states {
		if !it.known {
			if it.inputs, err = startInputs(ctx, hist, it.subject); err != nil {
				return res, err
			}
		}
		if d := it.state.Damaged; d != nil {
			res.Damaged[id] = *d
		}
		written, err := putIfNewer(ctx, kv, id, it.inputs.Execution(it.state), modelLimit(js.Conn(), maxModel))
		if err != nil {
			// One model that cannot be written stops none of the others:
			// the live projector parks it.
			res.Failed = append(res.Failed, id)
			continue
		}
		if written {
			res.Written++
		} else {
			res.Unchanged++
		}
	}
	return res, nil
}

// putIfNewer stores x unless the stored model has folded further, or is
// already exactly x: the same bytes. A model that decodes to x but is
// stored otherwise (its step counts wrong, or stored before they were)
// is written again.
func putIfNewer(ctx context.Context, kv jetstream.KeyValue, id string, x projections.Execution, max int) (bool, error) {
	b, err := marshalModel(x, max, nil)
	if err != nil {
		return false, err
	}
	for range 10 {
		e, err := kv.Get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err = kv.Create(ctx, id, b); err == nil {
				return true, nil
			}
		case err != nil:
			return false, fmt.Errorf("read model %s: %w", id, err)
		default:
			var cur projections.Execution
			if json.Unmarshal(e.Value(), &cur) == nil {
				if cur.LastSeq > x.LastSeq {
					return false, nil
				}
				if bytes.Equal(e.Value(), b) {
					return false, nil
				}
			}
			if _, err = kv.Update(ctx, id, b, e.Revision()); err == nil {
				return true, nil
			}
		}
		if !bus.KeyChanged(err) {
			return false, fmt.Errorf("write read model %s: %w", id, err)
		}
	}
	return false, fmt.Errorf("write read model %s: too much contention", id)
}

// maxModel is the largest read model stored by default: a KV value must
// fit in a NATS message (1 MiB by default), with room for headers. A
// smaller server limit, or the api's -max-read-model, makes it smaller.
const maxModel = 900 << 10

// noteOver is the size above which a step's input or output, or a
// variable, is replaced by a note in a read model that is too large.
const noteOver = 2 << 10

// marshalModel encodes a read model in at most max bytes. A read model is
// a summary of the execution's state, whose whole is the fold of its
// history: when one would be larger, every input, output and variable
// over noteOver is replaced by a note, then, if that is not enough, the
// finished step instances are left out, oldest first (instances that run,
// wait or failed are always kept: the janitor and people look for them).
// x.Truncated counts what was left out; GET /v1/executions/{id}/steps
// pages the whole step table. If even that does not fit, the encoding is
// returned as it is and the write fails (the projector parks the
// execution).
func marshalModel(x projections.Execution, max int, c *stepCache) ([]byte, error) {
	b, err := encodeModel(x, c)
	if err != nil || len(b) <= max {
		return b, err
	}
	t := projections.Truncation{}
	note := func(n int) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"omitted": true, "bytes": n,
			"note": "too large for the read model; the full value is in the execution's history"})
		return b
	}
	x.Steps = slices.Clone(x.Steps)
	for i := range x.Steps {
		st := &x.Steps[i]
		if len(st.Output) > noteOver && !isNote(st.Output) {
			st.Output, t.Values = note(len(st.Output)), t.Values+1
		}
		if len(st.Input) > noteOver && !isNote(st.Input) {
			st.Input, t.Values = note(len(st.Input)), t.Values+1
		}
	}
	for _, v := range []*json.RawMessage{&x.Input, &x.Output} {
		if len(*v) > noteOver && !isNote(*v) {
			*v, t.Values = note(len(*v)), t.Values+1
		}
	}
	if len(x.Vars) > 0 {
		vars := make(map[string]json.RawMessage, len(x.Vars))
		for k, v := range x.Vars {
			if len(v) > noteOver && !isNote(v) {
				v, t.Values = note(len(v)), t.Values+1
			}
			vars[k] = v
		}
		x.Vars = vars
	}
	x.Truncated = &t
	if b, err = encodeModel(x, nil); err != nil || len(b) <= max {
		return b, err
	}
	// The instances a move to another version left behind go first.
	retired := len(x.RetiredSteps)
	if retired > 0 {
		x.RetiredSteps, t.Retired = nil, retired
		if b, err = encodeModel(x, nil); err != nil || len(b) <= max {
			return b, err
		}
	}
	// Leave out finished instances, oldest first: keep the k most recent
	// of them, the largest k that fits (found by halving).
	all := x.Steps
	var done []int
	for i, st := range all {
		if st.Status.Done() {
			done = append(done, i)
		}
	}
	encode := func(k int) ([]byte, error) {
		drop := make(map[int]bool, len(done)-k)
		for _, i := range done[:len(done)-k] {
			drop[i] = true
		}
		x.Steps = make([]projections.Step, 0, len(all)-len(drop))
		for i, st := range all {
			if !drop[i] {
				x.Steps = append(x.Steps, st)
			}
		}
		t.Steps = len(drop)
		return encodeModel(x, nil)
	}
	lo, hi := 0, len(done) // the largest k that fits is in [lo, hi)
	best, err := encode(0)
	if err != nil || len(best) > max {
		return best, err // the kept instances alone do not fit
	}
	for lo+1 < hi {
		mid := (lo + hi) / 2
		b, err := encode(mid)
		if err != nil {
			return nil, err
		}
		if len(b) <= max {
			lo, best = mid, b
		} else {
			hi = mid
		}
	}
	return best, nil
}

func isNote(b json.RawMessage) bool {
	return bytes.Contains(b, []byte(`"omitted":true`)) && len(b) < 200
}
