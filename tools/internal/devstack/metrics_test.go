package devstack

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// scrape reads the stack's /metrics.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}

// TestMetricsOfEveryService: with MetricsAddr the stack serves one
// /metrics with every service's metrics: an execution run through it is
// counted by the dispatcher (started, ended, its sleep's timer), the
// agent (its operation) and the api's projector, beside the janitor's,
// both services' consumers and the process's.
func TestMetricsOfEveryService(t *testing.T) {
	t.Parallel()
	info, cancel, done := runWith(t, Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.True(t, strings.HasPrefix(info.MetricsURL, "http://127.0.0.1:") && strings.HasSuffix(info.MetricsURL, "/metrics"), info.MetricsURL)

	ctx := t.Context()
	c := info.Client()
	_, err := c.ApplyWorkflow(ctx, []byte("name: measured\nsteps:\n  - {id: a, kind: noop}\n  - {id: nap, kind: sleep, duration: 10ms}\n"))
	require.NoError(t, err)
	st, err := c.Start(ctx, client.StartRequest{Workflow: "measured"})
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool {
		x, err := c.Execution(ctx, st.ID)
		return err == nil && x.Status == projections.StatusSucceeded
	}, "the execution succeeded")

	want := []string{
		`jetflow_dispatcher_executions_started_total{namespace="default"} 1`,
		`jetflow_dispatcher_executions_ended_total{namespace="default",status="succeeded"} 1`,
		`jetflow_dispatcher_steps_total{kind="sleep",namespace="default",outcome="succeeded"} 1`,
		`jetflow_dispatcher_timer_lateness_seconds_count{namespace="default",purpose="sleep"} 1`,
		`jetflow_agent_operations_total{kind="noop",namespace="default",outcome="succeeded"} 1`,
		`jetflow_agent_tasks_in_flight{namespace="default",queue="default"} 0`,
		`jetflow_consumer_pending_messages{consumer="agent-default",namespace="default",service="agent",stream="JF_TASKS"} 0`,
		`jetflow_consumer_pending_messages{consumer="dispatcher-commands",namespace="default",service="dispatcher",stream="JF_COMMANDS"} 0`,
		`jetflow_janitor_finished_executions{namespace="default"} `,
		`jetflow_projector_events_total{namespace="default"} `,
		`jetflow_projections_parked{namespace="default"} 0`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
	}
	var body string
	var missing []string
	natstest.Eventually(t, 30*time.Second, func() bool {
		body, missing = scrape(t, info.MetricsURL), missing[:0]
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0
	}, "every service's metrics served (missing: %q)", &missing)
	require.NotContains(t, body, `jetflow_projector_events_total{namespace="default"} 0`+"\n", "the projector's events counted")
}

// TestMetricsAddressRefused: a metrics address another program listens
// on stops the stack before it makes anything, naming it; so does
// giving both MetricsAddr and Registerer.
func TestMetricsAddressRefused(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dir := t.TempDir() + "/data"
	err = Run(ctx, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: busy.Addr().String(), Log: zerolog.Nop()}, nil)
	require.ErrorContains(t, err, "metrics address")
	require.ErrorContains(t, err, "address already in use")
	require.NoDirExists(t, dir, "nothing made before the address was found busy")

	err = Run(ctx, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Registerer: prometheus.NewRegistry(), Log: zerolog.Nop()}, nil)
	require.ErrorContains(t, err, "MetricsAddr and Registerer are both set")
}

