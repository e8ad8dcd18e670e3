package interp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

func exec(id string) workflow.Step {
	return workflow.Step{ID: id, Kind: workflow.KindExec, Command: id}
}

// versioned runs version 1 of wf (steps v1) until it failed at the step
// that fails, and registers version 2 (steps v2).
func versioned(t *testing.T, v1, v2 []workflow.Step, fails string) *memShell {
	t.Helper()
	def1 := workflow.Definition{Name: "wf", Version: 1, Steps: v1}
	m := newMemShell(t, def1, `{}`)
	m.catalog[CalledRef{Name: "wf", Version: 2}] = &Called{Name: "wf", Version: 2, Definition: workflow.Definition{Name: "wf", Version: 2, Steps: v2}}
	m.catalog[CalledRef{Name: "wf"}] = m.catalog[CalledRef{Name: "wf", Version: 2}]
	for range 100 {
		m.advance()
		if m.state.Status != projections.StatusStarted {
			break
		}
		task := m.tasks[len(m.tasks)-1]
		if task.StepID == fails {
			m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
			continue
		}
		m.carry(m.report(&events.OperationSucceeded{Output: []byte(`"` + task.StepID + ` done"`)}))
	}
	require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
	return m
}

// finish reports success for every task sent from the index from on,
// until the execution ends; it returns the steps of the tasks sent.
func (m *memShell) finish1(from int) []string {
	m.t.Helper()
	var sent []string
	for range 100 {
		m.advance()
		if m.state.Status != projections.StatusStarted || len(m.tasks) <= from {
			break
		}
		task := m.tasks[len(m.tasks)-1]
		sent = append(sent, task.StepID)
		from = len(m.tasks)
		m.carry(m.report(&events.OperationSucceeded{Output: []byte(`"` + task.StepID + ` done"`)}))
	}
	return sent
}

// act decides cmd, loading what it needs, and returns the decision.
func (m *memShell) act(cmd ActionCommand) Decision {
	m.t.Helper()
	d := Action(m.input(), cmd)
	for d.Need != nil {
		m.carry(d)
		d = Action(m.input(), cmd)
	}
	return d
}

func resumeOn(version events.TargetVersion, action string) ActionCommand {
	return ActionCommand{Key: "k-" + action, Version: version,
		Record: events.ActionRecord{Action: action, RequestedBy: "alice", Command: "k-" + action}}
}

// TestResumeOnANewVersion: a failed execution resumed on version 2 keeps
// the results of the steps version 2 still has (a is not sent again),
// runs the steps new in it when they are reached (n, d), runs the failed
// step again, and ignores the step version 2 removed (c): the move is
// recorded first, with who asked, and the execution is on version 2.
func TestResumeOnANewVersion(t *testing.T) {
	t.Parallel()
	m := versioned(t, []workflow.Step{exec("a"), exec("b"), exec("c")},
		[]workflow.Step{exec("a"), {ID: "n", Kind: workflow.KindLet, Vars: map[string]any{"new": true}}, exec("b"), exec("d")}, "b")
	sentBefore := len(m.tasks)
	d := m.act(resumeOn(2, events.ActionResume))
	require.Nil(t, d.Reject)
	m.carry(d)
	changed := m.evs[indexOfType(m.evs, events.TypeDefinitionChanged)].Data.(*events.DefinitionChanged)
	require.Equal(t, 1, changed.FromVersion)
	require.Equal(t, 2, changed.Version)
	require.Equal(t, "alice", changed.RequestedBy)
	require.Equal(t, []string{"c"}, changed.Retired)
	require.Equal(t, events.TypeExecutionResumed, m.evs[indexOfType(m.evs, events.TypeDefinitionChanged)+1].Type, "then the resume")

	sent := m.finish1(sentBefore)
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Equal(t, []string{"b", "d"}, sent, "a is kept, c is gone")
	require.Equal(t, 2, m.state.Version)
	require.JSONEq(t, `true`, string(m.state.Vars["new"]), "the step new in version 2 ran")
	require.Len(t, m.state.VersionChanges, 1)
	require.Equal(t, projections.VersionChange{From: 1, To: 2, Action: events.ActionResume, RequestedBy: "alice",
		At: m.state.VersionChanges[0].At, Retired: []string{"c"}}, m.state.VersionChanges[0])
	require.Len(t, m.state.RetiredSteps, 1)
	require.Equal(t, "c", m.state.RetiredSteps[0].ID)
	require.Negative(t, m.state.StepIndex("c"))
}

