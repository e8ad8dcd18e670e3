package agent_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestRedeliveryPastAnUndecodableResult: a malformed message on an
// execution's results subject (anyone may publish there) must not stop a
// redelivered task's "already reported?" look-up, or the task would never
// run again.
func TestRedeliveryPastAnUndecodableResult(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &agentBundle{js: js}
	task := b.publishTask(t, "x-poison", workflow.Step{ID: "s", Kind: "count"})
	cons, err := js.CreateOrUpdateConsumer(t.Context(), events.StreamTasks, jetstream.ConsumerConfig{
		Durable: agent.ConsumerName("default"), FilterSubject: events.TaskSubject("default"),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: 5, MaxAckPending: 4096,
	})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for range batch.Messages() {
	}
	m := nats.NewMsg(events.ResultSubject(task.ExecutionID))
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", "junk")
	m.Header.Set("ce-source", "somebody")
	m.Header.Set("ce-type", string(events.TypeOperationSucceeded))
	m.Header.Set("ce-datacontenttype", "application/json")
	m.Data = []byte(`{"task_id": 42`)
	_, err = js.PublishMsg(t.Context(), m)
	require.NoError(t, err)

	var runs atomic.Int32
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 1, Handlers: map[string]operation.Handler{
		"count": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) { runs.Add(1); return nil, nil }),
	}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 15*time.Second, 20*time.Millisecond, "the redelivered task runs")
}
