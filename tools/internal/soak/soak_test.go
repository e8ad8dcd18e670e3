package soak

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	t.Parallel()
	require.Equal(t, Latency{}, Summarize(nil))
	require.Equal(t, Latency{N: 1, P50: 7, P90: 7, P99: 7, Max: 7}, Summarize([]time.Duration{7}))

	// 100 values 1..100 ms, shuffled: nearest rank gives the q-th value.
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	before := append([]time.Duration(nil), d...)
	l := Summarize(d)
	require.Equal(t, Latency{N: 100, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond,
		P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}, l)
	require.Equal(t, before, d, "Summarize must not reorder its argument")

	// Ten values: p99 is the largest, p90 the ninth, p50 the fifth.
	l = Summarize([]time.Duration{10, 1, 9, 2, 8, 3, 7, 4, 6, 5})
	require.Equal(t, Latency{N: 10, P50: 5, P90: 9, P99: 10, Max: 10}, l)
}

// series samples f every step from 0 to total.
func series(total, step time.Duration, f func(at time.Duration) float64) []Sample {
	var s []Sample
	for at := time.Duration(0); at <= total; at += step {
		s = append(s, Sample{At: at, Value: f(at)})
	}
	return s
}

func TestTheilSen(t *testing.T) {
	t.Parallel()
	require.Zero(t, TheilSen(nil))
	require.Zero(t, TheilSen([]Sample{{At: time.Minute, Value: 3}}))
	require.Zero(t, TheilSen([]Sample{{At: time.Minute, Value: 3}, {At: time.Minute, Value: 9}}), "no two samples at different times")

	line := series(10*time.Minute, 10*time.Second, func(at time.Duration) float64 { return 50 + 2*at.Minutes() })
	require.InDelta(t, 2, TheilSen(line), 1e-9)

	// A few wild outliers do not move the median slope.
	line[5].Value, line[30].Value, line[len(line)-1].Value = 500, -300, 900
	require.InDelta(t, 2, TheilSen(line), 0.05)
}

func TestMannKendallZ(t *testing.T) {
	t.Parallel()
	up := series(9*time.Minute, time.Minute, func(at time.Duration) float64 { return at.Minutes() })
	// n = 10, S = 45, Var = 10·9·25/18 = 125, z = 44/√125.
	require.InDelta(t, 44/math.Sqrt(125), MannKendallZ(up), 1e-9)

	down := series(9*time.Minute, time.Minute, func(at time.Duration) float64 { return -at.Minutes() })
	require.InDelta(t, -44/math.Sqrt(125), MannKendallZ(down), 1e-9)

	flat := series(9*time.Minute, time.Minute, func(time.Duration) float64 { return 7 })
	require.Zero(t, MannKendallZ(flat))
	require.Zero(t, MannKendallZ(nil))

	// Order of the argument does not matter: the time does.
	rev := []Sample{up[3], up[1], up[0], up[2]}
	require.Greater(t, MannKendallZ(rev), 0.0)

	// Ties are corrected for: 0,0,1,1 has S = 4, Var = (4·3·13 − 2·(2·1·9))/18 = 6.67.
	ties := []Sample{{0, 0}, {1, 0}, {2, 1}, {3, 1}}
	require.InDelta(t, 3/math.Sqrt((4*3*13-2*2*1*9)/18.0), MannKendallZ(ties), 1e-9)
}

