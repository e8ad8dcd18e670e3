package dispatch

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/groupcommit"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/internal/metrics"
)

// Metrics are the dispatcher's Prometheus metrics (docs/observability.md).
// Make them once per registry with NewMetrics, for one namespace (wrap
// the registerer with its label), and give them to the dispatchers of
// that namespace in Config.Metrics. A nil *Metrics counts nothing: tests
// and programs that do not serve metrics leave it out.
//
// Everything is counted where the dispatcher appends an event (what the
// event did to the execution's state) or publishes a rejection, on label
// children resolved once: the handling of a message pays a type switch and
// an atomic add or two. Consumer lag and the lock table are read at
// scrape time or from the lock watch the dispatcher runs anyway.
type Metrics struct {
	started   prometheus.Counter
	ended     map[projections.Status]endMetrics
	steps     map[string]*lazy[stepMetrics] // by step kind; read only once made
	appends   [appendResults]prometheus.Counter
	conflicts prometheus.Counter
	rejected  map[string]prometheus.Counter // by code; read only once made
	lateness  map[string]*lazy[prometheus.Observer]
	lockWait  prometheus.Observer
	holders   prometheus.Gauge
	waiters   prometheus.Gauge
	lag       *metrics.ConsumerLag
	// firings counts fired timers handed on, by where they fired from:
	// memory (soon.go) or the schedule's message.
	firings [2]prometheus.Counter
	// localRuns counts the runs of local steps (local.go) that ended, by
	// outcome: succeeded, failed.
	localRuns [2]prometheus.Counter
	// retakes counts the leases that expired under this dispatcher and
	// that it took back (partition.Table's Retook).
	retakes prometheus.Counter
	// localAgain counts the local runs left to run again (cutShort).
	localAgain prometheus.Counter
	// taken counts the partitions taken, by how their lease was found
	// (partition.Vacancy: never held, released, expired).
	taken [3]prometheus.Counter
	// partitions reads, at scrape time, the partitions the running
	// dispatcher holds and their count (nil while none runs).
	partitions *atomic.Pointer[func() (held, total int)]
	// commits reads, at scrape time, what the running dispatcher's group
	// commit wrote, by stream (nil while none runs).
	commits *atomic.Pointer[func(stream string) groupcommit.Stats]
}

// groupCommitStreams are the streams group commit writes to (the stream
// label).
var groupCommitStreams = []string{bus.StreamEvents, bus.StreamTasks}

type endMetrics struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// stepMetrics are one step kind's children: a count per outcome, and the
// durations of those that ran.
type stepMetrics struct {
	count    [stepOutcomes]prometheus.Counter
	duration [stepOutcomes]prometheus.Observer // nil for skipped
}

// Step outcomes (the outcome label).
const (
	stepSucceeded = iota
	stepFailed
	stepSkipped
	stepOutcomes
)

var stepOutcomeNames = [stepOutcomes]string{"succeeded", "failed", "skipped"}

// Append results (the result label).
const (
	appendOK = iota
	appendConflict
	appendError
	appendResults
)

var appendResultNames = [appendResults]string{"ok", "conflict", "error"}

// otherLabel stands for a label value outside the known set (a step kind
// or rejection code of a newer release, a timer purpose): the set of
// series stays bounded whatever the histories hold.
const otherLabel = "other"

// endedStatuses are the statuses an execution settles in (ended, or
// suspended waiting for an operator).
var endedStatuses = []projections.Status{projections.StatusSucceeded, projections.StatusFailed,
	projections.StatusCancelled, projections.StatusSuspended}

// rejectionCodes are the codes of events.CommandRejected.
var rejectionCodes = []string{events.CodeInvalid, events.CodeNotFound, events.CodeConflict, events.CodeForbidden,
	events.CodeExpired, events.CodeDamaged, otherLabel}

// timerPurposes are the purposes of events.TimerArmed.
var timerPurposes = []string{events.TimerSleep, events.TimerWaitTimeout, events.TimerStepTimeout, events.TimerRetry,
	events.TimerWorkflowTimeout, events.TimerCallTimeout, events.TimerLockTimeout, otherLabel}

