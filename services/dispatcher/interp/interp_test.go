package interp

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

// The interpreter without a server: memShell carries out decisions on a
// history kept in memory, as the dispatcher's shell does on JetStream
// (effects before, events folded in order, effects after, outcomes
// recorded), and stands in for agents, timers and the catalog.
type memShell struct {
	t       testing.TB
	def     workflow.Definition
	evs     []events.Event
	state   projections.Execution
	memo    *Memo
	now     time.Time
	called  map[CalledRef]*Called
	catalog map[CalledRef]*Called
	history bool
	stored  map[string]events.Event
	// split: the shell records step.sent (Input.SplitDispatch).
	split bool
	// maxEvent, when set, is the largest event (Input.MaxEvent; 1 MiB).
	maxEvent int
	// what the effects did
	tasks  []events.Task
	timers map[string]time.Time
	seq    uint64
	// kills are the kill notices published, each with the number of
	// events recorded before it.
	kills []killPublished
	// busy locks keep every request waiting; holders are what the lock
	// bucket lists (NeedHolders); clears the clear-lock commands
	// published, each with the number of events recorded before it.
	busy    map[string]bool
	holders map[string][]events.LockEntry
	clears  []clearPublished
	starts  []PublishStart
	// actions are the actions published on other executions (a child's
	// stop), each with the number of events recorded before it.
	actions []actionPublished
	// loadedHolders are the holders loaded for the decision under way,
	// checks the starts checked.
	loadedHolders map[string][]events.LockEntry
	checks        map[string]string
}

type clearPublished struct {
	PublishClear
	after int
}

type actionPublished struct {
	PublishAction
	after int
}

type killPublished struct {
	PublishKill
	after int
}

func newMemShell(t testing.TB, def workflow.Definition, input string) *memShell {
	t.Helper()
	b, err := json.Marshal(def)
	require.NoError(t, err)
	m := &memShell{t: t, def: def, memo: &Memo{}, now: decideT0, timers: map[string]time.Time{}, catalog: map[CalledRef]*Called{}}
	m.append(&events.ExecutionStarted{Workflow: def.Name, Version: 1, Input: json.RawMessage(input),
		Steps: def.StepRefs(), Definition: b, Token: "tok"})
	return m
}

func (m *memShell) input() Input {
	in := Input{ID: "x1", Workflow: m.def.Name, Def: m.def, State: m.state, Memo: m.memo, Now: m.now,
		Token: fmt.Sprintf("token-%d", len(m.evs)), MaxEvent: cmp.Or(m.maxEvent, 1<<20), Called: m.called, SplitDispatch: m.split}
	if m.history {
		in.History = m.evs
	}
	in.Stored = m.stored
	in.Holders, in.StartChecks = m.loadedHolders, m.checks
	return in
}

// append folds p as the next event of the history, as the shell's
// append does (an illegal event fails the test).
func (m *memShell) append(p events.Payload) {
	m.t.Helper()
	m.seq++
	ev := events.Event{ID: fmt.Sprintf("e%d", m.seq), Type: p.EventType(), Source: "test", Subject: "x1",
		Workflow: m.def.Name, Time: m.now, Seq: m.seq, PrevSeq: m.state.LastSeq, Data: p}
	next, err := projections.Apply(m.state, ev)
	require.NoError(m.t, err, "append %T", p)
	next.LastSeq = m.seq
	m.state = next
	m.evs = append(m.evs, ev)
	if c, ok := p.(*events.DefinitionChanged); ok { // what follows runs the new version, as the shell does
		var def workflow.Definition
		require.NoError(m.t, json.Unmarshal(c.Definition, &def))
		m.def, m.memo = def, &Memo{}
	}
}

