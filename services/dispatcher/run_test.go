package main

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/svcruntest"
)

// TestRunRefusesOutOfRange: every numeric setting is checked before the
// dispatcher connects, and the error names the flag, its variable and the
// range; a negative -ack-wait is such an error, not a panic in the
// keep-alive's ticker.
func TestRunRefusesOutOfRange(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"NegativeAckWait": {args: []string{"-ack-wait", "-1s"},
			want: []string{"-ack-wait (JETFLOW_DISPATCH_ACK_WAIT) -1s", "out of range, use 300ms to 1h"}},
		"ZeroAckWaitEnv":  {env: map[string]string{"JETFLOW_DISPATCH_ACK_WAIT": "0s"}, want: []string{"-ack-wait (JETFLOW_DISPATCH_ACK_WAIT) 0s"}},
		"ShortAckWait":    {args: []string{"-ack-wait", "10ms"}, want: []string{"-ack-wait (JETFLOW_DISPATCH_ACK_WAIT) 10ms"}},
		"HugeAckWait":     {args: []string{"-ack-wait", "1000h"}, want: []string{"-ack-wait (JETFLOW_DISPATCH_ACK_WAIT) 1000h"}},
		"ZeroWorkers":     {args: []string{"-workers", "0"}, want: []string{"-workers (JETFLOW_WORKERS) 0", "1 to 4096"}},
		"NegativeWorkers": {env: map[string]string{"JETFLOW_WORKERS": "-2"}, want: []string{"-workers (JETFLOW_WORKERS) -2"}},
		"HugeWorkers":     {args: []string{"-workers", "1000000"}, want: []string{"-workers (JETFLOW_WORKERS) 1000000"}},
		"Replicas":        {env: map[string]string{"JETFLOW_REPLICAS": "9"}, want: []string{"-replicas (JETFLOW_REPLICAS) 9", "1 to 5"}},
		"BadMember":       {args: []string{"-member", "a.b"}, want: []string{"-member, JETFLOW_DISPATCHER_MEMBER"}},
		"TinyCacheBytes":  {args: []string{"-cache-bytes", "1000"}, want: []string{"-cache-bytes (JETFLOW_DISPATCH_CACHE_BYTES) 1000", "65536 to 68719476736"}},
		"HugeCacheBytes":  {env: map[string]string{"JETFLOW_DISPATCH_CACHE_BYTES": "1099511627776"}, want: []string{"-cache-bytes (JETFLOW_DISPATCH_CACHE_BYTES) 1099511627776"}},
		"BadMetricsAddr":  {env: map[string]string{"JETFLOW_DISPATCHER_METRICS_ADDR": "nowhere"}, want: []string{`-metrics-addr "nowhere"`}},
	} {
		svcruntest.Refuses(t, run, name, tc.args, tc.env, tc.want...)
	}
}

// TestRunStartsAndStops: with the defaults the dispatcher starts, fires
// timers from memory and sets long timers' notices (it says so), its
// probes say it is alive and ready, and it returns nil once stopped.
func TestRunStartsAndStops(t *testing.T) {
	srv := natstest.RunJetStream(t)
	log := svcruntest.Start(t, run, []string{"-health-addr", "127.0.0.1:0"}, map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}, "dispatcher running")
	line := log.Line("dispatcher running")
	require.Equal(t, true, line["timers_from_memory"], "timers from memory by default")
	require.Equal(t, true, line["timer_notices"], "notices by default (docs/adr/0019)")
	require.Equal(t, false, line["group_commit"], "no group commit by default (docs/adr/0020)")
	require.InDelta(t, dispatch.DefaultWorkers, line["workers"], 0)
	svcruntest.Probes(t, log)
}

// TestRunGroupCommitWorkers: -group-commit says so, and raises the
// workers to GroupCommitWorkers unless they are set, by flag or by
// variable.
func TestRunGroupCommitWorkers(t *testing.T) {
	srv := natstest.RunJetStream(t)
	for name, tc := range map[string]struct {
		args    []string
		env     map[string]string
		workers int
	}{
		"Default":  {args: []string{"-group-commit"}, workers: dispatch.GroupCommitWorkers},
		"Flag":     {args: []string{"-group-commit", "-workers", "64"}, workers: 64},
		"Variable": {env: map[string]string{"JETFLOW_GROUP_COMMIT": "true", "JETFLOW_WORKERS": "48"}, workers: 48},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}
			maps.Copy(env, tc.env)
			log := svcruntest.Start(t, run, tc.args, env, "dispatcher running")
			line := log.Line("dispatcher running")
			require.Equal(t, true, line["group_commit"])
			require.InDelta(t, tc.workers, line["workers"], 0)
		})
	}
}

// TestRunServesMetrics: with -metrics-addr from the environment, /metrics
// answers on that address with the dispatcher's metrics, labelled with
// the namespace, and the process's.
func TestRunServesMetrics(t *testing.T) {
	srv := natstest.RunJetStream(t)
	logs := svcruntest.Start(t, run, nil, map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(),
		"JETFLOW_DISPATCHER_METRICS_ADDR": "127.0.0.1:0"}, "dispatcher running")
	var body string
	natstest.Eventually(t, 10*time.Second, func() bool {
		body = svcruntest.Scrape(t, logs)
		return strings.Contains(body, `jetflow_consumer_pending_messages{consumer="dispatcher-commands",namespace="default",service="dispatcher",stream="JF_COMMANDS"} 0`)
	}, "the consumers' lag served")
	for _, want := range []string{`jetflow_dispatcher_executions_ended_total{namespace="default",status="succeeded"} 0`,
		`jetflow_dispatcher_appends_total{namespace="default",result="conflict"} 0`, "go_goroutines "} {
		require.Contains(t, body, want)
	}
}
