package dispatch_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// runMeasured runs a dispatcher counting into a registry of the test's,
// which it returns.
func (b *testBundle) runMeasured(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg, m := newMetrics(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4, Metrics: m})
	return reg
}

// waitMetric waits until metric name (with labels) reads want.
func waitMetric(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	metricstest.Wait(t, reg, waitFor, want, name, labels...)
}

// TestMetricsExecutionsAndSteps: an execution that succeeds and one that
// fails are counted started and ended by status, with their durations;
// their steps by kind and outcome, the operations' with their
// durations; and each event of their histories as one append.
func TestMetricsExecutionsAndSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	b.applyYAML(t, "name: mx\nsteps:\n  - {id: a, kind: noop}\n  - {id: set, kind: let, vars: {x: 1}}\n")
	began := time.Now()
	b.start(t, "mx", "ok1")
	b.finishTask(t, b.nextTask(t))
	_, okEvs := waitStatus(t, b.js, "mx", "ok1", projections.StatusSucceeded)
	ran := time.Since(began)
	b.start(t, "mx", "bad1")
	task := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: task.task.Ref("test-agent", 1), Error: "boom", Final: true})
	_, badEvs := waitStatus(t, b.js, "mx", "bad1", projections.StatusFailed)

	waitMetric(t, reg, 2, "jetflow_dispatcher_executions_started_total")
	waitMetric(t, reg, 1, "jetflow_dispatcher_executions_ended_total", "status", "succeeded")
	waitMetric(t, reg, 1, "jetflow_dispatcher_executions_ended_total", "status", "failed")
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_executions_ended_total", "status", "cancelled"))
	require.Equal(t, 1, metricstest.Series(t, reg, "jetflow_dispatcher_executions_ended_total", "status", "cancelled"),
		"a status that never happened reads 0, not nothing")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_execution_duration_seconds", "status", "succeeded"))
	okDur := metricstest.Sum(t, reg, "jetflow_dispatcher_execution_duration_seconds", "status", "succeeded")
	require.Greater(t, okDur, 0.0)
	require.LessOrEqual(t, okDur, ran.Seconds(), "from the start to the end, as the events' times say")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_execution_duration_seconds", "status", "failed"))

	waitMetric(t, reg, 1, "jetflow_dispatcher_steps_total", "kind", "noop", "outcome", "succeeded")
	waitMetric(t, reg, 1, "jetflow_dispatcher_steps_total", "kind", "noop", "outcome", "failed")
	waitMetric(t, reg, 1, "jetflow_dispatcher_steps_total", "kind", "let", "outcome", "succeeded")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_step_duration_seconds", "kind", "noop", "outcome", "succeeded"))
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_step_duration_seconds", "kind", "noop", "outcome", "failed"))
	require.Greater(t, metricstest.Sum(t, reg, "jetflow_dispatcher_step_duration_seconds", "kind", "noop", "outcome", "succeeded"), 0.0,
		"from the schedule to the success, through the test's agent")
	require.Zero(t, metricstest.Series(t, reg, "jetflow_dispatcher_steps_total", "kind", "http"), "a kind not used exports nothing")

	waitMetric(t, reg, float64(len(okEvs)+len(badEvs)), "jetflow_dispatcher_appends_total", "result", "ok")
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_appends_total", "result", "conflict"))
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_conflicts_total"))
}

// TestMetricsConflict: another writer appends to an execution whose state
// the dispatcher keeps; the dispatcher's next append meets the expected
// sequence check, is counted as a conflict, and it reads the history
// again and goes on.
func TestMetricsConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	b.applyYAML(t, "name: cf\nsteps:\n  - {id: a, kind: noop}\n")
	b.start(t, "cf", "cf1")
	task := b.nextTask(t)
	evs := waitHistory(t, b.js, "cf", "cf1", "the task sent", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	last := evs[len(evs)-1].Seq
	other := events.New("another-dispatcher", "cf1", "cf", time.Now(), &events.StepStarted{StepID: "a", Attempt: 1, Agent: "elsewhere"})
	other.PrevSeq = last
	_, err := history.Append(t.Context(), b.js, bus.ExecutionSubject("cf", "cf1"), last, other)
	require.NoError(t, err)

	b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
	waitStatus(t, b.js, "cf", "cf1", projections.StatusSucceeded)
	require.GreaterOrEqual(t, metricstest.Value(t, reg, "jetflow_dispatcher_appends_total", "result", "conflict"), 1.0)
	require.GreaterOrEqual(t, metricstest.Value(t, reg, "jetflow_dispatcher_conflicts_total"), 1.0)
}

