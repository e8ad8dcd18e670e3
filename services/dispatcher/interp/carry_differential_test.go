package interp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// The tests of this file run workflows through the interpreter twice:
// with every state its own event (SplitDispatch, as for histories older
// dispatchers read), and with successes carrying the next dispatch or
// the end (docs/adr/0008, 0015). Only the events may differ: the
// executions' states, outputs, variables, the tasks they send and what
// else they publish are the same.

// carryDrive runs a memShell's execution to where it waits on nothing
// the test gives it: reporting its tasks (succeeded, or failed as fail
// and failFin say, except those of hold), firing its timers, sending
// signals.
type carryDrive struct {
	m        *memShell
	reported map[string]bool
	fail     map[string]int  // step id -> failures to report (not final)
	failFin  map[string]bool // step id -> final failure
	hold     map[string]bool // tasks of these steps are not reported
	signals  []string
	nsig     int
}

func (d *carryDrive) run() {
	m := d.m
	for range 300 {
		m.advance()
		if !m.state.Status.Active() {
			return
		}
		progressed := false
		for _, task := range m.tasks {
			if d.reported[task.TaskID] || d.hold[localID(lastSegment(task.StepID))] {
				continue
			}
			d.reported[task.TaskID] = true
			ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
				Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1"}
			id := localID(lastSegment(task.StepID))
			var p events.Payload = &events.OperationSucceeded{TaskRef: ref, Output: []byte(`"` + task.StepID + ` ok"`)}
			switch {
			case d.failFin[id]:
				p = &events.OperationFailed{TaskRef: ref, Error: "boom", Final: true}
				delete(d.failFin, id)
			case d.fail[id] > 0:
				d.fail[id]--
				p = &events.OperationFailed{TaskRef: ref, Error: "flaky"}
			}
			m.carry(Result(m.input(), ref, events.Event{ID: "r-" + task.TaskID, Type: p.EventType(), Data: p}))
			progressed = true
			break
		}
		if progressed {
			continue
		}
		fired := false
		for tid := range m.timers {
			if t, ok := m.state.Timers[tid]; ok && !t.Fired {
				m.fire()
				fired = true
				break
			}
		}
		if fired {
			continue
		}
		if d.nsig < len(d.signals) {
			name := d.signals[d.nsig]
			d.nsig++
			m.carry(Signal(m.input(), SignalCommand{ID: fmt.Sprintf("s%d", d.nsig), Name: name, Sender: "t", SentAt: m.now}))
			continue
		}
		return
	}
	m.t.Fatal("run did not end")
}

// carrySummary is what must not differ between the two runs.
type carrySummary struct {
	Status, Error string
	Output        string
	Vars          map[string]string
	Steps         []string
	Tasks         []string
	Kills, Starts int
	Actions       int
	Clears        int
	Compensated   string
	Timers        []string
}

// summarize sums up m's execution, and checks that its history folds to
// its state.
func summarize(t *testing.T, m *memShell) carrySummary {
	s := m.state
	out := carrySummary{Status: string(s.Status), Error: s.Error, Output: string(s.Output), Vars: map[string]string{}}
	for k, v := range s.Vars {
		out.Vars[k] = string(v)
	}
	for _, st := range s.Steps {
		out.Steps = append(out.Steps, fmt.Sprintf("%s %s a%d out=%s err=%s", st.ID, st.Status, st.Attempt, st.Output, st.Error))
	}
	for _, tk := range m.tasks {
		out.Tasks = append(out.Tasks, tk.TaskID+" "+string(tk.Spec))
	}
	out.Kills, out.Starts, out.Actions, out.Clears = len(m.kills), len(m.starts), len(m.actions), len(m.clears)
	if s.Compensation != nil {
		out.Compensated = fmt.Sprintf("%s %v", s.Compensation.Status, s.Compensation.Steps)
	}
	for id, tm := range s.Timers {
		out.Timers = append(out.Timers, fmt.Sprintf("%s %s %s a%d fired=%t", id, tm.Purpose, tm.StepID, tm.Attempt, tm.Fired))
	}
	slices.Sort(out.Timers)
	// The fold of the history is the state.
	fold, err := projections.Fold(m.evs)
	require.NoError(t, err)
	require.Equal(t, s.Status, fold.Status)
	require.Equal(t, string(s.Output), string(fold.Output))
	require.Equal(t, len(s.Steps), len(fold.Steps))
	for i := range s.Steps {
		require.Equal(t, s.Steps[i].RecordedStatus(), fold.Steps[i].Status, s.Steps[i].ID)
	}
	return out
}

