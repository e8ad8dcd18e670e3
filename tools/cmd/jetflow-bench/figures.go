package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/tools/internal/benchcompare"
)

// figures are what a run measured of the speed goals (issue 14), for the
// goals table at its end. A figure the run did not measure is zero (its
// flag was off, or its run was skipped).
type figures struct {
	// stepsPerSec is the throughput run's steps per second; fsync says
	// the server fsynced every write (-fsync), which has a goal of its own.
	stepsPerSec float64
	fsync       bool
	// natsProcess says nats-server ran in a process of its own
	// (-nats-process), whose CPU and memory the figures count.
	natsProcess bool
	// spread is the throughput run's start-to-finish p99 divided by its p50.
	spread float64
	// cpuPerStep is the process's CPU time (user and system) over the
	// throughput run divided by the steps it ran.
	cpuPerStep time.Duration
	// perStep is the single-execution run's per-step p50.
	perStep time.Duration
	// oneStep is the 1-step run's start-to-finish p50.
	oneStep time.Duration
	// timerLate is the timer run's lateness p99 (when the firings were
	// stored), and timers its size.
	timerLate time.Duration
	timers    int
	// timersArmedLate counts the timer run's timers armed after their
	// due time: the benchmark could not start them in time (a busy
	// machine, or -timer-lead too short), so the lateness is not the
	// timers'.
	timersArmedLate int
	// sleeperBytes is the sleepers run's RSS growth per sleeping
	// execution, and sleepers its size.
	sleeperBytes float64
	sleepers     int
}

// goalRow is one line of the goals table.
type goalRow struct {
	figure, measured, goal string
	// met is "yes", "no", or "-" when the figure was not measured; a
	// run smaller than the goal's says so after it.
	met string
}

// The sizes the goals of the timer and sleepers runs are set for.
const (
	goalTimers   = 10_000
	goalSleepers = 100_000
)

// goalRows compares the figures with the goals, in the issue's
// order. Rows whose run did not happen say "not measured".
func goalRows(f figures) []goalRow {
	var rows []goalRow
	add := func(figure, goal string, measured bool, value string, ok bool) *goalRow {
		r := goalRow{figure: figure, goal: goal, measured: "not measured", met: "-"}
		if measured {
			r.measured, r.met = value, "no"
			if ok {
				r.met = "yes"
			}
		}
		rows = append(rows, r)
		return &rows[len(rows)-1]
	}
	smaller := func(r *goalRow, n, goal int) {
		if n > 0 && n < goal {
			r.met += " (smaller run)"
		}
	}
	// Each steps/s goal is for its mode: the other one's is not measured.
	add("steps/s, 10-step noop, 200 in flight", ">= 10,000", !f.fsync && f.stepsPerSec > 0,
		thousands(f.stepsPerSec), f.stepsPerSec >= 10_000)
	add("per step p50, one execution at a time", "<= 0.5 ms", f.perStep > 0,
		millis(f.perStep), f.perStep <= 500*time.Microsecond)
	add("start-to-finish p99 / p50, 200 in flight", "<= 1.5", f.spread > 0,
		strconv.FormatFloat(f.spread, 'f', 2, 64), f.spread <= 1.5)
	add("CPU per step (all processes)", "<= 0.2 ms", f.cpuPerStep > 0,
		millis(f.cpuPerStep), f.cpuPerStep <= 200*time.Microsecond)
	add("1-step execution, start to end p50", "<= 2 ms", f.oneStep > 0,
		millis(f.oneStep), f.oneStep <= 2*time.Millisecond)
	timers := "timers due at once: lateness p99"
	if f.timers > 0 {
		timers = thousands(float64(f.timers)) + " " + timers
	}
	r := add(timers, "<= 300 ms (10,000)", f.timers > 0, millis(f.timerLate), f.timerLate <= 300*time.Millisecond)
	smaller(r, f.timers, goalTimers)
	if f.timersArmedLate > 0 {
		r.met = fmt.Sprintf("invalid: %d armed after T (raise -timer-lead)", f.timersArmedLate)
	}
	sleepers := "memory per sleeping execution (RSS)"
	if f.sleepers > 0 {
		sleepers += ", " + thousands(float64(f.sleepers)) + " asleep"
	}
	r = add(sleepers, "<= 2 KiB (100,000)", f.sleepers > 0,
		strconv.FormatFloat(f.sleeperBytes/1024, 'f', 2, 64)+" KiB", f.sleeperBytes <= 2048)
	smaller(r, f.sleepers, goalSleepers)
	add("steps/s with fsync on every write", ">= 1,500", f.fsync && f.stepsPerSec > 0,
		thousands(f.stepsPerSec), f.stepsPerSec >= 1500)
	return rows
}

// printGoals prints the goals table, unless the run measured none of
// its figures.
func printGoals(out io.Writer, f figures) {
	rows := goalRows(f)
	if !slices.ContainsFunc(rows, func(r goalRow) bool { return r.met != "-" }) {
		return
	}
	fmt.Fprintln(out, "\ngoals (issue 14): figures of this run")
	if f.fsync {
		fmt.Fprintln(out, "  (-fsync: every write fsynced; the other goals are for the default mode)")
	}
	w := len("figure")
	for _, r := range rows {
		w = max(w, len(r.figure))
	}
	fmt.Fprintf(out, "  %-*s  %14s  %-20s  %s\n", w, "figure", "measured", "goal", "met")
	for _, r := range rows {
		fmt.Fprintf(out, "  %-*s  %14s  %-20s  %s\n", w, r.figure, r.measured, r.goal, r.met)
	}
}

// percentile is the q quantile of sorted latencies (the value below which
// a fraction q of them fall, as printLatency prints it); 0 for none.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// spread is p99 divided by p50 of the latencies (sorted in place); 0 when
// there are none or the p50 is 0.
func spread(lat []time.Duration) float64 {
	slices.Sort(lat)
	p50 := percentile(lat, 0.50)
	if p50 <= 0 {
		return 0
	}
	return float64(percentile(lat, 0.99)) / float64(p50)
}

// perUnit divides a duration by a count (0 for none, or an unknown
// duration, which cpuTime gives as -1).
func perUnit(d time.Duration, n int) time.Duration {
	if n <= 0 || d < 0 {
		return 0
	}
	return d / time.Duration(n)
}

// millis prints a duration in milliseconds with three significant digits
// at least to the microsecond.
func millis(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 1000:
		return thousands(ms) + " ms"
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64) + " ms"
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
	case ms >= 1:
		return strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
	}
	return strconv.FormatFloat(ms, 'f', 3, 64) + " ms"
}

// thousands prints a count rounded to a whole number, with commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// export is f as -figures writes it.
func (f figures) export() benchcompare.Figures {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return benchcompare.Figures{
		StepsPerSec: f.stepsPerSec, Fsync: f.fsync, NATSProcess: f.natsProcess, Spread: f.spread, CPUPerStepMs: ms(f.cpuPerStep),
		PerStepMs: ms(f.perStep), OneStepMs: ms(f.oneStep),
		TimerLateMs: ms(f.timerLate), Timers: f.timers, TimersArmedLate: f.timersArmedLate,
		SleeperKiB: f.sleeperBytes / 1024, Sleepers: f.sleepers,
	}
}
