package dispatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestStoppedHoldingHandsBackWhatItPulled: a holding given up while the
// server has delivered messages to it that its handler has not seen yet
// (the pull's buffer, and what was on the wire) hands every one of them
// to its handler, which gives them back (process Naks what a holding no
// longer handles): none waits for the ack wait. Stopped outright, nats.go
// drops the buffered ones, and they stay pending on the consumer until
// its ack wait; when the partition's next holder reset the consumer
// before this one stopped (a holder starved past its lease notices late),
// no reset comes after, and a report waited the whole ack wait.
func TestStoppedHoldingHandsBackWhatItPulled(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	// The holding pulls on a connection of its own, so that what it has
	// received is counted apart from the publishes' acknowledgements.
	pullConn, pullJS := natstest.Connect(t, srv)
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HANDBACK", Subjects: []string{"handback.>"}})
	require.NoError(t, err)
	const n = 200
	for i := range n {
		_, err := js.Publish(ctx, fmt.Sprintf("handback.%d", i), []byte("report"))
		require.NoError(t, err)
	}
	cons, err := js.CreateConsumer(ctx, "HANDBACK", jetstream.ConsumerConfig{
		Durable: "handback", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxDeliver: -1,
	})
	require.NoError(t, err)

	r := &consuming{part: 1}
	var seen, stopped atomic.Int64
	first := make(chan struct{})
	release := make(chan struct{})
	handler := func(m jetstream.Msg) {
		r.inFlight.Add(1)
		defer r.inFlight.Add(-1)
		if seen.Add(1) == 1 {
			close(first)
			<-release // the workers are busy: the pull's buffer fills behind this one
		}
		if r.isStopped() {
			stopped.Add(1)
		}
		_ = m.Nak() // no longer held here: given back (process)
	}
	pulled, err := pullJS.Consumer(ctx, "HANDBACK", "handback")
	require.NoError(t, err)
	before := pullConn.Stats().InMsgs
	cc, err := pulled.Consume(handler, jetstream.PullMaxMessages(64))
	require.NoError(t, err)
	resumed := bus.Resume(ctx, cc, func(context.Context) (jetstream.ConsumeContext, error) {
		return nil, errNotHeld
	}, func(error) {})
	require.True(t, r.add(bus.Consumer{Stream: "HANDBACK"}, resumed))

	<-first
	// Received by the holding's connection, not yet seen by the handler:
	// the pull's 64, the one in hand among them (a heartbeat comes only
	// after 15 s idle; no second pull while the handler holds the first).
	// A message the server has sent (the consumer counts it pending) may
	// still be on the wire, and one that arrives after the stop's
	// unsubscribe is dropped by nats.go, to wait for the ack wait: not
	// what this test is about.
	require.Eventually(t, func() bool { return pullConn.Stats().InMsgs-before >= 64 }, 10*time.Second, 10*time.Millisecond)
	stopDone := make(chan struct{})
	go func() { defer close(stopDone); r.stop(time.Minute) }()
	require.Eventually(t, r.isStopped, 10*time.Second, time.Millisecond)
	close(release)
	<-stopDone

	require.Greater(t, stopped.Load(), int64(1), "messages delivered before the stop, besides the one in hand, were handed to the handler after it")
	// The next holder is handed every message now, the given back ones
	// included (a Nak keeps a message pending on the consumer, due again
	// at once: only its delivery shows it was given back).
	requireHandedAll(t, cons, n)
}

// requireHandedAll checks that the consumer hands the next holder all n
// messages of its stream within 30 s: none is left pending for the ack
// wait.
func requireHandedAll(t *testing.T, cons jetstream.Consumer, n int) {
	t.Helper()
	got := map[uint64]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(got) < n && time.Now().Before(deadline); {
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			md, err := m.Metadata()
			require.NoError(t, err)
			got[md.Sequence.Stream] = true
			require.NoError(t, m.Ack())
		}
	}
	require.Len(t, got, n, "the next holder is handed every message, none left for the ack wait")
}

// TestStoppedHoldingGivesBackItsQueuedJobsAtOnce: the jobs a holding
// queued that no worker has reached (every worker busy with a backlog)
// are given back when it stops, not left for a worker: stop returns at
// once, rather than after its wait, and the next holder is handed every
// message now.
func TestStoppedHoldingGivesBackItsQueuedJobsAtOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "QUEUED", Subjects: []string{"queued.>"}})
	require.NoError(t, err)
	const n = 100
	for i := range n {
		_, err := js.Publish(ctx, fmt.Sprintf("queued.%d", i), nil)
		require.NoError(t, err)
	}
	cons, err := js.CreateConsumer(ctx, "QUEUED", jetstream.ConsumerConfig{
		Durable: "queued", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxDeliver: -1,
	})
	require.NoError(t, err)

	// No worker takes from the queue: a backlog that outlasts the test.
	work := newTurns()
	r := &consuming{part: 1, work: work}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		r.inFlight.Add(1)
		if !work.add(job{msg: m, key: m.Subject(), from: r}) {
			t.Error("the queue refused a job")
		}
	}, jetstream.PullMaxMessages(n))
	require.NoError(t, err)
	require.True(t, r.add(bus.Consumer{Stream: "QUEUED"}, bus.Resume(ctx, cc, func(context.Context) (jetstream.ConsumeContext, error) {
		return nil, errNotHeld
	}, func(error) {})))
	natstest.Eventually(t, 30*time.Second, func() bool { return r.inFlight.Load() == n }, "every message queued")

	stopped := make(chan struct{})
	go func() { defer close(stopped); r.stop(5 * time.Minute) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("stop waited for jobs no worker would reach")
	}
	require.Zero(t, r.inFlight.Load())
	require.Empty(t, work.queues)

	requireHandedAll(t, cons, n)
}

