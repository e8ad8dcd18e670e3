package chaoscheck_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/chaoscheck"
)

var t0 = time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)

// stream hands out stream sequences: every history of a test is in one
// stream, so their events are ordered with respect to each other.
type stream struct{ seq uint64 }

// history appends events with the given payloads to execution id's
// history, each appended after the one before it.
func (s *stream) history(id string, ps ...events.Payload) []events.Event {
	var evs []events.Event
	var prev uint64
	for _, p := range ps {
		s.seq++
		ev := events.New("jetflow/dispatcher", id, "wf", t0.Add(time.Duration(s.seq)*time.Second), p)
		ev.Seq, ev.PrevSeq, prev = s.seq, prev, s.seq
		evs = append(evs, ev)
	}
	return evs
}

// started starts an execution of the given steps ("id" for an exec
// step, "id:kind" for another kind).
func started(steps ...string) *events.ExecutionStarted {
	refs := make([]events.StepRef, len(steps))
	for i, s := range steps {
		id, kind, ok := strings.Cut(s, ":")
		if !ok {
			kind = "exec"
		}
		refs[i] = events.StepRef{ID: id, Kind: kind}
	}
	return &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: refs,
		Definition: json.RawMessage(`{"name":"wf"}`), Token: "tok", CommandKey: "k"}
}

// ran is the events of one successful exec step attempt.
func ran(step string, attempt int) []events.Payload {
	task := step + "-task"
	return []events.Payload{
		&events.StepScheduled{StepID: step, Attempt: attempt},
		&events.StepSending{StepID: step, Attempt: attempt, TaskID: task, Queue: "default"},
		&events.StepSent{StepID: step, Attempt: attempt, TaskID: task},
		&events.StepStarted{StepID: step, Attempt: attempt, Agent: "a"},
		&events.StepSucceeded{StepID: step, Attempt: attempt, Output: json.RawMessage(`{"ok":true}`)},
	}
}

func cat(parts ...[]events.Payload) []events.Payload { return slices.Concat(parts...) }

// done is an execution of the given history with the read model the
// projector would have stored.
func done(t *testing.T, id string, evs []events.Event) chaoscheck.Execution {
	t.Helper()
	x, err := projections.Fold(evs)
	require.NoError(t, err)
	b, err := json.Marshal(x)
	require.NoError(t, err)
	return chaoscheck.Execution{ID: id, Events: evs, ReadModel: b}
}

// good is a run that breaks no rule: two executions that succeeded, one
// after the other under a mutex, with marks to match.
func good(t *testing.T) chaoscheck.Input {
	var s stream
	a := s.history("a", cat([]events.Payload{started("s1"), &events.LockRequested{Lock: "m", Limit: 1}, &events.LockAcquired{Lock: "m"}},
		ran("s1", 1), []events.Payload{&events.LockReleased{Lock: "m"}, &events.ExecutionSucceeded{}})...)
	b := s.history("b", cat([]events.Payload{started("s1"), &events.LockRequested{Lock: "m", Limit: 1}, &events.LockAcquired{Lock: "m"}},
		ran("s1", 1), []events.Payload{&events.LockReleased{Lock: "m"}, &events.ExecutionSucceeded{}})...)
	return chaoscheck.Input{
		Executions: map[string]chaoscheck.Execution{"a": done(t, "a", a), "b": done(t, "b", b)},
		Accepted:   []string{"a", "b"},
		Marks: []chaoscheck.Mark{
			{Kind: chaoscheck.MarkEnter, Lock: "m", Execution: "a"}, {Kind: chaoscheck.MarkRun, Execution: "a", Step: "s1", Attempt: 1},
			{Kind: chaoscheck.MarkExit, Lock: "m", Execution: "a"},
			{Kind: chaoscheck.MarkEnter, Lock: "m", Execution: "b"}, {Kind: chaoscheck.MarkRun, Execution: "b", Step: "s1", Attempt: 1},
			{Kind: chaoscheck.MarkExit, Lock: "m", Execution: "b"},
		},
		Now: t0.Add(time.Hour),
	}
}

func TestGoodRunHasNoViolation(t *testing.T) {
	t.Parallel()
	r := chaoscheck.Check(good(t))
	require.Empty(t, r.Violations)
	require.Equal(t, 2, r.Executions)
	require.Equal(t, 2, r.ByStatus[projections.StatusSucceeded])
	require.Zero(t, r.RunTwice)
	require.Zero(t, r.StartedAgain)
}

