package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// A dispatcher handles the executions of the partitions it holds (package
// partition decides which): for each, it consumes the partition's inbox
// (commands the intake checked), reports, timers and long timers'
// notices. Partition p's messages are handled only while p is held; when
// it is given up they are left to the next holder, which resets the
// consumers so that what this one held is delivered again at once
// instead of after the ack wait.
//
// Holding a partition makes it rare, not impossible, that another
// dispatcher writes one of its executions (a clear-lock is routed by its
// own id and may name executions of other partitions, shared consumers
// still deliver reports and timers stored before partitions, and a holder
// that lost its lease goes on until it notices): the history's sequence
// check stays the fence, and a cached state is confirmed before a
// decision to change nothing and before a lock-bucket write, as without
// partitions (see withExecutionAs and ensureCurrent). A state cached in an
// earlier holding is read again.
//
// A lease that expired under this dispatcher (its process was starved past
// the lease's TTL) and that nobody held is taken back at once, as a new
// holding of the same consuming (retook): states cached before are read
// again, since another dispatcher may have held the partition during the
// stall, and the messages in hand are still handled here, in the new
// holding; the consumers are not reset. Should the table learn that
// another dispatcher did hold it meanwhile (heldMeanwhile), they are: what
// that one had pulled and not handed back is then delivered again now,
// not after the ack wait.

// partitions is the dispatcher's side of the partition table.
type partitions struct {
	n     int
	kv    jetstream.KeyValue // the dispatchers bucket
	table *partition.Table   // set by Run

	// mu guards running. Lock order: mu, then a consuming's mu or the
	// table's own lock (acquire asks the table under mu; the table calls
	// retook without its lock held).
	mu      sync.Mutex
	running map[int]*consuming
}

// consuming is a held partition being consumed: from the holding that
// acquired it (first) through the retakes of its lease (epoch follows
// them, see retook).
type consuming struct {
	part     int
	first    uint64
	epoch    atomic.Uint64 // the holding's epoch now
	inFlight atomic.Int64  // jobs of the partition queued or being handled
	// work is the dispatcher's queue of jobs (nil in tests of a holding
	// alone): stop takes the holding's jobs still waiting there out of it.
	work *turns

	// notices: the partition's notices consumer is consumed here, so the
	// timers of its executions may have notices set (docs/adr/0019).
	notices atomic.Bool

	mu      sync.Mutex // guards below
	ccs     []*bus.Consuming
	specs   []bus.Consumer       // the consumers of ccs, in order
	subs    []*nats.Subscription // the partition's direct reports (direct.go)
	stopped bool
}

// partitionOf returns the partition of an execution.
func (d *Dispatcher) partitionOf(id string) int { return partition.Of(id, d.parts.n) }

// holds reports whether the dispatcher handles execution id's partition,
// and the epoch of that holding.
func (d *Dispatcher) holds(id string) (epoch uint64, ok bool) {
	epoch, _, ok = d.holdsSince(id)
	return epoch, ok
}

// holdsSince is holds with the epoch the holding goes on from by
// retakes (partition.Table.HoldsSince).
func (d *Dispatcher) holdsSince(id string) (epoch, since uint64, ok bool) {
	if d.parts.table == nil {
		return 0, 0, false
	}
	return d.parts.table.HoldsSince(d.partitionOf(id))
}

// covers reports whether epoch is r's holding or one it went on from.
func (r *consuming) covers(epoch uint64) bool {
	return r.first <= epoch && epoch <= r.epoch.Load()
}

