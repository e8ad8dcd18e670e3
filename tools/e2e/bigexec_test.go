package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// TestBigExecutionDoesNotFreezeTheReadSide: an execution too big for a
// read model (here a foreach of 400 items with outputs of a few KiB,
// against a 32 KiB limit) gets a truncated read model, its whole step
// table is paged through the api, and an execution started after it
// shows up in the list and in its read model as usual: nothing is parked.
func TestBigExecutionDoesNotFreezeTheReadSide(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.MaxReadModel = 32 << 10 })
	ctx := context.Background()
	s.apply(t, `
name: bigfanout
steps:
  - id: each
    kind: foreach
    items: "${1..400}"
    concurrency: 50
    steps:
      - {id: gen, kind: let, vars: {blob: "${repeat('x', 3000)}"}}
`)
	s.apply(t, `
name: tiny
steps:
  - {id: hi, kind: log, message: hi}
`)
	big, err := s.c.Start(ctx, client.StartRequest{Workflow: "bigfanout"})
	require.NoError(t, err)
	x := s.waitDone(t, big.ID, 120*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)

	small, err := s.c.Start(ctx, client.StartRequest{Workflow: "tiny"})
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, small.ID, 60*time.Second).Status)
	require.Eventually(t, func() bool { // the list reads read models: the projector kept up
		l, _, err := s.c.ListExecutions(ctx, client.ListOptions{Workflow: "tiny"})
		return err == nil && len(l) == 1 && l[0].Status == string(projections.StatusSucceeded)
	}, 30*time.Second, 50*time.Millisecond)

	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, big.ID)
		return err == nil && x.Truncated != nil && x.Status == projections.StatusSucceeded
	}, 30*time.Second, 50*time.Millisecond, "the big execution's read model is truncated")
	x, err = s.c.Execution(ctx, big.ID)
	require.NoError(t, err)
	require.Positive(t, x.Truncated.Steps)

	var all []projections.Step
	for offset := 0; ; {
		page, err := s.c.Steps(ctx, big.ID, offset, 1000)
		require.NoError(t, err)
		all = append(all, page.Steps...)
		offset += len(page.Steps)
		if offset >= page.Total || len(page.Steps) == 0 {
			require.Equal(t, page.Total, len(all))
			break
		}
	}
	require.Len(t, all, 401, "the foreach and its 400 items")
	for _, st := range all {
		require.Equal(t, projections.OpSucceeded, st.Status, st.ID)
	}
	r, err := s.c.Ready(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, r.Parked)
}
