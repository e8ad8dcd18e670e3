// Package benchcompare compares the figures of two builds of
// jetflow-bench run in alternating pairs: the way to tell a change of a
// few percent from the noise of a shared machine (docs/benchmarks.md,
// "Comparing two commits").
//
// Figures is what one run measured, as jetflow-bench -figures writes it;
// Compare reduces pairs of runs to a row per figure: both builds' values,
// their medians, the ratio of the medians, in how many pairs the new
// build did better, and a two-sided sign test of that count.
package benchcompare

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Figures is what one run of jetflow-bench measured of the speed goals
// (issue 14). A figure the run did not measure is zero.
type Figures struct {
	// StepsPerSec is the throughput run's steps per second (with the read
	// models caught up); Fsync says every write was fsynced (-fsync).
	StepsPerSec float64 `json:"steps_per_sec,omitempty"`
	Fsync       bool    `json:"fsync,omitempty"`
	// NATSProcess: nats-server ran in a process of its own
	// (jetflow-bench -nats-process), counted in the CPU and memory.
	NATSProcess bool `json:"nats_process,omitempty"`
	// Spread is the throughput run's start-to-finish p99 divided by p50.
	Spread float64 `json:"p99_over_p50,omitempty"`
	// CPUPerStepMs is the process's CPU time over the throughput run
	// divided by its steps, in milliseconds.
	CPUPerStepMs float64 `json:"cpu_per_step_ms,omitempty"`
	// PerStepMs is the single-execution run's per-step p50.
	PerStepMs float64 `json:"per_step_p50_ms,omitempty"`
	// OneStepMs is the 1-step run's start-to-finish p50.
	OneStepMs float64 `json:"one_step_p50_ms,omitempty"`
	// TimerLateMs is the timer run's fire lateness p99, Timers its size,
	// TimersArmedLate the timers armed after their due time (the
	// lateness is then the benchmark's).
	TimerLateMs     float64 `json:"timer_lateness_p99_ms,omitempty"`
	Timers          int     `json:"timers,omitempty"`
	TimersArmedLate int     `json:"timers_armed_late,omitempty"`
	// SleeperKiB is the sleepers run's RSS growth per sleeping execution,
	// Sleepers its size.
	SleeperKiB float64 `json:"sleeper_kib,omitempty"`
	Sleepers   int     `json:"sleepers,omitempty"`
}

// figure is one figure a comparison looks at: how to read it from a run,
// and whether more is better.
type figure struct {
	name   string
	unit   string
	value  func(Figures) float64
	higher bool // more is better (steps/s); else less is
}

var figureList = []figure{
	{"steps/s", "", func(f Figures) float64 { return f.StepsPerSec }, true},
	{"CPU per step", "ms", func(f Figures) float64 { return f.CPUPerStepMs }, false},
	{"p99 / p50", "", func(f Figures) float64 { return f.Spread }, false},
	{"per step p50, one at a time", "ms", func(f Figures) float64 { return f.PerStepMs }, false},
	{"1-step p50", "ms", func(f Figures) float64 { return f.OneStepMs }, false},
	{"timers: lateness p99", "ms", func(f Figures) float64 {
		if f.TimersArmedLate > 0 { // the benchmark's lateness, not the timers'
			return 0
		}
		return f.TimerLateMs
	}, false},
	{"memory per sleeper", "KiB", func(f Figures) float64 { return f.SleeperKiB }, false},
}

// Pair is one pair of runs, one of each build.
type Pair struct{ Old, New Figures }

// Row is one figure compared over the pairs that measured it in both runs.
type Row struct {
	Figure, Unit string
	// HigherBetter: more of it is better (steps/s).
	HigherBetter bool
	Old, New     []float64 // by pair
	// OldMedian, NewMedian and Ratio (NewMedian / OldMedian); PairRatio
	// is the median of each pair's new / old, the change as the pairs
	// measure it (the machine's drift between pairs left out).
	OldMedian, NewMedian, Ratio, PairRatio float64
	// Better counts the pairs in which the new build did better, Worse
	// those in which it did worse (a tie is neither).
	Better, Worse int
	// P is the two-sided sign test's p-value of Better against Worse:
	// the chance of a split at least this lopsided if the builds were
	// the same.
	P float64
}

