package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

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
	cons, err := s.js.CreateOrUpdateConsumer(ctx, events.StreamTasks, jetstream.ConsumerConfig{
		Durable: "agent-flaky", FilterSubject: events.TaskSubject("flaky"), AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 300 * time.Millisecond, MaxDeliver: 2,
	})
	require.NoError(t, err)
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "doomed", ID: "doomed-1"})
	require.NoError(t, err)

	for delivery := 1; delivery <= 2; delivery++ { // each "agent" takes the task and dies
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

	x := s.waitDone(t, "doomed-1", 20*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Steps[0].Error, "delivered 2 times")
	require.Equal(t, "janitor", x.Steps[0].Agent)

	stream, err := s.js.Stream(ctx, events.StreamTasks)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 5*time.Second, 20*time.Millisecond, "the lost task is removed from its queue")
}
