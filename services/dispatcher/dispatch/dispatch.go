// Package dispatch is the dispatcher: the only writer of execution
// histories. It consumes commands and agents' results, folds each
// execution's history into state, decides the next step, appends events
// with optimistic concurrency and publishes tasks to agent queues.
//
// Messages for one execution are handled by one worker goroutine at a time
// (hashing the execution id); across processes, the events stream's
// expected-last-subject-sequence check fences out concurrent writers.
package dispatch

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

// Consumer names.
const (
	CommandsConsumer = bus.ConsumerDispatcherCommands
	ResultsConsumer  = bus.ConsumerDispatcherResults
	TimersConsumer   = bus.ConsumerDispatcherTimers
)

// Config configures a Dispatcher.
type Config struct {
	// Workers is the number of goroutines handling executions. Default 32.
	Workers int
	// Source is the CloudEvents source of the events it writes. Default "jetflow/dispatcher".
	Source string
	// CacheSize bounds the execution states kept in memory. Default 10000.
	CacheSize int
	// AckWait is how long a command or result may be handled before
	// JetStream redelivers it. Default 30s.
	AckWait time.Duration
	// MaxAckPending bounds messages in flight per consumer. Default 1024.
	MaxAckPending int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// APIURL is the api's base URL as workflows reach it, recorded in each
	// execution it starts (workflow.api_url in expressions). Optional.
	APIURL string
	// BindOnly: the durable consumers exist (made by the bootstrap) and
	// this dispatcher may not create or change them; it binds to them and
	// takes their ack wait. Services running with credentials set it.
	BindOnly bool
	// Member names this dispatcher among the dispatchers sharing the
	// partitions; unique per process. Default: host, process id and a
	// random suffix.
	Member string
	// LeaseTTL is how long a partition of a dispatcher that died waits for
	// another: whole seconds, default 1s.
	LeaseTTL time.Duration
}

// Validate reports a setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Workers < 0 || c.CacheSize < 0 || c.MaxAckPending < 0:
		return fmt.Errorf("dispatch: Workers, CacheSize and MaxAckPending must not be negative")
	case c.AckWait < 0:
		return fmt.Errorf("dispatch: AckWait %s must not be negative", c.AckWait)
	case c.AckWait > 0 && c.AckWait < 300*time.Millisecond:
		return fmt.Errorf("dispatch: AckWait %s is too short to keep a message while it is handled (at least 300ms)", c.AckWait)
	case c.Member != "" && !partition.ValidMember(c.Member):
		return fmt.Errorf("dispatcher member %q (-member, JETFLOW_DISPATCHER_MEMBER): %s", c.Member, partition.MemberRule)
	case c.LeaseTTL != 0 && (c.LeaseTTL < time.Second || c.LeaseTTL%time.Second != 0):
		return fmt.Errorf("dispatch: LeaseTTL %s: use whole seconds, at least 1s", c.LeaseTTL)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.Workers = cmp.Or(c.Workers, 32)
	c.Source = cmp.Or(c.Source, "jetflow/dispatcher")
	c.CacheSize = cmp.Or(c.CacheSize, 10000)
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, 1024)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Member == "" {
		host, _ := os.Hostname()
		host = strings.Map(func(r rune) rune {
			if r > 127 || !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z') {
				return '-'
			}
			return r
		}, host)
		if len(host) > 100 {
			host = host[:100]
		}
		c.Member = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "dispatcher"), os.Getpid(), newToken()[:8])
	}
	return c
}