// NewMetrics registers the dispatcher's metrics on reg (nil: a registry
// of their own, which nothing serves).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	started := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_executions_started_total",
		Help: "Executions started (their io.jetflow.execution.started appended).",
	})
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_executions_ended_total",
		Help: "Executions that ended (succeeded, failed, cancelled) or were suspended (wait_after_fail), by that status; one resumed and ended again counts again.",
	}, []string{"status"})
	execDur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetflow_dispatcher_execution_duration_seconds",
		Help:    "How long executions ran, from their start to the event that ended (or suspended) them, by status.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600},
	}, []string{"status"})
	steps := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_steps_total",
		Help: "Step attempts that ended, by step kind and outcome (succeeded, failed, skipped); a step retried counts once per attempt.",
	}, []string{"kind", "outcome"})
	stepDur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetflow_dispatcher_step_duration_seconds",
		Help:    "How long step attempts took, from their schedule to their success or failure (an operation's wait in its queue included), by step kind and outcome.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"kind", "outcome"})
	appends := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_appends_total",
		Help: "Appends to the events stream, by result: ok, conflict (another writer went first: the expected last sequence did not match), error.",
	}, []string{"result"})
	conflicts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_conflicts_total",
		Help: "Times the handling of a message found its execution's history moved underneath (an append's expected last sequence did not match, or a cached state was behind) and read it again.",
	})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_commands_rejected_total",
		Help: "Commands the dispatcher rejected (a rejection published to their sender), by code: invalid, not_found, conflict, forbidden, expired, damaged.",
	}, []string{"code"})
	lateness := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetflow_dispatcher_timer_lateness_seconds",
		Help:    "How late fired timers were recorded, from their due time (or their execution's last resume, if later) to the append of io.jetflow.timer.fired (or of the sleep's success recording it), by purpose.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"purpose"})
	lockWait := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "jetflow_dispatcher_lock_wait_seconds",
		Help:    "How long scopes waited for a lock, from io.jetflow.lock.requested to io.jetflow.lock.acquired.",
		Buckets: []float64{.001, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600},
	})
	holders := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetflow_dispatcher_lock_holders",
		Help: "Scopes holding a lock, in the whole lock table as the dispatcher's watch of it last saw it (every dispatcher reports the same: take the max).",
	})
	waiters := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetflow_dispatcher_lock_waiters",
		Help: "Scopes waiting for a lock, in the whole lock table as the dispatcher's watch of it last saw it (every dispatcher reports the same: take the max).",
	})
	firings := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_timer_firings_total",
		Help: "Fired timers handed to the fire loop, by where they fired from: memory (due soon when this dispatcher armed them, or brought here by their notice a minute before) or schedule (the message of their schedule in JF_TIMERS, not already handled from memory). Counted whether or not the firing changes anything: a timer of a cancelled execution, or a timeout whose step ended, fires too.",
	}, []string{"by"})
	localRuns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_local_runs_total",
		Help: "Runs of local steps (local: true, run by the dispatcher instead of an agent) that ended, by outcome: succeeded or failed. A run cut short because the dispatcher stopped or lost the execution's partition is not counted (it runs again).",
	}, []string{"outcome"})
	lag := metrics.NewConsumerLag("dispatcher")
	partitions := new(atomic.Pointer[func() (held, total int)])
	partitionsOf := func(total bool) func() float64 {
		return func() float64 {
			f := partitions.Load()
			if f == nil {
				return 0
			}
			held, n := (*f)()
			if total {
				return float64(n)
			}
			return float64(held)
		}
	}
	commits := new(atomic.Pointer[func(stream string) groupcommit.Stats])
	var commitCounters []prometheus.Collector
	for _, stream := range groupCommitStreams {
		for _, c := range []struct {
			name, help string
			of         func(groupcommit.Stats) int64
		}{
			{"jetflow_dispatcher_group_commit_writes_total", "With -group-commit (docs/adr/0020): atomic batches, or lone publishes, written to the stream (stream). Messages ÷ writes is the batches' size: about a hundred for the setting to pay.", func(s groupcommit.Stats) int64 { return s.Writes }},
			{"jetflow_dispatcher_group_commit_messages_total", "With -group-commit: history appends or tasks written in those batches.", func(s groupcommit.Stats) int64 { return s.Messages }},
			{"jetflow_dispatcher_group_commit_failed_total", "With -group-commit: writes that failed (an append's check failed, a task was a duplicate, the answer was lost), each of their messages made again on its own. A steady share of the writes means conflicts or duplicates, which cost their batch a second round.", func(s groupcommit.Stats) int64 { return s.Failed }},
		} {
			commitCounters = append(commitCounters, prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: c.name, Help: c.help, ConstLabels: prometheus.Labels{"stream": stream},
			}, func() float64 {
				f := commits.Load()
				if f == nil {
					return 0
				}
				return float64(c.of((*f)(stream)))
			}))
		}
	}
	retakes := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_partition_retakes_total",
		Help: "Partition leases that expired under this dispatcher (its renewals came late: a starved or paused process) and that it took back, nobody having taken them: the partition's work goes on, but a local step's run that ended while the lease was not valid here runs again (jetflow_dispatcher_local_runs_again_total). A steady rate means the process is starved of CPU.",
	})
	localAgain := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_local_runs_again_total",
		Help: "Local steps' runs whose result this dispatcher did not record, left to run again at the partition's holder: cut short by a stop or a release, or ended while the partition's lease was not valid here (its renewal late, or lost), or run here again after a release and a retake while their first result waited. At least once: each is a run more than the steps (a step that never reached its handler is not counted).",
	})
	taken := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetflow_dispatcher_partitions_taken_total",
		Help: "Partitions this dispatcher took, by how it found the lease (lease): never_held (a new deployment, or none held it for minutes), released (deleted: given back by a dispatcher that stopped or handed it over, or by hand) or expired (its holder died, renewed too late, could not ask for its local steps to run again, or was an earlier run of this dispatcher). A take of an expired lease reads the events stream's last seconds for the local steps its holder may have left running.",
	}, []string{"lease"})
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jetflow_dispatcher_partitions_held",
		Help: "Partitions this dispatcher holds now. Summed over the dispatchers of a namespace it should equal jetflow_dispatcher_partitions within seconds of any change: less for longer means partitions nobody handles, whose executions wait.",
	}, partitionsOf(false))
	total := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jetflow_dispatcher_partitions",
		Help: "The namespace's partition count (the same on every dispatcher).",
	}, partitionsOf(true))
	for _, c := range append([]prometheus.Collector{started, ended, execDur, steps, stepDur, appends, conflicts, rejected, lateness, lockWait, holders, waiters, firings, localRuns, retakes, localAgain, taken, held, total, lag}, commitCounters...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("dispatch: register metrics: %w", err)
		}
	}
	m := &Metrics{started: started, ended: map[projections.Status]endMetrics{}, steps: map[string]*lazy[stepMetrics]{},
		conflicts: conflicts, rejected: map[string]prometheus.Counter{}, lateness: map[string]*lazy[prometheus.Observer]{},
		lockWait: lockWait, holders: holders, waiters: waiters, lag: lag,
		firings:   [2]prometheus.Counter{firings.WithLabelValues("memory"), firings.WithLabelValues("schedule")},
		localRuns: [2]prometheus.Counter{localRuns.WithLabelValues("succeeded"), localRuns.WithLabelValues("failed")},
		retakes:   retakes, localAgain: localAgain, partitions: partitions, commits: commits}
	for i, v := range takenLeases {
		m.taken[i] = taken.WithLabelValues(v.String())
	}
	// Known small sets are made at once, so that their series read 0
	// rather than nothing until something happens; the step kinds and
	// timer purposes, and their histograms, on first use.
	for _, s := range endedStatuses {
		m.ended[s] = endMetrics{count: ended.WithLabelValues(string(s)), duration: execDur.WithLabelValues(string(s))}
	}
	for r, name := range appendResultNames {
		m.appends[r] = appends.WithLabelValues(name)
	}
	for _, code := range rejectionCodes {
		m.rejected[code] = rejected.WithLabelValues(code)
	}
	for _, kind := range append(workflow.Kinds[:len(workflow.Kinds):len(workflow.Kinds)], otherLabel) {
		m.steps[kind] = newLazy(func() *stepMetrics {
			var s stepMetrics
			for o, name := range stepOutcomeNames {
				s.count[o] = steps.WithLabelValues(kind, name)
				if o != stepSkipped {
					s.duration[o] = stepDur.WithLabelValues(kind, name)
				}
			}
			return &s
		})
	}
	for _, p := range timerPurposes {
		m.lateness[p] = newLazy(func() *prometheus.Observer {
			o := lateness.WithLabelValues(p)
			return &o
		})
	}
	return m, nil
}

