package agent_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestAgentDoesNotRunAgainATaskWhoseResultIsStored: an agent that stored a
// task's result and died before acknowledging the task leaves it to be
// delivered again. Once the result is stored the dispatcher may record it
// and move on (the step's lock may go to the next holder), so running the
// operation again would run it outside its lock: the agent acknowledges
// such a task without running it. A task redelivered without a stored
// result, or with only a result of an earlier token (the execution was
// resumed since), runs again.
func TestAgentDoesNotRunAgainATaskWhoseResultIsStored(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &agentBundle{js: js}
	reported := b.publishTask(t, "x-reported", workflow.Step{ID: "s", Kind: "count"})
	unreported := b.publishTask(t, "x-unreported", workflow.Step{ID: "s", Kind: "count"})
	resumed := b.publishTask(t, "x-resumed", workflow.Step{ID: "s", Kind: "count"})

	// The agent that died: it takes the three tasks and acknowledges none.
	takeWithoutAck(t, js, 3)
	// It stored the result of the first, and the second's execution was
	// resumed after the first delivery of a task of the same id reported.
	store := func(task *events.Task, token string) {
		ref := task.Ref("dead-agent", 1)
		ref.Token = token
		ev := events.New("jetflow/agent/dead-agent", task.ExecutionID, task.Workflow, time.Now(),
			&events.OperationSucceeded{TaskRef: ref})
		ev.ID = task.TaskID + ".done.1"
		msg, err := bus.Encode(bus.ResultSubject(task.Queue, task.ExecutionID), ev)
		require.NoError(t, err)
		_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
		require.NoError(t, err)
	}
	store(reported, reported.Token)
	store(resumed, "tok-before-resume")

	var mu sync.Mutex
	runs := map[string][]int{}
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, Handlers: map[string]operation.Handler{
		"count": operation.HandlerFunc(func(_ context.Context, tk operation.Task) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[tk.ExecutionID] = append(runs[tk.ExecutionID], tk.Delivery)
			return nil, nil
		}),
	}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)

	b.waitFinal(t, unreported.ExecutionID)
	natstest.Eventually(t, waitFor, func() bool {
		for _, ev := range readResults(t, js, resumed.ExecutionID) {
			if r, ok := ev.Data.(*events.OperationSucceeded); ok && r.Token == resumed.Token {
				return true
			}
		}
		return false
	}, "result of the resumed execution's task")
	b.waitQueueEmpty(t) // the reported task too was acknowledged
	mu.Lock()
	require.Equal(t, map[string][]int{unreported.ExecutionID: {2}, resumed.ExecutionID: {2}}, runs,
		"only the tasks without a stored result ran again")
	mu.Unlock()
	evs := readResults(t, js, reported.ExecutionID)
	require.Len(t, evs, 1, "nothing reported about the task run before")
}

// takeWithoutAck is an agent that dies: it takes n tasks of the default
// queue (on the agents' consumer) and acknowledges none, so each is
// delivered again after AckWait.
func takeWithoutAck(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	cons, err := js.CreateOrUpdateConsumer(t.Context(), bus.StreamTasks, jetstream.ConsumerConfig{
		Durable: agent.ConsumerName("default"), FilterSubject: bus.TaskSubject("default"),
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: 5, MaxAckPending: 4096,
	})
	require.NoError(t, err)
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	got := 0
	for range batch.Messages() {
		got++
	}
	require.Equal(t, n, got)
}

// TestRedeliveryPastAnUndecodableResult: a malformed message on an
// execution's results subject (anyone may publish there) must not stop a
// redelivered task's "already reported?" look-up, or the task would never
// run again.
func TestRedeliveryPastAnUndecodableResult(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &agentBundle{js: js}
	task := b.publishTask(t, "x-poison", workflow.Step{ID: "s", Kind: "count"})
	takeWithoutAck(t, js, 1)
	m := nats.NewMsg(bus.ResultSubject(task.Queue, task.ExecutionID))
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", "junk")
	m.Header.Set("ce-source", "somebody")
	m.Header.Set("ce-type", string(events.TypeOperationSucceeded))
	m.Header.Set("ce-datacontenttype", "application/json")
	m.Data = []byte(`{"task_id": 42`)
	_, err := js.PublishMsg(t.Context(), m)
	require.NoError(t, err)

	var runs atomic.Int32
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 1, Handlers: map[string]operation.Handler{
		"count": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) { runs.Add(1); return nil, nil }),
	}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 15*time.Second, 20*time.Millisecond, "the redelivered task runs")
}

// TestAResultIsStoredOnceTheStreamIsBack: while the results stream is
// missing (its leader being elected, say) for three ack waits, the agent
// keeps its task (heartbeats) and keeps trying to store the result; once
// the stream is back the result is stored and the operation has run
// once. An agent that gave up after one ack wait handed the task back,
// and the operation ran again.
func TestAResultIsStoredOnceTheStreamIsBack(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	b := setupAgent(t, map[string]operation.Handler{"count": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
		runs.Add(1)
		return "ran", nil
	})})
	results, err := b.js.Stream(t.Context(), bus.StreamResults)
	require.NoError(t, err)
	cfg := results.CachedInfo().Config
	require.NoError(t, b.js.DeleteStream(t.Context(), bus.StreamResults))
	b.publishTask(t, "once", workflow.Step{ID: "s", Kind: "count"})
	natstest.Eventually(t, waitFor, func() bool { return runs.Load() > 0 }, "the operation runs")
	time.Sleep(3 * ackWait) // the agent cannot report meanwhile
	_, err = b.js.CreateStream(t.Context(), cfg)
	require.NoError(t, err)
	evs := b.waitFinal(t, "once")
	require.Equal(t, events.TypeOperationSucceeded, evs[len(evs)-1].Type)
	b.waitQueueEmpty(t)
	require.EqualValues(t, 1, runs.Load(), "the operation ran again")
}
