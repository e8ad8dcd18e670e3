package svc_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/svc"
)

// TestDrainWaitsForHandlers: Drain returns only once the handler holding
// a message has finished and the connection is closed, with what the
// handler published on its way out flushed. (nats.Conn.Drain alone
// returns at once: the handler would see it return.)
func TestDrainWaitsForHandlers(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	obs, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer obs.Close()
	handled, err := obs.SubscribeSync("handled")
	require.NoError(t, err)
	require.NoError(t, obs.Flush())

	started, returned, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var early atomic.Bool
	_, err = nc.Subscribe("work", func(m *nats.Msg) {
		defer close(finished)
		close(started)
		select {
		case <-returned: // Drain returned while this handler still ran
			early.Store(true)
		case <-time.After(500 * time.Millisecond):
		}
		_ = nc.Publish("handled", m.Data)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	require.NoError(t, obs.Publish("work", []byte("job-1")))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never got the message")
	}

	require.NoError(t, svc.Drain(nc, 30*time.Second))
	closed := nc.IsClosed()
	close(returned)
	select { // at once, unless Drain returned too early
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never finished")
	}
	require.False(t, early.Load(), "Drain returned while a handler still held its message")
	require.True(t, closed, "Drain returned before the connection was closed")
	m, err := handled.NextMsg(10 * time.Second)
	require.NoError(t, err, "what the handler published as it finished was lost")
	require.Equal(t, "job-1", string(m.Data))
}

// TestDrainTimesOut: a handler that never finishes does not hold Drain
// past its timeout; the connection is closed anyway and the error says so.
func TestDrainTimesOut(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	_, err = nc.Subscribe("work", func(*nats.Msg) { close(started); <-release })
	require.NoError(t, err)
	require.NoError(t, nc.Publish("work", nil))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never got the message")
	}

	err = svc.Drain(nc, 200*time.Millisecond)
	require.ErrorContains(t, err, "not done after 200ms")
	require.True(t, nc.IsClosed())
}

// TestDrainClosedAndHandlers: a closed connection drains at once, and a
// closed handler the connection had still runs.
func TestDrainClosedAndHandlers(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	var called atomic.Int32
	nc, err := nats.Connect(srv.ClientURL(), nats.ClosedHandler(func(*nats.Conn) { called.Add(1) }))
	require.NoError(t, err)
	require.NoError(t, svc.Drain(nc, 10*time.Second))
	natstest.Eventually(t, 10*time.Second, func() bool { return called.Load() == 1 }, "the connection's own closed handler ran")
	require.NoError(t, svc.Drain(nc, 10*time.Second), "drain a closed connection")
}