// carry performs d, and reports whether it did anything.
func (m *memShell) carry(d Decision) bool {
	m.t.Helper()
	require.NoError(m.t, d.Err)
	if n, ok := d.Need.(NeedWorkflow); ok {
		if m.called == nil {
			m.called = map[CalledRef]*Called{}
		}
		m.called[n.Ref] = m.catalog[n.Ref]
		return true
	}
	if _, ok := d.Need.(NeedHistory); ok {
		m.history = true
		return true
	}
	if n, ok := d.Need.(NeedHolders); ok {
		if m.loadedHolders == nil {
			m.loadedHolders = map[string][]events.LockEntry{}
		}
		m.loadedHolders[n.Lock] = append([]events.LockEntry{}, m.holders[n.Lock]...)
		return true
	}
	if n, ok := d.Need.(NeedStartCheck); ok { // as the shell does, against the catalog
		if m.checks == nil {
			m.checks = map[string]string{}
		}
		m.checks[n.ID] = ""
		called := m.catalog[CalledRef{Name: n.Start.Workflow, Version: n.Start.Version}]
		if called == nil {
			called = m.catalog[CalledRef{Name: n.Start.Workflow}]
		}
		ev := events.New("jetflow/dispatcher", n.Start.ExecutionID, n.Start.Workflow, m.now, &n.Start)
		ev.ID = n.ID
		var def *startcheck.Definition
		if called != nil {
			def = &startcheck.Definition{Name: called.Name, Version: called.Version, Spec: called.Definition}
		}
		_, err := startcheck.Check(ev, def, startcheck.Options{Now: m.now})
		var p *startcheck.Problem
		if errors.As(err, &p) {
			m.checks[n.ID] = p.Message
		}
		return true
	}
	if _, ok := d.Need.(NeedToken); ok {
		return true // input() always gives one
	}
	if _, ok := d.Need.(NeedStoredResults); ok {
		m.stored = map[string]events.Event{} // no report is stored unrecorded
		return true
	}
	for _, e := range d.Before {
		m.perform(e)
	}
	for _, p := range d.Events {
		m.append(p)
	}
	for _, e := range d.After {
		o := m.perform(e)
		if noted, ok := Noted(m.input(), o); ok { // as the dispatcher does: recorded with the step's next event
			m.state = noted
			continue
		}
		if o != nil {
			m.carry(Recorded(m.input(), o))
		}
	}
	return !d.Empty()
}

func (m *memShell) perform(e Effect) Outcome {
	switch e := e.(type) {
	case ArmTimer:
		m.timers[e.TimerID] = e.Due
	case PublishTask:
		m.tasks = append(m.tasks, e.Task)
		return TaskStored{Task: e, Seq: uint64(100 + len(m.tasks)), At: m.now}
	case EnqueueLock:
		if m.busy[e.Lock] {
			return nil // it waits
		}
		return LockHeld{Lock: e}
	case PublishClear:
		m.clears = append(m.clears, clearPublished{e, len(m.evs)})
	case PublishStart:
		m.starts = append(m.starts, e)
	case PublishAction:
		m.actions = append(m.actions, actionPublished{e, len(m.evs)})
	case PublishKill:
		m.kills = append(m.kills, killPublished{e, len(m.evs)})
	case ReleaseLock, CatchUp:
	default:
		m.t.Fatalf("unknown effect %T", e)
	}
	return nil
}

// advance decides until the execution waits.
func (m *memShell) advance() {
	m.t.Helper()
	for i := 0; i < 1000; i++ {
		if !m.carry(Next(m.input())) {
			m.called, m.history, m.stored, m.loadedHolders, m.checks = nil, false, nil, nil, nil
			return
		}
	}
	m.t.Fatal("the execution did not settle")
}

// report hands the interpreter an agent's report about the last task.
func (m *memShell) report(p events.Payload) Decision {
	m.t.Helper()
	require.NotEmpty(m.t, m.tasks)
	task := m.tasks[len(m.tasks)-1]
	ev := events.Event{ID: fmt.Sprintf("r%d", len(m.evs)), Type: p.EventType(), Data: p}
	ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
		Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1"}
	return Result(m.input(), ref, ev)
}

