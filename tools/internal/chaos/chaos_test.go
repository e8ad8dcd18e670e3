package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/chaoscheck"
)

// TestWorkflowsAreValid: every workflow of the mix is a valid definition,
// and the mix starts each of them.
func TestWorkflowsAreValid(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	for _, def := range workflows("/tmp/marks") {
		d, err := workflow.Parse([]byte(def))
		require.NoError(t, err, def)
		names[d.Name] = true
	}
	for _, wf := range mix {
		require.True(t, names[wf], "the mix starts %s, which is not defined", wf)
	}
	require.Len(t, names, 7)
	var drillNames []string
	for _, def := range drillWorkflows("/tmp/drill-marks") {
		d, err := workflow.Parse([]byte(def))
		require.NoError(t, err, def)
		drillNames = append(drillNames, d.Name)
	}
	require.Equal(t, []string{wfDrill, wfDrillSignal}, drillNames)
}

func TestReportRecoveryAndVerdict(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC)
	r := &Report{Mode: ModeServices, Started: 3, Accepted: 3, Kills: []Kill{
		{Kind: "agent", At: at, Recovered: 300 * time.Millisecond, Busy: true},
		{Kind: "agent", At: at, Recovered: 900 * time.Millisecond, Busy: true},
		{Kind: "agent", At: at, Recovered: 500 * time.Millisecond},
		{Kind: "api", At: at}, // no progress seen
	}}
	p50, most, n := r.Recovery("agent")
	require.Equal(t, []any{500 * time.Millisecond, 900 * time.Millisecond, 3}, []any{p50, most, n})
	_, _, n = r.Recovery("api")
	require.Zero(t, n)
	require.Equal(t, map[string]int{"agent": 3, "api": 1}, r.KillsBy())
	require.True(t, r.Passed())
	var b strings.Builder
	r.Write(&b)
	require.Contains(t, b.String(), "agent        500ms / 900ms (3 kills)")
	require.Contains(t, b.String(), "2 while an operation ran")
	require.Contains(t, b.String(), "PASS")

	r.Check.Violations = []chaoscheck.Violation{{Rule: chaoscheck.RuleLostCommand, Execution: "x", Detail: "lost"}}
	require.False(t, r.Passed())
	b.Reset()
	r.Write(&b)
	require.Contains(t, b.String(), "lost-command: x: lost")
	require.Contains(t, b.String(), "FAIL")
}

func TestScheduleKillsEachKindAsOftenAsAsked(t *testing.T) {
	t.Parallel()
	r := &run{cfg: Config{Mode: ModeServices, KillsPerKind: 3}, kills: rand.New(rand.NewPCG(7, 1))}
	by := map[string]int{}
	for _, k := range r.schedule() {
		by[k]++
	}
	require.Equal(t, map[string]int{KindNATS: 3, "api": 3, "dispatcher": 3, "agent": 3, "janitor": 3}, by)
	r.cfg.Mode = ModeCluster
	require.Equal(t, []string{KindNode, KindNode, KindNode}, r.schedule())
}

// TestRunsAgainTellsADeadAgentsTaskFromALiveOnes: a step attempt run
// again after the agent running it was killed is a rerun (at least once);
// one run again while that agent lived is counted apart, with its agents.
func TestRunsAgainTellsADeadAgentsTaskFromALiveOnes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC)
	mark := func(done bool, exec string, pid int, s int) drillMark {
		return drillMark{done: done, execution: exec, step: "s1", try: "1", pid: pid, at: at.Add(time.Duration(s) * time.Second)}
	}
	marks := []drillMark{
		mark(false, "drill-chain-agent-0001", 10, 0), // killed at 1 s, run again by 20 at 6 s: a rerun
		mark(false, "drill-chain-agent-0002", 20, 0), // 20 lives: run again by 30 at 7 s: twice
		mark(false, "drill-chain-agent-0001", 20, 6),
		mark(false, "drill-chain-agent-0002", 30, 7),
		mark(true, "drill-chain-agent-0002", 30, 8),
		mark(false, "drill-chain-agent-0003", 30, 9), // once: nothing
		mark(false, "drill-chain-node-0001", 10, 0),  // another drill's
		mark(false, "drill-chain-node-0001", 20, 9),
	}
	agent := func(id string) bool { return strings.HasPrefix(id, "drill-chain-agent-") }
	reruns, twice, which := runsAgain(marks, agent, map[int]time.Time{10: at.Add(time.Second)})
	require.Equal(t, 1, reruns)
	require.Equal(t, 1, twice)
	require.Len(t, which, 1)
	require.Contains(t, which[0], "drill-chain-agent-0002 step s1 attempt 1: run by the agent of pid 20, again by pid 30 7s later")
	// An agent killed only after the second run began did not cause it.
	reruns, twice, _ = runsAgain(marks, agent, map[int]time.Time{10: at.Add(10 * time.Second)})
	require.Equal(t, []int{0, 2}, []int{reruns, twice})
}

