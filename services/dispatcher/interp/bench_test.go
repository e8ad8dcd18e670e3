package interp

import (
	"fmt"
	"testing"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// reportTask hands the interpreter an agent's report about task, and
// carries out its decision, as the dispatcher does with a result.
func (m *memShell) reportTask(task events.Task, p events.Payload) {
	m.t.Helper()
	ev := events.Event{ID: fmt.Sprintf("r%d", len(m.evs)), Type: p.EventType(), Data: p}
	ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
		Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1", Delivery: 1}
	m.carry(Result(m.input(), ref, ev))
}

// finish reports task started and succeeded.
func (m *memShell) finish(task events.Task) {
	m.reportTask(task, &events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}})
	m.reportTask(task, &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}})
}

// tenStepsMidway is an execution of ten noop steps whose 6th step's
// success was just recorded. With split, each success is recorded without
// the next dispatch (as with -split-dispatch), and the next decision
// (Next) schedules the 7th; without, the 6th success carried the 7th's
// dispatch (docs/adr/0008), which Result decides.
func tenStepsMidway(tb testing.TB, split bool) *memShell { return stepsMidway(tb, 10, 6, split) }

// stepsMidway is an execution of n noop steps with the first done ones
// done, as tenStepsMidway.
func stepsMidway(tb testing.TB, n, done int, split bool) *memShell {
	def := workflow.Definition{Name: "bench"}
	for i := range n {
		def.Steps = append(def.Steps, workflow.Step{ID: fmt.Sprintf("s%d", i+1), Kind: workflow.KindNoop})
	}
	m := newMemShell(tb, def, `{}`)
	m.split = split
	for i := range done {
		m.advance()
		if len(m.tasks) != i+1 {
			tb.Fatalf("%d tasks after %d steps", len(m.tasks), i)
		}
		m.finish(m.tasks[i])
	}
	return m
}

// foreachMidway is an execution of a foreach over 1,000 noop items, 50
// at a time, with 500 done and the 500th's success just recorded: the
// next decision starts one more item.
func foreachMidway(b *testing.B) *memShell {
	def, err := workflow.Parse([]byte(`
name: bench-foreach
steps:
  - id: each
    kind: foreach
    items: ${0..999}
    concurrency: 50
    steps:
      - {id: op, kind: noop}
`))
	if err != nil {
		b.Fatal(err)
	}
	m := newMemShell(b, def, `{}`)
	m.advance()
	for done := range 500 {
		if done >= len(m.tasks) {
			b.Fatalf("%d tasks published for %d items done", len(m.tasks), done)
		}
		if done > 0 {
			m.advance()
		}
		m.finish(m.tasks[done])
	}
	return m
}

// loopMidway is an execution of a goto loop (a noop, a let counting the
// rounds, the goto back) whose 500th round's let was just scheduled: the
// next decision evaluates its variable, in a history of 1,500 instances.
func loopMidway(b *testing.B) *memShell {
	def, err := workflow.Parse([]byte(`
name: bench-loop
steps:
  - {id: init, kind: let, vars: {n: 0}}
  - {id: work, kind: noop}
  - {id: count, kind: let, vars: {n: "${vars.n + 1}"}}
  - {id: again, kind: goto, target: work, condition: "${vars.n < 1000}"}
`))
	if err != nil {
		b.Fatal(err)
	}
	m := newMemShell(b, def, `{}`)
	for round := range 500 {
		m.advance()
		if len(m.tasks) != round+1 {
			b.Fatalf("%d tasks published in round %d", len(m.tasks), round)
		}
		m.finish(m.tasks[round])
	}
	m.carry(Next(m.input())) // the let is scheduled
	return m
}

// noVerify turns off, for a benchmark, the check of every decision taken
// with a view against one taken without (view_test.go turns it on for the
// package's tests): it would count both, and keep views of small
// executions. Benchmarks run after the tests.
func noVerify(b *testing.B) {
	was := verifyView
	SetVerifyView(false) // and small executions walked again, as in production
	b.Cleanup(func() { SetVerifyView(was) })
}

