// Package soak holds the pure calculations of jetflow-bench's soak run:
// latency percentiles, the trend of a resource sampled over time, and the
// leak verdict drawn from it. Nothing here reads a clock or does I/O, so
// the rules can be tested on made-up series.
//
// # The leak rule
//
// A resource (heap after a forced GC, goroutines, open files) is sampled
// at a fixed period while a steady load runs. Only the samples of the
// second half of the run are judged: the first half is warm-up (caches,
// the streams' duplicate windows and the retention of finished executions
// reach their steady state there). The series is called growing only when
// both of these hold:
//
//   - the trend is real: the Mann–Kendall test of a monotonic trend gives
//     z above [Rule.Z] (2.33 by default: one-sided, 1% false alarms on a
//     series of pure noise), so that noise, a GC that ran late or a burst
//     on a shared machine does not make a slope;
//   - the trend matters: its Theil–Sen slope (the median of the slopes
//     between every two samples, which ignores a few outliers) is above
//     [Rule.MinSlope] per minute, so that a real but negligible creep is
//     reported as a figure, not as a leak, and the growth it gives over
//     the judged samples is above [Rule.MinGrowth], so that a level that
//     moves in large steps (nats-server holds the message blocks it reads
//     in 4 or 8 MiB buffers) does not make a leak of one more step in a
//     short run.
//
// With fewer than [Rule.MinSamples] samples after warm-up there is no
// verdict ("too short to judge"), which is not a failure.
package soak

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Latency summarises a set of durations with nearest-rank percentiles.
type Latency struct {
	N                  int
	P50, P90, P99, Max time.Duration
}

// Summarize returns the percentiles of d (nearest rank: the smallest value
// with at least q of the values at or below it). It does not modify d.
// The zero Latency (N 0) stands for an empty set.
func Summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return Latency{N: len(s), P50: rank(s, 0.50), P90: rank(s, 0.90), P99: rank(s, 0.99), Max: s[len(s)-1]}
}

// rank is the nearest-rank q-quantile of the sorted, non-empty s.
func rank(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(len(s)-1, i))]
}

// Sample is one measurement of a resource: At is the time since the run
// began.
type Sample struct {
	At    time.Duration
	Value float64
}

// TheilSen returns the Theil–Sen slope of s per minute: the median of the
// slopes between every two samples taken at different times. It is 0 with
// fewer than two such samples.
func TheilSen(s []Sample) float64 {
	var slopes []float64
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			dt := (s[j].At - s[i].At).Minutes()
			if dt == 0 {
				continue
			}
			slopes = append(slopes, (s[j].Value-s[i].Value)/dt)
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	slices.Sort(slopes)
	n := len(slopes)
	if n%2 == 1 {
		return slopes[n/2]
	}
	return (slopes[n/2-1] + slopes[n/2]) / 2
}

// MannKendallZ returns the Mann–Kendall statistic of s, in time order, as
// a z score: positive for an increasing trend, negative for a decreasing
// one, near 0 for none. Ties (equal values, frequent in goroutine counts)
// are corrected for; a constant series gives 0.
func MannKendallZ(s []Sample) float64 {
	s = slices.Clone(s)
	slices.SortStableFunc(s, func(a, b Sample) int { return cmp.Compare(a.At, b.At) })
	n := len(s)
	var stat float64
	for i := range s {
		for j := i + 1; j < n; j++ {
			switch {
			case s[j].Value > s[i].Value:
				stat++
			case s[j].Value < s[i].Value:
				stat--
			}
		}
	}
	ties := map[float64]int{}
	for _, x := range s {
		ties[x.Value]++
	}
	nf := float64(n)
	variance := nf * (nf - 1) * (2*nf + 5)
	for _, t := range ties {
		tf := float64(t)
		variance -= tf * (tf - 1) * (2*tf + 5)
	}
	variance /= 18
	switch {
	case variance <= 0 || stat == 0:
		return 0
	case stat > 0:
		return (stat - 1) / math.Sqrt(variance)
	default:
		return (stat + 1) / math.Sqrt(variance)
	}
}

// Rule is the leak rule for one resource (see the package comment).
type Rule struct {
	// MinSlope is the growth per minute above which a real trend is a
	// leak, in the resource's unit. Must be positive.
	MinSlope float64
	// MinGrowth is the growth over the judged samples (the slope times
	// their span) above which a real trend is a leak: the noise of the
	// level, in the resource's unit. Default 0: the slope alone decides.
	MinGrowth float64
	// Z is the Mann–Kendall z above which a trend is real. Default 2.33.
	Z float64
	// MinSamples is how many samples after warm-up a verdict needs.
	// Default 8.
	MinSamples int
	// Warmup is the share of the run left out, from its start. Default
	// 0.5; it must be in [0, 1).
	Warmup float64
}

// Verdict is what a rule concludes about a series.
type Verdict int

// The verdicts.
const (
	// TooShort means there were too few samples after warm-up.
	TooShort Verdict = iota
	// Flat means no leak: no real trend, or one below the slope threshold.
	Flat
	// Growing means a leak: a real trend steeper than the threshold.
	Growing
)

