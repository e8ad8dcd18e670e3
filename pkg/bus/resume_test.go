package bus_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

// drainFixture is a stream of 20 messages and a durable consumer c of
// it, whose handler holds the first message it gets until gate closes.
type drainFixture struct {
	js jetstream.JetStream
	// pulls is the Consume's connection, of its own, and before what it
	// had received when its last Consume began (its pull's messages come
	// after).
	pulls   *nats.Conn
	pullsJS jetstream.JetStream
	before  atomic.Uint64
	spec    bus.Consumer
	handled atomic.Int32
	holding chan struct{} // closed once the handler holds its first message
	gate    chan struct{}
	first   atomic.Bool
}

func newDrainFixture(t *testing.T, stream string) *drainFixture {
	t.Helper()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	pulls, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(pulls.Close)
	pullsJS, err := jetstream.New(pulls)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	require.NoError(t, err)
	for range 20 {
		_, err := js.Publish(t.Context(), stream+".m", nil)
		require.NoError(t, err)
	}
	f := &drainFixture{js: js, pulls: pulls, pullsJS: pullsJS, holding: make(chan struct{}), gate: make(chan struct{}),
		// An ack wait far longer than the test: a message pulled and
		// dropped stays pending.
		spec: bus.Consumer{Stream: stream, Config: jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute}}}
	t.Cleanup(func() {
		select {
		case <-f.gate:
		default:
			close(f.gate)
		}
	})
	return f
}

// consume starts a Consume of c that pulls ten at a time, on the
// fixture's pulls connection.
func (f *drainFixture) consume(ctx context.Context) (jetstream.ConsumeContext, error) {
	cons, err := bus.Bind(ctx, f.pullsJS, true, f.spec, nil)
	if err != nil {
		return nil, err
	}
	f.before.Store(f.pulls.Stats().InMsgs)
	return cons.Consume(func(m jetstream.Msg) {
		if f.first.CompareAndSwap(false, true) {
			close(f.holding)
			<-f.gate
		}
		f.handled.Add(1)
		_ = m.Ack()
	}, jetstream.PullMaxMessages(10))
}

// waitConsumer waits until c's info satisfies ok, which says what it waits for.
func (f *drainFixture) waitConsumer(t *testing.T, what string, ok func(*jetstream.ConsumerInfo) bool) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, func() bool {
		cons, err := f.js.Consumer(t.Context(), f.spec.Stream, "c")
		if err != nil {
			return false
		}
		info, err := cons.Info(t.Context())
		return err == nil && ok(info)
	}, what)
}

// waitAllHandled waits until every message c delivered was handled and
// acknowledged: none is left pending (as one pulled and dropped would be,
// for the ack wait).
func (f *drainFixture) waitAllHandled(t *testing.T) {
	t.Helper()
	f.waitConsumer(t, "every message delivered handled and acknowledged", func(info *jetstream.ConsumerInfo) bool {
		return info.NumAckPending == 0 && uint64(f.handled.Load()) == info.Delivered.Consumer
	})
}

// waitAllDelivered waits until the first pull's ten messages are in the
// client: nats.go drains by unsubscribing, and what is still on the wire
// then is dropped (pending for the ack wait, which the next holder's
// reset of the consumer covers in the dispatcher). The server counts
// them delivered as it sends them, before the client has read them (on
// a busy machine a CI run failed so): it waits for that, then for the
// Consume's connection to have received ten messages since the Consume
// began.
func (f *drainFixture) waitAllDelivered(t *testing.T) {
	t.Helper()
	f.waitConsumer(t, "the first pull delivered", func(info *jetstream.ConsumerInfo) bool { return info.NumAckPending == 10 })
	natstest.Eventually(t, 30*time.Second, func() bool { return f.pulls.Stats().InMsgs >= f.before.Load()+10 },
		"the client received the pull's ten messages")
}

// TestDrainWithinWaitsForTheHandler: DrainWithin reports a Consume whose
// handler still holds a message as not closed within its wait; once the
// handler goes on, every message delivered (those in the pull's buffer
// too) is handled, and the Consume closes.
func TestDrainWithinWaitsForTheHandler(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t, "DW")
	cc, err := f.consume(t.Context())
	require.NoError(t, err)
	c := bus.Resume(t.Context(), cc, f.consume, func(error) {})
	select {
	case <-f.holding:
	case <-time.After(30 * time.Second):
		t.Fatal("no message delivered")
	}
	f.waitAllDelivered(t)
	require.False(t, c.DrainWithin(100*time.Millisecond), "the handler holds a message: not closed")
	close(f.gate)
	select {
	case <-cc.Closed():
	case <-time.After(30 * time.Second):
		t.Fatal("the drain never ended")
	}
	f.waitAllHandled(t)
	require.True(t, c.DrainWithin(time.Millisecond), "drained already")
}

// TestDrainCoversAConsumeStartedMeanwhile: a Consuming drained while its
// watch starts a new Consume (the last one ended on its own) drains that
// one too, rather than stopping it: the messages it pulled are handled,
// not left pending for the ack wait.
func TestDrainCoversAConsumeStartedMeanwhile(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t, "DM")
	// The first Consume is of another consumer, deleted: it ends on its
	// own and the watch starts f's.
	other := bus.Consumer{Stream: "DM", Config: jetstream.ConsumerConfig{Durable: "other", AckPolicy: jetstream.AckExplicitPolicy}}
	cons, err := bus.Bind(t.Context(), f.js, true, other, nil)
	require.NoError(t, err)
	first, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() }, bus.Consume(bus.StopIfGone(f.js, other, nil))...)
	require.NoError(t, err)
	var started atomic.Pointer[jetstream.ConsumeContext]
	c := bus.Resume(t.Context(), first, func(ctx context.Context) (jetstream.ConsumeContext, error) {
		next, err := f.consume(context.WithoutCancel(ctx))
		if err != nil {
			return nil, err
		}
		started.Store(&next)
		<-ctx.Done() // returned once the Consuming is being drained
		return next, nil
	}, func(error) {})
	require.NoError(t, f.js.DeleteConsumer(t.Context(), "DM", "other"))
	select {
	case <-f.holding:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch's Consume got no message")
	}
	f.waitAllDelivered(t)
	drained := make(chan struct{})
	go func() { c.Drain(); close(drained) }()
	select {
	case <-drained:
		t.Fatal("Drain returned while the new Consume's handler holds a message")
	case <-time.After(100 * time.Millisecond):
	}
	close(f.gate)
	select {
	case <-drained:
	case <-time.After(30 * time.Second):
		t.Fatal("Drain never returned")
	}
	require.NotNil(t, started.Load())
	select {
	case <-(*started.Load()).Closed():
	default:
		t.Fatal("Drain returned before the new Consume closed")
	}
	f.waitAllHandled(t)
}

// TestSecondDrainWithinReportsStoppedAlready: DrainWithin of a Consuming
// whose drain is still under way (a first DrainWithin gave up waiting)
// reports true at once: it was stopped already, and nothing is left to
// wait for here.
func TestSecondDrainWithinReportsStoppedAlready(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t, "SD")
	cc, err := f.consume(t.Context())
	require.NoError(t, err)
	c := bus.Resume(t.Context(), cc, f.consume, func(error) {})
	<-f.holding
	require.False(t, c.DrainWithin(50*time.Millisecond))
	require.True(t, c.DrainWithin(50*time.Millisecond), "stopped already: nothing to wait for")
}
