package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/tools/internal/benchcompare"
	"jetflow.dev/tools/internal/devstack"
)

func TestPercentileAndSpread(t *testing.T) {
	t.Parallel()
	require.Zero(t, percentile(nil, 0.5))
	require.Zero(t, spread(nil))
	lat := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- { // unsorted: spread sorts
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	require.InDelta(t, 100.0/51.0, spread(lat), 1e-9, "p99 is the 100th of 100, p50 the 51st, as printLatency prints them")
	require.Equal(t, 51*time.Millisecond, percentile(lat, 0.5))
	require.Equal(t, time.Millisecond, percentile(lat, 0))
	require.Equal(t, 100*time.Millisecond, percentile(lat, 1))
	require.InDelta(t, 1.0, spread([]time.Duration{3, 3, 3}), 1e-9)
	require.Zero(t, spread([]time.Duration{0, 0}), "a p50 of 0 gives no ratio")
}

func TestPerUnit(t *testing.T) {
	t.Parallel()
	require.Equal(t, 850*time.Microsecond, perUnit(17*time.Second, 20_000), "CPU per step: 17 s over 2,000 executions of 10 steps")
	require.Zero(t, perUnit(time.Second, 0))
	require.Zero(t, perUnit(-1, 10), "an unknown CPU time gives no figure")
}

func TestPerExecution(t *testing.T) {
	t.Parallel()
	v, ok := perExecution(100<<20, 100<<20+200<<10, 100)
	require.True(t, ok)
	require.InDelta(t, 2048.0, v, 1e-9, "200 KiB over 100 executions is 2 KiB each")
	v, ok = perExecution(10<<20, 9<<20, 1024)
	require.True(t, ok)
	require.InDelta(t, -1024.0, v, 1e-9, "RSS that shrank is a negative figure, not an unknown one")
	_, ok = perExecution(-1, 5, 1)
	require.False(t, ok)
	_, ok = perExecution(1, -1, 1)
	require.False(t, ok)
	_, ok = perExecution(1, 2, 0)
	require.False(t, ok)
}

func TestFormats(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		32647 * time.Millisecond: "32,647 ms",
		1234 * time.Millisecond:  "1,234 ms",
		123 * time.Millisecond:   "123 ms",
		12345 * time.Microsecond: "12.3 ms",
		1260 * time.Microsecond:  "1.26 ms",
		850 * time.Microsecond:   "0.850 ms",
		0:                        "0.000 ms",
	} {
		require.Equal(t, want, millis(d))
	}
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 2987.6: "2,988", 1234567: "1,234,567", -4500: "-4,500"} {
		require.Equal(t, want, thousands(v))
	}
}

func TestGoalRows(t *testing.T) {
	t.Parallel()
	byFigure := func(rows []goalRow) map[string]goalRow {
		m := map[string]goalRow{}
		for _, r := range rows {
			m[strings.SplitN(r.figure, ",", 2)[0]] = r
		}
		return m
	}

	rows := byFigure(goalRows(figures{
		stepsPerSec: 10_500, spread: 3.04, cpuPerStep: 870 * time.Microsecond, perStep: 500 * time.Microsecond,
		oneStep: 3700 * time.Microsecond, timers: 10_000, timerLate: 1200 * time.Millisecond,
	}))
	require.Len(t, rows, 8, "every goal, measured or not")
	require.Equal(t, goalRow{figure: "steps/s, 10-step noop, 200 in flight", measured: "10,500", goal: ">= 10,000", met: "yes"},
		rows["steps/s"])
	require.Equal(t, goalRow{figure: "steps/s with fsync on every write", measured: "not measured", goal: ">= 1,500", met: "-"},
		rows["steps/s with fsync on every write"], "the default mode measures not the fsync goal")
	require.Equal(t, "yes", rows["per step p50"].met, "a figure at its goal meets it")
	require.Equal(t, "3.04", rows["start-to-finish p99 / p50"].measured)
	require.Equal(t, "no", rows["start-to-finish p99 / p50"].met)
	require.Equal(t, "0.870 ms", rows["CPU per step (all processes)"].measured)
	require.Equal(t, "no", rows["CPU per step (all processes)"].met)
	require.Equal(t, "no", rows["1-step execution"].met)
	require.Equal(t, goalRow{figure: "10,000 timers due at once: lateness p99", measured: "1,200 ms", goal: "<= 300 ms (10,000)", met: "no"},
		rows["10"])
	require.Equal(t, goalRow{figure: "memory per sleeping execution (RSS)", measured: "not measured", goal: "<= 2 KiB (100,000)", met: "-"},
		rows["memory per sleeping execution (RSS)"])

	// A smaller timer or sleepers run says so; -fsync has its own steps/s goal.
	rows = byFigure(goalRows(figures{fsync: true, stepsPerSec: 1600, timers: 500, timerLate: 200 * time.Millisecond,
		sleepers: 1000, sleeperBytes: 1500}))
	require.Len(t, rows, 8)
	require.Equal(t, "-", rows["steps/s"].met, "-fsync measures not the default mode's goal")
	require.Equal(t, goalRow{figure: "steps/s with fsync on every write", measured: "1,600", goal: ">= 1,500", met: "yes"},
		rows["steps/s with fsync on every write"])
	require.Equal(t, "yes (smaller run)", rows["500 timers due at once: lateness p99"].met)
	require.Equal(t, goalRow{figure: "memory per sleeping execution (RSS), 1,000 asleep", measured: "1.46 KiB", goal: "<= 2 KiB (100,000)",
		met: "yes (smaller run)"}, rows["memory per sleeping execution (RSS)"])
	require.Equal(t, "-", rows["per step p50"].met)

	// Timers armed after their due time make the lateness the benchmark's.
	rows = byFigure(goalRows(figures{timers: 10_000, timerLate: 30 * time.Second, timersArmedLate: 7069}))
	require.Equal(t, "invalid: 7069 armed after T (raise -timer-lead)", rows["10"].met)
}