// lazy is a label child (or a set of them) made on first use: the step
// kinds and timer purposes an installation never uses export no series.
type lazy[T any] struct {
	p     atomic.Pointer[T]
	build func() *T
}

func newLazy[T any](build func() *T) *lazy[T] { return &lazy[T]{build: build} }

func (l *lazy[T]) get() *T {
	if v := l.p.Load(); v != nil {
		return v
	}
	l.p.CompareAndSwap(nil, l.build()) // a race builds the same children twice: WithLabelValues returns one
	return l.p.Load()
}

// appendResult counts an append to the events stream that ended with err.
func (m *Metrics) appendResult(err error) {
	if m == nil {
		return
	}
	switch {
	case err == nil:
		m.appends[appendOK].Inc()
	case errors.Is(err, bus.ErrConflict):
		m.appends[appendConflict].Inc()
	default:
		m.appends[appendError].Inc()
	}
}

// fired counts a fired timer handed to the fire loop: from memory, or
// by its schedule's message.
func (m *Metrics) fired(fromMemory bool) {
	if m == nil {
		return
	}
	if fromMemory {
		m.firings[0].Inc()
	} else {
		m.firings[1].Inc()
	}
}

// again counts a local run left to run again.
func (m *Metrics) again() {
	if m != nil {
		m.localAgain.Inc()
	}
}