// BenchmarkNext is the interpreter's decision after a step's success: on
// a 10-step execution (small: walked every time), and on a 200-step one,
// a foreach of 1,000 items and a goto loop of 500 rounds halfway, with the view the dispatcher
// keeps with the state (its Memo) and without it (a state just read
// again).
func BenchmarkNext(b *testing.B) {
	noVerify(b)
	run := func(b *testing.B, m *memShell, memo bool) {
		in := m.input()
		if !memo {
			in.Memo = nil
		}
		d := Next(in)
		if d.Err != nil || len(d.Events) == 0 {
			b.Fatalf("the decision does nothing: %+v", d)
		}
		b.ReportAllocs()
		for b.Loop() {
			Next(in)
		}
	}
	b.Run("ten-steps-midway", func(b *testing.B) { run(b, tenStepsMidway(b, true), true) })
	b.Run("steps-200-midway/view", func(b *testing.B) { run(b, stepsMidway(b, 200, 100, false), true) })
	b.Run("steps-200-midway/walk", func(b *testing.B) { run(b, stepsMidway(b, 200, 100, false), false) })
	b.Run("foreach-1000-midway/view", func(b *testing.B) { run(b, foreachMidway(b), true) })
	b.Run("foreach-1000-midway/walk", func(b *testing.B) { run(b, foreachMidway(b), false) })
	b.Run("loop-500-rounds/view", func(b *testing.B) { run(b, loopMidway(b), true) })
	b.Run("loop-500-rounds/walk", func(b *testing.B) { run(b, loopMidway(b), false) })
}

// succeeding sends m's next operation, its nth, records it started and
// returns the input, task and report of its success: what Result is
// benchmarked on.
func succeeding(b *testing.B, m *memShell, n int) (Input, events.TaskRef, events.Event) {
	b.Helper()
	m.advance()
	if len(m.tasks) != n {
		b.Fatalf("%d tasks, want %d", len(m.tasks), n)
	}
	task := m.tasks[n-1]
	m.reportTask(task, &events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}})
	ev := events.Event{ID: "r", Type: events.TypeOperationSucceeded, Data: &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}}}
	ref := events.TaskRef{TaskID: task.TaskID, ExecutionID: "x1", Workflow: m.def.Name, StepID: task.StepID,
		Attempt: task.Attempt, Token: task.Token, Queue: task.Queue, Agent: "a1", Delivery: 1}
	return m.input(), ref, ev
}

// BenchmarkResult is the decision on an agent's report that a 10-step
// execution's 7th step succeeded: the success, with the 8th's dispatch.
func BenchmarkResult(b *testing.B) {
	noVerify(b)
	in, ref, ev := succeeding(b, tenStepsMidway(b, false), 7)
	if d := Result(in, ref, ev); d.Err != nil || len(d.Events) == 0 {
		b.Fatalf("the decision does nothing: %+v", d)
	} else if ok, _ := d.Events[0].(*events.StepSucceeded); ok == nil || ok.Then == nil {
		b.Fatalf("the success does not carry the next dispatch: %+v", d.Events[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		Result(in, ref, ev)
	}
}

// BenchmarkFired is the decision on a sleep's timer firing in a one-step
// workflow that sleeps until a time from its input (what the timer run of
// jetflow-bench fires 10,000 of at once): the sleep's success recording
// the firing, carried by the execution's end (docs/adr/0017).
func BenchmarkFired(b *testing.B) {
	noVerify(b)
	def, err := workflow.Parse([]byte(`
name: bench-timers
steps:
  - {id: nap, kind: sleep, until: "${input.due}"}
`))
	if err != nil {
		b.Fatal(err)
	}
	m := newMemShell(b, def, `{"due": "2030-01-01T00:00:00Z"}`)
	m.advance()
	if len(m.timers) != 1 {
		b.Fatalf("%d timers armed", len(m.timers))
	}
	var timer string
	for id := range m.timers {
		timer = id
	}
	in := m.input()
	d := Fired(in, timer, m.now)
	if d.Err != nil || len(d.Events) != 1 {
		b.Fatalf("the decision is not one event: %+v", d)
	}
	if end, ok := d.Events[0].(*events.ExecutionSucceeded); !ok || end.Step == nil || end.Step.Fired != timer || len(end.Output) > 0 {
		b.Fatalf("the firing is not recorded by the end (with no output) carrying the sleep's success: %+v", d.Events[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		Fired(in, timer, m.now)
	}
}

// BenchmarkResultLast is the decision on an agent's report that a 10-step
// execution's last step succeeded: the execution's end carrying it.
func BenchmarkResultLast(b *testing.B) {
	noVerify(b)
	in, ref, ev := succeeding(b, stepsMidway(b, 10, 9, false), 10)
	if d := Result(in, ref, ev); d.Err != nil || len(d.Events) != 1 {
		b.Fatalf("the decision is not one event: %+v", d)
	} else if end, ok := d.Events[0].(*events.ExecutionSucceeded); !ok || end.Step == nil || end.Step.StepID != "s10" || len(end.Output) > 0 {
		b.Fatalf("the last step's success is not carried by the end (with no output): %+v", d.Events[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		Result(in, ref, ev)
	}
}