// TestRemovedStepsResultIsNotSeen: the result of a step the new version
// removed is no longer seen by expressions.
func TestRemovedStepsResultIsNotSeen(t *testing.T) {
	t.Parallel()
	m := versioned(t, []workflow.Step{exec("a"), exec("b")},
		[]workflow.Step{exec("b"), {ID: "r", Kind: workflow.KindReturn, Output: "${steps.a?.output ?? 'gone'}"}}, "b")
	m.carry(m.act(resumeOn(events.LatestVersion, events.ActionResume)))
	m.finish1(len(m.tasks))
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v; error %s", m.types(), m.state.Error)
	require.JSONEq(t, `"gone"`, string(m.state.Output))
}

// TestMovedIntoABlockKeepsItsResult: a step version 2 moved into a block
// keeps its result under its new path (it is not sent again).
func TestMovedIntoABlockKeepsItsResult(t *testing.T) {
	t.Parallel()
	m := versioned(t, []workflow.Step{exec("a"), exec("b")},
		[]workflow.Step{{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{exec("a")}}, exec("b"),
			{ID: "r", Kind: workflow.KindReturn, Output: "${steps.blk.output}"}}, "b")
	m.carry(m.act(resumeOn(2, events.ActionResume)))
	sent := m.finish1(len(m.tasks))
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Equal(t, []string{"b"}, sent)
	require.Equal(t, map[string]string{"a": "blk/a"}, m.state.VersionChanges[0].Moved)
	require.JSONEq(t, `"a done"`, string(m.state.Output), "the block's result is a's, recorded under version 1")
}

// TestVersionChangesRefused: what cannot move is refused, saying why, and
// nothing is recorded: an operation still with an agent that the new
// version has not (a force-resume gives it up), a step whose kind changed
// and that has not succeeded, a version that does not exist, and a
// version on an action that takes none. The version it is on already
// resumes as usual.
func TestVersionChangesRefused(t *testing.T) {
	t.Parallel()
	t.Run("InFlightStepRemoved", func(t *testing.T) {
		t.Parallel()
		par := workflow.Step{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "x", Steps: []workflow.Step{exec("slow")}}, {ID: "y", Steps: []workflow.Step{exec("bad")}}}}
		def1 := workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{par}}
		m := newMemShell(t, def1, `{}`)
		m.catalog[CalledRef{Name: "wf", Version: 2}] = &Called{Name: "wf", Version: 2, Definition: workflow.Definition{Name: "wf", Version: 2,
			Steps: []workflow.Step{{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{{ID: "y", Steps: []workflow.Step{exec("bad")}}}}}}}
		m.advance()
		require.Len(t, m.tasks, 2)
		require.Equal(t, "par/y/bad", m.tasks[1].StepID)
		m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status, "history: %v", m.types())
		n := len(m.evs)
		d := m.act(resumeOn(2, events.ActionResume))
		require.NotNil(t, d.Reject)
		require.Equal(t, events.CodeConflict, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "step par/x/slow (exec) was sent to an agent and has not reported")
		require.Contains(t, d.Reject.Reason, "a force-resume (jetflow resume --force) with this version gives it up")
		require.Len(t, m.evs, n)

		d = m.act(resumeOn(2, events.ActionForceResume))
		require.Nil(t, d.Reject)
		m.carry(d)
		require.Equal(t, []string{"par/x/slow"}, m.state.VersionChanges[0].Retired)
	})
	t.Run("KindChanged", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{exec("a"), exec("b")},
			[]workflow.Step{exec("a"), {ID: "b", Kind: workflow.KindLet, Vars: map[string]any{"x": 1}}}, "b")
		d := m.act(resumeOn(2, events.ActionResume))
		require.NotNil(t, d.Reject)
		require.Contains(t, d.Reject.Reason, "step b was an exec step and is a let step in the new version, and it has not succeeded (failed): give a step whose code changes a new id")
	})
	t.Run("UnknownVersion", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{exec("a")}, []workflow.Step{exec("a")}, "a")
		d := m.act(resumeOn(7, events.ActionReplay))
		require.NotNil(t, d.Reject)
		require.Equal(t, events.CodeNotFound, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "workflow wf has no version 7")
	})
	t.Run("NotForCancel", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{exec("a")}, []workflow.Step{exec("a")}, "a")
		d := Action(m.input(), resumeOn(2, events.ActionCancel))
		require.NotNil(t, d.Reject)
		require.Contains(t, d.Reject.Reason, "version applies to resume, force-resume and replay")
	})
	t.Run("SameVersion", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{exec("a")}, []workflow.Step{exec("a")}, "a")
		m.catalog[CalledRef{Name: "wf", Version: 1}] = &Called{Name: "wf", Version: 1, Definition: m.def}
		m.carry(m.act(resumeOn(1, events.ActionResume)))
		require.Equal(t, -1, indexOfType(m.evs, events.TypeDefinitionChanged), "no move: %v", m.types())
		require.Equal(t, projections.StatusStarted, m.state.Status)
	})
}

