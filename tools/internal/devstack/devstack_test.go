package devstack

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func run(t *testing.T, dir string) (Info, context.CancelFunc, <-chan error) {
	t.Helper()
	cfg := Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)}
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

	err = Run(context.Background(), Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.Nop()}, nil)
	require.True(t, errors.Is(err, ErrDataDirInUse), "%v", err)
	require.Contains(t, err.Error(), dir)
	require.Contains(t, err.Error(), "process "+strconv.Itoa(os.Getpid()))

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
