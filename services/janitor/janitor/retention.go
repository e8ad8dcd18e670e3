package janitor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
)

// DefaultRetention is the system retention rule when none is configured:
// the three most recent finished executions of each group are kept, and
// every one that finished in the last 7 days, long enough to look at,
// resume or replay what ran last week.
const DefaultRetention = "max(3, 7d)"

// metrics are the janitor's Prometheus metrics.
type metrics struct {
	purged   *prometheus.CounterVec
	errors   prometheus.Counter
	finished prometheus.Gauge
	// sweeps counts the sweeps by outcome (ok, failed), sweepSeconds
	// times them and lastSweep says when the last one ended well: a
	// janitor that stopped sweeping shows, even when its sweeps had
	// nothing to do.
	sweeps       *prometheus.CounterVec
	sweepSeconds prometheus.Histogram
	lastSweep    prometheus.Gauge
	// What the janitor found and did: the running executions idle past
	// IdleAfter the last sweep that ended well looked at, the reconciles
	// it published (a repeat the commands stream dropped not counted),
	// the tasks it reported failed (by why: vanished from their queue, a
	// sweep found; lost after their deliveries, an advisory said), and the
	// errors the sweeps' reads, publishes and deletions met (each tried
	// again at the next sweep; none counted for a sweep cut short by a
	// stop).
	idle        prometheus.Gauge
	reconciles  prometheus.Counter
	failedTasks *prometheus.CounterVec
	sweepErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_janitor_executions_purged_total",
			Help: "Finished executions whose history and read model the janitor deleted under their retention rule.",
		}, []string{"workflow"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetflow_janitor_purge_errors_total",
			Help: "Expired executions the janitor could not delete (retried on the next sweep).",
		}),
		finished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetflow_janitor_finished_executions",
			Help: "Finished executions kept, as counted by the last retention sweep.",
		}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_janitor_sweeps_total",
			Help: "Sweeps of the read models (idle executions and retention), by outcome: ok or failed.",
		}, []string{"outcome"}),
		sweepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "jetflow_janitor_sweep_seconds",
			Help:    "How long each sweep took, failed ones included.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5 ms to 41 s
		}),
		lastSweep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetflow_janitor_last_sweep_timestamp_seconds",
			Help: "When the last sweep that ended well ended (Unix time); 0 before the first.",
		}),
		idle: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetflow_janitor_idle_executions",
			Help: "Running executions the last sweep that ended well looked at: idle past -idle-after (waiting on a timer or a signal, with tasks in flight, or nudged), or with a local step sending for 10 s.",
		}),
		reconciles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetflow_janitor_reconciles_total",
			Help: "Reconcile commands the janitor published for idle executions (nothing in flight, or a local step left sending); a repeat the commands stream dropped (within its dedupe window) is not counted.",
		}),
		failedTasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_janitor_failed_tasks_total",
			Help: "Tasks the janitor reported failed, by why: vanished (gone from their queue without a result) or lost (their deliveries exhausted).",
		}, []string{"why"}),
		sweepErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetflow_janitor_sweep_errors_total",
			Help: "Reads, publishes and deletions a sweep could not make, each tried again at the next sweep (the deletions are jetflow_janitor_purge_errors_total too).",
		}),
	}
	for _, o := range []string{sweepOK, sweepFailed} {
		m.sweeps.WithLabelValues(o) // both series from the start: a rate of failures needs its zero
	}
	for _, why := range []string{failVanished, failLost} {
		m.failedTasks.WithLabelValues(why)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.purged, m.errors, m.finished, m.sweeps, m.sweepSeconds, m.lastSweep,
		m.idle, m.reconciles, m.failedTasks, m.sweepErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("janitor: register metrics: %w", err)
		}
	}
	return m, nil
}

// The outcomes of jetflow_janitor_sweeps_total.
const (
	sweepOK     = "ok"
	sweepFailed = "failed"
)

// The whys of jetflow_janitor_failed_tasks_total, and of the ids of the
// failures the janitor reports (<task id>.<why>).
const (
	failVanished = "vanished"
	failLost     = "lost"
)

// sweepEnded counts and times a sweep that began at began and ended now
// with err, having done res (what it did before an error too).
func (m *metrics) sweepEnded(began, now time.Time, res Result, err error) {
	m.sweepSeconds.Observe(now.Sub(began).Seconds())
	m.sweepErrors.Add(float64(res.Errors))
	if err != nil {
		m.sweeps.WithLabelValues(sweepFailed).Inc()
		return
	}
	m.sweeps.WithLabelValues(sweepOK).Inc()
	m.lastSweep.Set(float64(now.UnixNano()) / 1e9)
	m.idle.Set(float64(res.Checked))
}

