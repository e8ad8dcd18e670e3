package devstack_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/tools/internal/devstack"
)

// signalWriter collects a log and closes seen when a line holds want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want []byte
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Contains(p, w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return w.buf.Write(p)
}

// TestStopWhileServicesStart: a stack stopped while its services still
// wait for JetStream stops cleanly: Run returns nil, not the error of the
// setup call that the stop cancelled. (The end-to-end tests stop a stack
// as soon as they are done, which on a loaded machine can be before its
// slowest service is up.) The services here wait on an address that takes
// connections and never speaks NATS.
func TestStopWhileServicesStart(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	log := &signalWriter{want: []byte("waiting for jetstream"), seen: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- devstack.Run(ctx, devstack.Config{NATSURL: "nats://" + silent.Addr().String(), HTTPAddr: "127.0.0.1:0",
			DataDir: t.TempDir(),
			Log:     zerolog.New(log)}, func(devstack.Info) { t.Error("ready without JetStream") })
	}()
	select {
	case <-log.seen:
	case err := <-done:
		t.Fatalf("the stack stopped by itself: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the services never said they wait for JetStream")
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "stopped while starting")
	case <-time.After(30 * time.Second):
		t.Fatal("the stack did not stop")
	}
}

// TestRefusesOutOfRangeFirst: a service setting out of its range stops
// the stack before anything starts (no JetStream store is made), with an
// error naming the setting, instead of one service failing once the
// server is up.
func TestRefusesOutOfRangeFirst(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  devstack.Config
		want string
	}{
		"NegativeTaskAckWait":     {cfg: devstack.Config{TaskAckWait: -time.Second}, want: "agent: AckWait -1s: out of range"},
		"NegativeKillGrace":       {cfg: devstack.Config{KillGrace: -time.Second}, want: "agent: KillGrace -1s"},
		"NegativeWorkers":         {cfg: devstack.Config{Workers: -1}, want: "dispatch: Workers -1"},
		"NegativeJanitorInterval": {cfg: devstack.Config{JanitorInterval: -time.Second}, want: "janitor: Interval -1s"},
		"HugeIdleAfter":           {cfg: devstack.Config{IdleAfter: 1000 * time.Hour}, want: "janitor: IdleAfter 1000h"},
		"NegativeStartWait":       {cfg: devstack.Config{StartWait: -time.Second}, want: "api: StartWait -1s"},
		"TinyVisibilityCache":     {cfg: devstack.Config{VisibilityCache: 1000}, want: "api: VisibilityCache (-visibility-cache-bytes, JETFLOW_VISIBILITY_CACHE_BYTES) 1000"},
	} {
		dir := t.TempDir()
		cfg := tc.cfg
		cfg.DataDir, cfg.NATSAddr, cfg.HTTPAddr, cfg.Log = dir, "127.0.0.1:0", "127.0.0.1:0", zerolog.New(zerolog.NewTestWriter(t))
		err := devstack.Run(t.Context(), cfg, func(devstack.Info) { t.Errorf("%s: the stack started", name) })
		require.ErrorContains(t, err, tc.want, name)
		_, err = os.Stat(filepath.Join(dir, "jetstream"))
		require.True(t, errors.Is(err, fs.ErrNotExist), "%s: a JetStream store was made: %v", name, err)
	}
}
