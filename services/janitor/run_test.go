package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/internal/svcruntest"
)

// TestRunServesMetrics: the retention default and the metrics and health
// addresses come from the environment; /metrics answers on the loopback
// address, and the probes say the janitor is alive and ready.
func TestRunServesMetrics(t *testing.T) {
	srv := natstest.RunJetStream(t)
	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(), "JETFLOW_RETENTION_DEFAULT": "max(5, 7d)",
		"JETFLOW_JANITOR_METRICS_ADDR": "127.0.0.1:0", "JETFLOW_JANITOR_INTERVAL": "50ms", "JETFLOW_HEALTH_ADDR": "127.0.0.1:0"}
	logs := svcruntest.Start(t, run, nil, env, "janitor running")
	require.Equal(t, "max(5, 7d)", logs.Line("janitor running")["retention_default"])
	addr, _ := logs.Line("metrics listening")["addr"].(string)
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)

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
	svcruntest.Probes(t, logs)
}

// TestRunCatchUps: catch-ups run every 5s by default, not at all with
// -catch-up-every 0, and a -catch-up-every the interval leaves no room
// for is said to be off, not dropped silently.
func TestRunCatchUps(t *testing.T) {
	srv := natstest.RunJetStream(t)
	for name, tc := range map[string]struct {
		args       []string
		want, warn string
	}{
		"default":        {want: "5s"},
		"off":            {args: []string{"-catch-up-every", "0"}, want: "0s"},
		"longer":         {args: []string{"-catch-up-every", "10s"}, want: "10s"},
		"interval short": {args: []string{"-catch-up-every", "20s"}, want: "0s", warn: "20s"},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(), "JETFLOW_JANITOR_INTERVAL": "30s"}
			logs := svcruntest.Start(t, run, tc.args, env, "janitor running")
			require.Equal(t, tc.want, logs.Line("janitor running")["catch_up_every"])
			if tc.warn != "" {
				require.Equal(t, tc.warn, logs.Line("no catch-ups between sweeps: -catch-up-every needs an -interval of at least twice it")["catch_up_every"])
			}
		})
	}
}

// TestRunRefuses: every setting is checked before the janitor connects
// (NATS is nowhere here), and a numeric one's error names the flag, its
// variable and the range; a negative interval is such an error, not a
// panic in the sweep's ticker.
func TestRunRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"BadRetentionDefault": {args: []string{"-retention-default", "max(parent, 3)"},
			want: []string{`-retention-default, JETFLOW_RETENTION_DEFAULT) "max(parent, 3)"`, "cannot refer to context, parent or system"}},
		"NegativeInterval": {args: []string{"-interval", "-30s"},
			want: []string{"-interval (JETFLOW_JANITOR_INTERVAL) -30s", "out of range, use 10ms to 24h"}},
		"ZeroIntervalEnv":   {env: map[string]string{"JETFLOW_JANITOR_INTERVAL": "0s"}, want: []string{"-interval (JETFLOW_JANITOR_INTERVAL) 0s"}},
		"HugeInterval":      {args: []string{"-interval", "1000h"}, want: []string{"-interval (JETFLOW_JANITOR_INTERVAL) 1000h"}},
		"NegativeIdleAfter": {args: []string{"-idle-after", "-1m"}, want: []string{"-idle-after (JETFLOW_IDLE_AFTER) -1m", "100ms to 168h"}},
		"ZeroIdleAfterEnv":  {env: map[string]string{"JETFLOW_IDLE_AFTER": "0s"}, want: []string{"-idle-after (JETFLOW_IDLE_AFTER) 0s"}},
		"Replicas":          {args: []string{"-replicas", "6"}, want: []string{"-replicas (JETFLOW_REPLICAS) 6"}},
		"NegativeCatchUp":   {args: []string{"-catch-up-every", "-5s"}, want: []string{"-catch-up-every (JETFLOW_JANITOR_CATCH_UP_EVERY) -5s: out of range, use 0 (never) or 100ms to 1h"}},
		"LongCatchUp":       {args: []string{"-catch-up-every", "2h"}, want: []string{"-catch-up-every (JETFLOW_JANITOR_CATCH_UP_EVERY) 2h: out of range, use 0 (never) or 100ms to 1h"}},
		"ShortCatchUpEnv":   {env: map[string]string{"JETFLOW_JANITOR_CATCH_UP_EVERY": "1ms"}, want: []string{"-catch-up-every (JETFLOW_JANITOR_CATCH_UP_EVERY) 1ms: out of range, use 0 (never) or 100ms to 1h"}},
	} {
		svcruntest.Refuses(t, run, name, tc.args, tc.env, tc.want...)
	}
}
