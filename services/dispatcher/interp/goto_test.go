package interp

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// The decisions of goto loops go on from the round a goto ended (the
// list's memo) and see each step's latest instance through the view's
// index: every decision below is also taken without the view
// (view_test.go), and the two must agree.

// finishWith reports task started and succeeded with this output.
func (m *memShell) finishWith(task events.Task, output string) {
	m.reportTask(task, &events.OperationStarted{TaskRef: events.TaskRef{Agent: "a1", Delivery: 1}})
	m.reportTask(task, &events.OperationSucceeded{TaskRef: events.TaskRef{Agent: "a1"}, Output: json.RawMessage(output)})
}

func mustParse(t testing.TB, src string) workflow.Definition {
	t.Helper()
	d, err := workflow.Parse([]byte(src))
	require.NoError(t, err)
	return d
}

// TestALoopSeesItsLatestRound runs 40 rounds of a loop whose let and
// condition read the latest round's operation output, then a forward
// jump over a step, and checks what each round saw.
func TestALoopSeesItsLatestRound(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, mustParse(t, `
name: loop
steps:
  - {id: init, kind: let, vars: {n: 0, seen: ""}}
  - {id: work, kind: exec, command: x, args: ["${vars.n}"]}
  - id: count
    kind: let
    vars: {n: "${vars.n + 1}", seen: "${vars.seen}${steps.work.output.i},"}
  - {id: again, kind: goto, target: work, condition: "${steps.work.output.i < 39}"}
  - {id: skip, kind: goto, target: done}
  - {id: never, kind: fail, message: jumped over}
  - id: done
    kind: return
    output: {n: "${vars.n}", last: "${steps.work.output.i}", again: "${steps.again.status}", count: "${steps.count.attempt}", seen: "${vars.seen}"}
`), `{}`)
	for round := range 40 {
		m.advance()
		require.Len(t, m.tasks, round+1, "round %d sends one task", round)
		task := m.tasks[round]
		want := "work"
		if round > 0 {
			want = fmt.Sprintf("work~%d", round)
		}
		require.Equal(t, want, task.StepID)
		require.JSONEq(t, fmt.Sprintf(`{"id":"work","kind":"exec","command":"x","args":["%d"]}`, round), string(task.Spec), "round %d renders the variable the last round set", round)
		m.finishWith(task, fmt.Sprintf(`{"i":%d}`, round))
	}
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	seen := ""
	for i := range 40 {
		seen += fmt.Sprintf("%d,", i)
	}
	require.JSONEq(t, fmt.Sprintf(`{"n":40,"last":39,"again":"skipped","count":1,"seen":%q}`, seen), string(m.state.Output))
	require.Equal(t, projections.OpNone, m.state.Steps[m.state.StepIndex("never")].Status, "the forward jump passed over it")
	require.NotEqual(t, -1, m.state.StepIndex("done~40"), "the jump started round 40")
}

// TestALoopInsideAContainerAndItsHandler: rounds of a block's list, one of
// whose operations fails once a round and is sent back to by its on-error
// goto, then an outer loop around the block.
func TestALoopInsideAContainerAndItsHandler(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, mustParse(t, `
name: nested
steps:
  - {id: init, kind: let, vars: {outer: 0}}
  - id: block
    kind: workflow
    steps:
      - {id: start, kind: let, vars: {inner: 0}}
      - id: flaky
        kind: exec
        command: x
        on-error:
          - {id: back, kind: goto, target: flaky}
      - {id: bump, kind: let, vars: {inner: "${vars.inner + 1}"}}
      - {id: again, kind: goto, target: flaky, condition: "${vars.inner < 12}"}
  - {id: more, kind: let, vars: {outer: "${vars.outer + 1}"}}
  - {id: loop, kind: goto, target: block, condition: "${vars.outer < 3}"}
  - {id: done, kind: return, output: {outer: "${vars.outer}", inner: "${vars.inner}", flaky: "${steps.block.status}"}}
`), `{}`)
	sent := 0
	for range 3 * 12 {
		m.advance()
		require.Len(t, m.tasks, sent+1)
		m.reportTask(m.tasks[sent], &events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "flaky"})
		sent++
		m.advance()
		require.Len(t, m.tasks, sent+1, "the handler's goto sends it again: %v", m.types())
		m.finishWith(m.tasks[sent], `{}`)
		sent++
	}
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.JSONEq(t, `{"outer":3,"inner":12,"flaky":"succeeded"}`, string(m.state.Output))
	require.NotEqual(t, -1, m.state.StepIndex("block~2/flaky~23"), "the third block's last round")
}

// TestALoopFailsPastItsRoundLimit: the goto that would start round 1001
// fails the execution, with or without the view.
func TestALoopFailsPastItsRoundLimit(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, mustParse(t, `
name: forever
steps:
  - {id: again, kind: goto, target: again}
`), `{}`)
	for i := 0; i < 10*workflow.MaxRounds && m.state.Status.Active(); i++ {
		m.carry(Next(m.input()))
	}
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %d events", len(m.evs))
	require.Contains(t, m.state.Error, fmt.Sprintf("goto again ran more than %d times", workflow.MaxRounds))
	require.NotEqual(t, -1, m.state.StepIndex(fmt.Sprintf("again~%d", workflow.MaxRounds)), "round %d ran", workflow.MaxRounds)
	require.Equal(t, -1, m.state.StepIndex(fmt.Sprintf("again~%d", workflow.MaxRounds+1)), "round %d did not", workflow.MaxRounds+1)
}

// TestALoopsMemoGoesOnFromItsLatestRound: after 50 rounds, the list's
// memo is at the 50th round's target, so that the next decision walks
// one round, not fifty (decisions agree either way: this is the cost).
func TestALoopsMemoGoesOnFromItsLatestRound(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, mustParse(t, `
name: memo
steps:
  - {id: init, kind: let, vars: {n: 0}}
  - {id: work, kind: noop}
  - {id: count, kind: let, vars: {n: "${vars.n + 1}"}}
  - {id: again, kind: goto, target: work, condition: "${vars.n < 100}"}
`), `{}`)
	for round := range 50 {
		m.advance()
		require.Len(t, m.tasks, round+1)
		m.finishWith(m.tasks[round], `{}`)
	}
	m.advance() // round 50's noop sent
	require.Len(t, m.tasks, 51)
	lm := m.memo.view.lists[""]
	require.NotNil(t, lm, "the workflow's list has a memo")
	require.Equal(t, 50, lm.round, "at the latest round")
	require.Equal(t, 1, lm.done, "at its target, work")
}