// fire decides the timer that comes due first (of two due together, the
// one whose id sorts first: the same every run), as the shell does for a
// FireTimer command (Fired: a sleep's success may record the firing),
// moving the clock to it.
func (m *memShell) fire() {
	m.t.Helper()
	var id string
	for tid, due := range m.timers {
		if t, ok := m.state.Timers[tid]; ok && !t.Fired && (id == "" || due.Before(m.timers[id]) || (due.Equal(m.timers[id]) && tid < id)) {
			id = tid
		}
	}
	require.NotEmpty(m.t, id, "no timer to fire")
	m.now = m.timers[id]
	d := Fired(m.input(), id, m.now)
	require.Len(m.t, d.Events, 1, "a firing is recorded by one event")
	m.carry(d)
}

func (m *memShell) types() []string {
	out := make([]string, len(m.evs))
	for i, ev := range m.evs {
		out[i] = strings.TrimPrefix(string(ev.Type), "io.jetflow.")
	}
	return out
}

// TestInterpreterRunsAWorkflowWithoutAServer drives an operation, a let, a
// sleep and the output through the interpreter alone, and checks the
// history it writes, the task it sends and the timer it arms.
func TestInterpreterRunsAWorkflowWithoutAServer(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "deploy", Output: map[string]any{"built": "${steps.build.output.ref}", "n": "${vars.n}"},
		Steps: []workflow.Step{
			{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${input.target}"}, Queue: "builders"},
			{ID: "count", Kind: workflow.KindLet, Vars: map[string]any{"n": 3}},
			{ID: "rest", Kind: workflow.KindSleep, Duration: "90s"},
		}}
	m := newMemShell(t, def, `{"target":"all"}`)
	m.advance()
	require.Len(t, m.tasks, 1, "one task is published")
	task := m.tasks[0]
	require.Equal(t, "build", task.StepID)
	require.Equal(t, "builders", task.Queue)
	require.Equal(t, "tok", task.Token)
	require.Contains(t, string(task.Spec), `"all"`, "the task carries the rendered input")
	st := m.state.Steps[m.state.StepIndex("build")]
	require.Equal(t, projections.OpSent, st.Status, "sent, as the shell knows")
	require.True(t, st.SentUnrecorded(), "and the history does not say yet")
	require.Equal(t, projections.OpSending, st.RecordedStatus())
	require.Equal(t, uint64(101), st.TaskSeq, "the task's stream sequence")

	m.carry(m.report(&events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}}))
	m.carry(m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}, Output: json.RawMessage(`{"ref":"v1"}`)}))
	m.advance()
	require.Len(t, m.timers, 1, "the sleep arms one timer")
	for _, due := range m.timers {
		require.Equal(t, decideT0.Add(90*time.Second), due, "counted from the input's clock")
	}
	require.Equal(t, projections.StatusStarted, m.state.Status)

	m.fire()
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.JSONEq(t, `{"built":"v1","n":3}`, string(m.state.Output))
	require.Equal(t, []string{
		"execution.started",
		"step.dispatched", "step.started", "step.succeeded", // build: scheduled and sending are one event, sent is recorded with the start
		"step.scheduled", "step.succeeded", // count: the variables and the success are one event
		"step.scheduled", "step.waiting", // rest: the wait records its timer's arming (docs/adr/0018)
		"execution.succeeded", // carrying rest's success (docs/adr/0015), which carries its timer's firing (0017)
	}, m.types())
	end, ok := m.evs[len(m.evs)-1].Data.(*events.ExecutionSucceeded)
	require.True(t, ok)
	require.NotNil(t, end.Step, "the end carries the sleep's success")
	require.Equal(t, "rest", end.Step.StepID)
	require.NotEmpty(t, end.Step.Fired, "and the sleep's success its timer's firing")
	require.True(t, m.state.Timers[end.Step.Fired].Fired)
	require.Equal(t, 4, events.SchemaOf(end), "an older reader must not pass over the firing")
	require.Equal(t, projections.OpSucceeded, m.state.Steps[m.state.StepIndex("rest")].Status)
}

