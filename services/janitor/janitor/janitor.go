// Package janitor is periodic and event-driven maintenance done as an
// ordinary JetStream client:
//
//   - lost tasks: a task delivered MaxDeliver times without a result (its
//     agents died or hung) raises a JetStream advisory, captured in a
//     stream; the janitor reports the step failed and removes the task;
//   - idle executions: a started execution with no activity for IdleAfter
//     is nudged with a reconcile command (the dispatcher re-decides, which
//     is idempotent), and a step whose task vanished from its queue without
//     a result is reported failed;
//   - retention: finished executions that their retention rule no longer
//     keeps have their history and read model deleted (see retention.go).
package janitor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/workflow"
)

// AdvisoriesConsumer is the janitor's durable consumer of advisories.
const AdvisoriesConsumer = bus.ConsumerJanitorAdvisories

// Config configures a Janitor. Its durations must lie in [Ranges]; zero
// is the default.
type Config struct {
	// Interval between sweeps. Default 30s.
	Interval time.Duration
	// IdleAfter is how long a started execution may show no activity
	// before the sweep looks at it. Default 2m.
	IdleAfter time.Duration
	// Source is the CloudEvents source of what it publishes. Default "jetflow/janitor".
	Source string
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// RetentionDefault is the system retention rule: it applies to
	// executions whose workflow sets none, and to parent and system in
	// rules. It cannot refer to context, parent or system. Default
	// DefaultRetention: the three most recent finished executions of each
	// group, and every one that finished in the last 7 days.
	RetentionDefault string
	// Registerer, if set, receives the janitor's Prometheus metrics.
	Registerer prometheus.Registerer
	// BindOnly: the advisories consumer exists (made by the bootstrap) and
	// this janitor may not create or change it.
	BindOnly bool
	// CatchUpEvery is how often, between sweeps, the janitor reads the
	// read models that settled since its last read into its index, when
	// Interval is at least twice it (see DefaultCatchUpEvery). Default
	// DefaultCatchUpEvery; negative: never (the sweeps alone read).
	CatchUpEvery time.Duration
}

func (c Config) withDefaults() Config {
	c.Interval = cmp.Or(c.Interval, 30*time.Second)
	c.IdleAfter = cmp.Or(c.IdleAfter, 2*time.Minute)
	c.Source = cmp.Or(c.Source, "jetflow/janitor")
	c.RetentionDefault = cmp.Or(c.RetentionDefault, DefaultRetention)
	c.CatchUpEvery = cmp.Or(c.CatchUpEvery, DefaultCatchUpEvery)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Ranges are the values Config's durations may take once their defaults
// are applied (zero is the default). Validate checks them, and
// jetflow-janitor's flags take the same.
var Ranges = struct {
	Interval, IdleAfter, CatchUpEvery svc.Range[time.Duration]
}{
	// A sweep reads the read models written since the one before (all
	// of them every FullReadEvery): more often than every 10ms it would
	// do little else; a day is the longest a lost step may wait for one.
	Interval:  svc.Range[time.Duration]{Min: 10 * time.Millisecond, Max: 24 * time.Hour},
	IdleAfter: svc.Range[time.Duration]{Min: 100 * time.Millisecond, Max: 7 * 24 * time.Hour},
	// A catch-up asks the bucket where it stands (a request) even when
	// nothing settled: not more often than every 100ms. A positive
	// CatchUpEvery lies in it; a negative one is never.
	CatchUpEvery: svc.Range[time.Duration]{Min: 100 * time.Millisecond, Max: time.Hour},
}

// Validate checks a configuration, its defaults applied: New does, and a
// program may before it connects.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := cmp.Or(
		Ranges.Interval.Check("janitor: Interval", c.Interval),
		Ranges.IdleAfter.Check("janitor: IdleAfter", c.IdleAfter),
	); err != nil {
		return err
	}
	if c.CatchUpEvery > 0 {
		if !Ranges.CatchUpEvery.Contains(c.CatchUpEvery) {
			return fmt.Errorf("janitor: CatchUpEvery (-catch-up-every, JETFLOW_JANITOR_CATCH_UP_EVERY) %s: out of range, use a negative value (never; 0 on the command line) or %s", svc.ShortDuration(c.CatchUpEvery), Ranges.CatchUpEvery)
		}
	}
	if _, err := retention.ParseDefault(c.RetentionDefault); err != nil {
		return fmt.Errorf("janitor: RetentionDefault (-retention-default, JETFLOW_RETENTION_DEFAULT) %q: %w", c.RetentionDefault, err)
	}
	return nil
}