// takenLeases are the values of jetflow_dispatcher_partitions_taken_total's
// lease label, in the order of Metrics.taken.
var takenLeases = [3]partition.Vacancy{partition.VacancyNever, partition.VacancyReleased, partition.VacancyExpired}

// took counts a partition taken, its lease found as v.
func (m *Metrics) took(v partition.Vacancy) {
	if m == nil {
		return
	}
	if v == partition.VacancyUnknown {
		v = partition.VacancyExpired // looked for as if (mayHaveDied)
	}
	for i, l := range takenLeases {
		if l == v {
			m.taken[i].Inc()
		}
	}
}

// retook counts a lease taken back after it expired here.
func (m *Metrics) retook() {
	if m != nil {
		m.retakes.Inc()
	}
}

// localRun counts a local step's run that ended (not one cut short by
// the dispatcher's stop: stopped).
func (m *Metrics) localRun(err error, stopped bool) {
	switch {
	case m == nil || stopped:
	case err == nil:
		m.localRuns[0].Inc()
	default:
		m.localRuns[1].Inc()
	}
}

// conflict counts a handling that read its execution's history again.
func (m *Metrics) conflict() {
	if m != nil {
		m.conflicts.Inc()
	}
}

// rejection counts a command rejected with code.
func (m *Metrics) rejection(code string) {
	if m == nil {
		return
	}
	c, ok := m.rejected[code]
	if !ok {
		c = m.rejected[otherLabel]
	}
	c.Inc()
}

// appended counts what appending ev did to an execution, whose state was
// before and is now after; now is the clock (read only for a timer).
func (m *Metrics) appended(before, after *projections.Execution, ev *events.Event, now func() time.Time) {
	if m == nil {
		return
	}
	// A timer.fired, or a sleep's success carrying its firing (docs/adr/0017).
	if id := events.FiringOf(ev.Data); id != "" {
		if t, ok := before.Timers[id]; ok {
			l, known := m.lateness[t.Purpose]
			if !known {
				l = m.lateness[otherLabel]
			}
			(*l.get()).Observe(lateness(t, before, now()))
		}
	}
	switch p := ev.Data.(type) {
	case *events.ExecutionStarted:
		m.started.Inc()
	case *events.StepSucceeded:
		m.step(after, p.StepID, stepSucceeded, ev.Time)
	case *events.ExecutionSucceeded:
		if p.Step != nil { // the last step's success, carried by the end
			m.step(after, p.Step.StepID, stepSucceeded, ev.Time)
		}
	case *events.StepFailed:
		m.step(after, p.StepID, stepFailed, ev.Time)
	case *events.StepSkipped:
		m.step(after, p.StepID, stepSkipped, ev.Time)
	case *events.LockAcquired:
		if l, ok := after.LockAt(p.Path); ok && !l.RequestedAt.IsZero() && !l.AcquiredAt.IsZero() {
			m.lockWait.Observe(max(0, l.AcquiredAt.Sub(l.RequestedAt).Seconds()))
		}
	}
	if !before.Status.Settled() && after.Status.Settled() {
		if e, ok := m.ended[after.Status]; ok {
			e.count.Inc()
			if !after.StartedAt.IsZero() {
				e.duration.Observe(max(0, ev.Time.Sub(after.StartedAt).Seconds()))
			}
		}
	}
}