// acquire starts consuming partition p for its holding epoch, which the
// table just took.
func (d *Dispatcher) acquire(ctx context.Context, p int, epoch uint64, enqueue func(jetstream.Msg, *consuming)) error {
	// current: the table still holds p in this holding or a retake of it
	// (a release may come before this start is done; then it must not
	// start at all). A renewal merely late is no release: a start slowed
	// by a starved process goes on.
	current := func() bool {
		_, ok := d.parts.table.Current(p, epoch)
		return ok
	}
	r := &consuming{part: p, first: epoch, work: d.work.Load()}
	d.parts.mu.Lock()
	// Under d.parts.mu: a retake's hook (retook) sees r, or r has its epoch.
	now, ok := d.parts.table.Current(p, epoch)
	if !ok {
		d.parts.mu.Unlock()
		return nil
	}
	r.epoch.Store(now)
	old := d.parts.running[p]
	d.parts.running[p] = r
	d.parts.mu.Unlock()
	if old != nil {
		old.stop(handlingMax) // a holding lost and taken again: start afresh
	}
	// Direct reports are listened for before anything is consumed: a
	// start consumed below may send a task at once, and its agent's
	// report must find this holder listening, not be told that nobody
	// does (it would be stored on the results stream). The subscription
	// and the task go out on one connection, so the server this
	// connection talks to has the one before the other; in a cluster, an
	// agent on another server may see the interest later, and then stores
	// its report, as without direct reports.
	if !d.cfg.NoDirectReports {
		sub, err := d.listenDirect(p, r, enqueue)
		if err != nil {
			return err
		}
		if !r.addSub(sub) {
			return nil // released meanwhile
		}
	}
	for _, c := range bus.PartitionConsumers(d.durables(), p) {
		// Made by the bootstrap since notices have their own subjects:
		// against an older one, the partition is taken without it, and
		// it is bound once made (noticesLater).
		later := d.cfg.BindOnly && c.Config.Durable == bus.PartitionNoticesConsumer(p)
		bctx, cancel := context.WithCancel(ctx)
		wait := func(err error) {
			d.log.Warn().Err(err).Int("partition", p).Msg("waiting for the bootstrap")
		}
		if later {
			wait = func(err error) {
				if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
					cancel()
					return
				}
				d.log.Warn().Err(err).Int("partition", p).Msg("waiting for the bootstrap")
			}
		}
		cons, err := bus.Bind(bctx, d.js, !d.cfg.BindOnly, c, wait)
		cancel()
		if err != nil && later && ctx.Err() == nil {
			d.later.Go(func() { d.noticesLater(ctx, r, c, current, enqueue, err) })
			continue
		}
		if err != nil {
			return err
		}
		if ok, err := d.consumeBound(ctx, r, c, cons, current, enqueue); !ok || err != nil {
			return err
		}
	}
	if !current() { // released while starting: the release found nothing to stop yet
		d.stopHolding(r)
		return nil
	}
	// Info once running: a move is worth telling an operator; the first
	// takes of a dispatcher starting are its "dispatcher running".
	lvl := zerolog.InfoLevel
	if time.Since(d.started) < 5*time.Second {
		lvl = zerolog.DebugLevel
	}
	vacancy := d.parts.table.Vacancy(p, epoch)
	d.cfg.Metrics.took(vacancy)
	d.log.WithLevel(lvl).Int("partition", p).Uint64("epoch", epoch).Stringer("lease", vacancy).Msg("partition taken")
	if mayHaveDied(vacancy) {
		d.rescue.took(p) // its last holder may have died running local steps
	}
	return nil
}

// consumeBound resets partition p's consumer c, bound as cons, and
// consumes it for the holding r; ok is false when the holding was
// released meanwhile (nothing more is to be started for it).
func (d *Dispatcher) consumeBound(ctx context.Context, r *consuming, c bus.Consumer, cons jetstream.Consumer,
	current func() bool, enqueue func(jetstream.Msg, *consuming)) (ok bool, err error) {
	p := r.part
	// Whatever the last holder had in hand (it died, or let go
	// before handling it) is delivered again now, not after the
	// ack wait. Messages it had handled and acknowledged are not
	// (work queues drop them; the reports' consumer may repeat a
	// few, which are recognised as stale).
	if !current() {
		d.stopHolding(r)
		return false, nil
	}
	if _, err := d.js.ResetConsumer(ctx, c.Stream, c.Config.Durable); err != nil {
		return false, fmt.Errorf("reset consumer %s: %w", c.Config.Durable, err)
	}
	name := c.Config.Durable
	// Timers come due by the thousand at once and are recorded in
	// batches (fires.go): pulled a batch at a time.
	pull := 64
	if c.Stream == bus.StreamTimers {
		pull = fireBatchMax
	}
	handler := func(m jetstream.Msg) {
		r.inFlight.Add(1)
		enqueue(m, r)
	}
	opts := bus.Consume(jetstream.PullMaxMessages(pull), bus.StopIfGone(d.js, c, func(err error) {
		if ctx.Err() == nil {
			d.log.Warn().Err(err).Str("consumer", name).Msg("consume partition")
		}
	}))
	cc, err := cons.Consume(handler, opts...)
	if err != nil {
		return false, fmt.Errorf("consume %s: %w", c.Config.Durable, err)
	}
	// Consumed again, while the partition is held here, should the
	// consumer be deleted under it.
	start := bus.Starter(d.js, !d.cfg.BindOnly, c, func(err error) {
		d.log.Warn().Err(err).Int("partition", p).Msg("waiting for the bootstrap")
	}, handler, opts...)
	resumed := bus.Resume(ctx, cc, func(ctx context.Context) (jetstream.ConsumeContext, error) {
		if !current() {
			return nil, errNotHeld
		}
		return start(ctx)
	}, func(err error) {
		if errors.Is(err, errNotHeld) {
			return
		}
		d.log.Warn().Err(err).Str("consumer", name).Msg("a partition's consumer stopped delivering (deleted?): binding it again")
	})
	if !r.add(c, resumed) {
		return false, nil // released meanwhile
	}
	if c.Config.Durable == bus.PartitionNoticesConsumer(p) {
		r.notices.Store(true)
	}
	return true, nil
}