// finished is what retention needs of a finished execution's read model.
// The JSON names are those of [projections.Execution]; decoding only
// these fields keeps a sweep cheap.
type finished struct {
	ID           string             `json:"id"`
	Workflow     string             `json:"workflow"`
	Status       projections.Status `json:"status"`
	EndedAt      time.Time          `json:"ended_at"`
	Retention    string             `json:"retention"`
	RetentionKey string             `json:"retention_key"`
	LastSeq      uint64             `json:"last_seq"`
	ExpiredAt    time.Time          `json:"expired_at"`
	// Damaged: a damaged execution is never expired (its history is what
	// an admin repairs from).
	Damaged *projections.Damage `json:"damaged"`
}

// group is the retention group of an execution: its hash key, or its
// workflow's name.
func (f finished) group() string { return cmp.Or(f.RetentionKey, f.Workflow) }

// markerAge is how old a deleted read model's marker must be before the
// sweep removes it (JetStream's own default for PurgeDeletes).
const markerAge = 30 * time.Minute

// expire applies retention once, to what the sweep's index of the read
// models says (never a history): the finished executions by group, of
// which it deals with those their rule no longer keeps (retained).
// Running, cancelling and suspended executions are never touched.
//
// Deleting takes two steps, because an operator may resume a finished
// execution at any moment and the dispatcher is the only writer of
// histories: the janitor asks the dispatcher to record execution.expired
// (which it does only if the history has not moved since the janitor
// looked, and after which nothing can be added to it), and deletes a
// history only once it ends with that event, normally at the next sweep.
func (j *Janitor) expire(ctx context.Context, kv jetstream.KeyValue, read swept, now time.Time) (retentionResult, error) {
	var res retentionResult
	ret := j.index.ret
	res.finished = ret.finished()
	rules := map[string]retention.Rule{}
	bad := map[string]bool{}
	ruleOf := func(text string) (retention.Rule, bool) {
		if rule, ok := rules[text]; ok {
			return rule, true
		}
		if bad[text] {
			return retention.Rule{}, false
		}
		rule, err := j.rule(text)
		if err != nil {
			bad[text] = true
			j.log.Warn().Err(err).Str("rule", text).Msg("retention: rule not understood, executions that have it kept")
			return retention.Rule{}, false
		}
		rules[text] = rule
		return rule, true
	}
	todo, _ := ret.expired(now, ruleOf)
	if len(todo) > 0 || len(ret.expiring) > 0 {
		st, err := j.openStores(ctx, kv)
		if err != nil {
			return res, err
		}
		// An execution whose expiry is recorded is deleted whatever its
		// rule says now, and no longer counts among its group's.
		for key := range ret.expiring {
			if ctx.Err() != nil {
				return res, ctx.Err() // stopped: no failed deletions to count
			}
			f := j.index.entries[key].finished(key)
			j.expireOne(ctx, st, f, f.group(), retention.Rule{}, -1, &res)
		}
		for _, e := range todo {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			j.expireOne(ctx, st, j.index.entries[e.key].finished(e.key), e.group, e.rule, e.rank, &res)
		}
	}
	j.metrics.finished.Set(float64(res.finished - res.deleted))
	// Deleted read models leave a marker each; without this the bucket,
	// and every full read, would grow with every expiry.
	if err := j.index.purgeMarkers(ctx, j.js, read.oldMarkers); err != nil {
		j.log.Warn().Err(err).Msg("retention: remove old markers of deleted read models")
	}
	return res, nil
}

// expireOne moves one expired execution a step on (purge) and counts it.
// rank is its place in its group, -1 for one whose expiry was recorded
// (and rule is then unknown: it is not needed any more).
func (j *Janitor) expireOne(ctx context.Context, st *stores, f finished, group string, rule retention.Rule, rank int, res *retentionResult) {
	step, err := j.purge(ctx, st, f, group, rule)
	if err != nil {
		res.failed++
		j.metrics.errors.Inc()
		j.log.Warn().Err(err).Str("execution_id", f.ID).Msg("retention: delete expired execution, will retry")
		return
	}
	switch step {
	case expiryRequested:
		res.requested++
	case expiryDone:
		res.deleted++
		j.metrics.purged.WithLabelValues(f.Workflow).Inc()
		log := j.log.Info().Str("execution_id", f.ID).Str("workflow", f.Workflow).Str("group", group).
			Str("status", string(f.Status)).Time("ended_at", f.EndedAt)
		if rank >= 0 {
			log = log.Str("rule", rule.String()).Int("rank", rank)
		}
		log.Msg("execution expired: history and read model deleted")
	}
}

// retentionResult counts what a retention pass did.
type retentionResult struct {
	finished, deleted, requested, failed int
}

// watchModels calls fn with every entry of the read-model bucket (the
// markers of deleted ones included; with jetstream.ResumeFromRevision,
// those written from that revision on), in revision order, in one pass
// of a watcher: one ordered consumer, not a request per key. It stops at
// the first error fn returns, which it returns (wrapped).
func watchModels(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry) error, opts ...jetstream.WatchOpt) error {
	err := bus.EachEntry(ctx, kv, fn, opts...)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("read executions: %w", err)
	}
	return err
}

