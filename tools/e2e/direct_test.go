package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

const threeNoops = `
name: three
steps:
  - {id: a, kind: noop}
  - {id: b, kind: noop}
  - {id: c, kind: noop}
`

// finalReportsStored counts the final reports about an execution stored
// on the results stream.
func (s *stack) finalReportsStored(t *testing.T, id string) int {
	t.Helper()
	evs, err := history.ReadStream(context.Background(), s.js, bus.StreamResults, bus.ExecutionResults(id), 0, 0)
	require.NoError(t, err)
	n := 0
	for _, ev := range evs {
		if ev.Type == events.TypeOperationSucceeded || ev.Type == events.TypeOperationFailed {
			n++
		}
	}
	return n
}

// TestReportsGoStraightToTheDispatcher: with the identities jetflow dev
// issues (agents may hand reports on jf.direct.<their queue>.>, the
// dispatcher takes and answers them), every final report of an execution
// goes straight to the dispatcher: its steps succeed, each recorded once,
// its tasks have left their queue, and the results stream stores none of
// its reports. With -direct-reports=false
// (both services), each is stored there, as before direct reports.
func TestReportsGoStraightToTheDispatcher(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		off    bool
		stored int
	}{{"Direct", false, 0}, {"Stored", true, 3}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// A wait long enough for a loaded machine: a report answered
			// after it is stored (and counted below).
			s := startStack(t, func(cfg *devstack.Config) { cfg.NoDirectReports, cfg.DirectWait = c.off, 20*time.Second })
			s.apply(t, threeNoops)
			x := s.runToEnd(t, client.StartRequest{Workflow: "three", ID: "three-1"})
			require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
			evs := s.history(t, "three-1")
			requireLinear(t, evs)
			n := countTypes(evs)
			for _, step := range []string{"a", "b", "c"} {
				require.Equal(t, 1, n[string(events.TypeStepSucceeded)+"/"+step], step)
			}
			require.Equal(t, c.stored, s.finalReportsStored(t, "three-1"))
			poll(t, 20*time.Second, "tasks acknowledged", func() (bool, string) {
				st := s.streamState(t, bus.StreamTasks)
				// Keepers (empty messages on jf.tasks._keep) may wait there.
				return st.NumSubjects == 0 || (st.NumSubjects == 1 && s.onlyKeepers(t)), "tasks left in the queue"
			})
		})
	}
}

// onlyKeepers reports whether the tasks stream holds nothing but keepers.
func (s *stack) onlyKeepers(t *testing.T) bool {
	t.Helper()
	st, err := s.js.Stream(context.Background(), bus.StreamTasks)
	require.NoError(t, err)
	_, err = st.GetLastMsgForSubject(context.Background(), bus.TasksKeeperSubject)
	return err == nil
}
