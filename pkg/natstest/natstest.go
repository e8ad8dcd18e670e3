// Package natstest starts real embedded JetStream servers for tests: one
// server per test with its file store in the test's temp dir, or a 3-node
// cluster on loopback ports. It never mocks NATS.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
)

// RunJetStream starts a single JetStream server listening on a free
// loopback port; it is shut down when the test ends.
func RunJetStream(t testing.TB) *server.Server {
	t.Helper()
	return RunJetStreamIn(t, t.TempDir())
}

// RunJetStreamIn is RunJetStream with a given store directory (to restart
// a server on the same data).
func RunJetStreamIn(t testing.TB, dir string) *server.Server {
	t.Helper()
	s, err := natsserver.Start(natsserver.Config{StoreDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { natsserver.Stop(s) })
	return s
}

// Connect returns a connection and JetStream context to s, with jetflow's
// topology created; both are closed when the test ends.
func Connect(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js := dial(t, s)
	ensure(t, js, bus.Config{}, 10*time.Second)
	return nc, js
}

// dial connects to s, closed when the test ends.
func dial(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	// The services' buffer for synchronous subscriptions (bus.Connect):
	// tests read histories with what production reads them with.
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.SyncQueueLen(bus.SyncQueueLen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// ensure creates jetflow's topology as c says, within d.
func ensure(t testing.TB, js jetstream.JetStream, c bus.Config, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := bus.Ensure(ctx, js, c); err != nil {
		t.Fatal(err)
	}
}

// ConnectCluster connects to each of servers (a cluster of RunCluster)
// and ensures jetflow's topology with 3 replicas; the connections are
// closed when the test ends.
func ConnectCluster(t testing.TB, servers []*server.Server) []jetstream.JetStream {
	t.Helper()
	var jss []jetstream.JetStream
	for _, s := range servers {
		_, js := dial(t, s)
		jss = append(jss, js)
	}
	ensure(t, jss[0], bus.Config{Replicas: 3}, time.Minute)
	return jss
}

// RunCluster starts a 3-node JetStream cluster on loopback ports and waits
// for a meta leader.
func RunCluster(t testing.TB) []*server.Server {
	t.Helper()
	var servers []*server.Server
	for attempt := 1; ; attempt++ {
		var err error
		if servers, err = startCluster(t); err == nil {
			break
		}
		// The cluster ports are picked free, then bound by the servers:
		// another test may take one in between. Pick new ones.
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("start cluster (attempt %d): %v; again with new ports", attempt, err)
	}
	for _, s := range servers {
		t.Cleanup(func() { natsserver.Stop(s) })
	}
	// A meta leader alone is not enough: until it counts every server as
	// a current peer, creating a replicated stream can fail with "no
	// suitable peers for placement".
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if Formed(servers) {
			return servers
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("cluster has no JetStream meta leader with every server a current peer")
	return nil
}

// Formed reports whether a server of the cluster is the JetStream meta
// leader and sees every other server as a current peer (what RunCluster
// waits for; a test that starts its own nodes can wait for it too).
func Formed(servers []*server.Server) bool {
	for _, s := range servers {
		if !s.JetStreamIsLeader() {
			continue
		}
		info, err := s.Jsz(nil)
		if err != nil || info.Meta == nil {
			return false
		}
		current := 0
		for _, p := range info.Meta.Replicas {
			if p.Current && !p.Offline {
				current++
			}
		}
		return current == len(servers)-1
	}
	return false
}

// startCluster starts three servers routed to each other on free cluster
// ports; on an error it stops those it started.
func startCluster(t testing.TB) ([]*server.Server, error) {
	ports := make([]int, 3)
	for i := range ports {
		ports[i] = freePort(t)
	}
	routes := fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", ports[0], ports[1], ports[2])
	servers := make([]*server.Server, 0, 3)
	for i := range 3 {
		s, err := natsserver.Start(natsserver.Config{StoreDir: t.TempDir(), Port: -1, Name: fmt.Sprintf("n%d", i+1),
			ClusterName: "jf", ClusterPort: ports[i], Routes: []string{routes}})
		if err != nil {
			for _, started := range servers {
				natsserver.Stop(started)
			}
			return nil, err
		}
		servers = append(servers, s)
	}
	return servers, nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Eventually polls cond every 10ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("condition not met within %s: "+format, append([]any{timeout}, args...)...)
}

// Later formats as f's result when printed: an argument of Eventually's
// message that reads what the last try of cond saw (the args are
// evaluated when Eventually is called, before any try).
type Later func() any

func (l Later) String() string { return fmt.Sprint(l()) }

// Serve runs fn (a service's Run) in a goroutine until the test ends; then
// it cancels fn's context, waits for it to return, and fails the test if
// it returned an error or did not stop within 30 s.
func Serve(t testing.TB, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("service stopped with an error: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("service did not stop within 30s")
		}
	})
}

// CaughtUp reports whether the consumer ci describes has handled every
// message stored for it in its stream: nothing pending, nothing
// unacknowledged, and no message matching its filters stored past its
// acknowledgement floor; if not, what is left. The last check is what
// makes it true only after the consumer saw the messages: a stream
// acknowledges a publish before it tells its consumers of the message (a
// queue another goroutine of the server empties), so right after a
// publish a consumer can show nothing pending, nothing unacknowledged,
// and not know of the message yet. The last message is asked of the
// stream's leader: a replica behind it would say there is none.
func CaughtUp(ctx context.Context, js jetstream.JetStream, ci *jetstream.ConsumerInfo) (bool, string, error) {
	if ci.NumPending > 0 || ci.NumAckPending > 0 {
		return false, fmt.Sprintf("%s: %d pending, %d unacknowledged", ci.Name, ci.NumPending, ci.NumAckPending), nil
	}
	filters := slices.Clone(ci.Config.FilterSubjects)
	if ci.Config.FilterSubject != "" {
		filters = append(filters, ci.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	for _, f := range filters {
		last, err := bus.LeaderGet(ctx, js, ci.Stream, bus.MsgQuery{LastBySubject: f})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, "", fmt.Errorf("last message on %s: %w", f, err)
		}
		if last.Sequence > ci.AckFloor.Stream {
			return false, fmt.Sprintf("%s: message %d on %s stored, acknowledged up to %d", ci.Name, last.Sequence, f, ci.AckFloor.Stream), nil
		}
	}
	return true, "", nil
}

// ChangeStream changes stream's configuration with change, as an older
// release's bootstrap or an operator would.
func ChangeStream(t testing.TB, js jetstream.JetStream, stream string, change func(*jetstream.StreamConfig)) {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	change(&cfg)
	if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}
