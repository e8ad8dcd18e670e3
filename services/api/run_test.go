package main

import (
	"testing"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/internal/svcruntest"
)

// TestRunRefusesOutOfRange: every numeric setting is checked before the
// api connects, and the error names the flag, its variable and the range.
func TestRunRefusesOutOfRange(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want []string
	}{
		"NegativeStartWait": {args: []string{"-start-wait", "-1s"},
			want: []string{"-start-wait (JETFLOW_START_WAIT) -1s", "out of range, use 1ms to 1m"}},
		"ZeroStartWaitEnv":  {env: map[string]string{"JETFLOW_START_WAIT": "0s"}, want: []string{"-start-wait (JETFLOW_START_WAIT) 0s"}},
		"HugeStartWait":     {args: []string{"-start-wait", "2h"}, want: []string{"-start-wait (JETFLOW_START_WAIT) 2h"}},
		"NegativeCacheTTL":  {args: []string{"-key-cache-ttl", "-5s"}, want: []string{"-key-cache-ttl (JETFLOW_KEY_CACHE_TTL) -5s", "1ms to 1m"}},
		"LongCacheTTLEnv":   {env: map[string]string{"JETFLOW_KEY_CACHE_TTL": "2m"}, want: []string{"-key-cache-ttl (JETFLOW_KEY_CACHE_TTL) 2m"}},
		"Replicas":          {args: []string{"-replicas", "0"}, want: []string{"-replicas (JETFLOW_REPLICAS) 0"}},
		"AuthOffWithTokens": {args: []string{"-no-http-auth", "-admin-token-file", "x"}, want: []string{"authentication is off"}},
		"NegativeCoalesce":  {args: []string{"-projector-coalesce", "-1s"}, want: []string{"-projector-coalesce (JETFLOW_PROJECTOR_COALESCE) -1s", "0s to 10s"}},
		"LongCoalesceEnv":   {env: map[string]string{"JETFLOW_PROJECTOR_COALESCE": "1m"}, want: []string{"-projector-coalesce (JETFLOW_PROJECTOR_COALESCE) 1m"}},
		"NegativeGather":    {args: []string{"-projector-gather", "-1ms"}, want: []string{"-projector-gather (JETFLOW_PROJECTOR_GATHER) -1ms", "0s to 1s"}},
		"LongGatherEnv":     {env: map[string]string{"JETFLOW_PROJECTOR_GATHER": "2s"}, want: []string{"-projector-gather (JETFLOW_PROJECTOR_GATHER) 2s"}},
		"TinyProjectorCache": {args: []string{"-projector-cache-bytes", "4096"},
			want: []string{"-projector-cache-bytes (JETFLOW_PROJECTOR_CACHE_BYTES) 4096", "65536 to 68719476736"}},
		"TinyVisibilityCacheEnv": {env: map[string]string{"JETFLOW_VISIBILITY_CACHE_BYTES": "65536"},
			want: []string{"-visibility-cache-bytes (JETFLOW_VISIBILITY_CACHE_BYTES) 65536", "1048576 to 68719476736"}},
	} {
		svcruntest.Refuses(t, run, name, tc.args, tc.env, tc.want...)
	}
}

// TestRunStartsAndStops: the api starts with the default ranges, and
// returns nil once stopped.
func TestRunStartsAndStops(t *testing.T) {
	srv := natstest.RunJetStream(t)
	svcruntest.Start(t, run, []string{"-http", "127.0.0.1:0", "-no-http-auth"},
		map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}, "api listening")
}
