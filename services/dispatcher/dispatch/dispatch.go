// Package dispatch is the dispatcher: the only writer of execution
// histories. It consumes commands and agents' results, folds each
// execution's history into state, decides the next step, appends events
// with optimistic concurrency and publishes tasks to agent queues.
//
// Messages for one execution are handled by one worker goroutine at a time,
// executions taking turns (fair.go); across processes, the events stream's
// expected-last-subject-sequence check fences out concurrent writers.
package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/groupcommit"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/workflow"
)

// Consumer names.
const (
	CommandsConsumer = bus.ConsumerDispatcherCommands
	ResultsConsumer  = bus.ConsumerDispatcherResults
	TimersConsumer   = bus.ConsumerDispatcherTimers
)

// Config configures a Dispatcher. Its counts and durations must lie in
// [Ranges]; zero is the default.
type Config struct {
	// Workers is the number of goroutines handling executions. Default 32.
	Workers int
	// Source is the CloudEvents source of the events it writes. Default "jetflow/dispatcher".
	Source string
	// CacheSize bounds the execution states kept in memory. Default 10000.
	CacheSize int
	// CacheBytes bounds the memory those states hold, as estimated from
	// their content (their steps, inputs, outputs, variables): whichever
	// of CacheSize and CacheBytes is reached first lets the least recently
	// used go. Default DefaultCacheBytes.
	CacheBytes int
	// AckWait is how long a command or result may be handled before
	// JetStream redelivers it (a message handled longer is kept alive
	// every third of it). Default bus.DefaultDispatcherAckWait (5s).
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
	// BulkAfter: a task goes to its queue's bulk lane
	// (bus.BulkTaskSubject) when its execution already has at least this
	// many other tasks in flight on the queue, so that a fan-out does not
	// queue ahead of every other execution's tasks; agents serve the
	// normal lane first. Default DefaultBulkAfter; NoBulkLane sends
	// every task to the normal lane (agents older than the bulk lane do
	// not serve it).
	BulkAfter int
	// SplitDispatch: record an operation's schedule and sending as two
	// events (io.jetflow.step.scheduled, io.jetflow.step.sending) instead
	// of one io.jetflow.step.dispatched, which dispatchers older than it
	// do not read: set it while such dispatchers still run.
	SplitDispatch bool
	// NoDirectReports: take agents' reports from the results stream only.
	// By default the dispatcher also takes the reports that agents hand
	// straight to the holder of their execution's partition (core NATS
	// requests on bus.DirectResultSubject, docs/adr/0009), and tells
	// agents so in each task it sends (events.Task.Partitions).
	NoDirectReports bool
	// NoTimersFromMemory: timers fire by their schedules' messages only.
	// By default a timer this dispatcher arms that is due within two
	// minutes also fires from memory at its due time (soon.go,
	// docs/adr/0013), its schedule staying the guarantee.
	NoTimersFromMemory bool
	// NoTimerNotices: a timer due later than two minutes when armed has
	// its schedule set for its due time. By default it is set a minute
	// before, with a notice (events.TimerNotice) on the partition's
	// notices subject (bus.PartitionNoticeSubject), which brings the timer
	// into the memory of the dispatcher holding its execution then
	// (docs/adr/0019). Dispatchers older than the notices' subjects never
	// see one: a notice waits for a dispatcher that knows them. Without
	// timers from memory there are no notices.
	NoTimerNotices bool
	// GroupCommit gathers the history appends made at once into atomic
	// batches (history.Options.GroupCommit, docs/adr/0020), and so too
	// the tasks it publishes: for a single server that fsyncs every write
	// (sync_interval: always), where it fsyncs a batch once instead of
	// each message. It needs many at once: Workers defaults to
	// GroupCommitWorkers with it.
	GroupCommit bool
	// soonHorizon, noticeLead: how far ahead a timer fires from memory
	// when armed, and how long before a longer one its notice comes
	// (0: two minutes, one minute). Tests shorten them.
	soonHorizon, noticeLead time.Duration
	// LocalHandlers are the handlers of local call steps (docs/adr/0014),
	// by operation name, as an agent's Handlers: a program that embeds
	// the dispatcher registers them, in every dispatcher alike. The
	// built-in noop and log always run locally.
	LocalHandlers map[string]operation.Handler
	// LocalConcurrency bounds the local call handlers running at once.
	// Default 64.
	LocalConcurrency int
	// Metrics, if set, counts what the dispatcher does (NewMetrics); nil
	// counts nothing.
	Metrics *Metrics
	// Tracer, if set, records the executions' and step attempts' spans
	// and adds their trace context to the events and tasks (tracing.go);
	// nil records nothing.
	Tracer trace.TracerProvider
}

