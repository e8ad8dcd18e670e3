package benchcompare

import (
	"regexp"
	"strconv"
	"strings"
)

// ParseGoals reads the figures from the goals table a jetflow-bench run
// prints at its end ("goals (issue 14): figures of this run"), for builds
// older than -figures (from 2026-11-24 on). It reports false when the
// text holds no such table. The table rounds its figures (whole
// steps/s, p99 / p50 to two places, milliseconds to three significant
// digits). Compare takes them as read: a close pair of an older build
// against a newer one's exact figures may split by the rounding alone.
func ParseGoals(text string) (Figures, bool) {
	var f Figures
	_, table, ok := strings.Cut(text, "goals (issue 14): figures of this run")
	if !ok {
		return f, false
	}
	if strings.Contains(table, "(-fsync:") {
		f.Fsync = true
	}
	for _, line := range strings.Split(table, "\n") {
		cells := columns.Split(strings.TrimSpace(line), -1)
		if len(cells) < 4 || cells[0] == "figure" {
			continue
		}
		label, measured, met := cells[0], cells[1], cells[3]
		v, ok := readFigure(measured)
		if !ok {
			continue // not measured
		}
		switch {
		case strings.HasPrefix(label, "steps/s with fsync"):
			f.StepsPerSec, f.Fsync = v, true
		case strings.HasPrefix(label, "steps/s"):
			f.StepsPerSec = v
		case strings.HasPrefix(label, "per step p50"):
			f.PerStepMs = v
		case strings.HasPrefix(label, "start-to-finish p99 / p50"):
			f.Spread = v
		case strings.HasPrefix(label, "CPU per step"):
			f.CPUPerStepMs = v
		case strings.HasPrefix(label, "1-step execution"):
			f.OneStepMs = v
		case strings.Contains(label, "timers due at once: lateness p99"):
			f.TimerLateMs = v
			if n, ok := readFigure(strings.Fields(label)[0]); ok {
				f.Timers = int(n)
			}
			if strings.HasPrefix(met, "invalid") {
				f.TimersArmedLate = 1 // how many is not in the table
			}
		case strings.HasPrefix(label, "memory per sleeping execution"):
			f.SleeperKiB = v
			if _, n, ok := strings.Cut(label, ", "); ok {
				if k, ok := readFigure(strings.Fields(n)[0]); ok {
					f.Sleepers = int(k)
				}
			}
		}
	}
	return f, true
}

// columns splits a row of the goals table: its cells are set apart by
// two spaces or more.
var columns = regexp.MustCompile(`\s{2,}`)

// readFigure reads a measured cell: 5,029; 0.380 ms; 1,234 ms; 1.24;
// 2.25 KiB. "not measured" and the like are not figures.
func readFigure(cell string) (float64, bool) {
	cell = strings.TrimSpace(cell)
	for _, unit := range []string{" ms", " KiB"} {
		cell = strings.TrimSuffix(cell, unit)
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(cell, ",", ""), 64)
	return v, err == nil && v > 0
}