// typesWithCarry lists m's events with what they carry, for the log.
func typesWithCarry(m *memShell) string {
	var b []string
	for _, ev := range m.evs {
		ty := strings.TrimPrefix(string(ev.Type), "io.jetflow.")
		switch p := ev.Data.(type) {
		case *events.StepSucceeded:
			ty += "(" + p.StepID
			if p.Then != nil {
				ty += " then=" + p.Then.StepID
			}
			ty += ")"
		case *events.ExecutionSucceeded:
			if p.Step != nil {
				ty += "(with=" + p.Step.StepID + ")"
			}
		case *events.StepDispatched:
			ty += "(" + p.StepID + ")"
		}
		b = append(b, ty)
	}
	return strings.Join(b, " ")
}

// carryCase is a workflow, and how its run goes: the called workflows it
// finds, the steps that fail (fail times, or finally), the tasks never
// reported, the signals sent, the largest event, a dry run, and what to
// do once it has run (after).
type carryCase struct {
	def      workflow.Definition
	input    string
	catalog  map[CalledRef]*Called
	fail     map[string]int
	failFin  map[string]bool
	hold     map[string]bool
	signals  []string
	maxEvent int
	dry      bool
	after    func(t *testing.T, d *carryDrive) // more, once run
}

// newCarryShell starts c's execution (dry, for a dry run).
func newCarryShell(t *testing.T, c carryCase) *memShell {
	m := newMemShell(t, c.def, cmp.Or(c.input, `{}`))
	if c.dry { // start it again, dry
		b, _ := json.Marshal(c.def)
		m2 := &memShell{t: t, def: c.def, memo: &Memo{}, now: decideT0, timers: m.timers, catalog: map[CalledRef]*Called{}}
		m2.append(&events.ExecutionStarted{Workflow: c.def.Name, Version: 1, Input: json.RawMessage(cmp.Or(c.input, `{}`)),
			Steps: c.def.StepRefs(), Definition: b, Token: "tok", DryRun: true})
		m = m2
	}
	for k, v := range c.catalog {
		m.catalog[k] = v
	}
	return m
}

// cloneOrEmpty is a copy of m, empty (not nil) for none.
func cloneOrEmpty[V any](m map[string]V) map[string]V {
	out := map[string]V{}
	maps.Copy(out, m)
	return out
}