// TestReplayOnANewVersion: a replay from the start on version 2 runs
// version 2's steps from the start.
func TestReplayOnANewVersion(t *testing.T) {
	t.Parallel()
	m := versioned(t, []workflow.Step{exec("a"), exec("b")}, []workflow.Step{exec("a2"), exec("b")}, "b")
	m.def.Replayable = "from start"
	m.catalog[CalledRef{Name: "wf", Version: 2}].Definition.Replayable = "from start"
	cmd := resumeOn(2, events.ActionReplay)
	cmd.From = events.ReplayStart
	d := m.act(cmd)
	require.Nil(t, d.Reject, "%+v", d.Reject)
	m.carry(d)
	sent := m.finish1(len(m.tasks))
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
	require.Equal(t, []string{"a2", "b"}, sent)
	require.Equal(t, []string{"a"}, m.state.VersionChanges[0].Retired)
}

// TestVersionReviewCases: what an independent review found, each kept
// by a test. A running execution is refused (not dropped); a step retired
// and back in a later version gets new task ids; a force-resume tells the
// agents to terminate the operation it retires; a switch whose chosen
// case moved is refused; a foreach moved into a block takes its items
// with it; a moved block's steps are matched with the new version too.
func TestVersionReviewCases(t *testing.T) {
	t.Parallel()
	t.Run("StartedIsRefused", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{exec("a")}}, `{}`)
		m.catalog[CalledRef{Name: "wf", Version: 2}] = &Called{Name: "wf", Version: 2, Definition: workflow.Definition{Name: "wf", Version: 2, Steps: []workflow.Step{exec("b")}}}
		m.advance()
		d := m.act(resumeOn(2, events.ActionResume))
		require.NotNil(t, d.Reject, "%+v", d)
		require.Equal(t, events.CodeConflict, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "only an execution that is over or suspended moves to another version")
	})
	t.Run("ReaddedStepGetsNewTasks", func(t *testing.T) {
		t.Parallel()
		v1 := []workflow.Step{exec("a"), exec("b")}
		m := versioned(t, v1, []workflow.Step{exec("a"), exec("c")}, "b")
		m.catalog[CalledRef{Name: "wf", Version: 1}] = &Called{Name: "wf", Version: 1, Definition: workflow.Definition{Name: "wf", Version: 1, Steps: v1}}
		old := m.tasks[len(m.tasks)-1].TaskID
		m.carry(m.act(resumeOn(2, events.ActionResume)))
		m.advance()
		require.Equal(t, "c", m.tasks[len(m.tasks)-1].StepID)
		m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
		m.advance()
		require.Equal(t, projections.StatusFailed, m.state.Status)
		m.carry(m.act(ActionCommand{Key: "back", Version: 1, Record: events.ActionRecord{Action: events.ActionResume, Command: "back"}}))
		m.advance()
		task := m.tasks[len(m.tasks)-1]
		require.Equal(t, "b", task.StepID, "history: %v", m.types())
		require.NotEqual(t, old, task.TaskID, "b is back with a new attempt")
		require.Equal(t, 2, task.Attempt)
	})
	t.Run("ForceResumeTerminatesWhatItRetires", func(t *testing.T) {
		t.Parallel()
		par := workflow.Step{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "x", Steps: []workflow.Step{exec("slow")}}, {ID: "y", Steps: []workflow.Step{exec("bad")}}}}
		m := newMemShell(t, workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{par}}, `{}`)
		m.catalog[CalledRef{Name: "wf", Version: 2}] = &Called{Name: "wf", Version: 2, Definition: workflow.Definition{Name: "wf", Version: 2,
			Steps: []workflow.Step{{ID: "par", Kind: workflow.KindParallel, Branches: []workflow.Branch{{ID: "y", Steps: []workflow.Step{exec("bad")}}}}}}}
		m.advance()
		slow := m.tasks[0]
		m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
		m.advance()
		kills := len(m.kills)
		m.carry(m.act(resumeOn(2, events.ActionForceResume)))
		var terminated bool
		for _, k := range m.kills[kills:] {
			terminated = terminated || k.TaskID == slow.TaskID
		}
		require.True(t, terminated, "the retired operation's agent is told to terminate it: %+v", m.kills)
		require.True(t, AttemptOver(m.state, events.TaskRef{StepID: slow.StepID, Attempt: slow.Attempt, Token: slow.Token}),
			"a redelivered task of the retired step is over")
	})
	t.Run("SwitchCaseMoved", func(t *testing.T) {
		t.Parallel()
		sw1 := workflow.Step{ID: "sw", Kind: workflow.KindSwitch, Cases: []workflow.Case{{When: "${true}", Steps: []workflow.Step{exec("x"), exec("f")}}}}
		sw2 := workflow.Step{ID: "sw", Kind: workflow.KindSwitch, Cases: []workflow.Case{{When: "${false}", Steps: []workflow.Step{exec("never")}},
			{When: "${true}", Steps: []workflow.Step{exec("x"), exec("f")}}}}
		m := versioned(t, []workflow.Step{sw1}, []workflow.Step{sw2}, "sw/case0/f")
		d := m.act(resumeOn(2, events.ActionResume))
		require.NotNil(t, d.Reject)
		require.Contains(t, d.Reject.Reason, "switch sw chose its case case0, and the new version has another case there")
	})
	t.Run("ForeachMovesWithItsItems", func(t *testing.T) {
		t.Parallel()
		fe := workflow.Step{ID: "fe", Kind: workflow.KindForeach, Items: []any{1, 2}, Steps: []workflow.Step{exec("x")}}
		m := versioned(t, []workflow.Step{fe}, []workflow.Step{{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{fe}}}, "fe[1]/x")
		m.carry(m.act(resumeOn(2, events.ActionResume)))
		sent := m.finish1(len(m.tasks))
		require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
		require.Equal(t, []string{"blk/fe[1]/x"}, sent, "the item that succeeded is kept")
		require.Empty(t, m.state.VersionChanges[0].Retired)
	})
	t.Run("MovedBlocksStepsAreMatched", func(t *testing.T) {
		t.Parallel()
		blk1 := workflow.Step{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{exec("y"), exec("w")}}
		blk2 := workflow.Step{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{exec("w"), exec("r")}}
		m := versioned(t, []workflow.Step{blk1, exec("z")},
			[]workflow.Step{{ID: "outer", Kind: workflow.KindWorkflow, Steps: []workflow.Step{blk2}}, exec("z"),
				{ID: "out", Kind: workflow.KindReturn, Output: "${steps.y?.output ?? 'gone'}"}}, "z")
		m.carry(m.act(resumeOn(2, events.ActionResume)))
		m.finish1(len(m.tasks))
		require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
		require.Equal(t, map[string]string{"blk": "outer/blk"}, m.state.VersionChanges[0].Moved)
		require.Equal(t, []string{"outer/blk/y"}, m.state.VersionChanges[0].Retired, "y is not in the moved block any more")
	})
}

