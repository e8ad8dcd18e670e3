package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestStateAsOfSequence asks for an execution's state at every sequence of
// its history and checks it against the fold of the events up to there.
func TestStateAsOfSequence(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: travel\nsteps:\n  - id: a\n    kind: noop\n  - id: b\n    kind: log\n    message: hi\n")
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "travel", ID: "tt-0"}) // so tt-1 does not begin at seq 1
	require.NoError(t, err)
	s.waitDone(t, "tt-0", 20*time.Second)
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "travel", ID: "tt-1"})
	require.NoError(t, err)
	// Another execution interleaves its events in the same stream.
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "travel", ID: "tt-2"})
	require.NoError(t, err)
	s.waitDone(t, "tt-1", 20*time.Second)
	evs := s.history(t, "tt-1")

	for i, ev := range evs {
		want, err := projections.Fold(evs[:i+1])
		require.NoError(t, err)
		got, err := s.c.ExecutionAt(ctx, "tt-1", ev.Seq)
		require.NoError(t, err)
		require.Equal(t, want.Status, got.Status, "at seq %d", ev.Seq)
		require.Equal(t, want.LastSeq, got.LastSeq)
		require.Equal(t, want.Events, got.Events)
		for j := range want.Steps {
			require.Equal(t, want.Steps[j].Status, got.Steps[j].Status, "step %s at seq %d", want.Steps[j].ID, ev.Seq)
		}
		// A sequence between two of its events gives the earlier state.
		if i+1 < len(evs) && evs[i+1].Seq > ev.Seq+1 {
			between, err := s.c.ExecutionAt(ctx, "tt-1", ev.Seq+1)
			require.NoError(t, err)
			require.Equal(t, want.LastSeq, between.LastSeq)
		}
	}
	first, err := s.c.ExecutionAt(ctx, "tt-1", evs[0].Seq)
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, first.Status)
	require.Equal(t, projections.OpSending, first.Steps[0].Status, "the start carries a's dispatch (docs/adr/0008)")
	require.Equal(t, projections.OpNone, first.Steps[1].Status)
	last, err := s.c.ExecutionAt(ctx, "tt-1", evs[len(evs)-1].Seq)
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, last.Status)
	require.Equal(t, events.TypeExecutionSucceeded, evs[len(evs)-1].Type)

	// Before its first event the execution did not exist yet.
	require.Greater(t, evs[0].Seq, uint64(1))
	_, err = s.c.ExecutionAt(ctx, "tt-1", evs[0].Seq-1)
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusNotFound, apiErr.Status)
	require.Equal(t, "at_seq", apiErr.Field)
}
