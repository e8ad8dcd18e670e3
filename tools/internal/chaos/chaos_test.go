package chaos

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

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
	d, err := workflow.Parse([]byte(drillWorkflow("/tmp/drill-marks")))
	require.NoError(t, err)
	require.Equal(t, wfDrill, d.Name)
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
	reruns, twice, which := runsAgain(marks, "drill-chain-agent-", map[int]time.Time{10: at.Add(time.Second)})
	require.Equal(t, 1, reruns)
	require.Equal(t, 1, twice)
	require.Len(t, which, 1)
	require.Contains(t, which[0], "drill-chain-agent-0002 step s1 attempt 1: run by the agent of pid 20, again by pid 30 7s later")
	// An agent killed only after the second run began did not cause it.
	reruns, twice, _ = runsAgain(marks, "drill-chain-agent-", map[int]time.Time{10: at.Add(10 * time.Second)})
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
