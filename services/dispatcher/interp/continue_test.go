package interp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

func countdown() workflow.Definition {
	return workflow.Definition{Name: "countdown", Version: 1,
		Input: map[string]any{"type": "object", "required": []any{"n"}, "properties": map[string]any{"n": map[string]any{"type": "integer"}}},
		Steps: []workflow.Step{
			{ID: "work", Kind: workflow.KindLet, Vars: map[string]any{"seen": "${input.n}"}},
			{ID: "next", Kind: workflow.KindContinue, Condition: "${input.n > 0}", Input: map[string]any{"n": "${input.n - 1}"}},
			{ID: "done", Kind: workflow.KindReturn, Output: "done"},
		}}
}

// TestContinueAsNew: a continue-as-new step publishes its successor's
// start (the next run of the chain, with its input, before its own
// success is recorded), and the execution ends succeeded, continued as
// the successor; a successor continues the chain with the next run.
func TestContinueAsNew(t *testing.T) {
	t.Parallel()
	def := countdown()
	m := newMemShell(t, def, `{"n":2}`)
	m.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 1, Definition: def}
	m.advance()
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Equal(t, "x1-run2", m.state.ContinuedAs)
	require.JSONEq(t, `{"continued_as":"x1-run2","run":2,"start":{"workflow":"countdown","version":1,"input":{"n":1},
		"execution_id":"x1-run2","chain":"x1","run":2,"continued_from":"x1"}}`, string(m.state.Output))
	require.Len(t, m.starts, 1)
	s := m.starts[0]
	require.Equal(t, "continue-x1-run2", s.ID)
	require.Equal(t, "x1-run2", s.Start.ExecutionID)
	require.Equal(t, "countdown", s.Start.Workflow)
	require.Equal(t, 1, s.Start.Version)
	require.JSONEq(t, `{"n":1}`, string(s.Start.Input))
	require.Equal(t, "x1", s.Start.Chain)
	require.Equal(t, 2, s.Start.Run)
	require.Equal(t, "x1", s.Start.ContinuedFrom)
	require.Equal(t, projections.OpNone, m.state.Steps[m.state.StepIndex("done")].Status, "nothing after the step runs")

	// The successor (run 2 of chain x1) continues it as run 3.
	succ := newMemShell(t, def, `{"n":1}`)
	succ.state.Chain, succ.state.Run = "x1", 2 // as its start recorded them
	succ.catalog[CalledRef{Name: "countdown"}] = m.catalog[CalledRef{Name: "countdown"}]
	succ.advance()
	require.Equal(t, "x1-run3", succ.state.ContinuedAs)
	require.Equal(t, 3, succ.starts[0].Start.Run)

	last := newMemShell(t, def, `{"n":0}`)
	last.advance()
	require.Equal(t, projections.StatusSucceeded, last.state.Status)
	require.Empty(t, last.state.ContinuedAs, "the chain ends")
	require.JSONEq(t, `"done"`, string(last.state.Output))
}

// TestContinueAsNewRefusals: an input the next run's schema refuses, a
// continue-as-new in a workflow called by another, and a dry run start
// nothing.
func TestContinueAsNewRefusals(t *testing.T) {
	t.Parallel()
	def := countdown()
	def.Steps[1].Input = map[string]any{"n": "not a number"}
	m := newMemShell(t, def, `{"n":2}`)
	m.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 1, Definition: countdown()}
	m.advance()
	require.Equal(t, projections.StatusFailed, m.state.Status)
	require.Contains(t, m.state.Error, "the next run could not start: the input does not match workflow countdown's input schema: input.n got string, want integer")
	require.Empty(t, m.starts)

	parent := workflow.Definition{Name: "parent", Steps: []workflow.Step{{ID: "call", Kind: workflow.KindWorkflow, Workflow: "countdown", Input: map[string]any{"n": 1}}}}
	p := newMemShell(t, parent, `{}`)
	p.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 1, Definition: countdown()}
	p.advance()
	require.Equal(t, projections.StatusFailed, p.state.Status)
	require.Contains(t, p.state.Error, "continue-as-new ends a whole execution: it cannot run in a workflow called by another")
	require.Empty(t, p.starts)

	dry := newMemShell(t, countdown(), `{"n":2}`)
	dry.state.DryRun = true
	dry.advance()
	require.Equal(t, projections.StatusSucceeded, dry.state.Status, "history: %v", dry.types())
	require.Empty(t, dry.starts)
	var out any
	require.NoError(t, json.Unmarshal(dry.state.Output, &out))
}

// TestContinuationIsRecordedFirst: the successor's start is recorded with
// the step, and published only with the end, from the record: a version
// applied in between changes nothing, a cancel or a replay of an
// execution continuing (or continued) is refused, and a decision made
// again after a crash publishes the same start.
func TestContinuationIsRecordedFirst(t *testing.T) {
	t.Parallel()
	def := countdown()
	m := newMemShell(t, def, `{"n":2}`)
	m.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 1, Definition: def}
	for m.state.StepIndex("next") < 0 || m.state.Steps[m.state.StepIndex("next")].Status != projections.OpSucceeded {
		d := Next(m.input())
		require.False(t, d.Empty(), "history: %v", m.types())
		m.carry(d)
	}
	require.Empty(t, m.starts, "nothing published with the record")
	require.Equal(t, projections.StatusStarted, m.state.Status)

	// Meanwhile: version 2 is applied, and an operator tries to cancel.
	v2 := countdown()
	v2.Version = 2
	m.catalog[CalledRef{Name: "countdown"}] = &Called{Name: "countdown", Version: 2, Definition: v2}
	d := m.act(ActionCommand{Key: "c", Record: events.ActionRecord{Action: events.ActionCancel, Command: "c"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "is ending: a continue-as-new step continued it as x1-run2; cancel that one instead")

	end := Next(m.input())
	again := Next(m.input()) // as after a crash before the end was recorded
	require.Equal(t, end.Before, again.Before)
	require.Len(t, end.Before, 1)
	start := end.Before[0].(PublishStart)
	require.Equal(t, 1, start.Start.Version, "the version recorded, not the latest now")
	m.carry(end)
	require.Len(t, m.starts, 1)
	require.Equal(t, "x1-run2", m.state.ContinuedAs)

	d = m.act(ActionCommand{Key: "r", From: events.ReplayStart, Force: true, Record: events.ActionRecord{Action: events.ActionReplay, Command: "r"}})
	require.NotNil(t, d.Reject)
	require.Contains(t, d.Reject.Reason, "continued as x1-run2 (continue-as-new): replay the chain's latest run instead")
}

// TestSuccessorIDsOfLongChains: ids stay within 128 characters, and two
// long chain ids that differ only at their end keep apart.
func TestSuccessorIDsOfLongChains(t *testing.T) {
	t.Parallel()
	a := strings.Repeat("a", 126) + "xy"
	b := strings.Repeat("a", 126) + "xz"
	require.LessOrEqual(t, len(successorID(a, 2)), 128)
	require.True(t, events.ValidExecutionID(successorID(a, 2)))
	require.NotEqual(t, successorID(a, 2), successorID(b, 2))
	require.Equal(t, "cd-run7", successorID("cd", 7))
}