// TestMetricsRejections: rejected commands are counted by code.
func TestMetricsRejections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	readRejection(t, b.js, b.start(t, "nope", "r1"))
	readRejection(t, b.js, b.start(t, "nope", "bad id!"))
	waitMetric(t, reg, 1, "jetflow_dispatcher_commands_rejected_total", "code", events.CodeNotFound)
	waitMetric(t, reg, 1, "jetflow_dispatcher_commands_rejected_total", "code", events.CodeInvalid)
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_commands_rejected_total", "code", events.CodeConflict))
}

// TestMetricsTimerLateness: a sleep's timer (recorded in a batch of
// fired timers) and a wait's timeout (recorded by a worker) are each
// observed, by purpose, with how late they were recorded after their due
// time.
func TestMetricsTimerLateness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	b.applyYAML(t, "name: tm\nsteps:\n  - {id: nap, kind: sleep, duration: 50ms}\n  - {id: w, kind: wait, signal: go, timeout: 50ms}\n")
	began := time.Now()
	b.start(t, "tm", "tm1")
	_, evs := waitStatus(t, b.js, "tm", "tm1", projections.StatusFailed) // the wait timed out
	require.Equal(t, 2, countType(evs, events.TypeTimerFired))
	waitMetric(t, reg, float64(len(evs)), "jetflow_dispatcher_appends_total", "result", "ok") // the batch's append too
	waitMetric(t, reg, 1, "jetflow_dispatcher_timer_lateness_seconds", "purpose", events.TimerSleep)
	waitMetric(t, reg, 1, "jetflow_dispatcher_timer_lateness_seconds", "purpose", events.TimerWaitTimeout)
	late := metricstest.Sum(t, reg, "jetflow_dispatcher_timer_lateness_seconds")
	require.GreaterOrEqual(t, late, 0.0)
	require.Less(t, late, time.Since(began).Seconds(), "late by less than the whole test")
}

// TestMetricsTimerLatenessFromAResume: a sleep cancelled before its due
// time and resumed well after it fires at the resume; its lateness is
// counted from the resume, not from the due time (the wait was the
// operator's).
func TestMetricsTimerLatenessFromAResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	b.applyYAML(t, "name: tr\nsteps:\n  - {id: nap, kind: sleep, duration: 3s}\n")
	b.start(t, "tr", "tr1")
	waitHistory(t, b.js, "tr", "tr1", "asleep", func(evs []events.Event) bool {
		return countType(evs, events.TypeStepWaiting) == 1
	})
	b.act(t, "tr1", events.ActionCancel, "")
	_, evs := waitStatus(t, b.js, "tr", "tr1", projections.StatusCancelled)
	due := time.Time{}
	for _, ev := range evs {
		if a := events.ArmingOf(ev.Data); a != nil {
			due = a.Due
		}
	}
	require.False(t, due.IsZero(), "the sleep's arming is recorded")
	time.Sleep(time.Until(due.Add(3 * time.Second))) // cancelled past its due time
	resumed := time.Now()
	b.act(t, "tr1", events.ActionResume, "")
	waitStatus(t, b.js, "tr", "tr1", projections.StatusSucceeded)
	waitMetric(t, reg, 1, "jetflow_dispatcher_timer_lateness_seconds", "purpose", events.TimerSleep)
	require.Less(t, metricstest.Sum(t, reg, "jetflow_dispatcher_timer_lateness_seconds"), time.Since(resumed).Seconds(),
		"late by less than the time since the resume: not counted from the due time, %s before it", resumed.Sub(due))
}

