package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/internal/svcruntest"
)

// TestRunChecksPolicyAndSecretsFirst: a policy or a secret source that
// cannot work stops the agent at once, before it waits for NATS (none is
// running here), with a message naming the setting.
func TestRunChecksPolicyAndSecretsFirst(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		msg  string
	}{
		"AllowExecNotABoolean":  {env: map[string]string{"JETFLOW_AGENT_ALLOW_EXEC": "maybe"}, msg: `JETFLOW_AGENT_ALLOW_EXEC="maybe": not a boolean`},
		"AllowListWithoutExec":  {args: []string{"-exec-allow", "echo,ls"}, msg: "exec is not allowed"},
		"RelativeAllowedPath":   {args: []string{"-allow-exec", "-exec-allow", "bin/tool"}, msg: "must be absolute"},
		"BadHostPattern":        {env: map[string]string{"JETFLOW_AGENT_HTTP_ALLOW_HOSTS": "api.example.com, https://x"}, msg: `"https://x"`},
		"MissingSecretsDir":     {args: []string{"-secrets-dir", missing}, msg: "secrets directory"},
		"BadSecretsEnvPrefix":   {env: map[string]string{"JETFLOW_AGENT_SECRETS_ENV_PREFIX": "A-B"}, msg: "secrets environment prefix"},
		"NoNATSStillValidFirst": {args: []string{"-allow-exec=false", "-exec-allow", "sh"}, msg: "exec is not allowed"},
	} {
		env := map[string]string{"JETFLOW_NATS_URL": "nats://127.0.0.1:1"}
		for k, v := range tc.env {
			env[k] = v
		}
		ctx, cancel := context.WithCancel(t.Context())
		var logs bytes.Buffer
		err := run(ctx, tc.args, func(k string) string { return env[k] }, &logs)
		cancel()
		require.ErrorContains(t, err, tc.msg, name)
	}
}

// TestRunRefusesOutOfRange: every numeric setting is checked before the
// agent connects, and the error names the flag, its variable and the
// range; a negative ack wait is such an error, not a panic in the
// heartbeat's ticker.
func TestRunRefusesOutOfRange(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"NegativeAckWait": {args: []string{"-task-ack-wait", "-1s"},
			want: []string{"-task-ack-wait (JETFLOW_TASK_ACK_WAIT) -1s", "out of range, use 300ms to 1h"}},
		"ShortAckWaitEnv": {env: map[string]string{"JETFLOW_TASK_ACK_WAIT": "100ms"},
			want: []string{"-task-ack-wait (JETFLOW_TASK_ACK_WAIT) 100ms", "300ms to 1h"}},
		"HugeAckWait":      {args: []string{"-task-ack-wait=48h"}, want: []string{"-task-ack-wait (JETFLOW_TASK_ACK_WAIT) 48h"}},
		"ZeroConcurrency":  {args: []string{"-concurrency", "0"}, want: []string{"-concurrency (JETFLOW_CONCURRENCY) 0", "1 to 1024"}},
		"NegativeConcEnv":  {env: map[string]string{"JETFLOW_CONCURRENCY": "-4"}, want: []string{"-concurrency (JETFLOW_CONCURRENCY) -4"}},
		"HugeConcurrency":  {args: []string{"-concurrency", "100000"}, want: []string{"-concurrency (JETFLOW_CONCURRENCY) 100000"}},
		"ZeroMaxDeliver":   {args: []string{"-max-deliver", "0"}, want: []string{"-max-deliver (JETFLOW_TASK_MAX_DELIVER) 0", "1 to 10000"}},
		"NegativeMaxDeliv": {env: map[string]string{"JETFLOW_TASK_MAX_DELIVER": "-1"}, want: []string{"-max-deliver (JETFLOW_TASK_MAX_DELIVER) -1"}},
		"NegativeGrace":    {args: []string{"-kill-grace", "-5s"}, want: []string{"-kill-grace (JETFLOW_KILL_GRACE) -5s", "10ms to 1h"}},
		"ZeroGraceEnv":     {env: map[string]string{"JETFLOW_KILL_GRACE": "0s"}, want: []string{"-kill-grace (JETFLOW_KILL_GRACE) 0s"}},
		"NegStartedAfter":  {args: []string{"-report-started-after", "-1ms"}, want: []string{"-report-started-after (JETFLOW_AGENT_REPORT_STARTED_AFTER) -1ms", "0s to 1m"}},
		"Replicas":         {args: []string{"-replicas", "-1"}, want: []string{"-replicas (JETFLOW_REPLICAS) -1", "1 to 5"}},
		"BadQueue":         {args: []string{"-queues", "gpu,a.b"}, want: []string{`queue "a.b"`}},
		"BadMetricsAddr":   {args: []string{"-metrics-addr", "127.0.0.1:99999"}, want: []string{`-metrics-addr "127.0.0.1:99999"`}},
	} {
		svcruntest.Refuses(t, run, name, tc.args, tc.env, tc.want...)
	}
}

// TestRunStartsAndStops: with the defaults the agent starts, its probes
// say it is alive and ready, and it returns nil once stopped.
func TestRunStartsAndStops(t *testing.T) {
	srv := natstest.RunJetStream(t)
	log := svcruntest.Start(t, run, []string{"-health-addr", "127.0.0.1:0"}, map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}, "agent running")
	svcruntest.Probes(t, log)
}

// TestRunServesMetrics: with -metrics-addr from the environment, /metrics
// answers on that address with the agent's metrics, labelled with the
// namespace: each queue served, and its consumers' lag.
func TestRunServesMetrics(t *testing.T) {
	srv := natstest.RunJetStream(t)
	logs := svcruntest.Start(t, run, []string{"-queues", "gpu,default"}, map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(),
		"JETFLOW_AGENT_METRICS_ADDR": "127.0.0.1:0"}, "agent running")
	var body string
	natstest.Eventually(t, 10*time.Second, func() bool {
		body = svcruntest.Scrape(t, logs)
		return strings.Contains(body, `jetflow_consumer_pending_messages{consumer="bulk-agent-gpu",namespace="default",service="agent",stream="JF_TASKS"} 0`)
	}, "the consumers' lag served")
	for _, want := range []string{`jetflow_agent_tasks_in_flight{namespace="default",queue="gpu"} 0`,
		`jetflow_agent_redeliveries_total{namespace="default",queue="default"} 0`, "go_goroutines "} {
		require.Contains(t, body, want)
	}
}