// Janitor does maintenance.
type Janitor struct {
	cfg     Config
	js      jetstream.JetStream
	log     zerolog.Logger
	system  retention.Rule
	metrics *metrics

	running   atomic.Bool                 // its consumer is bound (Run)
	lastSweep atomic.Pointer[sweepStatus] // the last sweep's outcome

	sweeping sync.Mutex // one sweep (or catch-up) at a time
	index    modelIndex // the read models, as the last read (a sweep's or a catch-up's) left them
	// catchUpEvery is how often Run brings the index up to date between
	// sweeps (Config.CatchUpEvery; 0: never).
	catchUpEvery time.Duration
}

// DefaultCatchUpEvery is how often, by default, the janitor reads the
// read models that settled since its last read into its index between
// sweeps (the models written before the last read and not since), so
// that a sweep reads only the last few seconds' models, not an
// interval's: the read of 10,000 executions started at once comes a few
// seconds after them, not in whichever sweep comes next, whatever burst
// it falls on. With an Interval shorter than twice it, only the sweeps
// read.
const DefaultCatchUpEvery = 5 * time.Second

// sweepStatus is a sweep's outcome, for Ready.
type sweepStatus struct{ err error }

// Ready says why the janitor does not serve (nil when it does): its
// advisories consumer is not bound yet, or its last sweep failed.
func (j *Janitor) Ready() error {
	if !j.running.Load() {
		return errors.New("binding its consumer")
	}
	if s := j.lastSweep.Load(); s != nil && s.err != nil {
		return fmt.Errorf("last sweep failed: %w", s.err)
	}
	return nil
}

// New returns a janitor; call Run to start it.
func New(cfg Config, js jetstream.JetStream, log zerolog.Logger) (*Janitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	asked := cfg.CatchUpEvery // 0: the default, which a short interval turns off silently
	cfg = cfg.withDefaults()
	system, err := retention.ParseDefault(cfg.RetentionDefault)
	if err != nil {
		return nil, fmt.Errorf("janitor: RetentionDefault %q: %w", cfg.RetentionDefault, err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	j := &Janitor{cfg: cfg, js: js, log: log, system: system, metrics: m}
	if cfg.CatchUpEvery > 0 && cfg.Interval >= 2*cfg.CatchUpEvery {
		j.catchUpEvery = cfg.CatchUpEvery
	} else if asked > 0 {
		log.Warn().Str("catch_up_every", svc.ShortDuration(asked)).Str("interval", svc.ShortDuration(cfg.Interval)).
			Msg("no catch-ups between sweeps: -catch-up-every needs an -interval of at least twice it")
	}
	return j, nil
}

// Run works until ctx ends.
func (j *Janitor) Run(ctx context.Context) error {
	spec := bus.JanitorConsumerSpec()
	consume := bus.Starter(j.js, !j.cfg.BindOnly, spec, func(err error) {
		j.log.Warn().Err(err).Msg("waiting for the bootstrap")
	}, func(m jetstream.Msg) {
		if err := j.lostTask(ctx, m.Data()); err != nil {
			j.log.Warn().Err(err).Msg("handle max-deliveries advisory, will retry")
			_ = m.NakWithDelay(2 * time.Second)
			return
		}
		_ = m.Ack()
	}, bus.Consume(bus.StopIfGone(j.js, spec, nil))...)
	cc, err := consume(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not an error
		}
		return err
	}
	// Consumed again should its consumer be deleted under it.
	advisories := bus.Resume(ctx, cc, consume, func(err error) {
		j.log.Warn().Err(err).Str("consumer", bus.ConsumerJanitorAdvisories).Msg("the advisories consumer stopped delivering (deleted?): binding it again")
	})
	defer advisories.Drain()
	// Record the system rule where the api shows it (jetflow show). Not
	// vital: a failure is logged, and the next start tries again.
	if defs, err := catalog.Open(ctx, j.js); err != nil {
		j.log.Warn().Err(err).Msg("record the system retention rule")
	} else if err := defs.PutSetting(ctx, catalog.SettingRetentionDefault, j.system.String()); err != nil && ctx.Err() == nil {
		j.log.Warn().Err(err).Msg("record the system retention rule")
	}
	j.log.Info().Str("interval", j.cfg.Interval.String()).Str("idle_after", j.cfg.IdleAfter.String()).
		Str("catch_up_every", svc.ShortDuration(j.catchUpEvery)). // 0s: none, the sweeps alone read
		Str("retention_default", j.system.String()).Msg("janitor running")
	j.running.Store(true)
	context.AfterFunc(ctx, func() { j.running.Store(false) }) // stopping: not ready
	t := time.NewTicker(j.cfg.Interval)
	defer t.Stop()
	var catchUp <-chan time.Time
	if j.catchUpEvery > 0 {
		c := time.NewTicker(j.catchUpEvery)
		defer c.Stop()
		catchUp = c.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-catchUp:
			if err := j.catchUp(ctx); err != nil && ctx.Err() == nil {
				// Not vital: the next sweep reads what this did not.
				j.log.Debug().Err(err).Msg("catch up with the read models")
			}
		case <-t.C:
			res, err := j.RunOnce(ctx)
			j.lastSweep.Store(&sweepStatus{err: err})
			if err != nil {
				j.log.Error().Err(err).Msg("sweep")
				continue
			}
			if res.Reconciled+res.LostTasks+res.Expired+res.ExpiryRequested+res.LocksCleared+res.Errors == 0 {
				// Nothing done: not worth a line at the default level (the
				// sweep metrics say it ran).
				j.log.Debug().Int("checked", res.Checked).Int("finished", res.Finished).
					Dur("idle_took", res.IdleTook).Dur("retention_took", res.RetentionTook).Msg("sweep: nothing to do")
			} else {
				j.log.Info().Int("checked", res.Checked).Int("reconciled", res.Reconciled).Int("lost_tasks", res.LostTasks).
					Int("finished", res.Finished).Int("expiry_requested", res.ExpiryRequested).Int("expired", res.Expired).
					Int("locks_cleared", res.LocksCleared).Int("errors", res.Errors).Msg("sweep")
			}
		}
	}
}