const (
	// DefaultBulkAfter is the default BulkAfter: an execution with more
	// than two operations in flight on a queue is a fan-out. It is kept
	// below the quarter of an agent's workers (4 of the default 16) that
	// take only the normal lane, so that a fan-out's operations on the
	// normal lane cannot take all of them.
	DefaultBulkAfter = 2
	// NoBulkLane is the BulkAfter that sends every task to the normal lane.
	NoBulkLane = -1
	// DefaultCacheBytes is the default CacheBytes, 32 MiB: about what the
	// default 10,000 states of small executions held before the cache was
	// bounded by bytes too (each with its own copy of its definition).
	DefaultCacheBytes = 32 << 20
)

// Ranges are the values Config's numeric settings may take once their
// defaults are applied (zero is the default). Validate checks them, and
// jetflow-dispatcher's flags take the same.
var Ranges = struct {
	Workers, CacheSize, CacheBytes, MaxAckPending, BulkAfter, LocalConcurrency svc.Range[int]
	AckWait, LeaseTTL                                                          svc.Range[time.Duration]
}{
	Workers:   svc.Range[int]{Min: 1, Max: 4096},
	CacheSize: svc.Range[int]{Min: 1, Max: 1_000_000},
	// From a few small executions to 64 GiB.
	CacheBytes:    svc.Range[int]{Min: 64 << 10, Max: 64 << 30},
	MaxAckPending: svc.Range[int]{Min: 1, Max: 65536},
	// Up to the count the interpreter stops at (or NoBulkLane).
	BulkAfter:        svc.Range[int]{Min: 1, Max: 256},
	LocalConcurrency: svc.Range[int]{Min: 1, Max: 4096},
	// A message must stay put while it is handled (kept alive every
	// third of it); past an hour a stuck dispatcher holds it too long.
	AckWait: svc.Range[time.Duration]{Min: 300 * time.Millisecond, Max: time.Hour},
	// Whole seconds: JetStream's granularity.
	LeaseTTL: svc.Range[time.Duration]{Min: time.Second, Max: time.Minute},
}

// Validate reports a setting that cannot work.
// MaxAPIURL is the longest -api-url a dispatcher takes.
const MaxAPIURL = 512

func (c Config) Validate() error {
	if c.Member != "" && !partition.ValidMember(c.Member) {
		return fmt.Errorf("dispatcher member %q (-member, JETFLOW_DISPATCHER_MEMBER): %s", c.Member, partition.MemberRule)
	}
	if len(c.APIURL) > MaxAPIURL {
		// Recorded in every execution's first event, in the room the start
		// check leaves for what the dispatcher adds (startcheck).
		return fmt.Errorf("dispatch: APIURL (-api-url, JETFLOW_API_URL) is %d bytes; at most %d", len(c.APIURL), MaxAPIURL)
	}
	if c.APIURL != "" {
		if u, err := url.Parse(c.APIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("dispatch: APIURL (-api-url, JETFLOW_API_URL) %q: give an http or https URL with a host, e.g. http://127.0.0.1:8080", c.APIURL)
		}
	}
	d := c.withDefaults()
	if err := cmp.Or(
		Ranges.Workers.Check("dispatch: Workers", d.Workers),
		Ranges.CacheSize.Check("dispatch: CacheSize", d.CacheSize),
		Ranges.CacheBytes.Check("dispatch: CacheBytes (-cache-bytes, JETFLOW_DISPATCH_CACHE_BYTES)", d.CacheBytes),
		Ranges.AckWait.Check("dispatch: AckWait", d.AckWait),
		Ranges.MaxAckPending.Check("dispatch: MaxAckPending", d.MaxAckPending),
		Ranges.LocalConcurrency.Check("dispatch: LocalConcurrency", d.LocalConcurrency),
	); err != nil {
		return err
	}
	if d.BulkAfter != NoBulkLane {
		if err := Ranges.BulkAfter.Check("dispatch: BulkAfter (-bulk-after, JETFLOW_BULK_AFTER; -1: no bulk lane)", d.BulkAfter); err != nil {
			return err
		}
	}
	if c.LeaseTTL != 0 { // 0: the partition table's default
		if err := Ranges.LeaseTTL.Check("dispatch: LeaseTTL", c.LeaseTTL); err != nil {
			return err
		}
		if c.LeaseTTL%time.Second != 0 {
			return fmt.Errorf("dispatch: LeaseTTL %s: use whole seconds", c.LeaseTTL)
		}
	}
	return nil
}

