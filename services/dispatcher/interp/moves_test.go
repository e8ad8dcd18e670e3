package interp

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Moves to another version that a review found wrong: a child listed
// before its moved parent, and a move onto a retired instance's path.

func blockOf(id string, steps ...workflow.Step) workflow.Step {
	return workflow.Step{ID: id, Kind: workflow.KindWorkflow, Steps: steps}
}

// register makes version v of wf, with these steps, known to the catalog.
func (m *memShell) register(v int, steps ...workflow.Step) {
	m.catalog[CalledRef{Name: "wf", Version: v}] = &Called{Name: "wf", Version: v, Definition: workflow.Definition{Name: "wf", Version: v, Steps: steps}}
}

// runFailing runs the execution until it no longer runs, every task
// succeeding but those of the steps fails names (which fail for good),
// and returns the steps of the tasks it sent.
func (m *memShell) runFailing(fails ...string) []string {
	m.t.Helper()
	var sent []string
	for range 200 {
		m.advance()
		if m.state.Status != projections.StatusStarted {
			break
		}
		task := m.tasks[len(m.tasks)-1]
		sent = append(sent, task.StepID)
		if slices.Contains(fails, task.StepID) {
			m.carry(m.report(&events.OperationFailed{TaskRef: events.TaskRef{Agent: "a1"}, Error: "exit status 1", Final: true}))
			continue
		}
		out, err := json.Marshal(task.StepID + " done")
		require.NoError(m.t, err)
		m.carry(m.report(&events.OperationSucceeded{Output: out}))
	}
	return sent
}

func resumeOnKey(version events.TargetVersion, key string) ActionCommand {
	return ActionCommand{Key: key, Version: version, Record: events.ActionRecord{Action: events.ActionResume, RequestedBy: "alice", Command: key}}
}

// noTwins checks that no two instances share a path.
func (m *memShell) noTwins() {
	m.t.Helper()
	seen := map[string]bool{}
	for _, st := range m.state.Steps {
		require.False(m.t, seen[st.ID], "one instance of %s: %v", st.ID, m.types())
		seen[st.ID] = true
	}
}

// TestAChildListedBeforeItsMovedParentKeepsItsResults: after a first move
// (b into the new blk), b's instances come before blk's; a second move
// takes b out of blk again and blk into outer. b moves with its
// instances, keeping x's success; blk, holding an instance that moved,
// does not move (it moved x with it to outer/blk/b/x, where it was
// retired, and x ran again).
func TestAChildListedBeforeItsMovedParentKeepsItsResults(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{blockOf("b", exec("x"), exec("z"))}}, `{}`)
	m.register(2, blockOf("blk", blockOf("b", exec("x"), exec("z"))), exec("last"))
	m.register(3, blockOf("outer", blockOf("blk", exec("w"))), blockOf("b", exec("x"), exec("z")), exec("last"))
	m.runFailing("b/z")
	m.carry(m.act(resumeOn(2, events.ActionResume)))
	require.Equal(t, []string{"blk/b/z"}, m.runFailing("blk/b/z"), "b moved into blk, x kept")
	m.carry(m.act(resumeOnKey(3, "to-3")))
	m.noTwins()
	sent := m.runFailing()
	require.NotContains(t, sent, "b/x", "x keeps its success as b moves out: %v", sent)
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
}

// TestAMoveOntoARetiredPathIsNotMade: x is retired by version 2 (two
// blocks hold an x), a/x fails there; version 3 has x at the top again.
// a/x does not move onto x's path: the x of version 3 counts on from the
// retired x's attempts, so no task id is sent twice (a task published
// again under an id the stream holds in its dedupe window is dropped, and
// the janitor, matching reports by task id, would take the old report
// for the new task's).
func TestAMoveOntoARetiredPathIsNotMade(t *testing.T) {
	t.Parallel()
	m := newMemShell(t, workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{exec("x"), exec("last")}}, `{}`)
	m.register(2, blockOf("a", exec("x")), blockOf("c", exec("x")), exec("last"))
	m.register(3, exec("x"), exec("last"))
	m.runFailing("x")
	m.carry(m.act(resumeOnKey(0, "again")))
	m.runFailing("last") // x's second attempt succeeded
	used := map[string]bool{}
	for _, task := range m.tasks {
		used[task.TaskID] = true
	}
	m.carry(m.act(resumeOn(2, events.ActionResume)))
	m.runFailing("a/x")
	m.carry(m.act(resumeOnKey(3, "to-3")))
	m.noTwins()
	from := len(m.tasks)
	m.runFailing()
	require.Greater(t, len(m.tasks), from, "version 3 runs x and last")
	for _, task := range m.tasks[from:] {
		require.False(t, used[task.TaskID], "task %s (step %s attempt %d) was sent before", task.TaskID, task.StepID, task.Attempt)
	}
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "history: %v", m.types())
}

