package agent_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/services/agent/agent"
)

// TestConfigValidate: every count, size and duration is checked against
// its range (zero is the default), by Validate and by New, so that a
// program embedding the agent gets an error naming the field instead of a
// panic or an agent that serves nothing.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  agent.Config
		want string // "" for valid
	}{
		"Defaults":              {},
		"Smallest":              {cfg: agent.Config{Concurrency: 1, AckWait: 300 * time.Millisecond, MaxDeliver: 1, KillGrace: 10 * time.Millisecond, HTTPTimeout: 100 * time.Millisecond, MaxOutput: 1, ShutdownGrace: time.Millisecond}},
		"NegativeConcurrency":   {cfg: agent.Config{Concurrency: -1}, want: "agent: Concurrency -1: out of range, use 1 to 1024"},
		"HugeConcurrency":       {cfg: agent.Config{Concurrency: 1 << 20}, want: "agent: Concurrency 1048576: out of range"},
		"NegativeAckWait":       {cfg: agent.Config{AckWait: -time.Second}, want: "agent: AckWait -1s: out of range, use 300ms to 1h"},
		"ShortAckWait":          {cfg: agent.Config{AckWait: 100 * time.Millisecond}, want: "agent: AckWait 100ms"},
		"HugeAckWait":           {cfg: agent.Config{AckWait: 48 * time.Hour}, want: "agent: AckWait 48h"},
		"NegativeMaxDeliver":    {cfg: agent.Config{MaxDeliver: -1}, want: "agent: MaxDeliver -1: out of range, use 1 to 10000"},
		"NegativeKillGrace":     {cfg: agent.Config{KillGrace: -time.Second}, want: "agent: KillGrace -1s: out of range, use 10ms to 1h"},
		"NegativeHTTPTimeout":   {cfg: agent.Config{HTTPTimeout: -time.Second}, want: "agent: HTTPTimeout -1s: out of range, use 100ms to 1h"},
		"NegativeMaxOutput":     {cfg: agent.Config{MaxOutput: -1}, want: "agent: MaxOutput -1: out of range, use 1 to 67108864"},
		"HugeMaxOutput":         {cfg: agent.Config{MaxOutput: 1 << 30}, want: "agent: MaxOutput 1073741824"},
		"NegativeShutdownGrace": {cfg: agent.Config{ShutdownGrace: -time.Second}, want: "agent: ShutdownGrace -1s: out of range, use 1ms to 1h"},
		"StartedAtOnce":         {cfg: agent.Config{StartedAfter: agent.StartedAtOnce}},
		"NegativeStartedAfter":  {cfg: agent.Config{StartedAfter: -2 * time.Second}, want: "agent: StartedAfter (-report-started-after; 0: at once) -2s: out of range, use 0s to 1m"},
		"HugeStartedAfter":      {cfg: agent.Config{StartedAfter: time.Hour}, want: "agent: StartedAfter (-report-started-after; 0: at once) 1h: out of range"},
		"BadQueue":              {cfg: agent.Config{Queues: []string{"gpu", " default"}}, want: `agent: queue " default"`},
		"EmptyQueue":            {cfg: agent.Config{Queues: []string{""}}, want: `agent: queue ""`},
		"QueueTwice":            {cfg: agent.Config{Queues: []string{"gpu", "gpu"}}, want: `agent: queue "gpu" is given twice`},
	} {
		err := tc.cfg.Validate()
		_, newErr := agent.New(tc.cfg, nil, zerolog.Nop())
		if tc.want == "" {
			require.NoError(t, err, name)
			require.NoError(t, newErr, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
		require.ErrorContains(t, newErr, tc.want, "%s: New", name)
	}
}