// noticesLater binds partition r.part's notices consumer c, which the
// bootstrap had not made when the partition was taken (an older
// bootstrap, and this dispatcher may not make consumers: err said why),
// once it is made, for as long as the holding lasts. Meanwhile no notice
// is set for the partition's timers (noticesHere): each has its firing
// scheduled for its due time, as without notices.
func (d *Dispatcher) noticesLater(ctx context.Context, r *consuming, c bus.Consumer,
	current func() bool, enqueue func(jetstream.Msg, *consuming), err error) {
	if d.noNotices.CompareAndSwap(false, true) {
		d.log.Warn().Err(err).Str("consumer", c.Config.Durable).
			Msg("the long timers' notices consumers are not made: run this release's jetflow bootstrap; until then no notice is set, and long timers fire by their schedules")
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(noticesRetry):
		}
		if !current() || r.isStopped() {
			return
		}
		bctx, cancel := context.WithTimeout(ctx, noticesRetry)
		cons, err := bus.Bind(bctx, d.js, false, c, func(error) { cancel() })
		cancel()
		if err != nil {
			continue
		}
		if ok, err := d.consumeBound(ctx, r, c, cons, current, enqueue); err != nil {
			if ctx.Err() == nil {
				d.log.Warn().Err(err).Int("partition", r.part).Msg("consume the long timers' notices")
			}
		} else if ok {
			d.log.Info().Int("partition", r.part).Msg("the long timers' notices consumer is made: notices are set again")
		}
		return
	}
}

// noticesRetry is how often a dispatcher looks for a notices consumer the
// bootstrap had not made (noticesLater).
const noticesRetry = 5 * time.Second

// noticesHere says whether the timers of execution id may have notices
// set: its partition is held here, and its notices consumer consumed.
func (d *Dispatcher) noticesHere(id string) bool { return d.noticesAt(d.partitionOf(id)) }

// noticesAt says whether partition p is held here with its notices
// consumer consumed.
func (d *Dispatcher) noticesAt(p int) bool {
	d.parts.mu.Lock()
	r := d.parts.running[p]
	d.parts.mu.Unlock()
	return r != nil && r.notices.Load()
}

// isStopped says whether the holding r was stopped.
func (r *consuming) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

// release stops consuming partition p's holding epoch and waits (up to
// handlingMax) for the jobs being handled: most of those still queued
// are given back at once (consuming.stop). It reports whether the local
// steps it stopped were all nudged (their next holder asked to run them
// again): if not, the lease is purged rather than deleted, and the next
// holder looks for them (rescue.go).
func (d *Dispatcher) release(p int, epoch uint64) (handedOver bool) {
	d.parts.mu.Lock()
	r := d.parts.running[p]
	d.parts.mu.Unlock()
	if r == nil || !r.covers(epoch) {
		return !d.local.takeUnnudged(p)
	}
	d.stopHolding(r)
	// Nudged before the lease is deleted (when this returns): the next
	// holder, finding it given back, does not look for them. A run that
	// ended before (cut short as Run's context ended) nudged itself; one
	// whose nudge failed, here or before, is in unnudged.
	for _, run := range d.local.release(func(exec string) bool { return d.partitionOf(exec) == p }) {
		d.nudgeOnce(run, run.exec, run.workflow)
	}
	return !d.local.takeUnnudged(p)
}

// mayHaveDied reports whether a partition's last holder may have died
// holding it, by how its lease was found (partition.Vacancy): one never
// held, or given back (its holder nudged the executions of the local
// steps it stopped running: release), left nothing to look for.
func mayHaveDied(v partition.Vacancy) bool {
	return v != partition.VacancyNever && v != partition.VacancyReleased
}

