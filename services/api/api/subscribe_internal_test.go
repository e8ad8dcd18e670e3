package api

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
)

// TestSubscribeIntoKeepsTheFirstMessagesQuietly: a request's channel
// that fills (a busy execution appending while the request waits for
// its answer) keeps the first messages, in order, and the others are
// dropped without the client's slow-consumer error, which a channel
// subscription reported (and the api logged) for what is no fault.
func TestSubscribeIntoKeepsTheFirstMessagesQuietly(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	var asyncErrs atomic.Int32
	nc, err := nats.Connect(srv.ClientURL(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) { asyncErrs.Add(1) }))
	require.NoError(t, err)
	defer nc.Close()
	pub, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer pub.Close()

	ch := make(chan *nats.Msg, 16)
	sub, err := subscribeInto(nc, "jf.events.wf.busy", ch)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, nc.Flush())
	const n = 5000
	for i := range n {
		require.NoError(t, pub.Publish("jf.events.wf.busy", []byte(strconv.Itoa(i))))
	}
	require.NoError(t, pub.Flush())
	require.NoError(t, nc.Flush()) // the messages published before it have reached nc
	require.Eventually(t, func() bool {
		delivered, err := sub.Delivered()
		return err == nil && delivered == n
	}, 30*time.Second, 10*time.Millisecond, "every message handed to the handler")
	require.Len(t, ch, cap(ch))
	for i := range cap(ch) {
		require.Equal(t, strconv.Itoa(i), string((<-ch).Data), "the first messages, in order")
	}
	require.Zero(t, asyncErrs.Load(), "no slow-consumer error")
	dropped, err := sub.Dropped()
	require.NoError(t, err)
	require.Zero(t, dropped, "the client dropped none")
}