// TestCarryingChangesOnlyTheEvents: every kind of step, container and
// handler ends the same whether its successes carry what follows or not.
func TestCarryingChangesOnlyTheEvents(t *testing.T) {
	sleep := func(id string) workflow.Step { return workflow.Step{ID: id, Kind: workflow.KindSleep, Duration: "1s"} }
	let := func(id string, vars map[string]any) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindLet, Vars: vars}
	}
	execA := func(id string, args ...string) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindExec, Command: id, Args: args}
	}
	inner := workflow.Definition{Name: "inner", Steps: []workflow.Step{sleep("is"), execA("ie", "${input.x}"), {ID: "ir", Kind: workflow.KindReturn, Output: map[string]any{"y": "${steps.ie.output}"}}}}
	cases := map[string]carryCase{
		"WaitThenOp": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "w", Kind: workflow.KindWait, Signal: "go"}, execA("build", "${steps.w.output.name}")}}, signals: []string{"go"}},
		"BlockSleepThenOp": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{sleep("s")}}, execA("after", "${steps.blk.status}")}}},
		"Foreach": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "fe", Kind: workflow.KindForeach, Items: "${[1,2,3]}", Concurrency: 2, Steps: []workflow.Step{sleep("s"), execA("e", "${item}")}},
			execA("after", "${len(steps.fe.output)}")}}},
		"ParallelAll": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "p", Kind: workflow.KindParallel, Branches: []workflow.Branch{
				{ID: "a", Steps: []workflow.Step{sleep("s"), execA("ea")}},
				{ID: "b", Steps: []workflow.Step{execA("eb")}}}},
			execA("after")}}},
		"ParallelFirstLoserInFlight": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "p", Kind: workflow.KindParallel, Mode: workflow.ModeFirst, Branches: []workflow.Branch{
				{ID: "a", Steps: []workflow.Step{sleep("s")}},
				{ID: "b", Steps: []workflow.Step{execA("eb")}}}}}}, hold: map[string]bool{"eb": true}},
		"ParallelFirstThenOp": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "p", Kind: workflow.KindParallel, Mode: workflow.ModeFirst, Branches: []workflow.Branch{
				{ID: "a", Steps: []workflow.Step{sleep("s")}},
				{ID: "b", Steps: []workflow.Step{execA("eb")}}}}, execA("after")}}, hold: map[string]bool{"eb": true}},
		"GotoLoop": {def: workflow.Definition{Name: "wf", Output: map[string]any{"i": "${vars.i}"}, Steps: []workflow.Step{
			let("init", map[string]any{"i": 0}), execA("a", "${vars.i}"), let("inc", map[string]any{"i": "${vars.i + 1}"}),
			sleep("nap"),
			{ID: "g", Kind: workflow.KindGoto, Target: "a", Condition: "${vars.i < 3}"}}}},
		"OnErrorGoto": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "a", Kind: workflow.KindExec, Command: "a", OnError: []workflow.Step{sleep("s"), {ID: "g", Kind: workflow.KindGoto, Target: "c"}}},
			execA("b"), execA("c")}}, failFin: map[string]bool{"a": true}},
		"OnErrorRetryNext": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "a", Kind: workflow.KindExec, Command: "a", OnError: []workflow.Step{{ID: "r", Kind: workflow.KindRetry, Retry: &workflow.Retry{Limit: 3}, Next: "c"}}},
			execA("b"), execA("c")}}, failFin: map[string]bool{"a": true}},
		"OnErrorRetry": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "a", Kind: workflow.KindExec, Command: "a", OnError: []workflow.Step{sleep("s"), {ID: "r", Kind: workflow.KindRetry, Retry: &workflow.Retry{Limit: 3}}}},
			execA("b")}}, failFin: map[string]bool{"a": true}},
		"WorkflowOnErrorReturn": {def: workflow.Definition{Name: "wf", OnError: []workflow.Step{sleep("s"), {ID: "ret", Kind: workflow.KindReturn, Output: map[string]any{"rescued": true}}},
			Steps: []workflow.Step{execA("a")}}, failFin: map[string]bool{"a": true}},
		"Compensation": {def: workflow.Definition{Name: "wf", CompensateOn: []string{workflow.CompensateOnFailure}, Steps: []workflow.Step{
			{ID: "hotel", Kind: workflow.KindExec, Command: "hotel", Compensate: []workflow.Step{sleep("cs"), execA("undo-hotel")}},
			{ID: "car", Kind: workflow.KindExec, Command: "car", Compensate: []workflow.Step{execA("undo-car"), sleep("cs2")}},
			execA("pay")}}, failFin: map[string]bool{"pay": true}},
		"Called": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "call", Kind: workflow.KindWorkflow, Workflow: "inner", Input: map[string]any{"x": 5}}, execA("after", "${steps.call.output.y}")}},
			catalog: map[CalledRef]*Called{{Name: "inner"}: {Name: "inner", Version: 1, Definition: inner}}},
		"CalledLast": {def: workflow.Definition{Name: "wf", Output: map[string]any{"o": "${steps.call.output}"}, Steps: []workflow.Step{
			{ID: "call", Kind: workflow.KindWorkflow, Workflow: "inner", Input: map[string]any{"x": 5}}}},
			catalog: map[CalledRef]*Called{{Name: "inner"}: {Name: "inner", Version: 1, Definition: inner}}},
		"WorkflowLock": {def: workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{sleep("s"), execA("e"), sleep("s2")}}},
		"StepLock": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "blk", Kind: workflow.KindWorkflow, Lock: "l", Steps: []workflow.Step{sleep("s"), execA("e"), sleep("s2")}}, execA("after"), sleep("last")}}},
		"Switch": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "sw", Kind: workflow.KindSwitch, Cases: []workflow.Case{{When: "${true}", Steps: []workflow.Step{sleep("s")}}}}, execA("after")}}},
		"ClearLockNoHolders": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "cl", Kind: workflow.KindClearLock, Lock: "zz"}, execA("after", "${steps.cl.output.lock}")}}},
		"ReplayableKind": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "rp", Kind: workflow.KindReplayable, Replayable: workflow.ReplayFromHere}, execA("after")}}},
		"DryRun": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{let("v", map[string]any{"a": 1}), sleep("s"), execA("e"), {ID: "ret", Kind: workflow.KindReturn, Output: map[string]any{"a": "${vars.a}"}}}}, dry: true},
		"ContinueAsNew": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{sleep("s"), {ID: "c", Kind: workflow.KindContinue}}},
			catalog: map[CalledRef]*Called{{Name: "wf"}: {Name: "wf", Version: 1, Definition: workflow.Definition{Name: "wf", Steps: []workflow.Step{sleep("s"), {ID: "c", Kind: workflow.KindContinue}}}}}},
		"LetLastBigVars":       {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{execA("e"), let("v", map[string]any{"big": strings.Repeat("x", 600)})}}, maxEvent: 2000},
		"LetLastBigVarsOutput": {def: workflow.Definition{Name: "wf", Output: map[string]any{"o": "${vars.big}"}, Steps: []workflow.Step{execA("e"), let("v", map[string]any{"big": strings.Repeat("x", 600)})}}, maxEvent: 2000},
		"WaitTwoSignals": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "w1", Kind: workflow.KindWait, Signal: "go"}, {ID: "w2", Kind: workflow.KindWait, Signal: "go"}, execA("e", "${steps.w2.output.signal_id}")}}, signals: []string{"go", "go"}},
		"WaitTimeoutArmedThenOp": {def: workflow.Definition{Name: "wf", Timeout: "1h", Steps: []workflow.Step{
			{ID: "w", Kind: workflow.KindWait, Signal: "go", Timeout: "10m"}, execA("e")}}, signals: []string{"go"}},
	}
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		c := cases[name]
		t.Run(name, func(t *testing.T) {
			var sums [2]carrySummary
			var hist [2]string
			var nevs [2]int
			for i, split := range []bool{true, false} {
				m := newCarryShell(t, c)
				m.split = split
				m.maxEvent = c.maxEvent
				d := &carryDrive{m: m, reported: map[string]bool{}, fail: cloneOrEmpty(c.fail),
					failFin: cloneOrEmpty(c.failFin), hold: c.hold, signals: c.signals}
				d.run()
				if c.after != nil {
					c.after(t, d)
				}
				sums[i] = summarize(t, m)
				hist[i] = typesWithCarry(m)
				nevs[i] = len(m.evs)
			}
			t.Logf("before (%d): %s", nevs[0], hist[0])
			t.Logf("after  (%d): %s", nevs[1], hist[1])
			require.Equal(t, sums[0], sums[1])
		})
	}
}