func TestPrintGoals(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	printGoals(&out, figures{})
	require.Empty(t, out.String(), "a run that measured none of the figures prints no table")
	printGoals(&out, figures{stepsPerSec: 3000, fsync: true})
	require.Contains(t, out.String(), "goals (issue 14)")
	require.Contains(t, out.String(), "-fsync: every write fsynced")
	require.Regexp(t, `steps/s with fsync on every write +3,000 +>= 1,500 +yes\n`, out.String())
}

func TestTakeFootprint(t *testing.T) {
	t.Parallel()
	f := takeFootprint()
	require.Positive(t, f.goroutines)
	require.Positive(t, f.heap)
	require.Positive(t, f.live)
	require.LessOrEqual(t, f.live, f.heap, "live objects fit in the spans in use")
	if runtime.GOOS == "linux" {
		require.Positive(t, f.rss, "VmRSS from /proc/self/status")
		require.Positive(t, f.rssFile, "RssFile: the binary's code is file-backed")
		require.Less(t, f.rssFile, f.rss)
	}
}

func TestNewFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-single1", "-1"}, "-single1, -sleepers, -sleepers-settle and -sync-interval must be non-negative"},
		{[]string{"-sleepers", "-5"}, "-single1, -sleepers, -sleepers-settle and -sync-interval must be non-negative"},
		{[]string{"-sleepers-settle", "-1s"}, "-single1, -sleepers, -sleepers-settle and -sync-interval must be non-negative"},
		{[]string{"-projector-coalesce", "-1s"}, "-projector-coalesce -1s: out of range, use 0 (write at every batch) to 10s"},
		{[]string{"-projector-coalesce", "20s"}, "-projector-coalesce 20s: out of range, use 0 (write at every batch) to 10s"},
		{[]string{"-projector-gather", "2s"}, "-projector-gather 2s: out of range, use 0 (each event as it comes) to 1s"},
		{[]string{"-fsync", "-sync-interval", "1s"}, "-fsync and -sync-interval exclude each other"},
		{[]string{"-dispatcher-workers", "-1"}, "-dispatcher-workers -1: out of range, use 1 to 4096, or 0 for the dispatcher's default"},
		{[]string{"-soak", "1m", "-sleepers", "10"}, "-soak runs alone: drop -sleepers"},
		{[]string{"-soak", "1m", "-single1", "10"}, "-soak runs alone: drop -single1"},
		{[]string{"-soak", "1m", "-nats-process"}, "-soak runs alone: drop -nats-process"},
	} {
		err := run(t.Context(), c.args, new(bytes.Buffer))
		require.ErrorContains(t, err, c.want, "%v", c.args)
	}
}