// rule is the rule an execution's read model records, with parent and
// system resolved to the configured default.
func (j *Janitor) rule(text string) (retention.Rule, error) {
	if text == "" {
		return j.system, nil
	}
	r, err := retention.ParseRule(text)
	if err != nil {
		return retention.Rule{}, err
	}
	return r.Resolve(j.system), nil
}

// stores are what deleting an execution touches.
type stores struct {
	events, results jetstream.Stream
	models          jetstream.KeyValue
	ids             *claim.Store
}

func (j *Janitor) openStores(ctx context.Context, models jetstream.KeyValue) (*stores, error) {
	st := &stores{models: models}
	var err error
	if st.events, err = j.js.Stream(ctx, bus.StreamEvents); err != nil {
		return nil, fmt.Errorf("open events stream: %w", err)
	}
	if st.results, err = j.js.Stream(ctx, bus.StreamResults); err != nil {
		return nil, fmt.Errorf("open results stream: %w", err)
	}
	if st.ids, err = claim.Open(ctx, j.js); err != nil {
		return nil, err
	}
	return st, nil
}

// expiryStep is what purge did for an expired execution.
type expiryStep int

const (
	expiryWaiting   expiryStep = iota // nothing: the history moved on, or expiry was asked already
	expiryRequested                   // asked the dispatcher to record execution.expired
	expiryDone                        // deleted
)

// purge moves an expired execution one step on. While its history does
// not end with execution.expired, it asks the dispatcher to record it
// (unless the history has gone on past the read model: a resume, or a
// projector that is behind; the next sweep decides again on the newer
// read model). Once it does, it marks the id's claim expired, purges the
// history (and the results agents reported for it), then deletes the
// read model. The read model goes last because it is what the sweep works
// from: after a crash anywhere in between, the next sweep finds the read
// model still there and does every step again (each is idempotent).
// Deleting it first could leave a history no sweep would ever find
// without reading the whole stream. The claim itself is never deleted:
// execution ids are unique forever.
func (j *Janitor) purge(ctx context.Context, st *stores, f finished, group string, rule retention.Rule) (expiryStep, error) {
	subject := bus.ExecutionSubject(f.Workflow, f.ID)
	// From the leader: a replica may not have stored the latest event yet.
	last, err := bus.LeaderGet(ctx, j.js, bus.StreamEvents, bus.MsgQuery{LastBySubject: subject})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound): // purged already, by a sweep that stopped halfway
	case err != nil:
		return expiryWaiting, fmt.Errorf("read last event of %s: %w", f.ID, err)
	case events.Type(last.Header.Get("ce-type")) == events.TypeExecutionExpired: // recorded: nothing can follow
	case last.Sequence != f.LastSeq:
		j.log.Debug().Str("execution_id", f.ID).Uint64("read_model_seq", f.LastSeq).Uint64("history_seq", last.Sequence).
			Msg("retention: history is ahead of the read model, decided again next sweep")
		return expiryWaiting, nil
	default:
		return expiryRequested, j.requestExpiry(ctx, f, group, rule)
	}
	// The claim says when the execution expired: when its expiry was
	// recorded (the read model has it once projected), not this sweep.
	expiredAt := f.ExpiredAt
	if expiredAt.IsZero() {
		expiredAt = j.cfg.Now()
	}
	if err := st.ids.MarkExpired(ctx, f.ID, expiredAt); err != nil {
		return expiryWaiting, err
	}
	if err := st.events.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return expiryWaiting, fmt.Errorf("purge history of %s: %w", f.ID, err)
	}
	for _, filter := range []string{bus.ExecutionResults(f.ID), bus.ExecutionResultsBefore(f.ID)} {
		if err := st.results.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
			return expiryWaiting, fmt.Errorf("purge results of %s: %w", f.ID, err)
		}
	}
	if err := st.models.Purge(ctx, f.ID); err != nil {
		return expiryWaiting, fmt.Errorf("delete read model of %s: %w", f.ID, err)
	}
	return expiryDone, nil
}

// requestExpiry publishes the command asking the dispatcher to record the
// execution's expiry, with one message id per history position, so that
// a sweep that asks again before the dispatcher answered adds nothing.
func (j *Janitor) requestExpiry(ctx context.Context, f finished, group string, rule retention.Rule) error {
	ev := events.New(j.cfg.Source, f.ID, f.Workflow, j.cfg.Now(), &events.ExpireExecution{
		ExecutionID: f.ID, Workflow: f.Workflow, LastSeq: f.LastSeq, Rule: rule.String(), Group: group})
	ev.ID = "expire-" + f.ID + "-" + strconv.FormatUint(f.LastSeq, 10)
	msg, err := bus.Encode(bus.SubjectExpire, ev)
	if err != nil {
		return err
	}
	if _, err := j.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID)); err != nil {
		return fmt.Errorf("publish expire command for %s: %w", f.ID, err)
	}
	return nil
}