// Dispatcher runs workflow logic.
type Dispatcher struct {
	cfg  Config
	js   jetstream.JetStream
	log  zerolog.Logger
	defs *catalog.Store
	ids  *claim.Store

	locks *lock.Table // the lock bucket (locks.go)

	damages damageLog // damages logged (damage.go)

	parts    partitions      // the partitions it holds (partitions.go)
	started  time.Time       // when Run began
	stopping <-chan struct{} // closed when Run is asked to stop

	mu    sync.Mutex // guards cache
	cache *lru

	// handling serialises withExecution per execution. A worker handles
	// the messages routed to it one at a time, but a message that names
	// several executions (a clear-lock command) is routed by its own id,
	// so it can reach an execution while the execution's worker handles
	// it; both would change the same cached state.
	handling keyedMutex
}

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
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// New returns a dispatcher; call Run to start it.
func New(ctx context.Context, cfg Config, js jetstream.JetStream, log zerolog.Logger) (*Dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	defs, err := catalog.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	locks, err := lock.Open(ctx, js, cfg.Now)
	if err != nil {
		return nil, err
	}
	n, err := bus.Partitions(ctx, js)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, events.BucketDispatchers)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", events.BucketDispatchers, err)
	}
	return &Dispatcher{cfg: cfg, js: js, log: log, defs: defs, ids: ids, locks: locks, cache: newLRU(cfg.CacheSize),
		parts: partitions{n: n, kv: kv, running: map[int]*consuming{}}}, nil
}

type job struct {
	msg  jetstream.Msg
	ev   events.Event
	key  string     // execution id
	from *consuming // the partition holding it came from; nil: a shared consumer
	// intake: a command taken from the intake for a partition this
	// dispatcher holds, handled here instead of going through the inbox.
	intake bool
}

// Run consumes commands and results until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.started, d.stopping = time.Now(), ctx.Done()
	// Bind every shared consumer before any message is handled: a
	// dispatcher that binds to the bootstrap's consumers takes their ack
	// wait.
	var bound []jetstream.Consumer
	for _, c := range bus.DispatcherConsumers(d.durables()) {
		cons, err := bus.Bind(ctx, d.js, !d.cfg.BindOnly, c, func(err error) {
			d.log.Warn().Err(err).Msg("waiting for the bootstrap")
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting: not an error
			}
			return err
		}
		if w := cons.CachedInfo().Config.AckWait; w > 0 && c.Config.Durable != bus.ConsumerDispatcherCommands {
			d.cfg.AckWait = w
		}
		bound = append(bound, cons)
	}
	queues := make([]chan job, d.cfg.Workers)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan job, 64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queues[i] {
				d.process(ctx, j)
			}
		}()
	}
	var ccs []jetstream.ConsumeContext
	tableDone := make(chan struct{})
	close(tableDone) // until the table runs
	defer func() {
		<-tableDone // the table gave its partitions back (their jobs are done)
		for _, cc := range ccs {
			cc.Drain()
			<-cc.Closed()
		}
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()
	// enqueue checks a message and hands it to the worker of its
	// execution; from is the partition holding it came from (nil for the
	// shared consumers).
	queue := func(j job) {
		h := fnv.New32a()
		h.Write([]byte(j.key))
		select {
		case queues[h.Sum32()%uint32(len(queues))] <- j:
		case <-ctx.Done():
			_ = j.msg.Nak() // shutting down: hand it to another dispatcher now
			j.from.done()
		}
	}
	enqueue := func(m jetstream.Msg, from *consuming) {
		ev, ok := d.intake(ctx, m)
		if !ok {
			from.done()
			return
		}
		queue(job{msg: m, ev: ev, key: routingKey(ev), from: from})
	}
	// The table exists before any message is taken (the intake asks it
	// which partitions this dispatcher holds); it takes partitions once
	// it runs, below.
	table, err := partition.New(d.js, d.parts.kv, partition.Config{
		Member: d.cfg.Member, Partitions: d.parts.n, TTL: d.cfg.LeaseTTL,
		Acquire: func(ctx context.Context, p int, epoch uint64) error { return d.acquire(ctx, p, epoch, enqueue) },
		Release: d.release,
		OnError: func(err error, what string) { d.log.Warn().Err(err).Msg(what) },
	})
	if err != nil {
		return err
	}
	d.parts.table = table
	for _, cons := range bound {
		handler := func(m jetstream.Msg) { enqueue(m, nil) }
		if cons.CachedInfo().Name == bus.ConsumerDispatcherCommands {
			handler = func(m jetstream.Msg) { d.routeCommand(ctx, m, queue) }
		}
		cc, err := cons.Consume(handler, jetstream.PullMaxMessages(64))
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting: not an error
			}
			return fmt.Errorf("consume %s: %w", cons.CachedInfo().Name, err)
		}
		ccs = append(ccs, cc)
	}
	tableDone = make(chan struct{})
	tableErr := make(chan error, 1)
	go func() { defer close(tableDone); tableErr <- table.Run(ctx) }()
	watched := make(chan struct{})
	go func() { defer close(watched); d.watchLocks(ctx) }()
	defer func() { <-watched }()
	d.log.Info().Int("workers", d.cfg.Workers).Int("partitions", d.parts.n).Str("member", d.cfg.Member).Msg("dispatcher running")
	if d.cfg.APIURL == "" {
		d.log.Warn().Msg("no -api-url: executions started here see an empty workflow.api_url (give every dispatcher the same one)")
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-tableErr:
		if err == nil || ctx.Err() != nil {
			return nil
		}
		return err
	}
}

