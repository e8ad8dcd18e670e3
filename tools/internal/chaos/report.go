package chaos

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/tools/internal/chaoscheck"
)

// Report is what a run did and what the checker found.
type Report struct {
	Mode Mode
	Seed uint64
	Dir  string
	// Started counts the executions the run started; Accepted those the
	// api accepted; Signals the signals it accepted.
	Started, Accepted, Signals int
	// Failures are starts or signals the api never accepted (the run
	// sends them again for minutes: each is a finding).
	Failures []string
	Kills    []Kill
	Check    chaoscheck.Report
	Took     time.Duration
	// Drills are the drills' measures (ModeDrills), Budget the longest
	// stall a drill may cause.
	Drills []DrillResult
	Budget time.Duration
}

// OverBudget names the drills whose longest stall exceeded the budget.
func (r *Report) OverBudget() []string {
	var out []string
	for _, d := range r.Drills {
		if d.Stall > r.Budget {
			out = append(out, d.Name)
		}
	}
	return out
}

// Passed reports whether the run broke no rule and lost no request.
func (r *Report) Passed() bool { return len(r.Check.Violations) == 0 && len(r.Failures) == 0 }

// KillsBy counts the kills by kind.
func (r *Report) KillsBy() map[string]int {
	n := map[string]int{}
	for _, k := range r.Kills {
		n[k.Kind]++
	}
	return n
}

// Recovery returns the median and the longest recovery of the kills of
// kind ("" for all), and how many kills showed a recovery.
func (r *Report) Recovery(kind string) (p50, longest time.Duration, n int) {
	var ds []time.Duration
	for _, k := range r.Kills {
		if (kind == "" || k.Kind == kind) && k.Recovered > 0 {
			ds = append(ds, k.Recovered)
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return ds[(len(ds)-1)/2], ds[len(ds)-1], len(ds)
}

// Write prints the report for people.
func (r *Report) Write(w io.Writer) {
	c := r.Check
	fmt.Fprintf(w, "chaos report (%s mode, seed %d, %s)\n", r.Mode, r.Seed, r.Took.Round(time.Second))
	fmt.Fprintf(w, "  executions      %d started, %d accepted, %d checked; %d signals sent\n", r.Started, r.Accepted, c.Executions, r.Signals)
	var st []string
	for _, s := range slices.Sorted(maps.Keys(c.ByStatus)) {
		st = append(st, fmt.Sprintf("%s %d", cmp.Or(string(s), "none"), c.ByStatus[s]))
	}
	fmt.Fprintf(w, "  by status       %s; %d legitimately waiting\n", strings.Join(st, ", "), c.Waiting)
	for _, why := range slices.Sorted(maps.Keys(c.FailedWhy)) {
		fmt.Fprintf(w, "    failed %4d   %s\n", c.FailedWhy[why], why)
	}
	if r.Mode == ModeDrills {
		r.writeDrills(w)
	} else {
		r.writeKills(w)
	}
	fmt.Fprintf(w, "  violations      %d\n", len(c.Violations))
	for _, rule := range chaoscheck.Rules {
		if n := c.Count(rule); n > 0 {
			fmt.Fprintf(w, "    %-16s %d\n", rule, n)
		}
	}
	for i, v := range c.Violations {
		if i == 20 {
			fmt.Fprintf(w, "    ... and %d more\n", len(c.Violations)-i)
			break
		}
		fmt.Fprintf(w, "    %s\n", v)
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "  requests never accepted: %d\n", len(r.Failures))
		for _, f := range r.Failures[:min(len(r.Failures), 10)] {
			fmt.Fprintf(w, "    %s\n", f)
		}
	}
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "  %s (data, logs and marks in %s)\n", verdict, r.Dir)
}

