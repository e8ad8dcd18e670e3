package devstack

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

func run(t *testing.T, dir string) (Info, context.CancelFunc, <-chan error) {
	t.Helper()
	return runWith(t, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
}

// runWith runs a stack of cfg until the returned cancel, once it is ready.
func runWith(t *testing.T, cfg Config) (Info, context.CancelFunc, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, func(i Info) { ready <- i }) }()
	select {
	case info := <-ready:
		return info, cancel, done
	case err := <-done:
		cancel()
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("stack did not start")
	}
	return Info{}, cancel, done
}

// TestOneStackPerDataDirectory: two jetflow dev on one data directory
// would share one JetStream store; the second refuses, naming the
// directory and the first process. The PID file names the process that
// runs, for `kill $(cat DIR/jetflow.pid)`.
func TestOneStackPerDataDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, stop, done := run(t, dir)

	pid, err := os.ReadFile(filepath.Join(dir, PIDFile))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid()), strings.TrimSpace(string(pid)))
	conn, err := ReadConn(dir)
	require.NoError(t, err)
	require.Equal(t, info.APIURL, conn.API)
	require.Equal(t, info.NATSURL, conn.NATS)
	require.Equal(t, os.Getpid(), conn.PID)
	require.Equal(t, filepath.Join(dir, AuthDir, "default", "client.creds"), conn.ClientCreds)
	require.True(t, strings.HasPrefix(conn.ClientInbox, "_INBOX_"))

	// Refused before it listens anywhere: no metrics address announced.
	var logged bytes.Buffer
	err = Run(context.Background(), Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		MetricsAddr: "127.0.0.1:0", Log: zerolog.New(&logged)}, nil)
	require.True(t, errors.Is(err, ErrDataDirInUse), "%v", err)
	require.Contains(t, err.Error(), dir)
	require.Contains(t, err.Error(), "process "+strconv.Itoa(os.Getpid()))
	require.Empty(t, logged.String(), "refused before anything is logged")

	stop()
	require.NoError(t, <-done)
	for _, f := range []string{PIDFile, ConnFile} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.True(t, os.IsNotExist(err), "%s is left after a clean stop", f)
	}
}

// TestStalePIDFileIsTakenOver: a process killed with SIGKILL leaves its
// PID file, but not its lock; the next start takes the directory.
func TestStalePIDFileIsTakenOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, PIDFile), []byte("999999\n"), 0o644))
	_, stop, done := run(t, dir)
	pid, err := os.ReadFile(filepath.Join(dir, PIDFile))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid()), strings.TrimSpace(string(pid)))
	stop()
	require.NoError(t, <-done)
}

// TestMissingStreamIsMadeAgain: the development stack is its own
// bootstrap: a stream deleted by hand (here the rejections stream, whose
// absence used to make every rejected command retry for ever) is found
// missing and made again, and the api is ready again once it is back.
func TestMissingStreamIsMadeAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, cancel, done := runWith(t, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TopologyEvery: 100 * time.Millisecond,
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)})
	defer func() { cancel(); require.NoError(t, <-done) }()
	ctx := t.Context()

	conn, err := info.Dial(ctx, auth.RoleAdmin, "test")
	require.NoError(t, err)
	defer conn.NC.Close()
	require.NoError(t, conn.JS.DeleteStream(ctx, bus.StreamRejections))
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := conn.JS.Stream(ctx, bus.StreamRejections)
		return err == nil
	}, "the rejections stream is made again")
	_, err = conn.JS.Publish(ctx, bus.RejectionSubject("test-key"), []byte("{}"))
	require.NoError(t, err, "the stream made again takes rejections")
	natstest.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get(info.APIURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "the api is ready again")
}
