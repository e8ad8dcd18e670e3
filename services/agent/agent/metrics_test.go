package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// setupMeasured is setupAgentWith counting into a registry of the
// test's, which it returns.
func setupMeasured(t *testing.T, cfg agent.Config) (*agentBundle, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	cfg.Metrics = m
	return setupAgentWith(t, cfg), reg
}

// runMeasured runs an agent of concurrency workers per queue on js until
// the test ends, counting into a registry of the test's, which it
// returns.
func runMeasured(t *testing.T, js jetstream.JetStream, concurrency int) (*agent.Agent, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := agent.NewMetrics(reg)
	require.NoError(t, err)
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: concurrency, Metrics: m}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	return a, reg
}

// waitMetric waits until metric name (with labels) reads want.
func waitMetric(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	metricstest.Wait(t, reg, waitFor, want, name, labels...)
}

// TestMetricsOperations: each operation reported is counted by kind and
// outcome, with how long it ran when it did: one that succeeds, one whose
// handler fails, one of a kind no handler runs and one the policy refuses
// (both counted refused, the first under "unregistered"). A task is in
// flight while its operation runs, and no longer once reported.
func TestMetricsOperations(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var ran atomic.Int64 // how long the slow handler ran, in nanoseconds
	b, reg := setupMeasured(t, agent.Config{Handlers: map[string]operation.Handler{
		"slow": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			began := time.Now()
			<-release
			ran.Store(int64(time.Since(began)))
			return nil, nil
		}),
		"boom": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) { return nil, errors.New("boom") }),
	}}) // exec off: the zero Policy
	b.publishTask(t, "x-slow", workflow.Step{ID: "s", Kind: "slow"})
	waitMetric(t, reg, 1, "jetflow_agent_tasks_in_flight", "queue", workflow.DefaultQueue)
	close(release)
	b.waitFinal(t, "x-slow")
	waitMetric(t, reg, 0, "jetflow_agent_tasks_in_flight", "queue", workflow.DefaultQueue)
	waitMetric(t, reg, 1, "jetflow_agent_operations_total", "kind", "slow", "outcome", "succeeded")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_agent_operation_duration_seconds", "kind", "slow", "outcome", "succeeded"))
	require.GreaterOrEqual(t, metricstest.Sum(t, reg, "jetflow_agent_operation_duration_seconds", "kind", "slow", "outcome", "succeeded"),
		time.Duration(ran.Load()).Seconds(), "at least as long as the handler ran")

	b.publishTask(t, "x-boom", workflow.Step{ID: "s", Kind: "boom"})
	b.publishTask(t, "x-nope", workflow.Step{ID: "s", Kind: "nope"})
	b.publishTask(t, "x-exec", workflow.Step{ID: "s", Kind: workflow.KindExec, Command: "true"})
	for _, id := range []string{"x-boom", "x-nope", "x-exec"} {
		b.waitFinal(t, id)
	}
	waitMetric(t, reg, 1, "jetflow_agent_operations_total", "kind", "boom", "outcome", "failed")
	waitMetric(t, reg, 1, "jetflow_agent_operations_total", "kind", "unregistered", "outcome", "refused")
	waitMetric(t, reg, 1, "jetflow_agent_operations_total", "kind", workflow.KindExec, "outcome", "refused")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_agent_operation_duration_seconds", "kind", "boom", "outcome", "failed"))
	require.Zero(t, metricstest.Series(t, reg, "jetflow_agent_operations_total", "kind", "nope"), "a kind no handler runs has no series of its own")
	require.Zero(t, metricstest.Value(t, reg, "jetflow_agent_operation_duration_seconds", "outcome", "refused"), "what did not run has no duration")
	require.Zero(t, metricstest.Value(t, reg, "jetflow_agent_redeliveries_total"))
}

// TestMetricsRedeliveries: a task an agent took and never acknowledged
// (it died) is delivered again, and the agent that runs it counts it.
func TestMetricsRedeliveries(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &agentBundle{js: js}
	b.publishTask(t, "x-again", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	takeWithoutAck(t, js, 1)
	_, reg := runMeasured(t, js, 2)
	b.waitFinal(t, "x-again")
	waitMetric(t, reg, 1, "jetflow_agent_redeliveries_total", "queue", workflow.DefaultQueue)
	waitMetric(t, reg, 1, "jetflow_agent_operations_total", "kind", workflow.KindNoop, "outcome", "succeeded")
}

// TestMetricsTaskRequests: the workers' requests for a task are counted
// by lane and answer: one task taken from each lane, and the looks that
// found a lane empty (an idle worker looks at both before it waits).
func TestMetricsTaskRequests(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	a, reg := runMeasured(t, js, 1)
	natstest.Eventually(t, waitFor, func() bool { return a.Ready() == nil }, "the agent binds its queues")
	b := &agentBundle{js: js}
	b.publishTask(t, "x-normal", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	b.waitFinal(t, "x-normal")
	b.publishTaskTo(t, bus.BulkTaskSubject(workflow.DefaultQueue), "x-bulk", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	b.waitFinal(t, "x-bulk")
	q := workflow.DefaultQueue
	waitMetric(t, reg, 1, "jetflow_agent_task_requests_total", "queue", q, "lane", "normal", "answer", "task")
	waitMetric(t, reg, 1, "jetflow_agent_task_requests_total", "queue", q, "lane", "bulk", "answer", "task")
	for _, lane := range []string{"normal", "bulk"} {
		natstest.Eventually(t, waitFor, func() bool {
			return metricstest.Value(t, reg, "jetflow_agent_task_requests_total", "queue", q, "lane", lane, "answer", "none") >= 1
		}, "a look at the %s lane that found nothing (the idle worker's, or its scout's)", lane)
		require.Zero(t, metricstest.Value(t, reg, "jetflow_agent_task_requests_total", "queue", q, "lane", lane, "answer", "error"), lane)
	}
}

// TestMetricsBusyQueue: with every worker of a queue busy, the tasks in
// flight are the workers', and a scrape reports the queue's consumer
// with those tasks in hand and the rest waiting (and the bulk lane's
// consumer, empty).
func TestMetricsBusyQueue(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b, reg := setupMeasured(t, agent.Config{Handlers: map[string]operation.Handler{
		"block": operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		}),
	}})
	const workers, tasks = 4, 6 // setupAgentWith's concurrency
	for i := range tasks {
		b.publishTask(t, fmt.Sprintf("x-%d", i), workflow.Step{ID: "s", Kind: "block"})
	}
	normal := []string{"service", "agent", "stream", bus.StreamTasks, "consumer", agent.ConsumerName(workflow.DefaultQueue)}
	waitMetric(t, reg, workers, "jetflow_agent_tasks_in_flight", "queue", workflow.DefaultQueue)
	waitMetric(t, reg, tasks-workers, "jetflow_consumer_pending_messages", normal...)
	waitMetric(t, reg, workers, "jetflow_consumer_ack_pending_messages", normal...)
	require.Equal(t, 1, metricstest.Series(t, reg, "jetflow_consumer_pending_messages",
		"consumer", bus.AgentBulkConsumer(workflow.DefaultQueue)), "the bulk lane's consumer too")
	close(release)
	for i := range tasks {
		b.waitFinal(t, fmt.Sprintf("x-%d", i))
	}
	waitMetric(t, reg, 0, "jetflow_agent_tasks_in_flight", "queue", workflow.DefaultQueue)
	waitMetric(t, reg, 0, "jetflow_consumer_pending_messages", normal...)
	require.Zero(t, metricstest.Value(t, reg, "jetflow_consumer_info_errors_total"))
}