// DefaultWorkers is the default of Config.Workers, GroupCommitWorkers
// with group commit: a batch pays only when it holds about a hundred
// appends, and each worker makes one at a time (docs/adr/0020).
const (
	DefaultWorkers     = 32
	GroupCommitWorkers = 256
)

// WorkersOrDefault is the number of workers c runs.
func (c Config) WorkersOrDefault() int { return c.withDefaults().Workers }

func (c Config) withDefaults() Config {
	if c.GroupCommit {
		c.Workers = cmp.Or(c.Workers, GroupCommitWorkers)
	}
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.Source = cmp.Or(c.Source, "jetflow/dispatcher")
	c.CacheSize = cmp.Or(c.CacheSize, 10000)
	c.CacheBytes = cmp.Or(c.CacheBytes, DefaultCacheBytes)
	c.AckWait = cmp.Or(c.AckWait, bus.DefaultDispatcherAckWait)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, 1024)
	c.BulkAfter = cmp.Or(c.BulkAfter, DefaultBulkAfter)
	c.LocalConcurrency = cmp.Or(c.LocalConcurrency, 64)
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
	// retryingHere counts the workers retrying a message in process
	// (process, retryHereFor).
	retryingHere atomic.Int32

	cfg  Config
	js   jetstream.JetStream
	log  zerolog.Logger
	defs *catalog.Store
	ids  *claim.Store

	locks *lock.Table // the lock bucket (locks.go)
	// seen: what look-ups read of the agents' queues and reports
	// (queued.go); lookupAfter: how long after its sending a task is
	// looked for before it is published again (half of JF_TASKS' dedupe
	// window).
	seen        seenTasks
	lookupAfter time.Duration
	tasks       jetstream.Stream // JF_TASKS
	// taskCommit publishes the tasks in atomic batches (GroupCommit);
	// nil: each task is a publish of its own.
	taskCommit *groupcommit.Committer
	keeper     *keeper // publishes JF_TASKS' keepers (keeper.go)
	hist       *history.Store

	// maxEvent is the largest payload an event may have: the server's
	// message limit, less room for headers and the other fields.
	maxEvent int

	damages damageLog // damages logged (damage.go)

	parts partitions // the partitions it holds (partitions.go)
	// noNotices: a notices consumer was found not made (an older
	// bootstrap), and said so once; later: the goroutines binding them
	// once made (noticesLater).
	noNotices atomic.Bool
	later     sync.WaitGroup
	work      atomic.Pointer[turns] // the turns of Run (direct reports look at their backlog)
	started   time.Time             // when Run began
	running   atomic.Bool           // its consumers are bound and its partition table runs
	stopping  <-chan struct{}       // closed when Run is asked to stop

	mu    sync.Mutex // guards cache
	cache *lru[string, *execState]
	// pinned shares the decoded definitions of the cached executions.
	pinned *pinnedDefs

	// handling serialises withExecution per execution. A worker handles
	// the messages routed to it one at a time, but a message that names
	// several executions (a clear-lock command) is routed by its own id,
	// so it can reach an execution while the execution's worker handles
	// it; both would change the same cached state.
	handling keyedMutex

	// soon: the timers due soon that fire from memory (soon.go); nil
	// with NoTimersFromMemory.
	soon *soonTimers
	// local runs the local steps (local.go); rescue gathers the
	// partitions taken, to look for those a dispatcher that died left
	// (rescue.go).
	local  *localOps
	rescue *rescuer
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
	failed := &commitFailures{log: log}
	hist, err := history.OpenWith(ctx, js, history.Options{GroupCommit: cfg.GroupCommit, GroupCommitFailed: failed.of(bus.StreamEvents)})
	if err != nil {
		return nil, err
	}
	n, err := bus.Partitions(ctx, js)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bus.BucketDispatchers, err)
	}
	tasks, lookupAfter, err := taskLookupAfter(ctx, js)
	if err != nil {
		return nil, err
	}
	var taskCommit *groupcommit.Committer
	if cfg.GroupCommit {
		if err := bus.AllowsAtomicBatches(tasks.CachedInfo().Config); err != nil {
			return nil, err
		}
		taskCommit = groupcommit.New(js, groupcommit.Config{Timeout: bus.PublishAttempt, Failed: failed.of(bus.StreamTasks)})
	}
	var soon *soonTimers
	if !cfg.NoTimersFromMemory {
		soon = newSoonTimers(cfg.soonHorizon, cfg.noticeLead)
	}
	return &Dispatcher{soon: soon, local: newLocalOps(cfg, log), rescue: newRescuer(), tasks: tasks, taskCommit: taskCommit, keeper: newKeeper(js, log), lookupAfter: lookupAfter, cfg: cfg, js: js, log: log, defs: defs, ids: ids, locks: locks, hist: hist, cache: newLRU[string](cfg.CacheSize, cfg.CacheBytes, (*execState).size),
		pinned: newPinnedDefs(maxPinnedDefs), maxEvent: int(js.Conn().MaxPayload()) - 64<<10,
		parts: partitions{n: n, kv: kv, running: map[int]*consuming{}}}, nil
}

