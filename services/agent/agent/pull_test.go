package agent

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
)

// pullBed is a work-queue stream with one consumer, as a queue's lane,
// on a real server, and a worker's pulls.
type pullBed struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	cons  jetstream.Consumer
	pulls *pulls
}

func newPullBed(t *testing.T) *pullBed { return newPullBedAckWait(t, time.Minute) }

// newPullBedAckWait is newPullBed with the consumer's ack wait.
func newPullBedAckWait(t *testing.T, ackWait time.Duration) *pullBed {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, s)
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PULLS", Subjects: []string{"pulls.>"}, Retention: jetstream.WorkQueuePolicy})
	require.NoError(t, err)
	cons, err := js.CreateOrUpdateConsumer(ctx, "PULLS", jetstream.ConsumerConfig{Durable: "lane", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	require.NoError(t, err)
	p, err := newPulls(nc, apiPrefix(js.Options()))
	require.NoError(t, err)
	t.Cleanup(p.close)
	return &pullBed{nc: nc, js: js, cons: cons, pulls: p}
}

func (b *pullBed) publish(t *testing.T, data string) {
	t.Helper()
	_, err := b.js.Publish(t.Context(), "pulls.task", []byte(data))
	require.NoError(t, err)
}

func (b *pullBed) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := b.cons.Info(t.Context())
	require.NoError(t, err)
	return ci
}

// waiting waits until the server holds n pull requests of the lane.
func (b *pullBed) waiting(t *testing.T, n int) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, func() bool { return b.info(t).NumWaiting == n },
		"the server holds %d pull requests (it holds %v)", n, natstest.Later(func() any { return b.info(t).NumWaiting }))
}

type taken struct {
	m   jetstream.Msg
	err error
}

func (b *pullBed) takeLater(ctx context.Context, o pullOpts) <-chan taken {
	ch := make(chan taken, 1)
	go func() {
		m, err := b.pulls.take(ctx, b.cons, o)
		ch <- taken{m, err}
	}()
	return ch
}

// TestPullTakesOneTask: a pull takes a waiting task, with its metadata
// read from its ack subject; the task's acknowledgement removes it from
// the work queue, once; with none waiting, a pull that does not wait
// gets nothing at once.
func TestPullTakesOneTask(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	b.publish(t, "one")
	// A look finds only what the consumer has counted (after the publish's
	// acknowledgement, on a loaded machine).
	natstest.Eventually(t, 30*time.Second, func() bool { return b.info(t).NumPending == 1 }, "the consumer counts the task")
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.NotNil(t, m)
	require.Equal(t, "one", string(m.Data()))
	require.Equal(t, "pulls.task", m.Subject())
	md, err := m.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(1), md.Sequence.Stream)
	require.Equal(t, uint64(1), md.NumDelivered)
	require.Equal(t, "PULLS", md.Stream)
	require.Equal(t, "lane", md.Consumer)
	require.False(t, md.Timestamp.IsZero())

	require.NoError(t, m.InProgress())
	require.NoError(t, m.Ack())
	require.ErrorIs(t, m.Ack(), jetstream.ErrMsgAlreadyAckd)
	require.ErrorIs(t, m.Nak(), jetstream.ErrMsgAlreadyAckd)
	require.ErrorIs(t, m.InProgress(), jetstream.ErrMsgAlreadyAckd)
	natstest.Eventually(t, 30*time.Second, func() bool {
		si, err := b.js.Stream(t.Context(), "PULLS")
		return err == nil && si.CachedInfo().State.Msgs == 0
	}, "the acknowledged task leaves the work queue")

	m, err = b.pulls.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.Nil(t, m, "no task waits")
}