// intake decodes a message and checks that it may be handled where it
// arrived; one that may not is rejected (a command) or dropped, and ok is
// false.
func (d *Dispatcher) intake(ctx context.Context, m jetstream.Msg) (ev events.Event, ok bool) {
	ev, err := events.Decode(m.Headers(), m.Data())
	why := d.misrouted(m.Subject(), ev)
	// The subject a command was published on decides who it is from: its
	// own, or for one the intake put in the inbox, the one it arrived on.
	published := ""
	switch {
	case strings.HasPrefix(m.Subject(), events.CommandsPrefix+"."):
		published = m.Subject()
	case strings.HasPrefix(m.Subject(), events.InboxPrefix+"."):
		published = m.Headers().Get(CommandSubjectHeader) // "": the dispatcher's own (a lock wake)
		if why == "" && err == nil && published != "" {
			why = d.misrouted(published, ev)
		}
	}
	if why == "" && err == nil && published != "" {
		var actor *events.Actor
		if actor, why = commandActor(published, ev.Data); why == "" && actor != nil {
			events.SetCommandActor(ev.Data, actor)
		}
	}
	if err != nil {
		why = strings.TrimPrefix(err.Error(), events.ErrMalformed.Error()+": ")
		if errors.Is(err, events.ErrUnknownType) {
			why = fmt.Sprintf("type %q is not a jetflow command", ev.Type)
		}
	}
	if why == "" {
		return ev, true
	}
	if perr := d.rejectMessage(ctx, m, ev.Type, why); perr != nil {
		d.log.Warn().Err(perr).Msg("publish rejection, will retry")
		_ = m.NakWithDelay(time.Second)
		return ev, false
	}
	_ = m.Term()
	return ev, false
}

// routeCommand is the intake of commands: any dispatcher checks a
// command (rejecting one that cannot be handled) and puts it on its
// execution's partition, whose holder handles it. A command for a
// partition this dispatcher holds is handled here at once (the common
// case with one dispatcher): the inbox would only bring it back.
func (d *Dispatcher) routeCommand(ctx context.Context, m jetstream.Msg, queue func(job)) {
	ev, ok := d.intake(ctx, m)
	if !ok {
		return
	}
	key := routingKey(ev)
	if from := d.holding(d.partitionOf(key)); from != nil {
		_ = m.InProgress() // the intake's ack wait is short: it may wait in the worker's queue
		queue(job{msg: m, ev: ev, key: key, from: from, intake: true})
		return
	}
	if err := d.route(ctx, m, ev); err != nil {
		d.log.Warn().Err(err).Msg("route command, will retry")
		_ = m.NakWithDelay(200 * time.Millisecond)
		return
	}
	_ = m.Ack()
}

// keepAlive tells JetStream every third of ackWait that m is still being
// handled, until handled is closed.
func (d *Dispatcher) keepAlive(m jetstream.Msg, ackWait time.Duration, handled <-chan struct{}) {
	t := time.NewTicker(ackWait / 3)
	defer t.Stop()
	for {
		select {
		case <-handled:
			return
		default:
		}
		if err := m.InProgress(); err != nil {
			return
		}
		select {
		case <-t.C:
		case <-handled:
			return
		}
	}
}

