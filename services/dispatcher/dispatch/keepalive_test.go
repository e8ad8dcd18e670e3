package dispatch

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestKeepAliveHoldsALongHandling: a message handled for longer than its
// AckWait is not redelivered while keepAlive runs. A pull waits through
// the whole handling (two AckWaits and a half), so a redelivery would
// reach it at once.
func TestKeepAliveHoldsALongHandling(t *testing.T) {
	t.Parallel()
	ackWait := 2 * time.Second // progress every 667 ms: room for a loaded machine
	cons, m := deliveredOnce(t, ackWait)

	d := &Dispatcher{cfg: Config{AckWait: ackWait}}
	handled := make(chan struct{})
	go d.keepAlive(m, ackWait/3, handled)
	require.Zero(t, redeliveries(t, cons, ackWait*5/2), "not redelivered while it is being handled") // the handling takes that long
	close(handled)
	require.NoError(t, m.Ack())
}

// TestQueuedMessagesAreKeptAlive: a message waiting in the turns behind
// its execution's others for longer than its ack wait is not delivered
// again: keepQueuedAlive acknowledges it in progress while it waits.
func TestQueuedMessagesAreKeptAlive(t *testing.T) {
	t.Parallel()
	ackWait := 2 * time.Second
	cons, m := deliveredOnce(t, ackWait)

	d := &Dispatcher{cfg: Config{AckWait: ackWait}}
	work := newTurns()
	// Queued behind a job of the same execution that a worker holds.
	require.True(t, work.add(job{key: "x1", alive: time.Now()}))
	_, ok := work.next()
	require.True(t, ok)
	require.True(t, work.add(job{msg: m, key: "x1", alive: time.Now()}))
	stop := make(chan struct{})
	defer close(stop)
	go d.keepQueuedAlive(work, newFireQueue(), stop)
	require.Zero(t, redeliveries(t, cons, ackWait*5/2), "not redelivered while it waits in the turns") // it waits that long
	require.NoError(t, m.Ack())
}

// deliveredOnce publishes one message on a consumer of its own with
// ackWait and returns it as delivered, unacknowledged.
func deliveredOnce(t *testing.T, ackWait time.Duration) (jetstream.Consumer, jetstream.Msg) {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	cons, err := js.CreateOrUpdateConsumer(t.Context(), bus.StreamCommands, jetstream.ConsumerConfig{
		Durable: "ka", FilterSubject: bus.SubjectReconcile, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), bus.SubjectReconcile, []byte("x"))
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	m := <-batch.Messages()
	require.NotNil(t, m)
	return cons, m
}

// redeliveries counts the messages cons delivers again within wait (one
// pull waiting all along, so a redelivery reaches it at once).
func redeliveries(t *testing.T, cons jetstream.Consumer, wait time.Duration) int {
	t.Helper()
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
	require.NoError(t, err)
	n := 0
	for range again.Messages() {
		n++
	}
	require.NoError(t, again.Error())
	return n
}