// taskLookupAfter checks that the dispatcher can look for a task it may
// have sent (docs/adr/0007) and returns after how long it must: half of
// the tasks stream's dedupe window (the other half covers clocks apart).
// The stream must allow direct gets, and the dispatcher's identity read
// them: a stream or credentials older than this release are refused with
// what to do, rather than failing each look-up.
func taskLookupAfter(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, time.Duration, error) {
	s, err := js.Stream(ctx, bus.StreamTasks)
	if err != nil {
		return nil, 0, fmt.Errorf("open stream %s: %w", bus.StreamTasks, err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowDirect || cfg.Duplicates <= 0 {
		return nil, 0, fmt.Errorf("stream %s does not allow direct gets or has no dedupe window, which this release needs: "+
			"run jetflow bootstrap of this release first (docs/upgrades.md)", bus.StreamTasks)
	}
	for attempt := 1; ; attempt++ { // a leader election or a busy server: asked again
		probe, cancel := context.WithTimeout(ctx, bus.ServiceRequestTimeout)
		_, err = s.GetLastMsgForSubject(probe, bus.TaskSubject("probe")+".none")
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			return s, cfg.Duplicates / 2, nil
		}
		if attempt == 5 || ctx.Err() != nil {
			return nil, 0, fmt.Errorf("read stream %s with a direct get, which this release needs (credentials issued before it may not allow it: "+
				"issue the dispatcher's again, docs/upgrades.md): %w", bus.StreamTasks, err)
		}
		time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
	}
}

// recheckSent forgets the tasks noted stored (projections.MarkSent) that
// are no longer in their queue, for an execution the janitor nudged (a
// reconcile): if such a task left without a report (purged), the step
// is looked for again and its task sent again; one still waiting costs a
// direct get by sequence.
func (d *Dispatcher) recheckSent(ctx context.Context, x *execState) error {
	var gone []string
	for _, st := range x.state.Steps {
		if !st.SentUnrecorded() {
			continue
		}
		if st.Queue == workflow.LocalQueue { // run here: gone if no longer running
			if !d.local.has(st.TaskID) {
				gone = append(gone, st.ID)
			}
			continue
		}
		_, err := d.tasks.GetMsg(ctx, st.TaskSeq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			gone = append(gone, st.ID)
		case err != nil:
			return fmt.Errorf("look for task %s: %w", st.TaskID, err)
		}
	}
	if len(gone) > 0 {
		x.state = projections.ForgetSent(x.state, gone...)
	}
	return nil
}

type job struct {
	msg  jetstream.Msg
	ev   events.Event
	key  string     // execution id
	from *consuming // the partition holding it came from; nil: a shared consumer
	// intake: a command taken from the intake for a partition this
	// dispatcher holds, handled here instead of going through the inbox.
	intake bool
	// alive is when the message was queued or last kept alive (an
	// in-progress acknowledgement): its ack wait runs from then.
	alive time.Time
}

// Run consumes commands and results until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.started, d.stopping = time.Now(), ctx.Done()
	defer d.hist.Close() // once the workers are done (below): their last appends written
	if d.taskCommit != nil {
		defer d.taskCommit.Stop() // so too their last tasks
	}
	defer d.later.Wait() // the notices consumers bound late (noticesLater)
	// Bind every shared consumer before any message is handled: a
	// dispatcher that binds to the bootstrap's consumers takes their ack
	// wait.
	var bound []jetstream.Consumer
	specs := bus.DispatcherConsumers(d.durables())
	for _, c := range specs {
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
	defer d.cfg.Metrics.watchConsumers(d.js, d)()
	// The workers handle executions in turns (fair.go).
	work := newTurns()
	d.work.Store(work)
	// Fired timers are recorded in batches first (fires.go).
	fires := newFireQueue()
	stopBeats := make(chan struct{})
	defer close(stopBeats)
	go d.keepQueuedAlive(work, fires, stopBeats)
	var wg sync.WaitGroup
	for range d.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j, ok := work.next()
				if !ok {
					return
				}
				d.process(ctx, j)
				work.done(j)
			}
		}()
	}
	var ccs []*bus.Consuming
	tableDone := make(chan struct{})
	close(tableDone) // until the table runs
	stopFires, firesDone := make(chan struct{}), make(chan struct{})
	stopSoon, soonDone := make(chan struct{}), make(chan struct{})
	close(soonDone) // until timers fire from memory
	defer func() {
		<-tableDone // the table gave its partitions back (their jobs are done)
		for _, cc := range ccs {
			cc.Drain()
		}
		close(stopSoon)
		<-soonDone // nothing more comes to the fire loop from memory
		close(stopFires)
		<-firesDone // what the fire loop held is with the workers
		work.close()
		wg.Wait()
		// The local steps running on goroutines of their own end with
		// ctx; each asks for its step to be run again.
		if !d.local.wait(5 * time.Second) {
			d.log.Warn().Msg("local step handlers still running 5s after the dispatcher stopped (they ignore their context): their steps run again elsewhere")
		}
		d.local.over.Store(true)
	}()
	// toWorkers hands a job to the workers, behind its execution's others.
	toWorkers := func(j job) {
		if ctx.Err() != nil || !work.add(j) {
			_ = j.msg.Nak() // shutting down: hand it to another dispatcher now
			j.from.done()
		}
	}
	go func() { defer close(firesDone); d.fireLoop(ctx, fires, toWorkers, stopFires) }()
	// queue hands a job to the workers, a fired timer by way of the fire
	// loop; enqueue checks a message first. from is the partition holding
	// it came from (nil for the shared consumers).
	queue := func(j job) {
		j.alive = time.Now()
		if p, fired := j.ev.Data.(*events.FireTimer); fired && !j.intake && ctx.Err() == nil {
			if _, fromMemory := j.msg.(*soonMsg); !fromMemory {
				switch d.soon.stand(p.ExecutionID, p.TimerID) {
				case handledHere: // fired from memory and handled
					_ = j.msg.Ack()
					j.from.done()
					return
				case firedHere: // and still in hand: decided once it is handled
					_ = j.msg.NakWithDelay(firedHereAgain)
					j.from.done()
					return
				}
				d.cfg.Metrics.fired(false)
			}
			fires.add(j)
			return
		}
		toWorkers(j)
	}
	d.local.start(ctx, queue)
	rescueCtx, stopRescues := context.WithCancel(ctx)
	rescued := make(chan struct{})
	go func() { defer close(rescued); d.runRescues(rescueCtx) }()
	defer func() { stopRescues(); <-rescued }()
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
		Acquire:       func(ctx context.Context, p int, epoch uint64) error { return d.acquire(ctx, p, epoch, enqueue) },
		Release:       d.release,
		Retook:        d.retook,
		HeldMeanwhile: func(p int, epoch uint64) { d.heldMeanwhile(ctx, p, epoch) },
		OnError:       func(err error, what string) { d.log.Warn().Err(err).Msg(what) },
	})
	if err != nil {
		return err
	}
	d.parts.table = table
	defer d.cfg.Metrics.watchPartitions(table, d.parts.n)()
	defer d.cfg.Metrics.watchCommits(d)()
	if d.soon != nil { // once the table is set: it asks it whether a timer's partition is held
		soonDone = make(chan struct{})
		go func() {
			defer close(soonDone)
			warmed := make(chan struct{})
			go func() { defer close(warmed); d.warmSoon(ctx, stopSoon) }()
			d.fireSoon(ctx, queue, stopSoon)
			<-warmed
		}()
	}
	for i, cons := range bound {
		handler := func(m jetstream.Msg) { enqueue(m, nil) }
		if cons.CachedInfo().Name == bus.ConsumerDispatcherCommands {
			handler = func(m jetstream.Msg) { d.routeCommand(ctx, m, queue) }
		}
		opts := bus.Consume(jetstream.PullMaxMessages(64), bus.StopIfGone(d.js, specs[i], nil))
		cc, err := cons.Consume(handler, opts...)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting: not an error
			}
			return fmt.Errorf("consume %s: %w", cons.CachedInfo().Name, err)
		}
		// Consumed again should the consumer be deleted under it.
		spec := specs[i]
		ccs = append(ccs, bus.Resume(ctx, cc, bus.Starter(d.js, !d.cfg.BindOnly, spec, func(err error) {
			d.log.Warn().Err(err).Msg("waiting for the bootstrap")
		}, handler, opts...), func(err error) {
			d.log.Warn().Err(err).Str("consumer", spec.Config.Durable).Msg("a consumer stopped delivering (deleted?): binding it again")
		}))
	}
	tableDone = make(chan struct{})
	tableErr := make(chan error, 1)
	go func() { defer close(tableDone); tableErr <- table.Run(ctx) }()
	watched := make(chan struct{})
	go func() { defer close(watched); d.watchLocks(ctx) }()
	defer func() { <-watched }()
	d.running.Store(true)
	context.AfterFunc(ctx, func() { d.running.Store(false) }) // stopping: not ready
	d.log.Info().Int("workers", d.cfg.Workers).Int("partitions", d.parts.n).Str("member", d.cfg.Member).
		Bool("direct_reports", !d.cfg.NoDirectReports).Bool("timers_from_memory", d.soon != nil).
		Bool("timer_notices", d.soon != nil && !d.cfg.NoTimerNotices).Bool("group_commit", d.cfg.GroupCommit).Msg("dispatcher running")
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