func routingKey(ev events.Event) string {
	switch p := ev.Data.(type) {
	case *events.StartExecution:
		_, id := startcheck.Identify(ev)
		return id
	case *events.ReconcileExecution:
		return p.ExecutionID
	case *events.FireTimer:
		return p.ExecutionID
	case *events.SignalExecution:
		return p.ExecutionID
	case *events.ExecutionAction:
		return p.ExecutionID
	case *events.ExpireExecution:
		return p.ExecutionID
	}
	if ref, ok := events.ResultRef(ev.Data); ok {
		return ref.ExecutionID
	}
	return ev.ID
}

// permanentError marks a message that can never succeed; it is terminated.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func (d *Dispatcher) process(ctx context.Context, j job) {
	defer j.from.done()
	if j.from != nil {
		if epoch, ok := d.parts.table.Holds(j.from.part); !ok || epoch != j.from.epoch {
			// The partition moved on (its next holder takes it), or this
			// holding's renewal is late: in a moment, not in a hot loop.
			_ = j.msg.NakWithDelay(500 * time.Millisecond)
			return
		}
	}
	log := d.log.With().Str("execution_id", j.key).Str("type", string(j.ev.Type)).Logger()
	// A long handling (a large foreach of the dispatcher's own steps) keeps
	// the message: without progress it would be redelivered meanwhile.
	handled := make(chan struct{})
	ackWait := d.cfg.AckWait
	if j.intake {
		ackWait = bus.IntakeAckWait
	}
	hb := time.AfterFunc(ackWait/3, func() { d.keepAlive(j.msg, ackWait, handled) })
	err := d.handle(log.WithContext(ctx), j.ev)
	close(handled)
	hb.Stop()
	if errors.Is(err, nats.ErrMaxPayload) {
		err = permanentError{err} // retrying cannot make it fit
	}
	var perm permanentError
	var rej rejectedError
	var dmg damagedError
	if errors.As(err, &dmg) {
		if err = d.damagedMessage(ctx, j, dmg); err == nil {
			_ = j.msg.Term() // rejected, or dropped: a repair catches up
			return
		}
	}
	switch {
	case err == nil:
		if aerr := j.msg.Ack(); aerr != nil {
			log.Warn().Err(aerr).Msg("ack")
		}
	case errors.As(err, &rej): // published and logged by reject
		_ = j.msg.Term()
	case errors.As(err, &perm):
		log.Error().Err(err).Msg("drop message that cannot be applied")
		_ = j.msg.Term()
	case ctx.Err() != nil:
		_ = j.msg.Nak()
	default:
		md, _ := j.msg.Metadata()
		delay := 100 * time.Millisecond
		if md != nil {
			delay = min(time.Duration(md.NumDelivered)*200*time.Millisecond, 10*time.Second)
		}
		log.Warn().Err(err).Dur("retry_in", delay).Msg("handle message, will retry")
		_ = j.msg.NakWithDelay(delay)
	}
}

func (d *Dispatcher) handle(ctx context.Context, ev events.Event) error {
	switch p := ev.Data.(type) {
	case *events.StartExecution:
		return d.start(ctx, ev, p)
	case *events.ReconcileExecution:
		return d.reconcile(ctx, p)
	case *events.FireTimer:
		return d.fireTimer(ctx, ev, p)
	case *events.SignalExecution:
		return d.signal(ctx, ev, p)
	case *events.ExecutionAction:
		return d.action(ctx, ev, p)
	case *events.ClearLock:
		return d.clearLock(ctx, ev, p)
	case *events.ExpireExecution:
		return d.expire(ctx, ev, p)
	}
	if ref, ok := events.ResultRef(ev.Data); ok {
		return d.result(ctx, ref, ev)
	}
	return permanentError{fmt.Errorf("dispatcher does not handle %s", ev.Type)}
}

