package bus_test

import (
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
	nc, err := nats.Connect(s.ClientURL(), nats.Name("jetflow-dispatcher"), nats.UserInfo("svc", "secret"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	other, js, err := bus.Beside(nc, "rescue")
	require.NoError(t, err)
	require.Equal(t, "jetflow-dispatcher-rescue", other.Opts.Name)
	_, err = js.AccountInfo(t.Context())
	require.NoError(t, err, "its JetStream context answers")
	cz, err := s.Connz(&server.ConnzOptions{})
	require.NoError(t, err)
	var names []string
	for _, c := range cz.Conns {
		names = append(names, c.Name)
	}
	require.ElementsMatch(t, []string{"jetflow-dispatcher", "jetflow-dispatcher-rescue"}, names)

	other.Close()
	require.True(t, nc.IsConnected(), "closing it leaves the first connection alone")
}