func TestStallAfterCountsOnlyGapsEndingAfterTheFault(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC)
	ev := func(ms int) events.Event { return events.Event{Time: at.Add(time.Duration(ms) * time.Millisecond)} }
	evs := []events.Event{ev(100), ev(5000), ev(5200), ev(12000), ev(12100)}
	require.Equal(t, 6800*time.Millisecond, stallAfter(at, evs, at.Add(6*time.Second)))
	require.Equal(t, 6800*time.Millisecond, stallAfter(at, evs, at))
	require.Equal(t, 100*time.Millisecond, stallAfter(at, evs, at.Add(12050*time.Millisecond)))
	require.Zero(t, stallAfter(at, evs, at.Add(time.Minute)))
	// A start held back: from its sending to its first event.
	require.Equal(t, 9*time.Second, stallAfter(at, []events.Event{ev(9000)}, at.Add(time.Second)))
}

// TestStallAfterLeavesOutTheWaitForTheUser: the time an execution waits
// for its user's signal (or action) is no stall; the measure goes on from
// the request's sending. A request sent while the execution still owed
// progress (before its step.waiting) ends a stall as any moment does.
func TestStallAfterLeavesOutTheWaitForTheUser(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	ev := func(n int, p events.Payload) events.Event {
		return events.Event{Type: p.EventType(), Time: ms(n), Data: p}
	}
	waiting := &events.StepWaiting{StepID: "hold", Attempt: 1, Signals: []string{"go"}}
	evs := []events.Event{
		ev(100, &events.ExecutionStarted{}),
		ev(200, waiting),
		ev(8200, &events.ExecutionResumed{}),         // the action, sent at 7800
		ev(9800, &events.SignalReceived{Name: "go"}), // the signal, sent at 8400
		ev(9900, &events.StepSucceeded{StepID: "hold", Attempt: 1}),
		ev(10000, &events.StepScheduled{StepID: "s1", Attempt: 1}),
		ev(10800, &events.StepSucceeded{StepID: "s1", Attempt: 1}),
		ev(10900, &events.ExecutionSucceeded{}),
	}
	// The action sent 7.6 s into the wait, the signal after its record:
	// the gaps up to each request are left out; from each on they count
	// (the action's 0.4 s, the signal's 1.4 s, s1's 0.8 s).
	require.Equal(t, 1400*time.Millisecond, stallAfter(at, evs, at, ms(7800), ms(8400)))
	// Without the requests' times, the wait would be the stall.
	require.Equal(t, 8*time.Second, stallAfter(at, evs, at))
	// A fault after the signal's record: only what follows it.
	require.Equal(t, 800*time.Millisecond, stallAfter(at, evs, ms(9850), ms(7800), ms(8400)))
	// An unset time (no action) is no moment.
	require.Equal(t, 1400*time.Millisecond, stallAfter(at, evs, at, ms(7800), time.Time{}, ms(8400)))

	// Before its step.waiting the execution owes progress: a request sent
	// then ends a gap that counts, and what follows it counts too.
	late := []events.Event{ev(100, &events.ExecutionStarted{}), ev(6100, waiting),
		ev(6300, &events.SignalReceived{Name: "go"}), ev(6400, &events.ExecutionSucceeded{})}
	require.Equal(t, 3*time.Second, stallAfter(at, late, at, ms(3100)))
	// A wait for a time (a sleep) is no wait for the user.
	sleep := []events.Event{ev(100, &events.ExecutionStarted{}), ev(200, &events.StepWaiting{StepID: "nap", Attempt: 1, Until: ms(5200)}),
		ev(5300, &events.ExecutionSucceeded{})}
	require.Equal(t, 3800*time.Millisecond, stallAfter(at, sleep, at, ms(4000)))
}