// TestInterpreterIsPure: the same input gives the same decision, and a
// decision does not change its input's state.
func TestInterpreterIsPure(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "deploy", Steps: []workflow.Step{
		{ID: "flaky", Kind: workflow.KindExec, Command: "x", Retry: &workflow.Retry{Limit: 3, Backoff: &workflow.Backoff{Initial: "10s"}, Jitter: 0.5}},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1"}))
	before := m.state
	in := m.input()
	in.Memo = nil
	first, second := Next(in), Next(in)
	require.Equal(t, first, second)
	require.Equal(t, before, m.state)
	require.Len(t, first.Events, 2, "the retry's timer and its schedule: %+v", first.Events)
	resc, ok := first.Events[1].(*events.StepRescheduled)
	require.True(t, ok, "%T", first.Events[1])
	delay := resc.Due.Sub(decideT0)
	require.True(t, delay >= 5*time.Second && delay <= 15*time.Second, "a 10s backoff with 50%% jitter is within [5s, 15s]: %s", delay)
	require.Equal(t, []Effect{ArmTimer{TimerID: resc.TimerID, Due: resc.Due}}, first.Before, "the schedule is published before it is recorded")
}

// TestJitterSpreadsRetries: the jitter factor stays within its bounds and
// differs between timers (so retries of many executions do not all come
// due at once), and is the same for the same timer.
func TestJitterSpreadsRetries(t *testing.T) {
	t.Parallel()
	seen := map[float64]bool{}
	for i := range 200 {
		id := timerID(fmt.Sprintf("x%d", i), events.TimerRetry, "op", 1)
		f := jitter(id, 0.25)
		require.GreaterOrEqual(t, f, 0.75)
		require.LessOrEqual(t, f, 1.25)
		require.Equal(t, f, jitter(id, 0.25))
		seen[f] = true
	}
	require.Greater(t, len(seen), 190, "jitter hardly varies between timers")
	require.Equal(t, 1.0, jitter("t", 0))
}

// TestTimerArmedBeforeACrashKeepsItsDueTime: a sleep whose timer was
// recorded but whose step.waiting was not (a crash in between) is decided
// again at a later time: the timer keeps its first due time, its schedule
// is published again, and it is not recorded twice.
func TestTimerArmedBeforeACrashKeepsItsDueTime(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "nap", Steps: []workflow.Step{{ID: "rest", Kind: workflow.KindSleep, Duration: "1m"}}}
	m := newMemShell(t, def, `{}`)
	m.carry(Next(m.input())) // step.scheduled
	first := Next(m.input())
	require.Len(t, first.Events, 1, "the wait records its timer's arming (docs/adr/0018)")
	w, ok := first.Events[0].(*events.StepWaiting)
	require.True(t, ok, "%T", first.Events[0])
	require.NotNil(t, w.Timer)
	require.Equal(t, events.TimerSleep, w.Timer.Purpose)
	require.Equal(t, decideT0.Add(time.Minute), w.Timer.Due)
	require.Equal(t, w.Until, w.Timer.Due)
	require.Equal(t, 5, events.SchemaOf(w), "older readers must not pass over the arming")
	// A history written with -split-dispatch (or by a dispatcher older
	// than schema 5) records the arming on its own, and may stop there.
	split := m.input()
	split.SplitDispatch = true
	first = Next(split)
	require.Len(t, first.Events, 2)
	for _, p := range first.Events {
		require.Less(t, events.SchemaOf(p), 5, "%T: split, for older readers", p)
	}
	m.append(first.Events[0]) // timer.armed; the dispatcher dies before step.waiting
	m.now = m.now.Add(20 * time.Second)
	again := Next(m.input())
	require.Len(t, again.Before, 1)
	require.Equal(t, decideT0.Add(time.Minute), again.Before[0].(ArmTimer).Due)
	require.Len(t, again.Events, 1, "timer.armed is not recorded twice")
	require.Equal(t, decideT0.Add(time.Minute), again.Events[0].(*events.StepWaiting).Until)
}

