package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestJanitorFailsTaskWhoseAgentsDie plays two agents of queue "flaky"
// that each take the task and die without a result. After MaxDeliver
// deliveries JetStream raises an advisory; the janitor must turn it into
// a step failure, so the execution ends instead of hanging forever.
func TestJanitorFailsTaskWhoseAgentsDie(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: doomed\nsteps:\n  - id: fragile\n    kind: noop\n    queue: flaky\n")
	cons := flakyAgents(t, s)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "doomed", ID: "doomed-1"})
	require.NoError(t, err)

	agentsDie(t, cons)
	x := s.waitDone(t, "doomed-1", 20*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	fragile := stepByID(t, x, "fragile")
	require.Contains(t, fragile.Error, "delivered 2 times")
	require.Equal(t, "janitor", fragile.Agent)

	stream, err := s.js.Stream(ctx, bus.StreamTasks)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		// The queue's lanes only: the stream also holds the dispatchers'
		// keepers for a few seconds (docs/subjects.md, JF_TASKS).
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(bus.TasksPrefix+".>"))
		return err == nil && info.State.Subjects[bus.TaskSubject("flaky")] == 0 && info.State.Subjects[bus.BulkTaskSubject("flaky")] == 0
	}, 5*time.Second, 20*time.Millisecond, "the lost task is removed from its queue")
}

// flakyAgents is the consumer of queue "flaky", whose agents the tests
// play: each delivery is taken and never answered.
func flakyAgents(t *testing.T, s *stack) jetstream.Consumer {
	t.Helper()
	cons, err := s.js.CreateOrUpdateConsumer(context.Background(), bus.StreamTasks, jetstream.ConsumerConfig{
		Durable: "agent-flaky", FilterSubject: bus.TaskSubject("flaky"), AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 300 * time.Millisecond, MaxDeliver: 2,
	})
	require.NoError(t, err)
	return cons
}

// agentsDie takes a task twice (two agents that die with it), then waits
// for the server to notice its deliveries are exhausted.
func agentsDie(t *testing.T, cons jetstream.Consumer) {
	t.Helper()
	for delivery := 1; delivery <= 2; delivery++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			require.NoError(t, err)
			require.EqualValues(t, delivery, md.NumDelivered)
			n++
		}
		require.Equal(t, 1, n, "delivery %d", delivery)
	}
	// A pull waiting after the last delivery lets the server notice the limit.
	go func() { _, _ = cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second)) }()
}

// TestJanitorLostTaskReplaysAutomatically: in a workflow replayable
// automatically, the janitor's finding that a task was lost replays the
// execution resuming at the (idempotent) step: its task is sent again
// with a new attempt and token, and a healthy agent finishes it.
func TestJanitorLostTaskReplaysAutomatically(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: resilient\nreplayable: automatically\nsteps:\n  - {id: fragile, kind: noop, queue: flaky, idempotent: yes}\n")
	cons := flakyAgents(t, s)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "resilient", ID: "res-1"})
	require.NoError(t, err)
	agentsDie(t, cons)

	var task *events.Task
	poll(t, 20*time.Second, "a second attempt is sent", func() (bool, string) { // the replay's task: a healthy agent takes it
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return false, err.Error()
		}
		for m := range batch.Messages() {
			ev, err := bus.Decode(m.Headers(), m.Data())
			require.NoError(t, err)
			if tk, ok := ev.Data.(*events.Task); ok && tk.Attempt == 2 {
				task = tk
				require.NoError(t, m.Ack())
			}
		}
		return task != nil, "no task of attempt 2"
	})
	ev := events.New("test-agent", task.ExecutionID, task.Workflow, time.Now(), &events.OperationSucceeded{TaskRef: task.Ref("healthy", 1)})
	msg, err := bus.Encode(bus.ResultSubject(task.Queue, task.ExecutionID), ev)
	require.NoError(t, err)
	_, err = s.js.PublishMsg(ctx, msg)
	require.NoError(t, err)

	x := s.waitDone(t, "res-1", 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Len(t, x.Replays, 1)
	require.True(t, x.Replays[0].Automatic)
	require.Equal(t, "fragile", x.Replays[0].Point)
	require.Contains(t, x.Replays[0].Reason, "delivered 2 times")
	requireLinear(t, s.history(t, "res-1"))
}