// TestCarryingKeepsWhatAReplayRestores: a replay from a step dispatched
// after a sleep, a wait, a let or a block restores the same variables
// (the let's among them) either way.
func TestCarryingKeepsWhatAReplayRestores(t *testing.T) {
	sleep := func(id string) workflow.Step { return workflow.Step{ID: id, Kind: workflow.KindSleep, Duration: "1s"} }
	let := func(id string, vars map[string]any) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindLet, Vars: vars}
	}
	build := workflow.Step{ID: "build", Kind: workflow.KindExec, Command: "make", Args: []string{"${vars.n}"}, Replayable: workflow.ReplayFromHere}
	replayFrom := func(from string) func(t *testing.T, d *carryDrive) {
		return func(t *testing.T, d *carryDrive) {
			require.Equal(t, projections.StatusFailed, d.m.state.Status)
			dec := askReplay(t, d.m, from, false)
			require.Nil(t, dec.Reject, "%+v", dec.Reject)
			d.m.carry(dec)
			d.run()
		}
	}
	cases := map[string]carryCase{
		"AfterSleep": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			let("set", map[string]any{"n": 3}), sleep("s"), build, let("bump", map[string]any{"n": 4}), {ID: "last", Kind: workflow.KindExec, Command: "x"}}},
			failFin: map[string]bool{"last": true}, after: replayFrom("build")},
		"AfterWait": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			let("set", map[string]any{"n": 3}), {ID: "w", Kind: workflow.KindWait, Signal: "go"}, build, let("bump", map[string]any{"n": 4}), {ID: "last", Kind: workflow.KindExec, Command: "x"}}},
			signals: []string{"go"}, failFin: map[string]bool{"last": true}, after: replayFrom("build")},
		"AfterLet": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			sleep("s"), let("set", map[string]any{"n": 3}), build, let("bump", map[string]any{"n": 4}), {ID: "last", Kind: workflow.KindExec, Command: "x"}}},
			failFin: map[string]bool{"last": true}, after: replayFrom("build")},
		"AfterBlockWithLet": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{let("set", map[string]any{"n": 3})}}, build, let("bump", map[string]any{"n": 4}), {ID: "last", Kind: workflow.KindExec, Command: "x"}}},
			failFin: map[string]bool{"last": true}, after: replayFrom("build")},
		"LastAfterSleep": {def: workflow.Definition{Name: "wf", Steps: []workflow.Step{
			let("set", map[string]any{"n": 3}), sleep("s"), build, let("bump", map[string]any{"n": 4}), {ID: "last", Kind: workflow.KindExec, Command: "x"}}},
			failFin: map[string]bool{"last": true}, after: replayFrom(events.ReplayLast)},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var sums [2]carrySummary
			for i, split := range []bool{true, false} {
				m := newCarryShell(t, c)
				m.split = split
				d := &carryDrive{m: m, reported: map[string]bool{}, fail: cloneOrEmpty(c.fail),
					failFin: cloneOrEmpty(c.failFin), hold: c.hold, signals: c.signals}
				d.run()
				c.after(t, d)
				sums[i] = summarize(t, m)
				t.Logf("split %v: %s", split, typesWithCarry(m))
				t.Logf("tasks: %v", sums[i].Tasks)
			}
			require.Equal(t, sums[0], sums[1])
		})
	}
}