// TestCalledWorkflowIsAskedFor: a step calling a registered workflow asks
// for its definition, and records it pinned with the schedule; one that
// is not registered fails the step.
func TestCalledWorkflowIsAskedFor(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "outer", Steps: []workflow.Step{
		{ID: "call", Kind: workflow.KindWorkflow, Workflow: "inner", Version: 2, Input: map[string]any{"n": 1}}}}
	ref := CalledRef{Name: "inner", Version: 2}

	m := newMemShell(t, def, `{}`)
	d := Next(m.input())
	require.Equal(t, NeedWorkflow{Ref: ref}, d.Need)
	require.Empty(t, d.Events)

	m.called = map[CalledRef]*Called{ref: nil}
	d = Next(m.input())
	require.Len(t, d.Events, 1)
	failed, ok := d.Events[0].(*events.StepFailed)
	require.True(t, ok, "%T", d.Events[0])
	require.Contains(t, failed.Error, `workflow "inner" version 2 is not registered`)
	require.True(t, failed.Final)

	inner := workflow.Definition{Name: "inner", Steps: []workflow.Step{{ID: "n", Kind: workflow.KindNoop}}}
	m.called = map[CalledRef]*Called{ref: {Name: "inner", Version: 2, Definition: inner}}
	d = Next(m.input())
	require.Len(t, d.Events, 1)
	sched, ok := d.Events[0].(*events.StepScheduled)
	require.True(t, ok, "%T", d.Events[0])
	require.Contains(t, string(sched.Input), `"definition"`)
	require.Contains(t, string(sched.Input), `"version":2`)
}

// TestEventsComeOutFinal: an output larger than an event may hold fails
// its step in the event the interpreter returns; nothing changes it on
// the write path.
func TestEventsComeOutFinal(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "big", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	in := m.input()
	in.MaxEvent = 100
	d := m.report(&events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}, Output: json.RawMessage(`"` + strings.Repeat("x", 200) + `"`)})
	require.Len(t, d.Events, 1)
	d = Result(in, events.TaskRef{TaskID: m.tasks[0].TaskID, ExecutionID: "x1", Workflow: "big", StepID: "op", Attempt: 1,
		Token: "tok", Queue: m.tasks[0].Queue}, events.Event{ID: "r1", Type: events.TypeOperationSucceeded,
		Data: &events.OperationSucceeded{Output: json.RawMessage(`"` + strings.Repeat("x", 200) + `"`)}})
	require.Len(t, d.Events, 1)
	failed, ok := d.Events[0].(*events.StepFailed)
	require.True(t, ok, "%T", d.Events[0])
	require.Contains(t, failed.Error, "the step's output is 202 bytes")
}

// TestStaleReportsAreRecordedOnce: a report about an earlier attempt is
// recorded ignored with why, once; the same report again records nothing.
func TestStaleReportsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	ref := events.TaskRef{TaskID: m.tasks[0].TaskID, ExecutionID: "x1", Workflow: "wf", StepID: "op", Attempt: 1,
		Token: "another", Queue: m.tasks[0].Queue}
	ev := events.Event{ID: "r1", Type: events.TypeOperationSucceeded, Data: &events.OperationSucceeded{}}
	d := Result(m.input(), ref, ev)
	require.Contains(t, d.Stale, "stale execution token")
	require.Len(t, d.Events, 1)
	require.IsType(t, &events.ResultIgnored{}, d.Events[0])
	m.carry(d)
	d = Result(m.input(), ref, ev)
	require.NotEmpty(t, d.Stale)
	require.Empty(t, d.Events, "recorded once")
	require.True(t, d.Empty())
}

// TestLocksAreAskedForAndRecorded: a workflow with a lock asks for it
// before any step (enqueueing after lock.requested is recorded), records
// its grant, and gives it up before it ends.
func TestLocksAreAskedForAndRecorded(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Lock: "deploy-${input.env}", Steps: []workflow.Step{{ID: "n", Kind: workflow.KindLet, Vars: map[string]any{"a": 1}}}}
	m := newMemShell(t, def, `{"env":"prod"}`)
	d := Next(m.input())
	require.Equal(t, []events.Payload{&events.LockRequested{Lock: "deploy-prod", Limit: 1}}, d.Events)
	require.Equal(t, []Effect{EnqueueLock{Lock: "deploy-prod", Limit: 1}}, d.After)
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Contains(t, m.types(), "lock.acquired")
	require.Contains(t, m.types(), "lock.released")
	require.Equal(t, "execution.succeeded", m.types()[len(m.types())-1])
}