// TestSingle1AndSleepersRuns runs the 1-step, sleepers and timer runs on
// a small scale, on the whole system with an fsync on every write, and
// checks what they report.
func TestSingle1AndSleepersRuns(t *testing.T) {
	ctx := t.Context()
	// As -fsync -group-commit runs it (docs/adr/0020): the runs below go
	// through the dispatcher's atomic batches.
	info, stop, err := startStack(ctx, devstack.Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), SyncAlways: true, GroupCommit: true})
	require.NoError(t, err)
	defer stop()
	require.True(t, info.Server.JetStreamConfig().SyncAlways, "the stack passes SyncAlways to its server")
	conn, err := info.Dial(ctx, auth.RoleAdmin, "jetflow-bench-test")
	require.NoError(t, err)
	defer conn.NC.Close()
	store, err := catalog.Open(ctx, conn.JS)
	require.NoError(t, err)

	var out bytes.Buffer
	p50, err := runSingle1(ctx, &out, conn, store, 3, false)
	require.NoError(t, err)
	require.Positive(t, p50)
	require.Contains(t, out.String(), "1-step run: 3 executions of one noop step one after another\n  start-to-finish  p50 ")

	res, err := runSleepers(ctx, &out, conn, store, 20, time.Second)
	t.Log(out.String())
	require.NoError(t, err, "every one of the 20 is recorded sleeping, none ended")
	require.Contains(t, out.String(), "sleepers run: 20 executions of a one-step workflow sleeping 1h")
	require.Contains(t, out.String(), "; measured 1s later\n")
	require.Contains(t, out.String(), "goroutines       ")
	require.Contains(t, out.String(), "live heap        ")
	require.Contains(t, out.String(), "of which files   ")
	require.Positive(t, res.after.goroutines)
	if _, err := os.Stat("/proc/self/status"); err == nil {
		require.True(t, res.rssKnown)
		require.Contains(t, out.String(), " KiB per sleeping execution")
	}

	// The timer run reads back when each firing was stored, and that is
	// its figure; its burst's profile is written.
	out.Reset()
	prof := filepath.Join(t.TempDir(), "burst.prof")
	p99, armedLate, err := runTimers(ctx, &out, conn, store, 20, 3*time.Second, prof, 200*time.Millisecond)
	t.Log(out.String())
	require.NoError(t, err)
	require.Zero(t, armedLate, "armed 3 s ahead")
	require.Contains(t, out.String(), "  timers fired     20 (0 before T)\n")
	require.Contains(t, out.String(), "  executions       20 succeeded, 0 failed\n")
	require.Regexp(t, `\n  read back        [0-9]+ events of the run, from [0-9.]+m?s after T, in `, out.String())
	var decided, storedAt time.Duration
	for _, line := range strings.Split(out.String(), "\n") {
		for name, d := range map[string]*time.Duration{"fire lateness": &decided, "fire stored": &storedAt} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
				f := strings.Fields(rest) // p50 X p90 X p99 X max X
				require.Len(t, f, 8, line)
				*d, err = time.ParseDuration(f[5])
				require.NoError(t, err, line)
			}
		}
	}
	require.Positive(t, storedAt, "every firing read back: %s", out.String())
	require.Equal(t, storedAt, p99.Round(10*time.Microsecond), "the figure is the stored p99")
	require.GreaterOrEqual(t, storedAt, decided, "each firing is stored after it is decided (one machine's clock)")
	require.Contains(t, out.String(), "  CPU profile      "+prof)
	info2, err := os.Stat(prof)
	require.NoError(t, err)
	require.Positive(t, info2.Size())

	// A second run on the same stack reads its own executions only.
	out.Reset()
	_, _, err = runTimers(ctx, &out, conn, store, 7, 3*time.Second, "", 0)
	t.Log(out.String())
	require.NoError(t, err)
	require.Contains(t, out.String(), "  timers armed     7, ")
	require.Contains(t, out.String(), "  timers fired     7 (0 before T)\n")
	require.Contains(t, out.String(), "  executions       7 succeeded, 0 failed\n")
	require.NotContains(t, out.String(), "CPU profile")
}

// The goals table reads back as the figures it prints (rounded as it
// prints them): jetflow-benchcompare reads builds older than -figures
// from it.
func TestGoalsTableReadsBack(t *testing.T) {
	t.Parallel()
	for _, f := range []figures{
		{stepsPerSec: 5029.4, spread: 1.2412, cpuPerStep: 380 * time.Microsecond, perStep: 238 * time.Microsecond,
			oneStep: 1234567 * time.Nanosecond, timerLate: 1736 * time.Millisecond, timers: 10000,
			sleeperBytes: 2.25 * 1024, sleepers: 100000},
		{stepsPerSec: 1411, fsync: true, cpuPerStep: 610 * time.Microsecond},
		{timerLate: 736 * time.Millisecond, timers: 2000, timersArmedLate: 12},
	} {
		var b strings.Builder
		printGoals(&b, f)
		got, ok := benchcompare.ParseGoals("output before it\n" + b.String())
		require.True(t, ok, b.String())
		want := f.export()
		require.InDelta(t, want.StepsPerSec, got.StepsPerSec, 0.5, b.String())
		require.Equal(t, want.Fsync, got.Fsync)
		require.InDelta(t, want.Spread, got.Spread, 0.005)
		require.InDelta(t, want.CPUPerStepMs, got.CPUPerStepMs, 0.0005)
		require.InDelta(t, want.PerStepMs, got.PerStepMs, 0.0005)
		require.InDelta(t, want.OneStepMs, got.OneStepMs, 0.005)
		require.InDelta(t, want.TimerLateMs, got.TimerLateMs, 0.5)
		require.Equal(t, want.Timers, got.Timers)
		require.Equal(t, want.TimersArmedLate > 0, got.TimersArmedLate > 0)
		require.InDelta(t, want.SleeperKiB, got.SleeperKiB, 0.005)
		require.Equal(t, want.Sleepers, got.Sleepers)
	}
	_, ok := benchcompare.ParseGoals("a run that printed no goals table")
	require.False(t, ok)
}
