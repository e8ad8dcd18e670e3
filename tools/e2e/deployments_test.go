package e2e

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
)

// TestClusterDeploymentIsSecure runs deployments/cluster/setup.sh and
// loads each node's configuration as nats-server would: TLS on client and
// route connections, jetflow's operator trusted. A node started from it
// (alone, on a free port) refuses anonymous and plain-text connections,
// takes the bootstrap as admin and lets the client identity start work
// only as its permissions say.
func TestClusterDeploymentIsSecure(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is needed (the CI installs it): ", err)
	}
	bin := buildJetflow(t)
	root := t.TempDir()
	dir := filepath.Join(root, "deployments", "cluster")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, f := range []string{"setup.sh", "n1.conf", "n2.conf", "n3.conf"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deployments", "cluster", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o755))
	}
	cmd := exec.Command(filepath.Join(dir, "setup.sh"))
	cmd.Env = append(os.Environ(), "JETFLOW="+bin)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Chdir(root) // the configurations name files relative to the repository root

	for _, n := range []string{"n1", "n2", "n3"} {
		opts, err := natsserver.LoadConfig(filepath.Join("deployments", "cluster", n+".conf"))
		require.NoError(t, err, n)
		require.NotNil(t, opts.TLSConfig, "%s: client connections are TLS", n)
		require.NotNil(t, opts.Cluster.TLSConfig, "%s: routes are TLS", n)
		require.Equal(t, tls.RequireAndVerifyClientCert, opts.Cluster.TLSConfig.ClientAuth, "%s: routes verify their peer", n)
		require.Len(t, opts.TrustedOperators, 1, "%s: jetflow's operator is trusted", n)
		require.Equal(t, 3, len(opts.Routes), n)
	}

	opts, err := natsserver.LoadConfig(filepath.Join("deployments", "cluster", "n1.conf"))
	require.NoError(t, err)
	opts.Port, opts.HTTPPort, opts.StoreDir = -1, 0, t.TempDir()
	opts.Cluster.Port, opts.Cluster.Name, opts.Routes = 0, "", nil
	srv, err := natsserver.StartOptions(opts)
	require.NoError(t, err)
	t.Cleanup(func() { natsserver.Stop(srv) })
	url := srv.ClientURL()
	secrets := filepath.Join(dir, "secrets")
	ca := nats.RootCAs(filepath.Join(secrets, "tls", "ca.pem"))
	creds := func(role auth.Role) []nats.Option {
		o, err := auth.ConnectOptions(filepath.Join(secrets, "auth", auth.DefaultNamespace, auth.CredsFile(role)))
		require.NoError(t, err)
		return append(o, ca)
	}

	_, err = nats.Connect(url, ca)
	require.Error(t, err, "an anonymous connection was accepted")
	_, err = nats.Connect(url, append(creds(auth.RoleAdmin)[:2:2], nats.Secure(nil))...)
	require.Error(t, err, "a connection that does not trust the CA was accepted")

	admin, err := nats.Connect(url, creds(auth.RoleAdmin)...)
	require.NoError(t, err)
	defer admin.Close()
	ajs, err := jetstream.New(admin)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, bus.Bootstrap(ctx, ajs, bus.Config{}, bus.Durables{}))

	violations := make(chan error, 4)
	client, err := nats.Connect(url, append(creds(auth.RoleClient), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		violations <- err
	}))...)
	require.NoError(t, err)
	defer client.Close()
	cjs, err := jetstream.New(client)
	require.NoError(t, err)
	_, err = cjs.Publish(ctx, "jf.commands.start", []byte(`{}`))
	require.NoError(t, err, "the client role publishes commands")
	require.NoError(t, client.Publish("jf.events.x.y", []byte("forged")))
	require.NoError(t, client.Flush())
	require.ErrorIs(t, <-violations, nats.ErrPermissionViolation)
}
