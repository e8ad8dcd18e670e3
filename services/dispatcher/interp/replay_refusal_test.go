package interp

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// askReplay decides an operator's replay of m's execution, giving the
// decision what it asks for (stored results, the history) until it
// records the replay or rejects it. Nothing is carried out.
func askReplay(t *testing.T, m *memShell, from string, force bool) Decision {
	t.Helper()
	cmd := ActionCommand{Key: "k", From: from, Force: force,
		Record: events.ActionRecord{Action: events.ActionReplay, RequestedBy: "ops", Command: "k"}}
	saved := *m
	defer func() { m.history, m.stored, m.called = saved.history, saved.stored, saved.called }()
	for range 5 {
		d := Action(m.input(), cmd)
		if d.Need == nil {
			return d
		}
		m.carry(d)
	}
	t.Fatalf("replay from %q: still needs something after 5 rounds", from)
	return Decision{}
}

// suggested returns the replays a refusal says are accepted now: from
// (resume, last, start, a step) and force.
func suggested(t *testing.T, reason string) (from []string, force []bool) {
	t.Helper()
	if strings.HasSuffix(reason, "; no replay of this execution is accepted now, forced or not") {
		return nil, nil
	}
	_, list, ok := strings.Cut(reason, "; accepted now: replay ")
	require.True(t, ok, "a refusal says what is accepted instead: %s", reason)
	for _, alt := range strings.FieldsFunc(strings.ReplaceAll(list, " or ", ", "), func(r rune) bool { return r == ',' }) {
		alt = strings.TrimPrefix(strings.TrimSpace(alt), "from ")
		f, forced := strings.CutSuffix(alt, " with force")
		from, force = append(from, f), append(force, forced)
	}
	return from, force
}

// TestReplayRefusalsSuggestOnlyWhatIsAccepted: for executions failed in
// several ways, every replay an operator may ask for (from resume, last,
// start, each step) that is refused names the replays accepted instead,
// and each of those, asked as named, is accepted. Resuming a step that is
// not idempotent, with no replay point, in a workflow not replayable from
// start suggests neither from start nor from last unforced (the issue's
// chain of refusals), only forcing.
func TestReplayRefusalsSuggestOnlyWhatIsAccepted(t *testing.T) {
	t.Parallel()
	op := func(id string, idem string) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindExec, Command: "x", Idempotent: idem}
	}
	mark := func(id string, r string) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindReplayable, Replayable: r}
	}
	for name, c := range map[string]struct {
		def  workflow.Definition
		fail int // the operation that fails (1: the first)
		// want: asked from resume unforced, the refusal's suggestions
		want string
	}{
		"NotIdempotentNoPoint": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			op("a", workflow.IdempotentYes), op("b", workflow.IdempotentNo)}}, fail: 2,
			want: "accepted now: replay from resume with force or from start with force"},
		"NotIdempotentFromStart": {def: workflow.Definition{Name: "wf", Replayable: workflow.ReplayFromStart, Steps: []workflow.Step{
			op("a", workflow.IdempotentYes), op("b", workflow.IdempotentNo)}}, fail: 2},
		"PointThenNotIdempotent": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			op("a", workflow.IdempotentNo), mark("m", workflow.ReplayFromHere), op("b", workflow.IdempotentNo)}}, fail: 2},
		"PointOnlyClearsStart": {def: workflow.Definition{Name: "wf", Replayable: workflow.ReplayFromStart, Steps: []workflow.Step{
			op("a", workflow.IdempotentYes), mark("m", workflow.ReplayFromHereOnly), op("b", workflow.IdempotentNo)}}, fail: 2},
		"FirstFails": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			op("a", workflow.IdempotentNo), mark("m", workflow.ReplayFromHere), op("b", workflow.IdempotentYes)}}, fail: 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := newMemShell(t, c.def, `{}`)
			m.advance()
			for n := 1; n < c.fail; n++ {
				m.carry(m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}))
				m.advance()
			}
			m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1"}))
			m.advance()
			require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())

			asks := []string{events.ReplayResume, events.ReplayLast, events.ReplayStart, "nosuch"}
			for _, st := range c.def.Steps {
				asks = append(asks, st.ID)
			}
			refused := 0
			for _, from := range asks {
				d := askReplay(t, m, from, false)
				if d.Reject == nil {
					require.Len(t, d.Events, 1, "from %s", from)
					continue
				}
				refused++
				require.Equal(t, events.CodeConflict, d.Reject.Code)
				if from == events.ReplayResume && c.want != "" {
					require.True(t, strings.HasSuffix(d.Reject.Reason, "; "+c.want), d.Reject.Reason)
				}
				alts, forced := suggested(t, d.Reject.Reason)
				for i, alt := range alts {
					require.NotEqual(t, from, alt+map[bool]string{true: "!"}[forced[i]], "the refused replay itself")
					got := askReplay(t, m, alt, forced[i])
					require.Nil(t, got.Reject, "from %s refused (%s), it suggested from %s force %v, refused too", from, d.Reject.Reason, alt, forced[i])
					require.Len(t, got.Events, 1)
					_, ok := got.Events[0].(*events.ExecutionReplayed)
					require.True(t, ok, "%T", got.Events[0])
				}
			}
			require.Positive(t, refused, "some replay is refused in each case")
		})
	}
}