// writeDrills prints the drills' table: per drill, the longest stall of
// an execution after the fault (and how many went over the budget), the
// starts, signals and operator's actions accepted of those sent, the
// requests a user saw fail and the raw 5xx answers behind the client's
// retries, the step attempts run again after their agent died and those
// run twice while it lived, and the checker's violations.
func (r *Report) writeDrills(w io.Writer) {
	c := r.Check
	fmt.Fprintf(w, "  run twice       %d step attempts started again (histories)\n", c.StartedAgain)
	fmt.Fprintf(w, "  drills          stall: the longest time an execution made no progress after the fault (budget %s);\n", r.Budget)
	fmt.Fprintf(w, "                  starts, signals, actions: accepted/sent; failed: those a user saw fail\n")
	const row = "    %-19s %8s %7s %9s %8s %8s %6s %-14s %5s %10s %5s\n"
	fmt.Fprintf(w, row, "drill", "stall", ">budget", "starts", "signals", "actions", "failed", "raw 5xx", "rerun", "live twice", "viol.")
	of := func(ok, sent int) string { return fmt.Sprintf("%d/%d", ok, sent) }
	for _, d := range r.Drills {
		var raw []string
		for _, st := range slices.Sorted(maps.Keys(d.Raw)) {
			raw = append(raw, fmt.Sprintf("%d×%d", d.Raw[st], st))
		}
		fmt.Fprintf(w, row, d.Name, d.Stall.Round(10*time.Millisecond), strconv.Itoa(d.OverBudget),
			of(d.Accepted, d.Started), of(d.Signals.Accepted, d.Signals.Sent), of(d.Actions.Accepted, d.Actions.Sent),
			strconv.Itoa(len(d.Failed)), cmp.Or(strings.Join(raw, " "), "0"), strconv.Itoa(d.Reruns), strconv.Itoa(d.LiveTwice),
			strconv.Itoa(d.Violations))
	}
	for _, d := range r.Drills {
		line := fmt.Sprintf("    %s: %s", d.Name, cmp.Or(d.Victim, d.What))
		if lasted := d.Back.Sub(d.At).Round(100 * time.Millisecond); lasted > 0 { // "none" lasts nothing
			f := d.InFault
			line += fmt.Sprintf("; sent during the fault (%s): starts %d, signals %d, actions %d", lasted, f.Starts, f.Signals, f.Actions)
		}
		if d.StallOf != "" {
			line += "; longest stall " + d.StallOf
		}
		if d.Note != "" {
			line += "; " + d.Note
		}
		fmt.Fprintln(w, line)
		for _, f := range d.Failed[:min(len(d.Failed), 5)] {
			fmt.Fprintf(w, "      failed: %s\n", f)
		}
		for _, t := range d.Twice[:min(len(d.Twice), 5)] {
			fmt.Fprintf(w, "      live twice: %s\n", t)
		}
	}
	if over := r.OverBudget(); len(over) > 0 {
		fmt.Fprintf(w, "  over budget     %s\n", strings.Join(over, ", "))
	}
}

// writeKills prints the kills and the recoveries.
func (r *Report) writeKills(w io.Writer) {
	c := r.Check
	by := r.KillsBy()
	var ks []string
	for _, kind := range slices.Sorted(maps.Keys(by)) {
		ks = append(ks, fmt.Sprintf("%s %d", kind, by[kind]))
	}
	leaders, busy := 0, 0
	for _, k := range r.Kills {
		if k.Leader {
			leaders++
		}
		if k.Busy {
			busy++
		}
	}
	line := fmt.Sprintf("  kills (SIGKILL) %d: %s", len(r.Kills), strings.Join(ks, ", "))
	if leaders > 0 {
		line += fmt.Sprintf(" (%d of them the events stream's leader)", leaders)
	}
	fmt.Fprintln(w, line+fmt.Sprintf("; %d while an operation ran", busy))
	fmt.Fprintf(w, "  run twice       %d operations ran again (%d extra runs, from the marks); %d step attempts started again\n",
		c.RunTwice, c.Reruns, c.StartedAgain)
	fmt.Fprintf(w, "  recovery        from the kill to the first progress after the restart (p50 / max over kills):\n")
	for _, kind := range append(slices.Sorted(maps.Keys(by)), "") {
		p50, most, n := r.Recovery(kind)
		name := kind
		if name == "" {
			name = "all"
		}
		if n == 0 {
			fmt.Fprintf(w, "    %-12s no progress seen after the restart\n", name)
			continue
		}
		fmt.Fprintf(w, "    %-12s %s / %s (%d kills)\n", name, p50.Round(10*time.Millisecond), most.Round(10*time.Millisecond), n)
	}
}
