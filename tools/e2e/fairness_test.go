package e2e

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// TestAFanOutOfSlowOperationsLeavesRoomForOthers: a foreach of 30 slow
// operations (held until the test lets them go) on an agent of 12
// workers takes at most 11 of them: its first two go to the queue's
// normal lane, the rest to its bulk lane, and 3 workers serve only the
// normal lane. A one-step execution started meanwhile succeeds while
// every fan-out operation is still held; before the lanes, the fan-out
// held all 12 workers and it waited for the fan-out.
func TestAFanOutOfSlowOperationsLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	var running, most atomic.Int64
	hold := operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-release:
			return "done", nil
		}
	})
	s := startStack(t, func(c *devstack.Config) {
		c.Concurrency = 12
		c.Handlers = map[string]operation.Handler{"hold": hold}
	})
	ctx := context.Background()
	s.apply(t, `
name: fanout
steps:
  - id: each
    kind: foreach
    items: "${1..30}"
    concurrency: 30
    steps:
      - {id: slow, kind: call, operation: hold}
`)
	s.apply(t, `
name: small
steps:
  - {id: one, kind: noop}
`)
	big, err := s.c.Start(ctx, client.StartRequest{Workflow: "fanout"})
	require.NoError(t, err)
	poll(t, 60*time.Second, "the fan-out holds the flex workers", func() (bool, string) {
		n := running.Load()
		return n >= 9, "running: " + strconv.FormatInt(n, 10)
	})
	small, err := s.c.Start(ctx, client.StartRequest{Workflow: "small"})
	require.NoError(t, err)
	x := s.waitDone(t, small.ID, 60*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.LessOrEqual(t, most.Load(), int64(11), "the fan-out took a worker kept for the normal lane")
	b, err := s.c.Execution(ctx, big.ID)
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, b.Status, "the fan-out was still held")
	open()
	x = s.waitDone(t, big.ID, 120*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
}