func TestJudge(t *testing.T) {
	t.Parallel()
	const total = 10 * time.Minute
	const every = 10 * time.Second
	heap := Rule{MinSlope: 1}
	noise := func(seed uint64, amp float64) func() float64 {
		r := rand.New(rand.NewPCG(seed, seed))
		return func() float64 { return (r.Float64()*2 - 1) * amp }
	}

	t.Run("NoisyButFlat", func(t *testing.T) {
		t.Parallel()
		for seed := range uint64(50) {
			n := noise(seed, 8)
			tr := heap.Judge(series(total, every, func(time.Duration) float64 { return 120 + n() }), total)
			require.Equal(t, Flat, tr.Verdict, "seed %d: %s", seed, tr.Format("MiB"))
		}
	})
	t.Run("WarmupIsLeftOut", func(t *testing.T) {
		t.Parallel()
		// 20 MiB/min for the first four minutes, then flat.
		n := noise(1, 2)
		tr := heap.Judge(series(total, every, func(at time.Duration) float64 {
			return 40 + 20*min(at.Minutes(), 4) + n()
		}), total)
		require.Equal(t, Flat, tr.Verdict, tr.Format("MiB"))
		require.Equal(t, 5*time.Minute, tr.From)
		require.Equal(t, total, tr.To)
		require.Equal(t, 31, tr.Samples)
	})
	t.Run("SteadyLeak", func(t *testing.T) {
		t.Parallel()
		n := noise(2, 4)
		tr := heap.Judge(series(total, every, func(at time.Duration) float64 { return 100 + 2*at.Minutes() + n() }), total)
		require.Equal(t, Growing, tr.Verdict, tr.Format("MiB"))
		require.InDelta(t, 2, tr.Slope, 0.5)
		require.Greater(t, tr.Last, tr.First)
		require.Regexp(t, `^growing: 2(\.\d+)? MiB/min \(z \d+\.\d\d; `, tr.Format("MiB"))
	})
	t.Run("RealButNegligibleCreep", func(t *testing.T) {
		t.Parallel()
		// Without noise the trend is certain, but 0.2 MiB/min is below the
		// threshold: a figure, not a leak.
		tr := heap.Judge(series(total, every, func(at time.Duration) float64 { return 100 + 0.2*at.Minutes() }), total)
		require.Equal(t, Flat, tr.Verdict, tr.Format("MiB"))
		require.Greater(t, tr.Z, tr.Rule.Z)
		require.InDelta(t, 0.2, tr.Slope, 1e-9)
		require.Regexp(t, `^flat \(\+0\.2 MiB/min, z `, tr.Format("MiB"))
	})
	t.Run("OneSpikeIsNoLeak", func(t *testing.T) {
		t.Parallel()
		s := series(total, every, func(time.Duration) float64 { return 300 })
		s[len(s)-1].Value = 900
		tr := Rule{MinSlope: 2}.Judge(s, total)
		require.Equal(t, Flat, tr.Verdict, tr.Format("goroutines"))
	})
	t.Run("GoroutinesLeakOneEveryTenSeconds", func(t *testing.T) {
		t.Parallel()
		n := noise(3, 15)
		tr := Rule{MinSlope: 2}.Judge(series(total, every, func(at time.Duration) float64 {
			return math.Round(400 + 6*at.Minutes() + n())
		}), total)
		require.Equal(t, Growing, tr.Verdict, tr.Format("goroutines"))
	})
	t.Run("StepsOfABufferAreNoLeakInAShortRun", func(t *testing.T) {
		t.Parallel()
		// The level moves in steps of 8 (one buffer more, or less) and
		// ends a step higher: a real trend of 2-3 a minute over the five
		// minutes judged, but no more growth than one step.
		steps := []float64{0, 0, 8, 0, 8, 8, 0, 8, 8, 16, 8, 8, 16, 8, 16, 8, 16, 16, 8, 16, 16, 24, 16, 16, 8, 16, 24, 16, 16, 24, 16}
		s := make([]Sample, 0, len(steps))
		for i, v := range steps {
			s = append(s, Sample{At: 5*time.Minute + time.Duration(i)*every, Value: 60 + v})
		}
		r := Rule{MinSlope: 1, MinGrowth: 16}
		tr := r.Judge(s, total)
		require.Equal(t, Flat, tr.Verdict, tr.Format("MiB"))
		require.Greater(t, tr.Z, tr.Rule.Z, "the trend is real")
		require.Greater(t, tr.Slope, 1.0, "and steeper than the slope threshold")
		require.Contains(t, tr.Format("MiB"), "and > 16 MiB in all)")
		// Without the growth threshold the same series is a leak.
		require.Equal(t, Growing, Rule{MinSlope: 1}.Judge(s, total).Verdict)
		// The same slope for an hour is a leak whatever the steps.
		n := noise(4, 8)
		long := r.Judge(series(time.Hour, every, func(at time.Duration) float64 { return 60 + 2.5*at.Minutes() + n() }), time.Hour)
		require.Equal(t, Growing, long.Verdict, long.Format("MiB"))
		require.InDelta(t, 75, long.Growth, 10)
	})
	t.Run("TooShort", func(t *testing.T) {
		t.Parallel()
		tr := heap.Judge(series(20*time.Second, 5*time.Second, func(at time.Duration) float64 { return at.Minutes() * 100 }), 20*time.Second)
		require.Equal(t, TooShort, tr.Verdict)
		require.Equal(t, 3, tr.Samples)
		require.Equal(t, "too short to judge (3 samples after warm-up, a verdict needs 8)", tr.Format("MiB"))
		require.Equal(t, TooShort, heap.Judge(nil, 0).Verdict)
	})
}

func TestRuleValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, Rule{MinSlope: 1}.Validate())
	require.NoError(t, Rule{MinSlope: 0.5, Z: 3, MinSamples: 20, Warmup: 0.25}.Validate())
	for _, r := range []Rule{
		{},
		{MinSlope: -1},
		{MinSlope: math.NaN()},
		{MinSlope: math.Inf(1)},
		{MinSlope: 1, Z: -1},
		{MinSlope: 1, MinSamples: 2},
		{MinSlope: 1, Warmup: 1},
		{MinSlope: 1, Warmup: -0.1},
		{MinSlope: 1, MinGrowth: -1},
		{MinSlope: 1, MinGrowth: math.NaN()},
	} {
		require.Error(t, r.Validate(), "%+v", r)
	}
}

func TestParseVmRSS(t *testing.T) {
	t.Parallel()
	status := "Name:\tjetflow-bench\nVmPeak:\t  900000 kB\nVmRSS:\t  123456 kB\nThreads:\t12\n"
	n, ok := ParseVmRSS(status)
	require.True(t, ok)
	require.Equal(t, int64(123456*1024), n)
	for _, bad := range []string{"", "Name: x\n", "VmRSS: lots kB\n", "VmRSS: 12 MB\n", "VmRSS: -4 kB\n", "VmRSS:\n"} {
		_, ok := ParseVmRSS(bad)
		require.False(t, ok, "%q", bad)
	}
	status = "VmRSS:\t  123456 kB\nRssAnon:\t  100000 kB\nRssFile:\t   23456 kB\n"
	n, ok = ParseStatusKB(status, "RssFile")
	require.True(t, ok)
	require.Equal(t, int64(23456*1024), n)
	_, ok = ParseStatusKB(status, "Rss") // a prefix of a field is no field
	require.False(t, ok)
}