// TestDecisionsDoNotDependOnMapOrder: a step whose several variables,
// environment entries or headers fail to render fails with the same error
// every time (Go's map order is random, and a decision taken again must
// be the one taken before: after a crash, and in the view's check).
func TestDecisionsDoNotDependOnMapOrder(t *testing.T) {
	t.Parallel()
	bad := func(n int) map[string]any {
		m := map[string]any{}
		for i := range n {
			m[fmt.Sprintf("v%d", i)] = fmt.Sprintf("${input.missing%d.x}", i)
		}
		return m
	}
	badStrings := func(n int) map[string]string {
		m := map[string]string{}
		for k, v := range bad(n) {
			m[k] = v.(string)
		}
		return m
	}
	for name, step := range map[string]workflow.Step{
		"Vars":    {ID: "s", Kind: workflow.KindLet, Vars: bad(6)},
		"Env":     {ID: "s", Kind: workflow.KindExec, Command: "x", Env: badStrings(6)},
		"Headers": {ID: "s", Kind: workflow.KindHTTP, URL: "http://127.0.0.1/", Headers: badStrings(6)},
		"Body":    {ID: "s", Kind: workflow.KindHTTP, URL: "http://127.0.0.1/", Body: bad(6)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			def := workflow.Definition{Name: "wf", Steps: []workflow.Step{step}}
			m := newMemShell(t, def, `{}`)
			first := Next(m.input())
			for i := 0; i < 3 && len(first.Events) == 1; i++ {
				if _, failed := first.Events[0].(*events.StepFailed); failed {
					break
				}
				m.carry(first) // the step is scheduled first
				first = Next(m.input())
			}
			require.Len(t, first.Events, 1)
			failed, ok := first.Events[0].(*events.StepFailed)
			require.True(t, ok, "%T", first.Events[0])
			require.Contains(t, failed.Error, "missing0", "the first name in order is the one reported")
			for range 50 {
				require.Equal(t, first, Next(m.input()))
			}
		})
	}
}

// TestReplayRestoresTheVariablesOfItsPoint: an operator's replay from the
// last replay point asks for the stored results, then for the history,
// and records the replay with the variables as they were when the point
// was entered; what happened while the execution was over is caught up
// with after.
func TestReplayRestoresTheVariablesOfItsPoint(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "one", Kind: workflow.KindLet, Vars: map[string]any{"x": 1}},
		{ID: "mark", Kind: workflow.KindReplayable, Replayable: workflow.ReplayFromHere},
		{ID: "two", Kind: workflow.KindLet, Vars: map[string]any{"x": 2}},
		{ID: "op", Kind: workflow.KindExec, Command: "x"},
	}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1"}))
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
	require.JSONEq(t, `2`, string(m.state.Vars["x"]))

	cmd := ActionCommand{Key: "k1", From: events.ReplayLast, Record: events.ActionRecord{Action: events.ActionReplay, RequestedBy: "ops", Command: "k1"}}
	d := Action(m.input(), cmd)
	require.Equal(t, NeedStoredResults{}, d.Need)
	m.carry(d)
	d = Action(m.input(), cmd)
	require.Equal(t, NeedHistory{}, d.Need, "the variables at the point are folded from the history")
	m.carry(d)
	d = Action(m.input(), cmd)
	require.Len(t, d.Events, 1)
	replayed, ok := d.Events[0].(*events.ExecutionReplayed)
	require.True(t, ok, "%T", d.Events[0])
	require.Equal(t, "mark", replayed.Point)
	require.JSONEq(t, `1`, string(replayed.Vars["x"]), "as when mark was entered")
	require.Equal(t, m.input().Token, replayed.Token)
	require.Equal(t, []Effect{CatchUp{}}, d.After)
	m.carry(d)
	m.history, m.stored = false, nil
	m.advance()
	require.Len(t, m.tasks, 2, "the operation runs again")
}