// TestEachRuleCanFail breaks each rule in a run that is otherwise good:
// the check must report that rule (and a good run none, above).
func TestEachRuleCanFail(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		rule  chaoscheck.Rule
		spoil func(t *testing.T, in *chaoscheck.Input)
	}{
		"RunningWithNothingToWaitFor": {chaoscheck.RuleUnfinished, func(t *testing.T, in *chaoscheck.Input) {
			var s stream
			evs := s.history("c", cat([]events.Payload{started("s1")}, ran("s1", 1)[:3])...)
			in.Executions["c"] = done(t, "c", evs)
		}},
		"WaitingForASignalThatWasSent": {chaoscheck.RuleUnfinished, func(t *testing.T, in *chaoscheck.Input) {
			var s stream
			evs := s.history("c", started("w:wait"), &events.StepScheduled{StepID: "w", Attempt: 1},
				&events.StepWaiting{StepID: "w", Attempt: 1, Signals: []string{"go"}, Until: t0.Add(48 * time.Hour)})
			in.Executions["c"] = done(t, "c", evs)
			in.Signals = append(in.Signals, chaoscheck.Signal{Execution: "c", Name: "go"})
		}},
		"SleepingPastItsDueTime": {chaoscheck.RuleUnfinished, func(t *testing.T, in *chaoscheck.Input) {
			var s stream
			evs := s.history("c", started("z:sleep"), &events.StepScheduled{StepID: "z", Attempt: 1},
				&events.StepWaiting{StepID: "z", Attempt: 1, Until: t0.Add(time.Minute)})
			in.Executions["c"] = done(t, "c", evs)
		}},
		"SucceededTwice": {chaoscheck.RuleSucceededTwice, func(t *testing.T, in *chaoscheck.Input) {
			var s stream
			evs := s.history("c", cat([]events.Payload{started("s1")}, ran("s1", 1),
				[]events.Payload{&events.StepSucceeded{StepID: "s1", Attempt: 1}, &events.ExecutionSucceeded{}})...)
			in.Executions["c"] = chaoscheck.Execution{ID: "c", Events: evs, ReadModel: []byte(`{}`)}
		}},
		"Forked": {chaoscheck.RuleNotLinear, func(t *testing.T, in *chaoscheck.Input) {
			x := in.Executions["a"]
			x.Events = slices.Clone(x.Events)
			x.Events[3].PrevSeq = x.Events[1].Seq // appended after the same event as the one before it
			in.Executions["a"] = x
		}},
		"EventLost": {chaoscheck.RuleNotLinear, func(t *testing.T, in *chaoscheck.Input) {
			x := in.Executions["a"]
			x.Events = slices.Delete(slices.Clone(x.Events), 2, 3)
			in.Executions["a"] = x
		}},
		"MarksOverlap": {chaoscheck.RuleLockOverlap, func(t *testing.T, in *chaoscheck.Input) {
			// b enters while a is inside.
			m := in.Marks
			in.Marks = []chaoscheck.Mark{m[0], m[3], m[1], m[2], m[4], m[5]}
		}},
		"RunAgainAfterTheNextHolderEntered": {chaoscheck.RuleLockOverlap, func(t *testing.T, in *chaoscheck.Input) {
			// a's exit ran again (its agent died) after b entered.
			in.Marks = append(in.Marks[:4:4], chaoscheck.Mark{Kind: chaoscheck.MarkExit, Lock: "m", Execution: "a"}, in.Marks[4], in.Marks[5])
		}},
		"HistoriesOverlap": {chaoscheck.RuleLockOverlap, func(t *testing.T, in *chaoscheck.Input) {
			// b acquires the mutex while a still runs its step under it.
			var s stream
			a := s.history("a", started("s1"), &events.LockRequested{Lock: "m", Limit: 1}, &events.LockAcquired{Lock: "m"},
				&events.StepScheduled{StepID: "s1", Attempt: 1})
			b := s.history("b", cat([]events.Payload{started("s1"), &events.LockRequested{Lock: "m", Limit: 1}, &events.LockAcquired{Lock: "m"}},
				ran("s1", 1), []events.Payload{&events.LockReleased{Lock: "m"}, &events.ExecutionSucceeded{}})...)
			a = append(a, s.history("a", ran("s1", 1)[1:]...)...)
			for i := 4; i < len(a); i++ { // continue a's chain after its first four events
				a[i].PrevSeq = a[i-1].Seq
			}
			in.Executions["a"] = chaoscheck.Execution{ID: "a", Events: a, ReadModel: in.Executions["a"].ReadModel}
			in.Executions["b"] = done(t, "b", b)
		}},
		"SemaphoreOverfull": {chaoscheck.RuleLockOverlap, func(t *testing.T, in *chaoscheck.Input) {
			in.Limits = map[string]int{"s": 2}
			for _, kind := range []chaoscheck.MarkKind{chaoscheck.MarkEnter, chaoscheck.MarkExit} {
				for _, e := range []string{"a", "b", "c"} {
					in.Marks = append(in.Marks, chaoscheck.Mark{Kind: kind, Lock: "s", Execution: e})
				}
			}
		}},
		"StartLost": {chaoscheck.RuleLostCommand, func(t *testing.T, in *chaoscheck.Input) {
			in.Accepted = append(in.Accepted, "never")
		}},
		"ReadModelBehind": {chaoscheck.RuleReadModel, func(t *testing.T, in *chaoscheck.Input) {
			x := in.Executions["a"]
			behind, err := projections.Fold(x.Events[:len(x.Events)-1])
			require.NoError(t, err)
			x.ReadModel, err = json.Marshal(behind)
			require.NoError(t, err)
			in.Executions["a"] = x
		}},
		"ReadModelDiffers": {chaoscheck.RuleReadModel, func(t *testing.T, in *chaoscheck.Input) {
			x := in.Executions["a"]
			var m projections.Execution
			require.NoError(t, json.Unmarshal(x.ReadModel, &m))
			m.Steps = slices.Clone(m.Steps)
			m.Steps[0].Output = json.RawMessage(`{"ok":false}`)
			b, err := json.Marshal(m)
			require.NoError(t, err)
			x.ReadModel = b
			in.Executions["a"] = x
		}},
		"ReadModelMissing": {chaoscheck.RuleReadModel, func(t *testing.T, in *chaoscheck.Input) {
			x := in.Executions["a"]
			x.ReadModel = nil
			in.Executions["a"] = x
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := good(t)
			tc.spoil(t, &in)
			r := chaoscheck.Check(in)
			require.Positive(t, r.Count(tc.rule), "no %s violation in %v", tc.rule, r.Violations)
		})
	}
}