// Compare returns a row for each figure measured in both runs of at least
// one pair, in the goals' order.
func Compare(pairs []Pair) []Row {
	var rows []Row
	for _, f := range figureList {
		r := Row{Figure: f.name, Unit: f.unit, HigherBetter: f.higher}
		for _, p := range pairs {
			o, n := f.value(p.Old), f.value(p.New)
			if o <= 0 || n <= 0 {
				continue
			}
			r.Old, r.New = append(r.Old, o), append(r.New, n)
			switch {
			case n == o:
			case (n > o) == f.higher:
				r.Better++
			default:
				r.Worse++
			}
		}
		if len(r.Old) == 0 {
			continue
		}
		r.OldMedian, r.NewMedian = Median(r.Old), Median(r.New)
		r.Ratio = r.NewMedian / r.OldMedian
		ratios := make([]float64, len(r.Old))
		for i := range r.Old {
			ratios[i] = r.New[i] / r.Old[i]
		}
		r.PairRatio = Median(ratios)
		r.P = SignTest(r.Better, r.Worse)
		rows = append(rows, r)
	}
	return rows
}

// Median is the median of xs (the mean of the middle two for an even
// count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// SignTest is the two-sided sign test's p-value of k successes against m
// failures (ties left out): twice the chance, with a fair coin, of a
// count at least as far from even as the smaller of the two, at most 1.
func SignTest(k, m int) float64 {
	n := k + m
	if n == 0 {
		return 1
	}
	low := min(k, m)
	p := 0.0
	for i := 0; i <= low; i++ {
		p += binomial(n, i)
	}
	return math.Min(1, 2*p*math.Pow(0.5, float64(n)))
}

func binomial(n, k int) float64 {
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

// Print writes the rows as a table: the values of each pair (old / new),
// the medians, the ratio, and the pairs in which the new build did
// better. A split the sign test cannot tell from chance (p above 0.05)
// says so.
func Print(out io.Writer, rows []Row) {
	if len(rows) == 0 {
		fmt.Fprintln(out, "no figure was measured by both builds in any pair")
		return
	}
	w := len("figure")
	for _, r := range rows {
		w = max(w, len(label(r)))
	}
	fmt.Fprintf(out, "%-*s  %-12s  %-12s  %7s  %s\n", w, "figure", "old median", "new median", "new/old", "new better in")
	// new/old is the median of the pairs' ratios: a machine that drifts
	// between pairs moves both runs of a pair, not their ratio.
	for _, r := range rows {
		verdict := fmt.Sprintf("%d of %d pairs", r.Better, len(r.Old))
		if r.Worse > 0 {
			verdict += fmt.Sprintf(" (worse in %d)", r.Worse)
		}
		if r.P > 0.05 {
			verdict += fmt.Sprintf(": not told from noise (sign test p = %.2f)", r.P)
		} else {
			verdict += fmt.Sprintf(": sign test p = %.3f", r.P)
		}
		fmt.Fprintf(out, "%-*s  %-12s  %-12s  %7s  %s\n", w, label(r), number(r.OldMedian), number(r.NewMedian),
			strconv.FormatFloat(r.PairRatio, 'f', 3, 64), verdict)
	}
	fmt.Fprintln(out, "(new/old: the median of the pairs' ratios, not the ratio of the medians)")
	fmt.Fprintln(out, "\nby pair (old / new):")
	for _, r := range rows {
		cells := make([]string, len(r.Old))
		for i := range r.Old {
			cells[i] = number(r.Old[i]) + " / " + number(r.New[i])
		}
		fmt.Fprintf(out, "  %-*s  %s\n", w, label(r), strings.Join(cells, ", "))
	}
}

func label(r Row) string {
	if r.Unit == "" {
		return r.Figure
	}
	return r.Figure + " (" + r.Unit + ")"
}

// number writes x with three significant digits past the point for small
// figures, none for large ones (steps/s).
func number(x float64) string {
	if math.Abs(x) >= 100 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}
