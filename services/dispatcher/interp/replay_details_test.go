package interp

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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
	key := fmt.Sprintf("replay-%d-%s-%v", len(m.evs), from, force) // one command per ask: a key seen is a copy
	cmd := ActionCommand{Key: key, From: from, Force: force,
		Record: events.ActionRecord{Action: events.ActionReplay, RequestedBy: "ops", Command: key}}
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

// TestReplayedSleepCountsFromItsStart: a sleep run again resuming (a
// replay resuming at it, after the execution was cancelled in its
// sleep) sleeps what is left of its duration, counted from when it first
// began to wait, not the whole duration again; one replayed from a point
// before it sleeps the whole duration.
func TestReplayedSleepCountsFromItsStart(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "mark", Kind: workflow.KindReplayable, Replayable: workflow.ReplayFromHere},
		{ID: "nap", Kind: workflow.KindSleep, Duration: "1h"},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	began := m.now
	require.Equal(t, projections.OpWaiting, m.state.Steps[m.state.StepIndex("nap")].Status)
	m.carry(Action(m.input(), ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "c"}}))
	require.Equal(t, projections.StatusCancelled, m.state.Status)

	m.now = began.Add(20 * time.Minute)
	d := askReplay(t, m, events.ReplayResume, false)
	require.Nil(t, d.Reject)
	m.carry(d)
	m.advance()
	nap := m.state.Steps[m.state.StepIndex("nap")]
	require.Equal(t, 2, nap.Attempt, "run again resuming")
	require.Equal(t, projections.OpWaiting, nap.Status)
	require.Equal(t, began.Add(time.Hour).UTC(), nap.WaitUntil.UTC(), "40 minutes left, not an hour from the replay")
	require.Equal(t, began.Add(time.Hour).UTC(), m.timers[timerID("x1", events.TimerSleep, "nap", 2)].UTC())

	m.carry(Action(m.input(), ActionCommand{Key: "c2", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "c2"}}))
	m.now = began.Add(30 * time.Minute)
	d = askReplay(t, m, "mark", false)
	require.Nil(t, d.Reject)
	m.carry(d)
	m.advance()
	nap = m.state.Steps[m.state.StepIndex("nap")]
	require.Equal(t, projections.OpWaiting, nap.Status)
	require.Equal(t, m.now.Add(time.Hour).UTC(), nap.WaitUntil.UTC(), "replayed anew from mark: the whole hour")
}

// TestReplayedWaitTakesALaterSignal: a wait replayed from a point before
// it takes the first signal of its name that no wait has taken, in the
// order they arrived: one sent after the original wait began (here, after
// it had taken the first). The signal the original wait took stays taken.
func TestReplayedWaitTakesALaterSignal(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "mark", Kind: workflow.KindReplayable, Replayable: workflow.ReplayFromHere},
		{ID: "w", Kind: workflow.KindWait, Signal: "go"},
		{ID: "op", Kind: workflow.KindExec, Command: "x"},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	signal := func(id string) {
		m.carry(Signal(m.input(), SignalCommand{ID: id, Name: "go", SentAt: m.now}))
		m.advance()
	}
	signal("s1")
	signal("s2") // after the wait began, and after it took s1: kept
	m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1"}))
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
	took := func() string {
		var out struct {
			SignalID string `json:"signal_id"`
		}
		require.NoError(t, json.Unmarshal(m.state.Steps[m.state.StepIndex("w")].Output, &out))
		return out.SignalID
	}
	require.Equal(t, "s1", took())

	d := askReplay(t, m, "mark", false)
	require.Nil(t, d.Reject)
	m.carry(d)
	m.advance()
	require.Equal(t, projections.OpSucceeded, m.state.Steps[m.state.StepIndex("w")].Status)
	require.Equal(t, "s2", took(), "the replayed wait took the signal sent after the original began")
	require.Len(t, m.state.Signals, 2)
	require.Equal(t, "w", m.state.Signals[0].TakenBy, "s1 stays taken by the original")
	require.Equal(t, "w", m.state.Signals[1].TakenBy)
}
