package bus_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestResumeConsumesAgainOnceTheConsumerIsDeleted: a Consume whose
// consumer is deleted ends (nats.go); Resume says so, binds the consumer
// again (making it) and consumes it, so that what is published next is
// handled; Drain then ends it all.
func TestResumeConsumesAgainOnceTheConsumerIsDeleted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}})
	require.NoError(t, err)
	spec := bus.Consumer{Stream: "R", Config: jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}}
	var handled, lost atomic.Int32
	start := func(ctx context.Context) (jetstream.ConsumeContext, error) {
		cons, err := bus.Bind(ctx, js, true, spec, nil)
		if err != nil {
			return nil, err
		}
		return cons.Consume(func(m jetstream.Msg) { handled.Add(1); _ = m.Ack() }, bus.Consume(bus.StopIfGone(js, spec, nil))...)
	}
	cc, err := start(t.Context())
	require.NoError(t, err)
	c := bus.Resume(t.Context(), cc, start, func(error) { lost.Add(1) })

	_, err = js.Publish(t.Context(), "r.1", nil)
	require.NoError(t, err)
	natstest.Eventually(t, 10*time.Second, func() bool { return handled.Load() == 1 }, "the first message handled")

	require.NoError(t, js.DeleteConsumer(t.Context(), "R", "c"))
	natstest.Eventually(t, 10*time.Second, func() bool { return lost.Load() >= 1 }, "the end of the Consume noticed")
	natstest.Eventually(t, 10*time.Second, func() bool {
		_, err := js.Consumer(t.Context(), "R", "c")
		return err == nil
	}, "the consumer made again")
	_, err = js.Publish(t.Context(), "r.2", nil)
	require.NoError(t, err)
	// Made again, it delivers from the start: both messages.
	natstest.Eventually(t, 10*time.Second, func() bool { return handled.Load() == 3 }, "consumed again")

	c.Drain()
	_, err = js.Publish(t.Context(), "r.3", nil)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // nothing should come; a loaded machine only makes this surer
	require.Equal(t, int32(3), handled.Load(), "drained: nothing more is consumed")
}

// TestResumeStopsDuringAFailingStart: a Consuming whose start keeps
// failing (the consumer cannot be made) stops at once when asked, without
// waiting for the start to give up.
func TestResumeStopsDuringAFailingStart(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	require.NoError(t, err)
	spec := bus.Consumer{Stream: "S", Config: jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}}
	cons, err := bus.Bind(t.Context(), js, true, spec, nil)
	require.NoError(t, err)
	// Deleted before its first pull, it is noticed by StopIfGone.
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() }, bus.Consume(bus.StopIfGone(js, spec, nil))...)
	require.NoError(t, err)
	starting := make(chan struct{}, 1)
	c := bus.Resume(t.Context(), cc, func(ctx context.Context) (jetstream.ConsumeContext, error) {
		select {
		case starting <- struct{}{}:
		default:
		}
		<-ctx.Done() // a bind waiting for a bootstrap that never comes
		return nil, errors.New("gave up")
	}, func(error) {})
	require.NoError(t, js.DeleteConsumer(t.Context(), "S", "c"))
	select {
	case <-starting:
	case <-time.After(30 * time.Second):
		t.Fatal("no start after the consumer was deleted")
	}
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop waited for the start")
	}
}