// TestCarryingKeepsACompensatedCancel: a cancel while waiting runs the
// compensations (sleeps and operations) the same either way.
func TestCarryingKeepsACompensatedCancel(t *testing.T) {
	sleep := func(id string) workflow.Step { return workflow.Step{ID: id, Kind: workflow.KindSleep, Duration: "1s"} }
	def := workflow.Definition{Name: "wf", CompensateOn: []string{workflow.CompensateOnCancel}, Steps: []workflow.Step{
		{ID: "hotel", Kind: workflow.KindExec, Command: "hotel", Compensate: []workflow.Step{sleep("cs"), exec("undo"), sleep("cs2"), exec("undo2")}},
		{ID: "w", Kind: workflow.KindWait, Signal: "go"}, exec("pay")}}
	var sums [2]carrySummary
	for i, split := range []bool{true, false} {
		m := newMemShell(t, def, `{}`)
		m.split = split
		d := &carryDrive{m: m, reported: map[string]bool{}, fail: map[string]int{}, failFin: map[string]bool{}, hold: map[string]bool{}}
		d.run()
		require.Equal(t, projections.OpWaiting, m.state.Steps[m.state.StepIndex("w")].Status)
		m.carry(m.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionCancel, Command: "c", RequestedBy: "ops"}}))
		d.run()
		sums[i] = summarize(t, m)
		t.Logf("split %v (%d): %s", split, len(m.evs), typesWithCarry(m))
	}
	require.Equal(t, sums[0], sums[1])
}