// TestMetricsLocks: while one execution holds a lock and another waits
// for it, the lock gauges say so; the wait is observed once the waiter
// acquires it (and the holder's immediate acquisition too), and the
// gauges go back to zero when both are done.
func TestMetricsLocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	b.applyYAML(t, "name: lk\nlock: db\nsteps:\n  - id: work\n    kind: noop\n")
	b.start(t, "lk", "h1")
	first := b.nextTask(t)
	b.start(t, "lk", "h2")
	lockStatus(t, b.js, "lk", "h2", "", projections.LockWaiting)
	waitMetric(t, reg, 1, "jetflow_dispatcher_lock_holders")
	waitMetric(t, reg, 1, "jetflow_dispatcher_lock_waiters")
	waitMetric(t, reg, 1, "jetflow_dispatcher_lock_wait_seconds")

	b.finishTask(t, first)
	second := b.nextTask(t)
	require.Equal(t, "h2", second.task.ExecutionID)
	waitMetric(t, reg, 2, "jetflow_dispatcher_lock_wait_seconds")
	var waited float64
	for _, id := range []string{"h1", "h2"} {
		s, err := projections.Fold(readHistory(t, b.js, "lk", id))
		require.NoError(t, err)
		l, _ := s.LockAt("")
		waited += l.AcquiredAt.Sub(l.RequestedAt).Seconds()
	}
	require.InDelta(t, waited, metricstest.Sum(t, reg, "jetflow_dispatcher_lock_wait_seconds"), 1e-6,
		"the waits observed are those the histories record")
	waitMetric(t, reg, 0, "jetflow_dispatcher_lock_waiters")
	b.finishTask(t, second)
	waitStatus(t, b.js, "lk", "h2", projections.StatusSucceeded)
	waitMetric(t, reg, 0, "jetflow_dispatcher_lock_holders")
}

// TestMetricsConsumerLag: a scrape reports the backlog of the shared
// consumers the dispatcher binds and of each partition's it holds.
func TestMetricsConsumerLag(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	want := []string{bus.ConsumerDispatcherCommands, bus.ConsumerDispatcherResults, bus.ConsumerDispatcherTimers,
		bus.PartitionInboxConsumer(0), bus.PartitionResultsConsumer(0), bus.PartitionTimersConsumer(0), bus.PartitionNoticesConsumer(0)}
	var missing []string
	natstest.Eventually(t, waitFor, func() bool {
		missing = missing[:0]
		for _, c := range want {
			if metricstest.Series(t, reg, "jetflow_consumer_pending_messages", "service", "dispatcher", "consumer", c) != 1 ||
				metricstest.Series(t, reg, "jetflow_consumer_ack_pending_messages", "service", "dispatcher", "consumer", c) != 1 {
				missing = append(missing, c)
			}
		}
		return len(missing) == 0
	}, "the lag of every consumer bound (missing: %v)", &missing)
	require.Zero(t, metricstest.Value(t, reg, "jetflow_consumer_info_errors_total"))
	require.Equal(t, 0.0, metricstest.Value(t, reg, "jetflow_consumer_pending_messages", "consumer", bus.ConsumerDispatcherCommands),
		"an idle dispatcher has no backlog")
}

// TestMetricsPartitions: a dispatcher alone holds every partition, and
// says so; the two gauges agree.
func TestMetricsPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := b.runMeasured(t)
	n, err := bus.Partitions(t.Context(), b.js)
	require.NoError(t, err)
	waitMetric(t, reg, float64(n), "jetflow_dispatcher_partitions")
	waitMetric(t, reg, float64(n), "jetflow_dispatcher_partitions_held")
}

// newMetrics returns dispatcher metrics registered on a registry of
// their own, to scrape.
func newMetrics(t *testing.T) (*prometheus.Registry, *dispatch.Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := dispatch.NewMetrics(reg)
	require.NoError(t, err)
	return reg, m
}
