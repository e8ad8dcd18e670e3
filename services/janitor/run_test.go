package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
)

// syncBuffer is a log destination the test reads while run writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// line returns the first logged JSON line whose message is msg.
func (b *syncBuffer) line(msg string) map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(b.buf.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["message"] == msg {
			return m
		}
	}
	return nil
}

// TestRunServesMetrics: the retention default and the metrics address
// come from the environment; /metrics answers on the loopback address.
//
// Not parallel: run sets zerolog's global time format.
func TestRunServesMetrics(t *testing.T) {
	srv := natstest.RunJetStream(t)
	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(), "JETFLOW_RETENTION_DEFAULT": "max(5, 7d)",
		"JETFLOW_JANITOR_METRICS_ADDR": "127.0.0.1:0", "JETFLOW_JANITOR_INTERVAL": "50ms"}
	ctx, cancel := context.WithCancel(t.Context())
	var logs syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, &logs) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	var addr string
	natstest.Eventually(t, 10*time.Second, func() bool {
		l := logs.line("metrics listening")
		if l == nil {
			return false
		}
		addr, _ = l["addr"].(string)
		return true
	}, "metrics endpoint started")
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)
	natstest.Eventually(t, 10*time.Second, func() bool { return logs.line("janitor running") != nil }, "janitor running")
	require.Equal(t, "max(5, 7d)", logs.line("janitor running")["retention_default"])

	natstest.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// Set by the first sweep.
		return strings.Contains(string(body), `jetflow_janitor_finished_executions{namespace="default"} 0`)
	}, "metrics served after a sweep")
}

func TestRunRefusesBadRetentionDefault(t *testing.T) {
	srv := natstest.RunJetStream(t)
	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}
	err := run(t.Context(), []string{"-retention-default", "max(parent, 3)"}, func(k string) string { return env[k] }, io.Discard)
	require.ErrorContains(t, err, `RetentionDefault "max(parent, 3)"`)
	require.ErrorContains(t, err, "cannot refer to context, parent or system")
}