// TestLockEffects: enqueueing again what the execution waits for, the
// record of a grant, and the release of an ended execution's lock, whose
// bucket removal comes before lock.released.
func TestLockEffects(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	require.Equal(t, Decision{}, Waiting(m.input()), "nothing asked for yet")
	m.carry(Decision{Events: Next(m.input()).Events}) // lock.requested, not granted yet
	require.Equal(t, Decision{After: []Effect{EnqueueLock{Lock: "l", Limit: 1}}}, Waiting(m.input()))
	require.Equal(t, Decision{}, Next(m.input()), "nothing runs while it waits")
	granted := Recorded(m.input(), LockHeld{Lock: EnqueueLock{Lock: "l", Limit: 1}})
	require.Equal(t, []events.Payload{&events.LockAcquired{Lock: "l"}}, granted.Events)
	m.carry(granted)
	require.Equal(t, Decision{}, Waiting(m.input()), "held: nothing to enqueue again")
	m.advance()
	require.Len(t, m.tasks, 1)

	require.Equal(t, Decision{}, Unlocking(m.input()), "a running execution keeps its lock")
	m.carry(Action(m.input(), ActionCommand{Key: "k", Record: events.ActionRecord{Action: events.ActionForceCancel, Command: "k"}}))
	d := Unlocking(m.input())
	require.Equal(t, []Effect{ReleaseLock{Lock: "l", Request: 1, Reason: "the execution is cancelled"}}, d.Before, "removed from the bucket first, its current request")
	require.Equal(t, []events.Payload{&events.LockReleased{Lock: "l", Reason: "the execution is cancelled"}}, d.Events)
	m.carry(d)
	require.Equal(t, Decision{}, Unlocking(m.input()))
}

// TestStaleReports: a report counts only for the step's current attempt,
// token and queue.
func TestStaleReports(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x", Queue: "gpu"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	st := m.state.Steps[m.state.StepIndex("op")]
	ref := events.TaskRef{StepID: "op", Attempt: 1, Token: "tok", Queue: "gpu"}
	require.Empty(t, Stale(m.state, st, ref))
	for name, r := range map[string]events.TaskRef{
		"attempt": {StepID: "op", Attempt: 2, Token: "tok", Queue: "gpu"},
		"token":   {StepID: "op", Attempt: 1, Token: "old", Queue: "gpu"},
		"queue":   {StepID: "op", Attempt: 1, Token: "tok", Queue: "default"},
	} {
		require.Contains(t, Stale(m.state, st, r), name)
	}
}

// TestAttemptOver: the attempt of a task is over once its result is
// recorded, or once the task's token is no longer the execution's (a
// resume); while the step waits for its result it is not, even in an
// execution that ended (a resume waits for that result), nor for a step
// the state does not know yet.
func TestAttemptOver(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "two", Steps: []workflow.Step{{ID: "s1", Kind: workflow.KindNoop}, {ID: "s2", Kind: workflow.KindNoop}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 1)
	first := m.tasks[0]
	ref := events.TaskRef{TaskID: first.TaskID, ExecutionID: "x1", Workflow: "two", StepID: first.StepID,
		Attempt: first.Attempt, Token: first.Token, Queue: first.Queue, Agent: "a1", Delivery: 2}
	require.False(t, AttemptOver(m.state, ref), "s1 is in flight")
	other := ref
	other.Token = "token-before-a-resume"
	require.True(t, AttemptOver(m.state, other), "sent with another token")
	unknown := ref
	unknown.StepID = "later/step"
	require.False(t, AttemptOver(m.state, unknown), "a step the state does not know yet")
	m.reportTask(first, &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}})
	require.True(t, AttemptOver(m.state, ref), "s1's result is recorded")
	m.advance()
	require.Len(t, m.tasks, 2)
	second := m.tasks[1]
	ref2 := events.TaskRef{TaskID: second.TaskID, ExecutionID: "x1", Workflow: "two", StepID: second.StepID,
		Attempt: second.Attempt, Token: second.Token, Queue: second.Queue}
	require.False(t, AttemptOver(m.state, ref2))
	cancelled := m.state
	cancelled.Status = projections.StatusCancelled
	require.False(t, AttemptOver(cancelled, ref2), "in flight in an execution that ended: a resume waits for its result")
	m.reportTask(second, &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}})
	m.advance()
	require.True(t, m.state.Status.Terminal())
	require.True(t, AttemptOver(m.state, ref2), "s2's result is recorded")
}