// step counts the end of step id's attempt (its state in after) with
// outcome, at at.
func (m *Metrics) step(after *projections.Execution, id string, outcome int, at time.Time) {
	i := after.StepIndex(id)
	if i < 0 {
		return
	}
	st := &after.Steps[i]
	k, ok := m.steps[st.Kind]
	if !ok {
		k = m.steps[otherLabel]
	}
	s := k.get()
	s.count[outcome].Inc()
	if d := s.duration[outcome]; d != nil && !st.ScheduledAt.IsZero() {
		d.Observe(max(0, at.Sub(st.ScheduledAt).Seconds()))
	}
}

// lockTable is what the lock watch last saw, for the lock gauges: the
// holders and waiters of each lock, and their totals (kept as they
// change: a lock's update costs the same however many locks there are).
type lockTable struct {
	locks            map[string][2]int
	holders, waiters int
}

func newLockTable() *lockTable { return &lockTable{locks: map[string][2]int{}} }

// setLock records lock name's holders and waiters (both 0: deleted) and,
// once synced, updates the gauges.
func (m *Metrics) setLock(t *lockTable, name string, holders, waiters int, synced bool) {
	if m == nil {
		return
	}
	old := t.locks[name]
	t.holders += holders - old[0]
	t.waiters += waiters - old[1]
	if holders == 0 && waiters == 0 {
		delete(t.locks, name)
	} else {
		t.locks[name] = [2]int{holders, waiters}
	}
	if synced {
		m.publishLocks(t)
	}
}

// publishLocks sets the lock gauges from t, once the watch has delivered
// every lock (before, a table half read would show a dip).
func (m *Metrics) publishLocks(t *lockTable) {
	if m == nil {
		return
	}
	m.holders.Set(float64(t.holders))
	m.waiters.Set(float64(t.waiters))
}

// watchPartitions reports, at each scrape, the partitions the table t
// holds of n, until stop is called.
func (m *Metrics) watchPartitions(t *partition.Table, n int) (stop func()) {
	if m == nil {
		return func() {}
	}
	f := func() (int, int) {
		held := 0
		for p := range n {
			if _, ok := t.Holds(p); ok {
				held++
			}
		}
		return held, n
	}
	m.partitions.Store(&f)
	return func() { m.partitions.CompareAndSwap(&f, nil) }
}

// watchCommits reports, at each scrape, what d's group commit wrote,
// until stop is called.
func (m *Metrics) watchCommits(d *Dispatcher) (stop func()) {
	if m == nil || !d.cfg.GroupCommit {
		return func() {}
	}
	f := func(stream string) groupcommit.Stats {
		switch {
		case stream == bus.StreamEvents:
			return d.hist.GroupCommits()
		case stream == bus.StreamTasks && d.taskCommit != nil:
			return d.taskCommit.Stats()
		}
		return groupcommit.Stats{}
	}
	m.commits.Store(&f)
	return func() { m.commits.CompareAndSwap(&f, nil) }
}

// watchConsumers reports the backlog of d's consumers at each scrape,
// until stop is called.
func (m *Metrics) watchConsumers(js jetstream.JetStream, d *Dispatcher) (stop func()) {
	if m == nil {
		return func() {}
	}
	return m.lag.Watch(js, d.consumerRefs)
}

// consumerRefs are the consumers d binds now: the shared ones, and those
// of the partitions it holds.
func (d *Dispatcher) consumerRefs() []metrics.ConsumerRef {
	var out []metrics.ConsumerRef
	// Their names and streams only: the settings of a bus.Durables do not
	// change them (and d.cfg's may change while it binds).
	for _, c := range bus.DispatcherConsumers(bus.Durables{}) {
		out = append(out, metrics.ConsumerRef{Stream: c.Stream, Consumer: c.Config.Durable})
	}
	d.parts.mu.Lock()
	held := make([]*consuming, 0, len(d.parts.running))
	for _, r := range d.parts.running {
		held = append(held, r)
	}
	d.parts.mu.Unlock()
	for _, r := range held {
		// Those bound so far: a partition just taken may not have made
		// its consumers yet.
		for _, c := range r.consumers() {
			out = append(out, metrics.ConsumerRef{Stream: c.Stream, Consumer: c.Config.Durable})
		}
	}
	return out
}

// lateness is how late timer t of the execution in state s fired at now,
// in seconds: from its due time, or from the execution's last resume if
// that came later (a timer that came due while its execution was
// cancelled, failed or suspended could not fire before the resume, and
// the wait was the operator's, not the engine's).
func lateness(t projections.Timer, s *projections.Execution, now time.Time) float64 {
	from := t.Due
	if s.ResumedAt.After(from) {
		from = s.ResumedAt
	}
	return max(0, now.Sub(from).Seconds())
}