// stopHolding stops consuming r, if it is still its partition's.
func (d *Dispatcher) stopHolding(r *consuming) {
	d.parts.mu.Lock()
	if d.parts.running[r.part] != r {
		d.parts.mu.Unlock()
		return
	}
	delete(d.parts.running, r.part)
	d.parts.mu.Unlock()
	r.stop(handlingMax)
	lvl := zerolog.InfoLevel
	select {
	case <-d.stopping: // every partition goes when the dispatcher stops
		lvl = zerolog.DebugLevel
	default:
	}
	d.log.WithLevel(lvl).Int("partition", r.part).Uint64("epoch", r.epoch.Load()).Msg("partition given up")
}

// retook follows the table's retake of partition p's lease: holding new
// goes on from old without a release, with the same consumers, the jobs
// in hand and the states cached (each used again once its history is
// found not to have moved: cached). It runs on the table's loop: quick.
func (d *Dispatcher) retook(p int, old, new uint64) {
	d.cfg.Metrics.retook()
	d.parts.mu.Lock()
	defer d.parts.mu.Unlock()
	if r := d.parts.running[p]; r != nil && r.covers(old) {
		r.epoch.Store(new)
	}
}

// heldMeanwhile resets partition p's consumers: another dispatcher held p
// during the stall before this one's retake began holding epoch, and what
// it pulled and did not hand back would wait for the ack wait. The jobs in
// hand here are delivered again too, and handled again (a result seen
// twice is stale the second time).
func (d *Dispatcher) heldMeanwhile(ctx context.Context, p int, epoch uint64) {
	d.rescue.took(p) // the one that held it meanwhile may have died running local steps
	d.parts.mu.Lock()
	r := d.parts.running[p]
	d.parts.mu.Unlock()
	if r == nil {
		return // not started yet: its start resets each consumer as it binds it
	}
	// Those bound so far: one bound later (a notices consumer an older
	// bootstrap had not made) is reset as it is bound.
	for _, c := range r.consumers() {
		if _, ok := d.parts.table.Current(p, epoch); !ok || ctx.Err() != nil {
			return // lost or given up since: its next holder resets them
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := d.js.ResetConsumer(rctx, c.Stream, c.Config.Durable)
		cancel()
		if err != nil {
			d.log.Warn().Err(err).Int("partition", p).Str("consumer", c.Config.Durable).Msg("reset consumer after a retake")
		}
	}
	d.log.Info().Int("partition", p).Uint64("epoch", epoch).Msg("partition was held by another dispatcher during a stall: its consumers reset")
}

// errNotHeld: a partition's consumer is not consumed again once the
// partition is no longer held here (its next holder consumes it).
var errNotHeld = errors.New("the partition is no longer held here")

// consumers are the consumers the holding r consumes so far, in the
// order it bound them.
func (r *consuming) consumers() []bus.Consumer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.specs)
}

// add keeps cc, the consuming of c, or drains it if the holding was
// released meanwhile: what it pulled is handed on and given back, as by
// stop (outside r.mu, which the handling may take).
func (r *consuming) add(c bus.Consumer, cc *bus.Consuming) bool {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		cc.DrainWithin(handlingMax)
		return false
	}
	r.ccs, r.specs = append(r.ccs, cc), append(r.specs, c)
	r.mu.Unlock()
	return true
}

// addSub keeps sub, or drains it if the holding was released meanwhile.
func (r *consuming) addSub(sub *nats.Subscription) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		_ = sub.Drain()
		return false
	}
	r.subs = append(r.subs, sub)
	return true
}

// stop stops pulling and waits up to wait for the jobs in hand. What the
// server delivered and the handling has not seen yet (the pulls' buffers,
// and what is on the wire) is handed on and given back (process Naks what
// a holding no longer handles), not dropped: dropped, it would wait for
// the ack wait, since the next holder's reset of the consumers may have
// come before this holding stopped pulling (its dispatcher, starved,
// noticed the lease lost late). The direct reports already in hand are
// handed on and answered (refused, once the holding is over) for the same
// reason: their agents store them at once instead of waiting for an
// answer that never comes. The jobs still waiting for a worker are taken
// out of the queue and given back at once (withdraw), but for a local
// step's report or a timer fired from memory: behind a backlog, a worker
// would reach them late, and the hand-over (the lease is given back once
// stop returns) would wait for it.
func (r *consuming) stop(wait time.Duration) {
	r.mu.Lock()
	r.stopped = true
	ccs, subs := r.ccs, r.subs
	r.mu.Unlock()
	deadline := time.Now().Add(wait)
	var drains sync.WaitGroup
	for _, cc := range ccs {
		drains.Go(func() { cc.DrainWithin(wait) })
	}
	for _, sub := range subs {
		_ = sub.Drain()
	}
	drains.Wait()
	// Withdrawn again while it waits: a direct report the subscription's
	// drain (asynchronous) hands on late, or a fired timer the fire loop
	// held, reaches the queue after the first withdrawal.
	r.withdraw()
	for tick := 0; r.inFlight.Load() > 0 && time.Now().Before(deadline); tick++ {
		time.Sleep(5 * time.Millisecond)
		if tick%10 == 9 {
			r.withdraw()
		}
	}
}