// naked is a delivered message whose Nak is counted.
type naked struct {
	delivered
	naks *atomic.Int32
}

func (m naked) Nak() error { m.naks.Add(1); return nil }

// TestHoldingWithdrawsOnlyItsOwnStoredJobs: a holding takes out of the
// queue only its own jobs, and of those neither a local step's report
// nor a timer fired from memory (their release gives them back).
func TestHoldingWithdrawsOnlyItsOwnStoredJobs(t *testing.T) {
	work := newTurns()
	r, other := &consuming{part: 1, work: work}, &consuming{part: 2, work: work}
	var naks atomic.Int32
	add := func(key string, from *consuming, m any) {
		if from != nil {
			from.inFlight.Add(1)
		}
		var j job
		switch m := m.(type) {
		case *localMsg:
			j = job{key: key, from: from, msg: m}
		case *soonMsg:
			j = job{key: key, from: from, msg: m}
		case naked:
			j = job{key: key, from: from, msg: m}
		}
		require.True(t, work.add(j))
	}
	msg := func(seq uint64) naked { return naked{delivered{consumer: "c", seq: seq, n: 1}, &naks} }
	add("a", r, msg(1))
	add("a", r, &localMsg{}) // a Nak of these would panic (nil d / soon)
	add("b", r, &soonMsg{})
	add("c", other, msg(2))
	add("d", nil, msg(3))
	r.withdraw()
	require.EqualValues(t, 1, naks.Load())
	require.EqualValues(t, 2, r.inFlight.Load(), "the local report and the timer fired from memory stay")
	require.EqualValues(t, 1, other.inFlight.Load())
	for k, n := range map[string]int{"a": 1, "b": 1, "c": 1, "d": 1} {
		require.Equal(t, n, work.backlog(k), k)
	}
}

// TestStopWithdrawsWhatTheDrainHandsOn: the jobs the consumers' drain
// hands on as the holding stops (the pull's buffer) are withdrawn too:
// stop does not wait for them.
func TestStopWithdrawsWhatTheDrainHandsOn(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DRAINQ", Subjects: []string{"drainq.>"}})
	require.NoError(t, err)
	const n = 50
	for i := range n {
		_, err := js.Publish(ctx, fmt.Sprintf("drainq.%d", i), nil)
		require.NoError(t, err)
	}
	cons, err := js.CreateConsumer(ctx, "DRAINQ", jetstream.ConsumerConfig{
		Durable: "q", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxDeliver: -1,
	})
	require.NoError(t, err)
	work := newTurns()
	r := &consuming{part: 1, work: work}
	holding, gate := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	cc, err := cons.Consume(func(m jetstream.Msg) {
		r.inFlight.Add(1)
		if first.CompareAndSwap(false, true) {
			close(holding)
			<-gate
		}
		work.add(job{msg: m, key: m.Subject(), from: r})
	}, jetstream.PullMaxMessages(n))
	require.NoError(t, err)
	require.True(t, r.add(bus.Consumer{Stream: "DRAINQ"}, bus.Resume(ctx, cc, func(context.Context) (jetstream.ConsumeContext, error) {
		return nil, errNotHeld
	}, func(error) {})))
	<-holding
	natstest.Eventually(t, 30*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == n
	}, "every message delivered")
	go func() {
		for !r.isStopped() {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		close(gate)
	}()
	began := time.Now()
	r.stop(time.Minute)
	require.Less(t, time.Since(began), 30*time.Second, "stop waited for jobs the drain handed on")
	require.Zero(t, r.inFlight.Load())
}

// TestStopWithdrawsDirectReportsHandedOnLate: direct reports the
// subscription's drain (asynchronous) hands on after the first
// withdrawal are withdrawn while stop waits: it does not wait for them.
func TestStopWithdrawsDirectReportsHandedOnLate(t *testing.T) {
	t.Parallel()
	nc, _ := natstest.Connect(t, natstest.RunJetStream(t))
	work := newTurns()
	r := &consuming{part: 1, work: work}
	gate := make(chan struct{})
	var first atomic.Bool
	sub, err := nc.Subscribe("direct.x", func(m *nats.Msg) {
		r.inFlight.Add(1) // listenDirect counts it first
		if first.CompareAndSwap(false, true) {
			<-gate // the subscription's goroutine, mid-callback as stop begins
		}
		work.add(job{key: "x", from: r, msg: &directMsg{msg: m, nc: nc}})
	})
	require.NoError(t, err)
	require.True(t, r.addSub(sub))
	for range 5 {
		require.NoError(t, nc.PublishRequest("direct.x", "_INBOX.none", nil))
	}
	require.NoError(t, nc.Flush())
	time.Sleep(200 * time.Millisecond) // the callback holds the first
	go func() { time.Sleep(300 * time.Millisecond); close(gate) }()
	began := time.Now()
	r.stop(time.Minute)
	require.Less(t, time.Since(began), 30*time.Second, "stop waited for direct reports handed on after its withdraw")
}

// TestHoldingsKnowTheWorkQueue: every holding a running dispatcher takes
// knows its work queue, to withdraw from it as it stops.
func TestHoldingsKnowTheWorkQueue(t *testing.T) {
	b := setupMem(t, Config{Workers: 1}, napDefinition)
	natstest.Eventually(t, 30*time.Second, func() bool {
		b.d.parts.mu.Lock()
		defer b.d.parts.mu.Unlock()
		return len(b.d.parts.running) == b.d.parts.n
	}, "every partition taken")
	b.d.parts.mu.Lock()
	defer b.d.parts.mu.Unlock()
	for p, r := range b.d.parts.running {
		require.NotNil(t, r.work, "partition %d", p)
		require.Same(t, b.d.work.Load(), r.work, "partition %d", p)
	}
}