// Trend is a rule's judgement of a series.
type Trend struct {
	Verdict Verdict
	// Samples is how many samples were judged (those after warm-up).
	Samples int
	// From and To bound the judged samples.
	From, To time.Duration
	// Slope is the Theil–Sen slope per minute and Z the Mann–Kendall z;
	// Growth is the slope times the span of the judged samples.
	Slope, Z, Growth float64
	// First and Last are the median of the first and of the last quarter
	// of the judged samples: the level before and after.
	First, Last float64
	// Rule is the rule applied, with its defaults.
	Rule Rule
}

// withDefaults fills the rule's unset fields.
func (r Rule) withDefaults() Rule {
	if r.Z == 0 {
		r.Z = 2.33
	}
	if r.MinSamples == 0 {
		r.MinSamples = 8
	}
	if r.Warmup == 0 {
		r.Warmup = 0.5
	}
	return r
}

// Validate says what is wrong with the rule, or nil.
func (r Rule) Validate() error {
	r = r.withDefaults()
	switch {
	case !(r.MinSlope > 0) || math.IsInf(r.MinSlope, 0):
		return fmt.Errorf("soak: the slope threshold must be positive, not %v", r.MinSlope)
	case !(r.MinGrowth >= 0) || math.IsInf(r.MinGrowth, 0):
		return fmt.Errorf("soak: the growth threshold must be zero or positive, not %v", r.MinGrowth)
	case !(r.Z > 0):
		return fmt.Errorf("soak: the z threshold must be positive, not %v", r.Z)
	case r.MinSamples < 3:
		return fmt.Errorf("soak: a verdict needs at least 3 samples, not %d", r.MinSamples)
	case !(r.Warmup >= 0 && r.Warmup < 1):
		return fmt.Errorf("soak: the warm-up share must be in [0, 1), not %v", r.Warmup)
	}
	return nil
}

// Judge applies the rule to the samples of a run that lasted total: it
// keeps those taken at or after Warmup×total and judges their trend.
func (r Rule) Judge(s []Sample, total time.Duration) Trend {
	r = r.withDefaults()
	cut := time.Duration(r.Warmup * float64(total))
	var kept []Sample
	for _, x := range s {
		if x.At >= cut {
			kept = append(kept, x)
		}
	}
	slices.SortStableFunc(kept, func(a, b Sample) int { return cmp.Compare(a.At, b.At) })
	t := Trend{Rule: r, Samples: len(kept)}
	if len(kept) > 0 {
		t.From, t.To = kept[0].At, kept[len(kept)-1].At
	}
	if len(kept) < r.MinSamples {
		return t
	}
	t.Slope, t.Z = TheilSen(kept), MannKendallZ(kept)
	q := max(1, len(kept)/4)
	t.First, t.Last = median(kept[:q]), median(kept[len(kept)-q:])
	t.Growth = t.Slope * (t.To - t.From).Minutes()
	t.Verdict = Flat
	if t.Z > r.Z && t.Slope > r.MinSlope && t.Growth > r.MinGrowth {
		t.Verdict = Growing
	}
	return t
}

func median(s []Sample) float64 {
	v := make([]float64, len(s))
	for i, x := range s {
		v[i] = x.Value
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// Format says the verdict in words, with the slope in unit per minute:
// "flat (+0.12 MiB/min, z 1.05; ...)", "growing: 3.4 MiB/min (z 4.20; ...)"
// or "too short to judge (...)".
func (t Trend) Format(unit string) string {
	if t.Verdict == TooShort {
		return fmt.Sprintf("too short to judge (%d samples after warm-up, a verdict needs %d)", t.Samples, t.Rule.MinSamples)
	}
	detail := fmt.Sprintf("z %.2f; %s → %s over %s..%s, %d samples; a leak is z > %.2f and > %s %s/min",
		t.Z, num(t.First), num(t.Last), t.From.Round(time.Second), t.To.Round(time.Second), t.Samples, t.Rule.Z, num(t.Rule.MinSlope), unit)
	if t.Rule.MinGrowth > 0 {
		detail += fmt.Sprintf(" and > %s %s in all", num(t.Rule.MinGrowth), unit)
	}
	if t.Verdict == Growing {
		return fmt.Sprintf("growing: %s %s/min (%s)", num(t.Slope), unit, detail)
	}
	return fmt.Sprintf("flat (%s%s %s/min, %s)", sign(t.Slope), num(math.Abs(t.Slope)), unit, detail)
}

func sign(x float64) string {
	if x < 0 {
		return "-"
	}
	return "+"
}

// num prints x with at most two decimals and no trailing zeros.
func num(x float64) string {
	s := strconv.FormatFloat(x, 'f', 2, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}

// ParseVmRSS returns the resident set size, in bytes, from the text of
// Linux's /proc/<pid>/status (its "VmRSS:  1234 kB" line), and whether it
// found one.
func ParseVmRSS(status string) (int64, bool) { return ParseStatusKB(status, "VmRSS") }

// ParseStatusKB returns the field of Linux's /proc/<pid>/status given by
// its name (a "RssFile:  1234 kB" line), in bytes, and whether it found
// one.
func ParseStatusKB(status, field string) (int64, bool) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}
