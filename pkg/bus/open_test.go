package bus_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
)

// TestOpenSaysWhyItWaits: while no server answers, Open tells OnRetry the
// address and the dialer's error (not a bare timeout of the topology
// request), and it stops when ctx ends.
func TestOpenSaysWhyItWaits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var mu sync.Mutex
	var why []string
	_, _, err := bus.Open(ctx, "nats://127.0.0.1:1", "test", bus.Config{OnRetry: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		why = append(why, err.Error())
	}})
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, why, "OnRetry is told while Open waits")
	require.Contains(t, why[len(why)-1], "not connected to nats at nats://127.0.0.1:1 yet")
	require.Contains(t, why[len(why)-1], "connection refused", "the reason")
	require.LessOrEqual(t, len(why), 2, "said once (and again after 5 s), not at every try: %v", why)
}

// TestOpenStopsWhenRefused: a server that refuses the credentials (here:
// none given) makes Open fail with the server's reason, instead of waiting
// for ever on a connection the client has closed.
func TestOpenStopsWhenRefused(t *testing.T) {
	t.Parallel()
	s, err := natsserver.StartOptions(&server.Options{Host: "127.0.0.1", Port: -1, Username: "u", Password: "p",
		JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	t.Cleanup(func() { natsserver.Stop(s) })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, _, err = bus.Open(ctx, s.ClientURL(), "test", bus.Config{})
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "it gave up on its own, not at the deadline")
	require.Contains(t, err.Error(), "uthorization", "the server's reason: %v", err)
}

// TestMissingNamesWhatIsGone: Missing names the deleted stream and bucket,
// and looks only where it is allowed to.
func TestMissingNamesWhatIsGone(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	missing, err := bus.Missing(ctx, js, bus.Config{}, nil)
	require.NoError(t, err)
	require.Empty(t, missing)
	require.NoError(t, js.DeleteStream(ctx, bus.StreamRejections))
	require.NoError(t, js.DeleteKeyValue(ctx, bus.BucketLocks))
	missing, err = bus.Missing(ctx, js, bus.Config{}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"bucket " + bus.BucketLocks, "stream " + bus.StreamRejections}, missing)
	missing, err = bus.Missing(ctx, js, bus.Config{}, func(stream string) bool { return stream != bus.StreamRejections })
	require.NoError(t, err)
	require.Equal(t, []string{"bucket " + bus.BucketLocks}, missing, "a stream it may not look up is not looked at")
}

// TestRequestTimeoutBoundsAnUnansweredRequest: a request that is never
// answered (as one in flight when its server died) waits RequestTimeout,
// not nats.go's 5 s, and fails as a transient error its caller retries.
func TestRequestTimeoutBoundsAnUnansweredRequest(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	// A subscriber that takes the publish and never answers it.
	hole, _ := natstest.Connect(t, s)
	_, err := hole.SubscribeSync("jf.blackhole")
	require.NoError(t, err)
	require.NoError(t, hole.Flush())

	nc, js, err := bus.Open(t.Context(), s.ClientURL(), "test", bus.Config{Restricted: true, RequestTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	began := time.Now()
	_, err = js.Publish(context.Background(), "jf.blackhole", []byte("x"))
	took := time.Since(began)
	require.Error(t, err)
	require.True(t, bus.Transient(err), "a timeout is retried by its caller: %v", err)
	require.GreaterOrEqual(t, took, 300*time.Millisecond)
	require.Less(t, took, 3*time.Second, "bounded by RequestTimeout, not the client's 5 s default")
}

// TestReplicasOnAServerInNoClusterSayWhatToDo: asked for three replicas,
// a server in no cluster refuses at once, and the error says to give one.
func TestReplicasOnAServerInNoClusterSayWhatToDo(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	began := time.Now()
	err := bus.Bootstrap(t.Context(), js, bus.Config{Replicas: 3}, bus.Durables{})
	require.ErrorContains(t, err, "replicas > 1 not supported")
	require.ErrorContains(t, err, "this NATS server is not in a cluster")
	require.ErrorContains(t, err, "give replicas 1")
	require.Less(t, time.Since(began), 10*time.Second, "refused at once, not waited for")
}
