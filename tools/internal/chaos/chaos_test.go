package chaos

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
