package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
)

// natsNode is one nats-server process with its configuration file and
// store directory, which survive its kills: it comes back on the same
// port with the same data.
type natsNode struct {
	*Process
	name       string
	port       int
	clusterURL string
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// startNATS writes the configuration of `nodes` nats-server processes (1:
// a standalone server; 3: a cluster) that trust the operator of trustConf
// (auth's server configuration), and starts them.
func startNATS(bin, dir, trustConf string, nodes int, log io.Writer) ([]*natsNode, error) {
	ports, err := freePorts(2 * nodes)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("nats directory: %w", err)
	}
	var routes []string
	for i := range nodes {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[nodes+i]))
	}
	var out []*natsNode
	for i := range nodes {
		name := fmt.Sprintf("n%d", i+1)
		var b strings.Builder
		fmt.Fprintf(&b, "server_name: %s\nlisten: \"127.0.0.1:%d\"\n", name, ports[i])
		fmt.Fprintf(&b, "jetstream { store_dir: %q }\n", filepath.Join(dir, name))
		if nodes > 1 {
			fmt.Fprintf(&b, "cluster { name: jf, listen: \"127.0.0.1:%d\", routes: [%s] }\n", ports[nodes+i], strings.Join(routes, ", "))
		}
		// Lame duck mode (the events-leader-ldm drill): leaderships
		// handed over, then the clients moved within lameDuckDuration.
		fmt.Fprintf(&b, "lame_duck_duration: %q\nlame_duck_grace_period: \"1s\"\n", lameDuckDuration)
		b.WriteString(trustConf)
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
			return nil, fmt.Errorf("nats configuration: %w", err)
		}
		n := &natsNode{name: name, port: ports[i], clusterURL: routes[i],
			Process: &Process{Name: "nats-" + name, Path: bin, Args: []string{"-c", conf}, Log: log}}
		if err := n.Start(); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// lameDuckDuration is how long a node in lame duck mode takes to move its
// clients before it stops (nats-server's least).
const lameDuckDuration = 30 * time.Second

// freePorts picks n loopback ports that are free now, below the range
// the system hands out for outgoing connections and for port 0: a server
// restarted after a SIGKILL must find its port again, and a port in that
// range could be taken meanwhile by any connection.
func freePorts(n int) ([]int, error) {
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, errors.New("chaos: no free port found between 20000 and 32000")
		}
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		dup := false
		for _, q := range ports {
			dup = dup || q == p
		}
		if !dup {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// connectAdmin connects to the servers as the admin identity of authDir,
// reconnecting forever (the servers are killed under it).
func connectAdmin(ctx context.Context, url, authDir, name string) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := auth.ConnectOptions(filepath.Join(authDir, auth.DefaultNamespace, auth.CredsFile(auth.RoleAdmin)))
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	var lastErr error
	for ctx.Err() == nil {
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			js, err := jetstream.New(nc)
			if err == nil {
				return nc, js, nil
			}
			nc.Close()
		}
		lastErr = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, nil, fmt.Errorf("connect to nats: %w (last: %w)", ctx.Err(), lastErr)
}

// waitJetStream waits until JetStream answers on js: the account's info
// and, for a replicated events stream, every replica current.
func waitJetStream(ctx context.Context, js jetstream.JetStream, replicas int, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last error
	for {
		last = jetStreamReady(ctx, js, replicas)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jetstream not ready within %s: %w", within, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func jetStreamReady(ctx context.Context, js jetstream.JetStream, replicas int) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(rctx); err != nil {
		return err
	}
	if replicas < 2 {
		return nil
	}
	s, err := js.Stream(rctx, bus.StreamEvents)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // not bootstrapped yet
	}
	if err != nil {
		return err
	}
	si, err := s.Info(rctx)
	if err != nil {
		return err
	}
	if si.Cluster == nil || si.Cluster.Leader == "" {
		return errors.New("events stream has no leader")
	}
	if len(si.Cluster.Replicas) < replicas-1 {
		return fmt.Errorf("events stream has %d replicas beside its leader", len(si.Cluster.Replicas))
	}
	for _, r := range si.Cluster.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("events stream replica %s is not current", r.Name)
		}
	}
	return nil
}

// streamLeader names the node leading stream ("" if unknown).
func streamLeader(ctx context.Context, js jetstream.JetStream, stream string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	si, err := s.Info(ctx)
	if err != nil || si.Cluster == nil {
		return ""
	}
	return si.Cluster.Leader
}
