package dispatch_test

import (
	"cmp"
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestForeachItemsEndingOutOfOrder: a foreach's items end in any order
// (the agent reports them in reverse), one fails, the execution is
// resumed and that item runs again; the output lists every item's result
// in item order. Every decision is also taken without the execution's
// view (this package's tests check they agree), so the foreach memo that
// skips the leading items already done is checked against walking them
// all, through out-of-order ends and a resume that resets an item.
func TestForeachItemsEndingOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	d, err := workflow.Parse([]byte(`
name: fan
output: {items: "${len(steps.each.output)}", last: "${vars.last}"}
steps:
  - id: each
    kind: foreach
    items: ${0..11}
    concurrency: 4
    steps:
      - {id: work, kind: noop}
      - {id: after, kind: let, vars: {last: "${item}"}}
`))
	require.NoError(t, err)
	_, _, err = b.defs.Apply(t.Context(), d)
	require.NoError(t, err)
	b.start(t, "fan", "f1")

	// Play the agent: take every task sent, then end them last first. The
	// last item fails once, when every other item is done: the execution
	// fails, is resumed, and only that item runs again.
	failed := false
	// The tasks already reported: the history may not show their reports
	// yet, and a task the dispatcher did not send yet is waited for only
	// while it is not among them (else the test waited for a task that
	// was already taken and reported, whose report was not recorded yet).
	reported := map[string]bool{}
	play := func(failLast bool) {
		t.Helper()
		succeeded := 0
		for succeeded < 12 {
			var pending []fetchedTask
			for len(pending) == 0 || len(pending) < running(foldOfExecution(t, b, "fan", "f1"), reported) {
				pending = append(pending, b.nextTask(t))
			}
			// The last item's task goes last (reported first from the end).
			slices.SortStableFunc(pending, func(a, c fetchedTask) int {
				return cmp.Compare(boolInt(c.task.StepID == "each[11]/work"), boolInt(a.task.StepID == "each[11]/work"))
			})
			for i := len(pending) - 1; i >= 0; i-- {
				reported[pending[i].task.TaskID] = true
				ref := pending[i].task.Ref("test-agent", 1)
				b.report(t, &events.OperationStarted{TaskRef: ref})
				if failLast && !failed && pending[i].task.StepID == "each[11]/work" && succeeded == 11 {
					failed = true
					b.report(t, &events.OperationFailed{TaskRef: ref, Error: "boom", Final: true})
					waitStatus(t, b.js, "fan", "f1", projections.StatusFailed)
					b.act(t, "f1", events.ActionResume, "fixed")
					continue
				}
				b.report(t, &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{}`)})
				succeeded++
			}
		}
	}
	play(true)
	s, _ := waitStatus(t, b.js, "fan", "f1", projections.StatusSucceeded)
	require.JSONEq(t, `{"items":12,"last":11}`, string(s.Output), "item 11 ended last, after its resume")
	for _, st := range s.Steps {
		require.Equal(t, projections.OpSucceeded, st.Status, st.ID)
	}
	require.True(t, failed)
	require.Equal(t, 1, s.Resumes)

	// Replayed from the start, every item runs again: a view that kept
	// the items done before would have the foreach end at once.
	b.replay(t, "f1", "start", true)
	waitStatus(t, b.js, "fan", "f1", projections.StatusStarted)
	play(false)
	s, _ = waitStatus(t, b.js, "fan", "f1", projections.StatusSucceeded)
	require.Equal(t, 2, s.Resumes)
	require.Len(t, s.Replays, 1)

	// Replayed from a step inside an item: that item's instances start over
	// in the same foreach instance (reopened, its other items kept).
	b.replay(t, "f1", "each@2[3]/work", true)
	waitStatus(t, b.js, "fan", "f1", projections.StatusStarted)
	task := b.nextTask(t)
	require.Equal(t, "each@2[3]/work", task.task.StepID)
	ref := task.task.Ref("test-agent", 1)
	b.report(t, &events.OperationStarted{TaskRef: ref})
	b.report(t, &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{}`)})
	s, _ = waitStatus(t, b.js, "fan", "f1", projections.StatusSucceeded)
	require.Equal(t, 3, s.Resumes)
	require.JSONEq(t, `{"items":12,"last":3}`, string(s.Output), "item 3 ran again, last")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// running counts the operations of s sent to an agent and not ended,
// but for those whose task was reported already.
func running(s projections.Execution, reported map[string]bool) int {
	n := 0
	for _, st := range s.Steps {
		if st.Status == projections.OpSent || st.Status == projections.OpStarted || st.Status == projections.OpSending {
			if !reported[events.TaskID(s.ID, st.ID, st.Attempt)] {
				n++
			}
		}
	}
	return n
}

func foldOfExecution(t *testing.T, b *testBundle, wf, id string) projections.Execution {
	t.Helper()
	s, err := projections.Fold(readHistory(t, b.js, wf, id))
	require.NoError(t, err)
	return s
}