func TestLegitimateWaitsAreNotViolations(t *testing.T) {
	t.Parallel()
	in := good(t)
	var s stream
	s.seq = 100
	signal := s.history("w", started("w:wait"), &events.StepScheduled{StepID: "w", Attempt: 1},
		&events.StepWaiting{StepID: "w", Attempt: 1, Signals: []string{"go"}, Until: t0.Add(48 * time.Hour)})
	sleep := s.history("z", started("z:sleep"), &events.StepScheduled{StepID: "z", Attempt: 1},
		&events.StepWaiting{StepID: "z", Attempt: 1, Until: in.Now.Add(time.Minute)})
	in.Executions["w"], in.Executions["z"] = done(t, "w", signal), done(t, "z", sleep)
	in.Signals = []chaoscheck.Signal{{Execution: "z", Name: "go"}} // another execution's signal
	r := chaoscheck.Check(in)
	require.Empty(t, r.Violations)
	require.Equal(t, 2, r.Waiting)
}

func TestRunsAgainAreCounted(t *testing.T) {
	t.Parallel()
	in := good(t)
	// a's step ran twice in attempt 1 (its agent died), and once in attempt 2.
	in.Marks = append(in.Marks,
		chaoscheck.Mark{Kind: chaoscheck.MarkRun, Execution: "a", Step: "s1", Attempt: 1},
		chaoscheck.Mark{Kind: chaoscheck.MarkRun, Execution: "a", Step: "s1", Attempt: 2})
	x := in.Executions["b"]
	var s stream
	s.seq = 100
	evs := s.history("c", cat([]events.Payload{started("s1")}, ran("s1", 1)[:4],
		[]events.Payload{&events.StepStarted{StepID: "s1", Attempt: 1, Agent: "b", Delivery: 2}}, ran("s1", 1)[4:],
		[]events.Payload{&events.ExecutionSucceeded{}})...)
	in.Executions["c"] = done(t, "c", evs)
	in.Executions["b"] = x
	r := chaoscheck.Check(in)
	require.Empty(t, r.Violations)
	require.Equal(t, 1, r.RunTwice)
	require.Equal(t, 1, r.Reruns)
	require.Equal(t, 1, r.StartedAgain)
}

func TestParseMark(t *testing.T) {
	t.Parallel()
	m, err := chaoscheck.ParseMark("run x-1 each/2 3")
	require.NoError(t, err)
	require.Equal(t, chaoscheck.Mark{Kind: chaoscheck.MarkRun, Execution: "x-1", Step: "each/2", Attempt: 3}, m)
	m, err = chaoscheck.ParseMark("enter crit x-2")
	require.NoError(t, err)
	require.Equal(t, chaoscheck.Mark{Kind: chaoscheck.MarkEnter, Lock: "crit", Execution: "x-2"}, m)
	for _, bad := range []string{"", "run x s", "run x s one", "leave crit x", "enter crit"} {
		_, err := chaoscheck.ParseMark(bad)
		require.Error(t, err, bad)
	}
}
