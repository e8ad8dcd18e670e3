package benchcompare_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/tools/internal/benchcompare"
)

func TestMedian(t *testing.T) {
	t.Parallel()
	require.Zero(t, benchcompare.Median(nil))
	require.InDelta(t, 2.0, benchcompare.Median([]float64{3, 1, 2}), 1e-9)
	require.InDelta(t, 2.5, benchcompare.Median([]float64{4, 1, 3, 2}), 1e-9)
	xs := []float64{3, 1, 2}
	benchcompare.Median(xs)
	require.Equal(t, []float64{3, 1, 2}, xs, "left as it was")
}

// The two-sided sign test against the binomial distribution's values.
func TestSignTest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		k, m int
		p    float64
	}{
		{6, 0, 2.0 / 64}, {0, 6, 2.0 / 64}, {5, 1, 2 * 7.0 / 64}, {3, 3, 1}, {0, 0, 1},
		{8, 0, 2.0 / 256}, {7, 1, 2 * 9.0 / 256}, {10, 2, 2 * 79.0 / 4096},
	} {
		require.InDelta(t, tt.p, benchcompare.SignTest(tt.k, tt.m), 1e-12, "%d against %d", tt.k, tt.m)
	}
}

// Compare reads each figure the way it is better (steps/s up, the rest
// down), leaves out the pairs that did not measure it in both runs, and
// a timer run whose timers were armed too late.
func TestCompare(t *testing.T) {
	t.Parallel()
	var pairs []benchcompare.Pair
	for i := range 6 {
		old := benchcompare.Figures{StepsPerSec: 5000 + float64(i), CPUPerStepMs: 0.400, TimerLateMs: 500, Timers: 10000}
		nw := benchcompare.Figures{StepsPerSec: 5500 + float64(i), CPUPerStepMs: 0.380, TimerLateMs: 400, Timers: 10000}
		if i == 5 {
			nw.CPUPerStepMs = 0 // not measured in this run
			nw.TimersArmedLate = 3
		}
		pairs = append(pairs, benchcompare.Pair{Old: old, New: nw})
	}
	rows := benchcompare.Compare(pairs)
	require.Len(t, rows, 3, "steps/s, CPU per step, timers: the rest was measured nowhere")

	steps := rows[0]
	require.Equal(t, "steps/s", steps.Figure)
	require.True(t, steps.HigherBetter)
	require.Equal(t, 6, steps.Better)
	require.Zero(t, steps.Worse)
	require.InDelta(t, 5502.5/5002.5, steps.Ratio, 1e-9)
	require.InDelta(t, (5502.0/5002+5503.0/5003)/2, steps.PairRatio, 1e-9, "the median of the pairs' ratios")
	require.InDelta(t, 2.0/64, steps.P, 1e-12)

	cpu := rows[1]
	require.Equal(t, "CPU per step", cpu.Figure)
	require.Len(t, cpu.Old, 5, "the pair without it left out")
	require.Equal(t, 5, cpu.Better, "less is better")
	require.InDelta(t, 0.95, cpu.Ratio, 1e-9)

	timers := rows[2]
	require.Len(t, timers.New, 5, "the run whose timers were armed late left out")

	// The other way round, it is worse every time.
	for i := range pairs {
		pairs[i].Old, pairs[i].New = pairs[i].New, pairs[i].Old
	}
	rows = benchcompare.Compare(pairs)
	require.Equal(t, 6, rows[0].Worse)
	require.Zero(t, rows[0].Better)
	require.False(t, math.IsNaN(rows[0].P))
}

// On a machine that drifts between pairs, the pairs' ratios tell the
// change that the ratio of each side's median blurs (as in the runs of
// docs/benchmarks.md, "An end carries the last success").
func TestPairRatioSeesThroughDrift(t *testing.T) {
	t.Parallel()
	var pairs []benchcompare.Pair
	for _, p := range [][2]float64{{0.30, 0.33}, {0.40, 0.36}, {0.31, 0.28}, {0.39, 0.35}, {0.32, 0.29}, {0.38, 0.345}} {
		pairs = append(pairs, benchcompare.Pair{Old: benchcompare.Figures{CPUPerStepMs: p[0]}, New: benchcompare.Figures{CPUPerStepMs: p[1]}})
	}
	r := benchcompare.Compare(pairs)[0]
	require.InDelta(t, (0.28/0.31+0.29/0.32)/2, r.PairRatio, 1e-9, "the median of the pairs' ratios: about -10%")
	require.InDelta(t, 0.3375/0.35, r.Ratio, 1e-9, "the medians' ratio: about -4%")
	require.Equal(t, 5, r.Better)
	var b bytes.Buffer
	benchcompare.Print(&b, []benchcompare.Row{r})
	require.Contains(t, b.String(), "0.905  5 of 6 pairs (worse in 1)")
}

func TestPrint(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	benchcompare.Print(&b, nil)
	require.Contains(t, b.String(), "no figure was measured by both builds")

	b.Reset()
	clear := []benchcompare.Pair{}
	for range 6 {
		clear = append(clear, benchcompare.Pair{Old: benchcompare.Figures{CPUPerStepMs: 0.4}, New: benchcompare.Figures{CPUPerStepMs: 0.3}})
	}
	benchcompare.Print(&b, benchcompare.Compare(clear))
	require.Contains(t, b.String(), "CPU per step (ms)  0.400")
	require.Contains(t, b.String(), "0.750  6 of 6 pairs: sign test p = 0.031")
	require.Contains(t, b.String(), "0.400 / 0.300, 0.400 / 0.300")

	b.Reset()
	mixed := []benchcompare.Pair{
		{Old: benchcompare.Figures{StepsPerSec: 5000}, New: benchcompare.Figures{StepsPerSec: 5100}},
		{Old: benchcompare.Figures{StepsPerSec: 5000}, New: benchcompare.Figures{StepsPerSec: 4900}},
	}
	benchcompare.Print(&b, benchcompare.Compare(mixed))
	require.Contains(t, b.String(), "1 of 2 pairs (worse in 1): not told from noise (sign test p = 1.00)")
}