// withdraw gives back at once the holding's jobs that wait in the queue
// for a worker: the messages of its consumers and its direct reports (a
// Nak, which for a direct report is a refusal: its agent stores it). A
// local step's report and a timer fired from memory stay queued, and
// stop waits for a worker to reach them as before: their Nak means
// something else (a report queued again, a firing left to its schedule).
func (r *consuming) withdraw() {
	if r.work == nil {
		return
	}
	for _, j := range r.work.withdraw(func(j job) bool {
		switch j.msg.(type) {
		case *localMsg, *soonMsg:
			return false
		}
		return j.from == r
	}) {
		_ = j.msg.Nak()
		r.done()
	}
}

// holding returns partition p's current holding, counting one more job in
// it, if this dispatcher handles p now (nil if not).
func (d *Dispatcher) holding(p int) *consuming {
	if d.parts.table == nil {
		return nil
	}
	epoch, ok := d.parts.table.Holds(p)
	if !ok {
		return nil
	}
	d.parts.mu.Lock()
	defer d.parts.mu.Unlock()
	r := d.parts.running[p]
	if r == nil || r.epoch.Load() != epoch {
		return nil // not started yet, or a retake's hook is on its way
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return nil
	}
	r.inFlight.Add(1)
	return r
}

// done marks a job of the holding r finished (nil: a shared consumer's).
func (r *consuming) done() {
	if r != nil {
		r.inFlight.Add(-1)
	}
}

// CommandSubjectHeader names, on a command in the inbox, the subject it
// was published on. Only dispatchers publish to the inbox.
const CommandSubjectHeader = "Jetflow-Command-Subject"

// inboxSubject is where the intake puts ev: its execution's partition,
// and the execution's id as the last token (a hash of the key for the
// commands that name no single execution, such as a clear-lock).
func (d *Dispatcher) inboxSubject(ev events.Event) string { return inboxSubjectOf(ev, d.parts.n) }

// inboxSubjectOf is inboxSubject with the number of partitions.
func inboxSubjectOf(ev events.Event, partitions int) string {
	key := routingKey(ev)
	token := key
	if !events.ValidExecutionID(key) {
		sum := sha256.Sum256([]byte(key))
		token = "k" + hex.EncodeToString(sum[:12])
	}
	return bus.InboxSubject(partition.Of(key, partitions), token)
}

func (d *Dispatcher) durables() bus.Durables {
	return bus.Durables{DispatcherAckWait: d.cfg.AckWait, DispatcherMaxAckPending: d.cfg.MaxAckPending, Partitions: d.parts.n}
}

// route puts a checked command on its execution's partition in the inbox
// stream. Its id makes a second routing of the same stored command (the
// intake died before acknowledging it) a duplicate the stream drops.
//
// The command goes on as it was published (its headers and body byte for
// byte: the handler's strict checks see what the sender sent), with the
// subject it arrived on in the header [CommandSubjectHeader], from which
// the handler decides its actor again.
func (d *Dispatcher) route(ctx context.Context, m jetstream.Msg, ev events.Event) error {
	msg := nats.NewMsg(d.inboxSubject(ev))
	for k, vs := range m.Headers() {
		if strings.HasPrefix(strings.ToLower(k), "nats-") || strings.EqualFold(k, CommandSubjectHeader) {
			continue // JetStream's own (message id, expectations) are the sender's to its stream; ours is set below
		}
		msg.Header[k] = vs
	}
	msg.Header.Set(CommandSubjectHeader, m.Subject())
	msg.Data = m.Data()
	id := "route-" + m.Subject() + "-" + ev.ID
	if md, err := m.Metadata(); err == nil {
		id = fmt.Sprintf("route-%d", md.Sequence.Stream)
	}
	if _, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("route command to %s: %w", msg.Subject, err)
	}
	return nil
}