// Ready says why the dispatcher does not serve (nil when it does): its
// shared consumers are not bound yet, or its partition table does not
// run yet. (Holding no partition is ready: another dispatcher holds them.)
func (d *Dispatcher) Ready() error {
	if !d.running.Load() {
		return errors.New("binding its consumers")
	}
	return nil
}

// beatEvery is how often a message in this dispatcher's hands, queued or
// being handled, is kept alive: every third of its consumer's ack wait,
// and at least every third of the default (a consumer bootstrapped with
// a shorter wait after this dispatcher bound it).
func (d *Dispatcher) beatEvery(j job) time.Duration {
	if j.intake {
		return bus.IntakeAckWait / 3
	}
	return min(d.cfg.AckWait, bus.DefaultDispatcherAckWait) / 3
}

// keepQueuedAlive keeps the messages waiting in the turns alive until
// stop is closed: a message waiting behind its execution's backlog (a
// fan-out's reports) longer than its ack wait would be delivered again,
// payload and all, every ack wait, and a shared consumer's to another
// dispatcher, which would handle it a second time.
func (d *Dispatcher) keepQueuedAlive(work *turns, fires *fireQueue, stop <-chan struct{}) {
	tick := time.NewTicker(max(10*time.Millisecond, min(500*time.Millisecond, bus.IntakeAckWait/4, d.cfg.AckWait/4)))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			for _, m := range append(work.due(now, d.beatEvery), fires.due(now, d.beatEvery)...) {
				_ = m.InProgress()
			}
		}
	}
}