// reconcile re-decides an execution. It must name an execution that was
// claimed for that workflow; anything else is dropped.
func (d *Dispatcher) reconcile(ctx context.Context, p *events.ReconcileExecution) error {
	if !events.ValidExecutionID(p.ExecutionID) {
		return permanentError{fmt.Errorf("reconcile of invalid execution id %q", p.ExecutionID)}
	}
	c, err := d.ids.Get(ctx, p.ExecutionID)
	if errors.Is(err, claim.ErrNotFound) {
		return permanentError{fmt.Errorf("reconcile of unknown execution %s", p.ExecutionID)}
	}
	if err != nil {
		return err
	}
	if c.Workflow != p.Workflow {
		return permanentError{fmt.Errorf("reconcile names workflow %q, execution %s belongs to %q", p.Workflow, p.ExecutionID, c.Workflow)}
	}
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		if err := d.rearmOverdue(ctx, x); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}

// execState is the dispatcher's view of one execution.
type execState struct {
	id, workflow string
	state        projections.Execution
	def          workflow.Definition
	// current: state is known to be the whole history (just read from the
	// stream, or just appended to), not a cached copy that another
	// dispatcher may have gone past. See ensureCurrent.
	current bool
	// firstSeq is the stream sequence of the history's first event (its
	// start), 0 while there is none.
	firstSeq uint64
	// epoch is the holding of the execution's partition in which the state
	// was read (0: not held then). A state cached in an earlier holding is
	// read again: another dispatcher held the partition in between.
	epoch uint64
	// view is what decisions derived from state so far (view.go).
	view *view
	// retains: 1 if a step of def may set a retention, -1 if none may, 0
	// not worked out yet (mayRetain).
	retains int
}

func (x *execState) subject() string { return events.ExecutionSubject(x.workflow, x.id) }

// withExecution loads an execution (cache or stream) and runs fn; on a
// write conflict it drops what it knew, reloads and runs fn again. A
// damaged execution is not handed to fn: it returns a damagedError (see
// damage.go), or, for an event of a type this dispatcher does not know, an
// error that retries (a newer dispatcher may know it).
func (d *Dispatcher) withExecution(ctx context.Context, wf, id string, fn func(*execState) error) error {
	return d.withExecutionAs(ctx, wf, id, false, fn)
}

// withDamagedExecution is withExecution that hands fn a damaged execution
// too (the repair action).
func (d *Dispatcher) withDamagedExecution(ctx context.Context, wf, id string, fn func(*execState) error) error {
	return d.withExecutionAs(ctx, wf, id, true, fn)
}

func (d *Dispatcher) withExecutionAs(ctx context.Context, wf, id string, damagedToo bool, fn func(*execState) error) error {
	if !events.ValidWorkflowName(wf) || !events.ValidExecutionID(id) {
		return permanentError{fmt.Errorf("invalid workflow %q or execution id %q", wf, id)}
	}
	defer d.handling.lock(id)()
	for attempt := 0; ; attempt++ {
		x, cached, err := d.load(ctx, wf, id)
		if err != nil {
			return err
		}
		x.current = !cached
		if x.state.Damaged != nil && !damagedToo {
			err := d.refuseDamaged(ctx, x, cached)
			if errors.Is(err, bus.ErrConflict) && attempt < 8 {
				continue // repaired by another dispatcher since it was cached
			}
			return err
		}
		before := x.state.LastSeq
		err = fn(x)
		if err == nil && !cached && x.state.LastSeq > 0 {
			// Keep what fn built (a new execution's first events), so the
			// next message for it does not read its history again.
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
			return nil
		}
		d.evict(id) // whatever happened, the stream is the truth: reload next time
		if !errors.Is(err, bus.ErrConflict) || attempt >= 8 {
			return err
		}
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
	stream, err := d.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return fmt.Errorf("open events stream: %w", err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, x.subject())
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if x.state.LastSeq == 0 {
			return nil
		}
	case err != nil:
		return fmt.Errorf("check history of %s: %w", x.id, err)
	case last.Sequence == x.state.LastSeq:
		return nil
	}
	return fmt.Errorf("cached state of %s is behind its history: %w", x.id, bus.ErrConflict)
}