// advisory is JetStream's max-deliveries advisory.
type advisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// lostTask turns a task that exhausted its deliveries into a failure.
func (j *Janitor) lostTask(ctx context.Context, data []byte) error {
	var adv advisory
	if err := json.Unmarshal(data, &adv); err != nil || adv.Stream != bus.StreamTasks {
		j.log.Warn().Err(err).Msg("ignore unexpected advisory")
		return nil
	}
	stream, err := j.js.Stream(ctx, bus.StreamTasks)
	if err != nil {
		return fmt.Errorf("open tasks stream: %w", err)
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already finished or removed
	}
	if err != nil {
		return fmt.Errorf("get task %d: %w", adv.StreamSeq, err)
	}
	ev, err := bus.Decode(raw.Header, raw.Data)
	task, ok := ev.Data.(*events.Task)
	if err == nil && ok {
		reason := fmt.Sprintf("task delivered %d times to agents (consumer %s) without a result: agents died or timed out", adv.Deliveries, adv.Consumer)
		if err := j.fail(ctx, task.Ref("janitor", int(adv.Deliveries)), failLost, reason); err != nil {
			return err
		}
		j.log.Warn().Str("execution_id", task.ExecutionID).Str("step_id", task.StepID).Uint64("deliveries", adv.Deliveries).Msg("failed lost task")
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete lost task %d: %w", adv.StreamSeq, err)
	}
	return nil
}

func (j *Janitor) fail(ctx context.Context, ref events.TaskRef, why, reason string) error {
	ev := events.New(j.cfg.Source, ref.ExecutionID, ref.Workflow, j.cfg.Now(), &events.OperationFailed{TaskRef: ref, Error: reason, Lost: true})
	ev.ID = ref.TaskID + "." + why
	msg, err := bus.Encode(bus.ResultSubject(cmp.Or(ref.Queue, workflow.DefaultQueue), ref.ExecutionID), ev)
	if err != nil {
		return err
	}
	ack, err := j.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID))
	if err != nil {
		return fmt.Errorf("publish failure of task %s: %w", ref.TaskID, err)
	}
	if !ack.Duplicate {
		j.metrics.failedTasks.WithLabelValues(why).Inc()
	}
	return nil
}