// keepAlive tells JetStream every interval that m is still being
// handled, until handled is closed.
func (d *Dispatcher) keepAlive(m jetstream.Msg, every time.Duration, handled <-chan struct{}) {
	t := time.NewTicker(every)
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

// permanentError marks a message that can never succeed; it is terminated.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func (d *Dispatcher) process(ctx context.Context, j job) {
	defer j.from.done()
	// The partition moved on (its next holder takes it), or this holding's
	// renewal is late (a lease renewed or taken back within handOver is
	// waited for; a retake goes on with the jobs in hand): in a moment,
	// not in a hot loop.
	if j.from != nil && !d.parts.table.Await(ctx, j.from.part, j.from.epoch.Load(), handOver) {
		_ = j.msg.NakWithDelay(handOver)
		return
	}
	if dm, ok := j.msg.(*directMsg); ok {
		if dm.late(time.Now()) {
			_ = dm.refuse("its agent stopped waiting for the answer")
			return // it stores the report: handled from the results stream
		}
		dm.id = j.ev.ID
		ctx = context.WithValue(ctx, directKey{}, dm) // the handling notes what the answer says
	}
	log := d.log.With().Str("execution_id", j.key).Str("handling", string(j.ev.Type)).Logger()
	// A long handling (a large foreach of the dispatcher's own steps) keeps
	// the message: without progress it would be redelivered meanwhile.
	handled := make(chan struct{})
	every := d.beatEvery(j)
	// Its ack wait runs from when it was queued or last kept alive while
	// it waited (keepQueuedAlive), not from when its handling began.
	hb := time.AfterFunc(max(0, every-time.Since(j.alive)), func() { d.keepAlive(j.msg, every, handled) })
	if md, err := j.msg.Metadata(); err == nil {
		if _, result := events.ResultRef(j.ev.Data); !result {
			j.ev.Time = sentAt(j.ev.Time, md.Timestamp)
		}
	}
	began, retryHere := time.Now(), retryHereFor
	if _, direct := j.msg.(*directMsg); direct {
		retryHere = 0 // refused at once: its agent stores it, and the stored one is tried again
	}
	err := d.handle(log.WithContext(ctx), j.ev)
	// A failure that may pass (a stream or bucket electing a leader) is
	// tried again here, the message kept, for up to retryHereFor. Handed
	// back to JetStream instead, its redelivery would wait on its consumer,
	// whose leader may be in the same election: a Nak sent meanwhile is
	// lost, and the message comes back only after its ack wait.
	//
	// At most a quarter of the workers retry so at once (retryingHere): a
	// resource that stays unhealthy (one queue's stream, the lock bucket)
	// must not hold every worker, and executions that do not use it, for
	// retryHereFor; past that, a message is handed back as before.
	if err != nil && bus.Transient(err) {
		if d.retryingHere.Add(1) > int32(max(1, d.cfg.Workers/4)) {
			retryHere = 0
		}
		first, tries := err, 1
		for ; err != nil && bus.Transient(err) && ctx.Err() == nil && time.Since(began) < retryHere; tries++ {
			select {
			case <-ctx.Done():
			case <-time.After(min(retryDelay(tries), time.Second)):
			}
			// A renewal merely late (the dispatchers' bucket electing a
			// leader too) is waited for; a partition that moved on is its
			// next holder's to handle.
			if ctx.Err() != nil || (j.from != nil && !d.parts.table.Await(ctx, j.from.part, j.from.epoch.Load(), retryHere-time.Since(began))) {
				break
			}
			err = d.handle(log.WithContext(ctx), j.ev)
		}
		d.retryingHere.Add(-1)
		if tries > 1 {
			// Said once per message, not per try: what a failover cost it.
			log.Info().AnErr("first_error", first).AnErr("last_error", err).Int("tries", tries).
				Dur("took", time.Since(began)).Msg("tried again in process")
		}
	}
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
	case ctx.Err() != nil:
		// Stopping: what failed may have failed for that (a read cut
		// short); whoever handles it next decides whether it is permanent.
		_ = j.msg.Nak()
	case errors.As(err, &perm):
		log.Error().Err(err).Msg("drop message that cannot be applied")
		_ = j.msg.Term()
	default:
		log.Warn().Err(err).Dur("retry_in", retryLater(j.msg)).Msg("handle message, will retry")
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
	case *events.TimerNotice:
		return d.noticeTimer(ctx, p)
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
		if err := d.recheckSent(ctx, x); err != nil {
			return err
		}
		if err := d.checkChildren(ctx, x); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}
