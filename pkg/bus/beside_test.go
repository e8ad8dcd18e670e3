package bus_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

// A connection beside another is made with its options, its identity
// among them (the server here refuses a client without its password),
// under its name and the suffix, and closes on its own.
func TestBesideConnectsAsTheConnectionDoes(t *testing.T) {
	t.Parallel()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Username: "svc", Password: "secret", NoLog: true, NoSigs: true})
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(10*time.Second))

	_, err = nats.Connect(s.ClientURL(), nats.Name("nobody"))
	require.Error(t, err, "the server must refuse a client without credentials")
	var closed atomic.Int32 // the first connection's handler: its own, not the second's
	nc, err := nats.Connect(s.ClientURL(), nats.Name("jetflow-dispatcher"), nats.UserInfo("svc", "secret"),
		nats.ClosedHandler(func(*nats.Conn) { closed.Add(1) }))
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	vz, err := s.Varz(nil)
	require.NoError(t, err)
	dialed := vz.TotalConnections
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	_, _, err = bus.Beside(cancelled, nc, "rescue")
	require.ErrorIs(t, err, context.Canceled)

	other, js, err := bus.Beside(t.Context(), nc, "rescue")
	require.NoError(t, err)
	vz, err = s.Varz(nil)
	require.NoError(t, err)
	require.Equal(t, dialed+1, vz.TotalConnections, "the cancelled call dialed nothing")
	require.Equal(t, "jetflow-dispatcher-rescue", other.Opts.Name)
	_, err = js.AccountInfo(t.Context())
	require.NoError(t, err, "its JetStream context answers")
	// The server's list of open connections (one closed by a client may
	// stay listed a moment, on a busy machine, until the server has read
	// the close).
	var names []string
	require.Eventually(t, func() bool {
		cz, err := s.Connz(&server.ConnzOptions{})
		require.NoError(t, err)
		names = names[:0]
		for _, c := range cz.Conns {
			names = append(names, c.Name)
		}
		return len(names) == 2
	}, 10*time.Second, 10*time.Millisecond, "open connections: %v", names)
	require.ElementsMatch(t, []string{"jetflow-dispatcher", "jetflow-dispatcher-rescue"}, names)

	other.Close()
	require.True(t, nc.IsConnected(), "closing it leaves the first connection alone")
	require.Zero(t, closed.Load(), "the first connection's closed handler is not the second's")

	nc.Close()
	_, _, err = bus.Beside(t.Context(), nc, "rescue")
	require.ErrorIs(t, err, nats.ErrConnectionClosed, "none beside a closed connection")
}