// Result counts what a sweep did.
type Result struct {
	Checked    int
	Reconciled int
	LostTasks  int
	// Finished counts the finished executions the retention sweep read
	// (kept, expiring or deleted).
	Finished int
	// Expired counts finished executions deleted under their retention rule.
	Expired int
	// ExpiryRequested counts finished executions whose rule no longer keeps
	// them and whose expiry the janitor asked the dispatcher to record;
	// they are deleted at a later sweep (retention.go).
	ExpiryRequested int
	Errors          int
	// LocksCleared counts lock entries of ended executions it asked the
	// dispatcher to clear (locks.go).
	LocksCleared int
	// IdleTook and RetentionTook are how long the sweep's two parts took:
	// idle executions and locks, then retention (wall time, not the Now
	// of Config).
	IdleTook, RetentionTook time.Duration
}

// RunOnce sweeps the execution read models once: it reads those written
// since the last read, a sweep's or a catch-up's, in one pass (sweepRead;
// all of them at the first read, and every FullReadEvery), then acts on
// the idle executions and on retention.
func (j *Janitor) RunOnce(ctx context.Context) (Result, error) {
	began := time.Now()
	res, err := j.sweep(ctx)
	if err == nil || ctx.Err() == nil { // a sweep cut short by a stop is no failed sweep
		j.metrics.sweepEnded(began, time.Now(), res, err)
	}
	return res, err
}

// catchUp reads the read models that settled since the last read into
// the index (modelIndex.catchUp).
func (j *Janitor) catchUp(ctx context.Context) error {
	j.sweeping.Lock()
	defer j.sweeping.Unlock()
	kv, err := j.js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return fmt.Errorf("open executions bucket: %w", err)
	}
	return j.index.catchUp(ctx, kv, j.cfg.Now())
}

// sweep is RunOnce without its metrics.
func (j *Janitor) sweep(ctx context.Context) (Result, error) {
	j.sweeping.Lock()
	defer j.sweeping.Unlock()
	began := time.Now()
	kv, err := j.js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return Result{}, fmt.Errorf("open executions bucket: %w", err)
	}
	tasks, err := j.js.Stream(ctx, bus.StreamTasks)
	if err != nil {
		return Result{}, fmt.Errorf("open tasks stream: %w", err)
	}
	now := j.cfg.Now()
	read, err := j.sweepRead(ctx, kv, tasks, now)
	if err != nil {
		return Result{}, err
	}
	res, err := j.sweepIdle(ctx, tasks, read.idle, now)
	res.Checked, res.Errors = res.Checked+read.waiting+read.flying, res.Errors+read.errors
	res.IdleTook = time.Since(began)
	if err != nil {
		return res, err
	}
	began = time.Now()
	ret, err := j.expire(ctx, kv, read, now)
	res.Finished, res.Expired, res.ExpiryRequested, res.Errors = ret.finished, ret.deleted, ret.requested, res.Errors+ret.failed
	res.RetentionTook = time.Since(began)
	if err != nil {
		return res, fmt.Errorf("retention: %w", err)
	}
	return res, nil
}

// swept is what a sweep found in the read models: the idle running
// executions (whole), how many more merely wait on time, and the markers
// of deleted read models older than markerAge. The finished executions
// are in the index, by retention group (retained).
type swept struct {
	idle       []projections.Execution
	waiting    int
	flying     int // idle ones whose tasks in flight are all in their queue (checkFlights)
	errors     int // idle executions' read models it could not read again
	oldMarkers []marker
}

// modelHead is what the janitor decodes of every read model it reads
// (those written since its last read): retention's fields (finished) and
// when it last changed. The JSON names are those of
// [projections.Execution]; decoding only these keeps a sweep cheap, and
// one decoding serves both parts.
type modelHead struct {
	finished
	UpdatedAt time.Time `json:"updated_at"`
}

// sweepRead brings the index of the read models up to date (reading
// those written since the last read, modelIndex) and says what the
// sweep must look at; the idle running executions it reads again whole.
func (j *Janitor) sweepRead(ctx context.Context, kv jetstream.KeyValue, tasks getter, now time.Time) (swept, error) {
	if err := j.index.refresh(ctx, kv, now); err != nil {
		return swept{}, err
	}
	out, look, check := j.index.swept(now, j.cfg.IdleAfter)
	again, err := j.index.checkFlights(ctx, tasks, check, &out, j.log)
	if err != nil {
		return swept{}, err
	}
	look = append(look, again...)
	if err := j.index.lookAgain(ctx, kv, look, now, j.cfg.IdleAfter, &out, j.log); err != nil {
		return swept{}, err
	}
	return out, nil
}