// TestAResumeOfTwinsFromAnOldMoveRunsOnlyTheLater: a dispatcher before
// 2026-12-05 could rename two instances onto one path (forged here: y/x,
// failed and recovered by its on-error steps, and blk/b/x, succeeded,
// both became b/x). A resume decides on the later of the two, as every
// other reader does: the earlier one's failure, which version 2's b/x
// would not recover, is not in its reset list (the fold would have reset
// the later one, which succeeded).
func TestAResumeOfTwinsFromAnOldMoveRunsOnlyTheLater(t *testing.T) {
	t.Parallel()
	fix := workflow.Step{ID: "fix", Kind: workflow.KindLet, Vars: map[string]any{"fixed": true}}
	flaky := exec("x")
	flaky.OnError = []workflow.Step{fix}
	m := newMemShell(t, workflow.Definition{Name: "wf", Version: 1, Steps: []workflow.Step{
		blockOf("y", flaky), blockOf("blk", blockOf("b", exec("x"))), exec("last")}}, `{}`)
	require.Equal(t, []string{"y/x", "blk/b/x", "last"}, m.runFailing("y/x", "last"))
	require.Equal(t, projections.StatusFailed, m.state.Status)
	v2 := workflow.Definition{Name: "wf", Version: 2, Steps: []workflow.Step{blockOf("b", exec("x")), exec("last")}}
	raw, err := json.Marshal(v2)
	require.NoError(t, err)
	m.append(&events.DefinitionChanged{ActionRecord: events.ActionRecord{Action: events.ActionResume, Command: "old"}, FromVersion: 1, Version: 2, Definition: raw,
		Steps: v2.StepRefs(), Moved: map[string]string{"blk/b": "b", "y/x": "b/x"}, Retired: []string{"y", "blk"}})
	twins := 0
	for _, st := range m.state.Steps {
		if st.ID == "b/x" {
			twins++
		}
	}
	require.Equal(t, 2, twins, "the forged move left twins")
	m.register(2, v2.Steps...)
	d := m.act(resumeOnKey(0, "again"))
	var resumed *events.ExecutionResumed
	for _, p := range d.Events {
		if r, ok := p.(*events.ExecutionResumed); ok {
			resumed = r
		}
	}
	require.NotNil(t, resumed, "%+v", d.Events)
	require.Equal(t, []string{"last"}, resumed.Reset, "the hidden twin's failure resets nothing")
	m.carry(d)
	require.Equal(t, []string{"last"}, m.runFailing(), "only the failed step runs again: %v", m.types())
	require.Equal(t, projections.StatusSucceeded, m.state.Status)
}

// TestTwinsAreFoundFromTheLast: of two instances at one path, the
// interpreter finds the later, walking a small execution or with its
// index or view, as the fold does.
func TestTwinsAreFoundFromTheLast(t *testing.T) {
	t.Parallel()
	s := projections.Execution{Steps: []projections.Step{
		{ID: "a", Status: projections.OpFailed}, {ID: "b"}, {ID: "a", Status: projections.OpSucceeded}}}
	require.Equal(t, 2, s.StepIndex("a"), "the fold")
	st, ok := newEngine(workflow.Definition{}, s).instance("a")
	require.True(t, ok)
	require.Equal(t, projections.OpSucceeded, st.Status, "a small execution, walked")
	e := newEngine(workflow.Definition{}, s)
	e.index()
	require.Equal(t, 2, e.byPath["a"], "the index")
	v := (&view{}).sync(s)
	require.Equal(t, 2, v.pos["a"], "the view")
}