// TestDrillsTableCountsSignalsAndActions: the drills' table shows the
// signals and actions accepted of those sent beside the starts, and a
// failed signal fails the run as a failed start does.
func TestDrillsTableCountsSignalsAndActions(t *testing.T) {
	t.Parallel()
	r := &Report{Mode: ModeDrills, Budget: 5 * time.Second, Drills: []DrillResult{
		{Name: "none", What: "none", At: time.Date(2026, 11, 24, 14, 0, 0, 0, time.UTC), Back: time.Date(2026, 11, 24, 14, 0, 0, 1000, time.UTC), Started: 40, Accepted: 40, Signals: Requests{Sent: 10, Accepted: 10}, Actions: Requests{Sent: 5, Accepted: 5},
			Stall: 450 * time.Millisecond},
		{Name: "events-leader", What: "events-leader", Started: 99, Accepted: 99, Signals: Requests{Sent: 25, Accepted: 24, Failed: 1},
			Actions: Requests{Sent: 12, Accepted: 12}, Stall: 8210 * time.Millisecond, OverBudget: 3, Raw: map[int]int{503: 7},
			Failed: []string{"signal drill-signal-events-leader-0011: internal"},
			At:     time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC), Back: time.Date(2026, 11, 24, 15, 0, 6, 0, time.UTC),
			InFault: InFault{Starts: 48, Signals: 11, Actions: 5}},
	}}
	var b strings.Builder
	r.Write(&b)
	out := b.String()
	lines := strings.Split(out, "\n")
	var header, none, leader string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "    drill "):
			header = l
		case strings.HasPrefix(l, "    none "):
			none = l
		case strings.HasPrefix(l, "    events-leader "):
			leader = l
		}
	}
	require.Equal(t, []string{"none", "450ms", "0", "40/40", "10/10", "5/5", "0", "0", "0", "0", "0"}, strings.Fields(none))
	require.Equal(t, []string{"events-leader", "8.21s", "3", "99/99", "24/25", "12/12", "1", "7×503", "0", "0", "0"}, strings.Fields(leader))
	// The columns line up: each row as wide as the header.
	require.Equal(t, utf8.RuneCountInString(header), utf8.RuneCountInString(none), out)
	require.Equal(t, utf8.RuneCountInString(header), utf8.RuneCountInString(leader), out)
	require.Contains(t, out, "failed: signal drill-signal-events-leader-0011: internal")
	require.Contains(t, out, "events-leader: events-leader; sent during the fault (6s): starts 48, signals 11, actions 5")
	require.NotContains(t, out, "none: none; sent during", "no fault, no window")
	require.True(t, r.Passed(), "the run's failures decide, not the table")
	r.Failures = []string{"drill events-leader: signal drill-signal-events-leader-0011: internal"}
	require.False(t, r.Passed())
	b.Reset()
	r.Write(&b)
	require.Contains(t, b.String(), "FAIL")
}

// TestDrillsSayTheirDurations: a drill's description names its
// durations as configured, not by the fields' names.
func TestDrillsSayTheirDurations(t *testing.T) {
	c, err := DrillConfig{}.withDefaults()
	require.NoError(t, err)
	for _, d := range drills {
		got := c.describe(d.what)
		for _, field := range []string{"NodeDown", "Down", "Restart", "Stop"} {
			require.NotContains(t, got, " "+field, "drill %s: %s", d.name, got)
		}
	}
	require.Equal(t, "back after 1s, down 15s, again after 5s, stopped 2s",
		c.describe("back after Down, down NodeDown, again after Restart, stopped Stop"))
}

// TestAProcessThatExitedShowsTheEndOfItsLog: the error about a process
// that exited by itself carries the last logTail lines of its log, the
// run's directory being gone by the time a test's failure is read.
func TestAProcessThatExitedShowsTheEndOfItsLog(t *testing.T) {
	t.Parallel()
	r := &run{logs: t.TempDir()}
	f, err := r.logFile("agent-1")
	require.NoError(t, err)
	for i := range logTail + 5 {
		_, err := fmt.Fprintf(f, "line %d\n", i)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	err = r.exitedByItself(&Process{Name: "agent-1"})
	require.ErrorContains(t, err, "agent-1 exited by itself (not killed): not started; the end of its log:\nline 5\n")
	require.ErrorContains(t, err, fmt.Sprintf("line %d", logTail+4))
	require.NotContains(t, err.Error(), "line 4\n", "only the last lines")
	require.ErrorContains(t, r.exitedByItself(&Process{Name: "no-log"}), "no-log exited by itself (not killed): not started; the end of its log:")
}
