// Package svcruntest runs a service program's run function in tests: its
// flags, its start against a real JetStream server and its shutdown.
// Only tests import it.
package svcruntest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/internal/svcrun"
)

// Log is a log destination that a test reads while run writes it.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Line returns the first logged JSON line whose message is msg, or nil.
func (l *Log) Line(msg string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(l.buf.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["message"] == msg {
			return m
		}
	}
	return nil
}

// Nowhere is a NATS URL where no server listens: a run that got as far as
// connecting would wait there.
const Nowhere = "nats://127.0.0.1:1"

// Refuses runs run with args and env, NATS at [Nowhere] unless env says
// otherwise, and requires it to fail at once with an error holding every
// one of want. A run that does not check would wait for NATS until the
// test's patience ends (20s), then return nil: the test fails.
func Refuses(t *testing.T, run svcrun.RunFunc, name string, args []string, env map[string]string, want ...string) {
	t.Helper()
	all := map[string]string{"JETFLOW_NATS_URL": Nowhere}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var log Log
	err := run(ctx, args, func(k string) string { return all[k] }, &log)
	require.Error(t, err, "%s: run did not refuse %v %v", name, args, env)
	for _, w := range want {
		require.ErrorContains(t, err, w, name)
	}
}

// Start runs run with args and env until the test ends, and returns its
// log once it has logged msg. At the end of the test it cancels run's
// context and requires run to return nil within 30s.
func Start(t *testing.T, run svcrun.RunFunc, args []string, env map[string]string, msg string) *Log {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := &Log{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "run stopped with an error")
		case <-time.After(30 * time.Second):
			var stacks strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			t.Errorf("run did not stop within 30s; its log:\n%s\ngoroutines:\n%s", log.String(), stacks.String())
		}
	})
	natstest.Eventually(t, 30*time.Second, func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("run returned before it logged %q: %v", msg, err)
		default:
		}
		return log.Line(msg) != nil
	}, "run logged %q", msg)
	return log
}

// Probes checks the health listener of a run started with -health-addr
// 127.0.0.1:0 (its log names the address): /healthz answers 200, and
// /readyz answers 200 with every namespace ready within 30s.
func Probes(t *testing.T, log *Log) {
	t.Helper()
	var addr string
	natstest.Eventually(t, 30*time.Second, func() bool {
		line := log.Line("health listening")
		if line == nil {
			return false
		}
		addr, _ = line["addr"].(string)
		return addr != ""
	}, "the health listener is up")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)
	deadline := time.Now().Add(30 * time.Second)
	code, body = get("/readyz")
	for code != http.StatusOK && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		code, body = get("/readyz")
	}
	require.Equal(t, http.StatusOK, code, "/readyz: %s", body)
	var st svcrun.HealthState
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	require.Equal(t, svcrun.HealthState{Status: "ok", Version: svc.Version(), Namespaces: map[string]string{"default": ""}}, st)
}

// Scrape reads /metrics from the metrics listener of a run started with
// -metrics-addr 127.0.0.1:0 (its log names the address) and returns the
// body of a 200 answer.
func Scrape(t *testing.T, log *Log) string {
	t.Helper()
	line := log.Line("metrics listening")
	require.NotNil(t, line, "no metrics listener logged")
	addr, _ := line["addr"].(string)
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}
