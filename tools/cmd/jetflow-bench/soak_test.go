package main

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/tools/internal/devstack"
	"jetflow.dev/tools/internal/soak"
)

func TestSoakFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-soak", "-1s"}, "-soak must be a positive duration"},
		{[]string{"-soak", "1m", "-executions", "10"}, "-soak runs alone: drop -executions"},
		{[]string{"-soak", "1m", "-locks", "3", "-single", "1"}, "-soak runs alone: drop -locks, -single"},
		{[]string{"-soak", "1m", "-soak-rate", "0"}, "-soak-rate must be above 0"},
		{[]string{"-soak", "1m", "-soak-every", "7s", "-soak-sample", "2s"}, "must be a multiple of -soak-sample"},
		{[]string{"-soak", "10s", "-soak-every", "20s"}, "must be at most -soak"},
		{[]string{"-soak", "1m", "-soak-retention", "sometimes"}, "-soak-retention: "},
		{[]string{"-soak", "1m", "-soak-heap-slope", "0"}, "-soak-heap-slope and -soak-heap-growth: soak: the slope threshold must be positive"},
		{[]string{"-soak", "1m", "-soak-heap-growth", "-1"}, "soak: the growth threshold must be zero or positive"},
		{[]string{"-soak", "1m", "-soak-sleep", "10ms"}, "-soak-sleep must be between 1s and 1m"},
		{[]string{"-soak", "1m", "-soak-cache", "0"}, "-soak-cache must be between 1 and 1000000"},
	} {
		err := run(t.Context(), c.args, new(bytes.Buffer))
		require.ErrorContains(t, err, c.want, "%v", c.args)
	}
}

func TestSoakDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		duration, every, sample time.Duration
	}{
		{10 * time.Minute, time.Minute, 10 * time.Second},
		{time.Hour, time.Minute, 10 * time.Second},
		{5 * time.Minute, 30 * time.Second, 10 * time.Second},
		{30 * time.Second, 3 * time.Second, 3 * time.Second},
		{3 * time.Minute, 18 * time.Second, 9 * time.Second},
		{7*time.Minute + 30*time.Second, 45 * time.Second, 9 * time.Second},
		{4*time.Minute + 10*time.Second, 25 * time.Second, 5 * time.Second},
		{5 * time.Second, time.Second, time.Second},
	} {
		cfg := defaultSoakConfig()
		cfg.Duration = c.duration
		cfg = cfg.withDefaults()
		require.Equal(t, c.every, cfg.Every, "%s", c.duration)
		require.Equal(t, c.sample, cfg.Sample, "%s", c.duration)
		require.NoError(t, cfg.validate())
	}
}

func TestSoakMix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "sleep", soakKinds[soakSleep].name)
	require.Equal(t, "wait", soakKinds[soakWait].name)
	mix := soakMix()
	count := make([]int, len(soakKinds))
	for _, k := range mix {
		count[k]++
	}
	for i, k := range soakKinds {
		require.Equal(t, k.weight, count[i], k.name)
	}
	// Evenly spread: never the same kind twice in a row within a cycle.
	for i := 1; i < len(mix); i++ {
		require.NotEqual(t, mix[i-1], mix[i], "%v", mix)
	}
}

// TestSoakRun runs the soak for a few seconds at a low rate on the whole
// system and checks that it prints its rows, that every kind of
// execution finishes (the waits get their signal, the sleeps wake up),
// and that a run this short gives no leak verdict rather than a wrong one.
func TestSoakRun(t *testing.T) {
	ctx := t.Context()
	info, stop, err := startStack(ctx, devstack.Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), JanitorInterval: soakJanitor, CacheSize: 1000})
	require.NoError(t, err)
	defer stop()
	conn, err := info.Dial(ctx, auth.RoleAdmin, "jetflow-bench-test")
	require.NoError(t, err)
	defer conn.NC.Close()
	store, err := catalog.Open(ctx, conn.JS)
	require.NoError(t, err)

	cfg := defaultSoakConfig()
	cfg.Duration, cfg.Rate, cfg.Every, cfg.Sample, cfg.Sleep = 6*time.Second, 4, 2*time.Second, time.Second, time.Second
	var out bytes.Buffer
	res, err := runSoak(ctx, &out, conn, store, cfg)
	t.Log(out.String())
	require.NoError(t, err)
	require.Equal(t, 3, res.rows)
	require.Len(t, regexp.MustCompile(`(?m)^ +[246]s +\d+ +\d+ +0 +\d+ `).FindAllString(out.String(), -1), 3, "a row every 2s, no failure")
	require.Equal(t, 24, res.started, "4/s for 6s")
	require.Equal(t, res.started, res.finished)
	require.Zero(t, res.failed)
	require.Zero(t, res.unfinished)
	require.Equal(t, soak.TooShort, res.heap.Verdict)
	require.Contains(t, out.String(), "latency by kind")
	require.Contains(t, out.String(), "heap        too short to judge")
	require.Contains(t, out.String(), "executions: 24 started, 24 finished, 0 failed, 0 did not finish")
}
