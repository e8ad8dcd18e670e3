package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
)

// lockedBuffer is a buffer a test reads while a command writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDevServesMetrics: jetflow dev serves its metrics by default on
// DefaultDevMetricsAddr; given another address, it says where they are
// once it runs, and serves there every service's on one /metrics.
func TestDevServesMetrics(t *testing.T) {
	t.Parallel()
	dev, _, err := newRoot(io.Discard, io.Discard).Find([]string{"dev"})
	require.NoError(t, err)
	require.Equal(t, DefaultDevMetricsAddr, dev.Flags().Lookup("metrics-addr").DefValue, "jetflow dev's default")

	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"dev", "--data", filepath.Join(t.TempDir(), "data"), "--log-level", "warn",
			"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	said := regexp.MustCompile(`(?m)^\s+metrics: (http://127\.0\.0\.1:\d+/metrics)\s`)
	var url string
	natstest.Eventually(t, time.Minute, func() bool {
		m := said.FindStringSubmatch(stdout.String())
		if m != nil {
			url = m[1]
		}
		return url != ""
	}, "jetflow dev says where its metrics are; it said:\n%s\n%s", &stdout, &stderr)
	want := []string{"jetflow_dispatcher_executions_started_total{", "jetflow_agent_tasks_in_flight{",
		"jetflow_janitor_finished_executions{", "jetflow_projections_parked{", "go_goroutines "}
	var missing []string
	natstest.Eventually(t, 30*time.Second, func() bool { // the api registers its metrics as it begins to serve
		resp, err := http.Get(url)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		missing = missing[:0]
		for _, w := range want {
			if !strings.Contains(string(body), w) {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0
	}, "every service's metrics served (missing: %q)", &missing)
	cancel()
	require.Equal(t, ExitOK, <-done, stderr.String())
}