// TestPullWaitsForATask: a pull that waits gets the task published while
// it waits; one that expires gets nothing.
func TestPullWaitsForATask(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	got := b.takeLater(t.Context(), pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	b.waiting(t, 1)
	b.publish(t, "later")
	r := <-got
	require.NoError(t, r.err)
	require.NotNil(t, r.m)
	require.Equal(t, "later", string(r.m.Data()))
	require.NoError(t, r.m.DoubleAck(t.Context()))

	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{expires: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Nil(t, m, "the request expired with no task")
}

// TestPullGivenUp: a request its worker gave up (its context ended) gets
// no task: the server passes it over, and the worker's next pull takes
// the task, delivered once; the end of a request given up does not end
// the next one. A pull asked when the context has already ended asks
// the server for nothing.
func TestPullGivenUp(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	ctx, cancel := context.WithCancel(t.Context())
	got := b.takeLater(ctx, pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	b.waiting(t, 1)
	cancel()
	r := <-got
	require.NoError(t, r.err)
	require.Nil(t, r.m)

	b.publish(t, "after the request given up")
	// Its expiry beyond the wait below: a request left live would show.
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{expires: time.Minute, heartbeat: time.Second})
	require.NoError(t, err)
	require.NotNil(t, m)
	md, err := m.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(1), md.NumDelivered, "the request given up got nothing")
	require.NoError(t, m.Term())
	natstest.Eventually(t, 30*time.Second, func() bool { return b.info(t).NumWaiting == 0 },
		"no request of the worker's is left with the server (it holds %v)", natstest.Later(func() any { return b.info(t).NumWaiting }))

	// A request given up whose expiry comes while the next one waits.
	ctx, cancel = context.WithCancel(t.Context())
	got = b.takeLater(ctx, pullOpts{expires: 300 * time.Millisecond})
	b.waiting(t, 1)
	cancel()
	require.Nil(t, (<-got).m)
	gaveUp := time.Now()
	got = b.takeLater(t.Context(), pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	natstest.Eventually(t, 30*time.Second, func() bool { return time.Since(gaveUp) > time.Second && b.info(t).NumWaiting == 1 },
		"the request given up expired, and the next one waits")
	b.publish(t, "for the next request")
	r = <-got
	require.NoError(t, r.err)
	require.NotNil(t, r.m, "the expiry of the request given up did not end the next one")
	require.Equal(t, "for the next request", string(r.m.Data()))
	require.NoError(t, r.m.Ack())

	asked := b.pulls.n
	m, err = b.pulls.take(ctx, b.cons, pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	require.NoError(t, err)
	require.Nil(t, m)
	require.Equal(t, asked, b.pulls.n, "no request made with the context ended")
}

// TestPullCloseLeavesTheTask: a task that came for the worker's request
// after its last look, when it stops, is not handed back (it may be older
// than its ack wait, and run elsewhere already: handed back, it would run
// again): it is delivered again once its ack wait passed. The
// subscription ends.
func TestPullCloseLeavesTheTask(t *testing.T) {
	t.Parallel()
	b := newPullBedAckWait(t, 5*time.Second)
	p, err := newPulls(b.nc, apiPrefix(b.js.Options()))
	require.NoError(t, err)
	b.publish(t, "in hand at the stop")
	// A request as take makes it, whose task nobody takes from the channel
	// (one that waits: a request that does not could end with "no task"
	// if the consumer has not counted the task yet, on a loaded machine).
	require.NoError(t, b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.PULLS.lane", p.inbox+".1", []byte(`{"batch":1,"expires":30000000000}`)))
	natstest.Eventually(t, 30*time.Second, func() bool { return len(p.ch) > 0 }, "the task comes on the subscription")
	sub := p.sub
	p.close()
	require.False(t, sub.IsValid(), "the subscription ended")
	require.Equal(t, 0, len(p.ch))
	time.Sleep(time.Second) // time for a hand-back to take effect: none should
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.Nil(t, m, "not handed back: it waits for its ack wait")
	m, err = b.pulls.take(t.Context(), b.cons, pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	require.NoError(t, err)
	require.NotNil(t, m)
	md, err := m.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(2), md.NumDelivered, "delivered again after its ack wait")
	require.Equal(t, uint64(1), md.Sequence.Stream)
	require.Equal(t, uint64(2), md.Sequence.Consumer)
	require.NoError(t, m.Ack())
}

// TestPullNothingBetweenPulls: a task that came on the worker's
// subscription while no pull of its was waiting (none should) is not
// taken as the next pull's answer: its age is not known.
func TestPullNothingBetweenPulls(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	b.publish(t, "stray")
	// A request that waits: its only answer is the task.
	require.NoError(t, b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.PULLS.lane", b.pulls.inbox+".7", []byte(`{"batch":1,"expires":30000000000}`)))
	natstest.Eventually(t, 30*time.Second, func() bool { return len(b.pulls.ch) > 0 }, "the task comes on the subscription")
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.Nil(t, m, "the stray task is left to its ack wait")
}

// TestPullErrorEndsTheRequest: after the server's error (on a cluster, a
// new leader's "leadership change"), a task the old leader still gives the
// request reaches nobody: the worker's next pull takes it, delivered
// once, and leaves no request with the server. The API here answers
// "leadership change" and hands the request on to the consumer later, as
// an old leader whose last delivery comes after the new one's error.
func TestPullErrorEndsTheRequest(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	requests := make(chan *nats.Msg, 1)
	sub, err := b.nc.Subscribe("relay.API.CONSUMER.MSG.NEXT.>", func(m *nats.Msg) {
		conflict := nats.NewMsg(m.Reply)
		conflict.Header.Set("Status", statusConflict)
		conflict.Header.Set("Description", "Leadership Change")
		_ = b.nc.PublishMsg(conflict)
		requests <- m
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	p, err := newPulls(b.nc, "relay.API.")
	require.NoError(t, err)
	defer p.close()
	b.publish(t, "after the leader moved")
	m, err := p.take(t.Context(), b.cons, pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	require.Nil(t, m)
	require.ErrorIs(t, err, jetstream.ErrConsumerLeadershipChanged)

	req := <-requests
	require.NoError(t, b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.PULLS.lane", req.Reply, req.Data))
	p.api = "$JS.API."
	// Its expiry beyond the wait below: a request left live would show.
	m, err = p.take(t.Context(), b.cons, pullOpts{expires: time.Minute, heartbeat: time.Second})
	require.NoError(t, err)
	require.NotNil(t, m)
	md, err := m.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(1), md.NumDelivered)
	require.NoError(t, m.Ack())
	natstest.Eventually(t, 30*time.Second, func() bool { return b.info(t).NumWaiting == 0 },
		"no request of the worker's is left with the server (it holds %v)", natstest.Later(func() any { return b.info(t).NumWaiting }))
}

// TestPullOthersStatusesDropped: a status about another request (on a
// cluster, an old leader's) does not end the one the worker waits on.
func TestPullOthersStatusesDropped(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	inbox := b.pulls.inbox
	got := b.takeLater(t.Context(), pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	b.waiting(t, 1)
	expired := nats.NewMsg(inbox + ".0") // requests are numbered from 1
	expired.Header.Set("Status", statusExpired)
	expired.Header.Set("Description", "Request Timeout")
	require.NoError(t, b.nc.PublishMsg(expired))
	require.NoError(t, b.nc.Flush())
	b.publish(t, "for the request waiting")
	r := <-got
	require.NoError(t, r.err)
	require.NotNil(t, r.m, "the other request's end did not end this one")
	require.NoError(t, r.m.Ack())
}

// TestPullIdleWithHeartbeats: a pull with heartbeats on an idle lane lasts
// until its expiry, and ends with nothing, not an error.
func TestPullIdleWithHeartbeats(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	began := time.Now()
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{expires: 4 * time.Second, heartbeat: time.Second})
	require.NoError(t, err, "the server's heartbeats kept the pull")
	require.Nil(t, m)
	require.GreaterOrEqual(t, time.Since(began), 4*time.Second, "it lasted until its expiry")
	require.True(t, b.pulls.sub != nil, "ended by the server's expiry, not given up: the subscription stays")
}

// TestPullHandBackWithDelay: a task handed back with a delay is not
// delivered again before it; the metadata of a delivery names the
// stream's and the consumer's sequences and the tasks pending.
func TestPullHandBackWithDelay(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	for i := range 3 {
		b.publish(t, strconv.Itoa(i))
	}
	natstest.Eventually(t, 30*time.Second, func() bool { return b.info(t).NumPending == 3 }, "the consumer counts the three tasks")
	m, err := b.pulls.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.NotNil(t, m)
	md, err := m.Metadata()
	require.NoError(t, err)
	require.Equal(t, uint64(2), md.NumPending, "two more wait")
	require.NoError(t, m.NakWithDelay(time.Minute))
	require.ErrorIs(t, m.Ack(), jetstream.ErrMsgAlreadyAckd)

	for want := 2; want <= 3; want++ {
		m, err = b.pulls.take(t.Context(), b.cons, pullOpts{expires: 2 * time.Second})
		require.NoError(t, err)
		require.NotNil(t, m)
		md, err = m.Metadata()
		require.NoError(t, err)
		require.Equal(t, uint64(want), md.Sequence.Stream, "the next task, not the one handed back for a minute")
		require.Equal(t, uint64(want), md.Sequence.Consumer)
		require.NoError(t, m.DoubleAck(t.Context()))
		require.ErrorIs(t, m.Ack(), jetstream.ErrMsgAlreadyAckd)
	}
	m, err = b.pulls.take(t.Context(), b.cons, pullOpts{expires: 2 * time.Second})
	require.NoError(t, err)
	require.Nil(t, m, "the task handed back waits for its delay")
}

// TestPullConsumerDeleted: a pull waiting on a consumer that is deleted
// says so (on which lanes.go binds it again:
// TestAQueueConsumerDeletedUnderTheAgentIsMadeAgain).
func TestPullConsumerDeleted(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	got := b.takeLater(t.Context(), pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	b.waiting(t, 1)
	require.NoError(t, b.js.DeleteConsumer(t.Context(), "PULLS", "lane"))
	r := <-got
	require.Nil(t, r.m)
	require.ErrorIs(t, r.err, jetstream.ErrConsumerDeleted)
}

// TestPullMissedHeartbeats: a pull whose server stops answering (its
// consumer's leader moved) is given up within two missed heartbeats. The
// JetStream API here is a responder that answers one heartbeat and then
// nothing, as a leader that went away.
func TestPullMissedHeartbeats(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	sub, err := b.nc.Subscribe("silent.API.CONSUMER.MSG.NEXT.>", func(m *nats.Msg) {
		hb := nats.NewMsg(m.Reply)
		hb.Header.Set("Status", statusHeartbeat)
		hb.Header.Set("Description", "Idle Heartbeat")
		_ = b.nc.PublishMsg(hb)
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	p, err := newPulls(b.nc, "silent.API.")
	require.NoError(t, err)
	defer p.close()
	began := time.Now()
	m, err := p.take(t.Context(), b.cons, pullOpts{expires: 30 * time.Second, heartbeat: 500 * time.Millisecond})
	require.Nil(t, m)
	require.ErrorIs(t, err, jetstream.ErrNoHeartbeat)
	// Three heartbeats at most (1.5 s), with room for a loaded machine.
	require.Less(t, time.Since(began), 3*time.Second, "given up within three missed heartbeats")
	require.True(t, p.sub == nil, "the request given up, its subscription ended")

	// A look that gets no answer at all is given up within a second.
	began = time.Now()
	m, err = p.take(t.Context(), b.cons, pullOpts{noWait: true})
	require.NoError(t, err)
	require.Nil(t, m)
	require.Less(t, time.Since(began), 4*time.Second, "a look holds the other lane up for a second, not the long poll's time")
	require.True(t, p.sub == nil)
}

// TestPullStatuses: what the status ending a request means to a worker.
func TestPullStatuses(t *testing.T) {
	t.Parallel()
	status := func(code, desc string) *nats.Msg {
		m := nats.NewMsg("x")
		m.Header.Set("Status", code)
		m.Header.Set("Description", desc)
		return m
	}
	require.NoError(t, statusErr(status("404", "No Messages")))
	require.NoError(t, statusErr(status("408", "Request Timeout")))
	require.ErrorIs(t, statusErr(status("503", "")), nats.ErrNoResponders)
	require.ErrorIs(t, statusErr(status("409", "Consumer Deleted")), jetstream.ErrConsumerDeleted)
	require.ErrorIs(t, statusErr(status("409", "Leadership Change")), jetstream.ErrConsumerLeadershipChanged)
	err := statusErr(status("409", "Exceeded MaxWaiting"))
	require.ErrorContains(t, err, "Exceeded MaxWaiting")
	require.ErrorContains(t, statusErr(status("400", "Bad Request")), "400 Bad Request")
	require.False(t, errors.Is(err, jetstream.ErrConsumerDeleted))

	require.Equal(t, "$JS.API.", apiPrefix(jetstream.JetStreamOptions{}))
	require.Equal(t, "$JS.hub.API.", apiPrefix(jetstream.JetStreamOptions{Domain: "hub"}))
	require.Equal(t, "other.API.", apiPrefix(jetstream.JetStreamOptions{APIPrefix: "other.API"}))
}

// TestPullsShareNoAnswers: two workers' pulls on one lane each get their
// own task.
func TestPullsShareNoAnswers(t *testing.T) {
	t.Parallel()
	b := newPullBed(t)
	other, err := newPulls(b.nc, apiPrefix(b.js.Options()))
	require.NoError(t, err)
	defer other.close()
	first := b.takeLater(t.Context(), pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
	second := make(chan taken, 1)
	go func() {
		m, err := other.take(t.Context(), b.cons, pullOpts{expires: 30 * time.Second, heartbeat: time.Second})
		second <- taken{m, err}
	}()
	b.waiting(t, 2)
	for i := range 2 {
		b.publish(t, strconv.Itoa(i))
	}
	seen := map[string]bool{}
	for _, ch := range []<-chan taken{first, second} {
		r := <-ch
		require.NoError(t, r.err)
		require.NotNil(t, r.m)
		seen[string(r.m.Data())] = true
		require.NoError(t, r.m.Ack())
	}
	require.Len(t, seen, 2)
}

// TestTaskWithoutReplyIsNotAnswered: a task that came with no subject to
// answer on (not a consumer's delivery) tells the server nothing: each
// answer says so rather than publishing nowhere.
func TestTaskWithoutReplyIsNotAnswered(t *testing.T) {
	t.Parallel()
	m := &taskMsg{m: &nats.Msg{Subject: "jf.tasks.default", Data: []byte("{}")}} // no connection: nothing may be sent
	require.ErrorIs(t, m.Ack(), jetstream.ErrMsgNoReply)
	require.ErrorIs(t, m.NakWithDelay(time.Second), jetstream.ErrMsgNoReply)
	require.ErrorIs(t, m.InProgress(), jetstream.ErrMsgNoReply)
	require.ErrorIs(t, m.DoubleAck(t.Context()), jetstream.ErrMsgNoReply)
	require.False(t, m.done.Load(), "not settled")
}