// load returns the execution's state from the cache (cached = true) or
// folded from its history. Only executions that exist are cached, and a
// cached state is used only for the workflow it belongs to.
func (d *Dispatcher) load(ctx context.Context, wf, id string) (x *execState, cached bool, err error) {
	d.mu.Lock()
	x, ok := d.cache.get(id)
	d.mu.Unlock()
	epoch, held := d.holds(id)
	if ok && x.workflow == wf && (!held || x.epoch == epoch) {
		return x, true, nil
	}
	// Not cached, or cached before this holding of its partition began
	// (another dispatcher may have written it in between).
	evs, err := history.Read(ctx, d.js, events.ExecutionSubject(wf, id), 0)
	if err != nil {
		return nil, false, err
	}
	// An event that does not fold marks the state damaged (damage.go).
	x = &execState{id: id, workflow: wf, state: projections.FoldQuarantined(id, evs), epoch: epoch, view: &view{}}
	if len(evs) == 0 {
		return x, false, nil
	}
	x.firstSeq = evs[0].Seq
	if x.state.Status != projections.StatusNone {
		// The fold began with the start (a damaged one is passed over, or
		// leaves the status none).
		for _, ev := range evs {
			started, ok := ev.Data.(*events.ExecutionStarted)
			if !ok {
				continue
			}
			if err := json.Unmarshal(started.Definition, &x.def); err != nil && x.state.Damaged == nil {
				x.state.Damaged = &projections.Damage{Seq: ev.Seq, EventID: ev.ID, Type: ev.Type,
					Reason: fmt.Sprintf("the pinned definition cannot be decoded: %v", err)}
			}
			break
		}
	}
	d.mu.Lock()
	d.cache.put(id, x)
	d.mu.Unlock()
	return x, false, nil
}

func (d *Dispatcher) evict(id string) {
	d.mu.Lock()
	d.cache.remove(id)
	d.mu.Unlock()
}

// append validates p against the fold, then appends it with the expected
// last subject sequence.
func (d *Dispatcher) append(ctx context.Context, x *execState, p events.Payload) error {
	p = d.fit(d.withRetention(x, p), x.state.WaitAfterFail)
	ev := events.New(d.cfg.Source, x.id, x.workflow, d.cfg.Now(), p)
	ev.PrevSeq = x.state.LastSeq
	next, err := projections.Apply(x.state, ev)
	if err != nil {
		return permanentError{fmt.Errorf("refusing to append illegal event: %w", err)}
	}
	seq, err := history.Append(ctx, d.js, x.subject(), x.state.LastSeq, ev)
	if err != nil {
		return err
	}
	next.LastSeq = seq
	x.state, x.current = next, true
	if x.firstSeq == 0 {
		x.firstSeq = seq
	}
	if len(next.Locks) > 0 && !next.Status.Active() {
		return d.releaseEnded(ctx, x) // e.g. a force-cancel: its locks go with it
	}
	return nil
}

// fit turns an event too large for a NATS message (an output, a rendered
// input or a called definition of about the size limit) into the failure
// it amounts to, so the execution ends clearly instead of retrying an
// append that can never fit.
func (d *Dispatcher) fit(p events.Payload, waitAfterFail bool) events.Payload {
	limit := int(d.js.Conn().MaxPayload()) - 64<<10 // room for headers and the other fields
	tooBig := func(what string, n int) string {
		return fmt.Sprintf("%s is %d bytes; an event holds at most about %d", what, n, limit)
	}
	switch e := p.(type) {
	case *events.StepSucceeded:
		n := len(e.Output)
		for _, v := range e.Vars {
			n += len(v)
		}
		if n > limit {
			return &events.StepFailed{StepID: e.StepID, Attempt: e.Attempt, Error: tooBig("the step's output", n), Final: true}
		}
	case *events.StepScheduled:
		if len(e.Input) > limit {
			return &events.StepFailed{StepID: e.StepID, Kind: e.Kind, Attempt: e.Attempt, Error: tooBig("the step's input", len(e.Input)), Final: true}
		}
	case *events.ExecutionSucceeded:
		if len(e.Output) > limit {
			if waitAfterFail {
				return &events.ExecutionSuspended{Error: tooBig("the workflow's output", len(e.Output))}
			}
			return &events.ExecutionFailed{Error: tooBig("the workflow's output", len(e.Output))}
		}
	}
	return p
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
