package dispatch

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

// TestKeepAliveHoldsALongHandling: a message handled for longer than its
// AckWait is not redelivered while keepAlive runs.
func TestKeepAliveHoldsALongHandling(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ackWait := 400 * time.Millisecond
	cons, err := js.CreateOrUpdateConsumer(t.Context(), events.StreamCommands, jetstream.ConsumerConfig{
		Durable: "ka", FilterSubject: events.SubjectReconcile, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), events.SubjectReconcile, []byte("x"))
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	m := <-batch.Messages()
	require.NotNil(t, m)

	d := &Dispatcher{cfg: Config{AckWait: ackWait}}
	handled := make(chan struct{})
	go d.keepAlive(m, handled)
	time.Sleep(3 * ackWait) // the handling takes three ack waits
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
	require.NoError(t, err)
	n := 0
	for range again.Messages() {
		n++
	}
	require.Zero(t, n, "not redelivered while it is being handled")
	close(handled)
	require.NoError(t, m.Ack())
}