// TestAMoveDoesNotRenameTwoInstancesOntoOnePath: version 2 takes b out
// of blk and drops y, whose step is also x: blk/b/x moves with blk/b to
// b/x, so y/x cannot move there too (before, both did, and the fold kept
// two instances of b/x). Found by a review. With y first, y/x moves to
// b/x, and blk/b, whose x would land there too, does not move.
func TestAMoveDoesNotRenameTwoInstancesOntoOnePath(t *testing.T) {
	t.Parallel()
	block := func(id string, steps ...workflow.Step) workflow.Step {
		return workflow.Step{ID: id, Kind: workflow.KindWorkflow, Steps: steps}
	}
	v2 := []workflow.Step{block("b", exec("x")), exec("last")}
	t.Run("the block first", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{block("blk", block("b", exec("x"))), block("y", exec("x")), exec("last")}, v2, "last")
		resumeWithoutTwins(t, m, map[string]string{"blk/b": "b"})
	})
	t.Run("the lone step first", func(t *testing.T) {
		t.Parallel()
		m := versioned(t, []workflow.Step{block("y", exec("x")), block("blk", block("b", exec("x"))), exec("last")}, v2, "last")
		resumeWithoutTwins(t, m, map[string]string{"y/x": "b/x"})
	})
}

// resumeWithoutTwins resumes m on version 2, checks the moves recorded
// and that no path is two instances, and finishes the execution.
func resumeWithoutTwins(t *testing.T, m *memShell, moves map[string]string) {
	t.Helper()
	d := m.act(resumeOn(2, events.ActionResume))
	require.NoError(t, d.Err)
	var changed *events.DefinitionChanged
	for _, p := range d.Events {
		if c, ok := p.(*events.DefinitionChanged); ok {
			changed = c
		}
	}
	require.NotNil(t, changed, "the move is recorded: %+v", d.Events)
	require.Equal(t, moves, changed.Moved)
	m.carry(d)
	seen := map[string]bool{}
	for _, st := range m.state.Steps {
		require.False(t, seen[st.ID], "one instance of %s", st.ID)
		seen[st.ID] = true
	}
	require.Equal(t, []string{"last"}, m.finish1(len(m.tasks)), "only the failed step runs again")
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
}