// sweepIdle nudges the idle executions a sweep read, and reports lost
// tasks.
func (j *Janitor) sweepIdle(ctx context.Context, tasks getter, idle []projections.Execution, now time.Time) (Result, error) {
	var res Result
	for _, x := range idle {
		if ctx.Err() != nil {
			// Stopped: the rest is looked at by the next janitor, and its
			// publishes failing with the stop are no errors to count.
			return res, ctx.Err()
		}
		res.Checked++
		nudged := false
		if localSending(x) {
			// A dispatcher that died while it ran a local step leaves it
			// sending, and nothing else would run it again: nudged at
			// every sweep while it is (a dispatcher still running it does
			// nothing more), not once per event as an idle one: the
			// dispatcher that took the nudge may have lost the partition
			// before the step's result was recorded.
			id := fmt.Sprintf("reconcile-%s-%d-local-%d", x.ID, x.LastSeq, now.Unix())
			if err := j.nudge(ctx, x, "a local step left sending", id); err != nil {
				j.log.Warn().Err(err).Str("execution_id", x.ID).Msg("sweep: reconcile")
				res.Errors++
				continue
			}
			res.Reconciled++
			if now.Sub(x.UpdatedAt) < j.cfg.IdleAfter {
				continue // not idle: only its local step was looked at
			}
			nudged = true // and its other steps are looked at, as an idle execution's
		}
		if waitingOnTime(x, now) {
			continue // a sleep, a wait or a retry backoff with its timer still to come
		}
		inFlight := false
		for _, st := range x.Steps {
			if !stepInFlight(st) {
				continue
			}
			inFlight = true
			if st.TaskSeq == 0 {
				continue
			}
			if _, err := tasks.GetMsg(ctx, st.TaskSeq); errors.Is(err, jetstream.ErrMsgNotFound) {
				// Gone from its queue. If an agent reported a result, the
				// dispatcher will apply it (perhaps after a retry): not lost.
				reported, err := j.hasResult(ctx, x.ID, st.TaskID)
				if err != nil {
					j.log.Warn().Err(err).Str("execution_id", x.ID).Msg("sweep: read results")
					res.Errors++
					continue
				}
				if reported {
					continue
				}
				ref := events.TaskRef{TaskID: st.TaskID, ExecutionID: x.ID, Workflow: x.Workflow, StepID: st.ID,
					Attempt: st.Attempt, Token: cmp.Or(st.Token, x.Token), Queue: cmp.Or(st.Queue, workflow.DefaultQueue), Agent: "janitor"}
				if err := j.fail(ctx, ref, failVanished, "task left its queue without a result"); err != nil {
					j.log.Warn().Err(err).Str("execution_id", x.ID).Msg("sweep: report lost task")
					res.Errors++
					continue
				}
				res.LostTasks++
			}
		}
		if !inFlight && !nudged {
			if err := j.reconcile(ctx, x); err != nil {
				j.log.Warn().Err(err).Str("execution_id", x.ID).Msg("sweep: reconcile")
				res.Errors++
				continue
			}
			res.Reconciled++
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if n, err := j.sweepLocks(ctx); err != nil {
		j.log.Warn().Err(err).Msg("sweep: locks")
		res.Errors++
	} else {
		res.LocksCleared = n
	}
	return res, nil
}

// LocalIdleAfter is how long an execution with a local step sending
// (run by its dispatcher, docs/adr/0014) may show no activity before the
// janitor nudges it, whatever IdleAfter is: a dispatcher that died while
// it ran the step leaves nothing else to run it again.
const LocalIdleAfter = 10 * time.Second

// localSending reports whether an execution has a local step sending.
func localSending(x projections.Execution) bool {
	for _, st := range x.Steps {
		if st.Queue == workflow.LocalQueue && st.Status == projections.OpSending {
			return true
		}
	}
	return false
}

// waitingOnTime reports whether the execution waits for a signal, or for a
// timer that is not overdue: nothing to nudge. An overdue timer (its
// schedule was lost) makes the execution a candidate, and the reconcile
// re-arms it; so does a timer recorded fired while its step still waits
// for it (the dispatcher that recorded the firing stopped before acting on
// it), and the reconcile acts on it; so does a step waiting for a child
// execution (its end may not have been passed on), and the reconcile
// reads the child's history.
func waitingOnTime(x projections.Execution, now time.Time) bool {
	waiting := false
	for _, st := range x.Steps {
		if st.Child != "" && st.Status == projections.OpPending {
			return false // a child execution's end may not have reached it: the reconcile looks
		}
		if st.Status == projections.OpWaiting || st.Status == projections.OpRescheduled {
			waiting = true
		}
	}
	if !waiting {
		return false
	}
	for _, t := range x.Timers {
		if !t.Fired && now.Sub(t.Due) > time.Minute {
			return false
		}
		if t.Fired && t.Purpose == events.TimerWorkflowTimeout {
			return false // the workflow timed out, yet it runs: act on it
		}
		if i := x.StepIndex(t.StepID); t.Fired && t.StepID != "" && i >= 0 {
			st := x.Steps[i]
			if st.Attempt == t.Attempt && (st.Status == projections.OpWaiting || st.Status == projections.OpRescheduled) {
				return false
			}
		}
		if !t.Fired {
			continue
		}
		switch t.Purpose {
		case events.TimerCallTimeout: // its step is the call's instance, its attempt the resume count
			if st, ok := callAt(x, t.StepID); ok && t.Attempt == x.Resumes && st.Status == projections.OpPending &&
				!callOnErrorWaits(x, t.StepID) {
				return false // a called workflow timed out, yet it runs
			}
		case events.TimerLockTimeout:
			if l, ok := x.LockAt(t.StepID); ok && l.Status == projections.LockWaiting && l.Requests == t.Attempt {
				return false // the wait for a lock timed out, yet it waits
			}
		}
	}
	return true
}

// callAt returns the call step whose attempt's instance is key ("call",
// "call@2"), if it is at that attempt.
func callAt(x projections.Execution, key string) (projections.Step, bool) {
	st, _, current := x.ContainerAt(key)
	return st, current
}

// callOnErrorWaits reports whether the on-error steps of the call whose
// instance is key wait (on a timer or a signal): it was acted on.
func callOnErrorWaits(x projections.Execution, key string) bool {
	for _, st := range x.Steps {
		if strings.HasPrefix(st.ID, key+"/on-error/") && (st.Status == projections.OpWaiting || st.Status == projections.OpRescheduled) {
			return true
		}
	}
	return false
}

// hasResult reports whether the results stream holds a final result for task.
func (j *Janitor) hasResult(ctx context.Context, executionID, taskID string) (bool, error) {
	found := false
	// Reports stored before partitions too (a task in flight across the upgrade).
	for _, filter := range []string{bus.ExecutionResults(executionID), bus.ExecutionResultsBefore(executionID)} {
		err := history.ScanReports(ctx, j.js, bus.StreamResults, filter, func(ev events.Event) error {
			if ref, ok := events.ResultRef(ev.Data); ok && ref.TaskID == taskID && ev.Type != events.TypeOperationStarted {
				found = true
			}
			return nil
		})
		if err != nil {
			return false, fmt.Errorf("read results of %s: %w", executionID, err)
		}
	}
	return found, nil
}

func (j *Janitor) reconcile(ctx context.Context, x projections.Execution) error {
	return j.nudge(ctx, x, "idle", "reconcile-"+x.ID+"-"+strconv.FormatUint(x.LastSeq, 10))
}

// nudge publishes a reconcile of x with CloudEvent and message id id (a
// repeat of the same id within the commands stream's dedupe window is
// dropped).
func (j *Janitor) nudge(ctx context.Context, x projections.Execution, reason, id string) error {
	ev := events.New(j.cfg.Source, x.ID, x.Workflow, j.cfg.Now(), &events.ReconcileExecution{
		ExecutionID: x.ID, Workflow: x.Workflow, Reason: reason})
	ev.ID = id
	msg, err := bus.Encode(bus.SubjectReconcile, ev)
	if err != nil {
		return err
	}
	ack, err := j.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID))
	if err != nil {
		return fmt.Errorf("publish reconcile of %s: %w", x.ID, err)
	}
	if !ack.Duplicate {
		j.metrics.reconciles.Inc()
	}
	return nil
}
