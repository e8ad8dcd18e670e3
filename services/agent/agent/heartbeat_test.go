package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestHeartbeats: an operation whose step has a heartbeat runs as long as
// it heartbeats (a Go handler calling operation.Heartbeat, an exec
// writing output); one silent for longer is terminated and fails as lost,
// saying so.
func TestHeartbeats(t *testing.T) {
	t.Parallel()
	causes := make(chan error, 1)
	b := setupAgent(t, map[string]operation.Handler{
		"beating": operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
			for range 50 {
				operation.Heartbeat(ctx)
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
			return "alive", nil
		}),
		"silent": operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
				return nil, ctx.Err()
			case <-time.After(time.Minute):
				return "never", nil
			}
		}),
	})
	beating := b.publishTask(t, "x1", workflow.Step{ID: "s", Kind: "beating", Heartbeat: "2s"})
	silent := b.publishTask(t, "x2", workflow.Step{ID: "s", Kind: "silent", Heartbeat: "500ms"})
	ticking := b.publishTask(t, "x3", workflow.Step{ID: "s", Kind: workflow.KindExec, Heartbeat: "2s",
		Command: "sh", Args: []string{"-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo tick; sleep 0.1; done"}})
	quiet := b.publishTask(t, "x4", workflow.Step{ID: "s", Kind: workflow.KindExec, Heartbeat: "500ms", Command: "sleep", Args: []string{"30"}})

	require.Equal(t, events.TypeOperationSucceeded, b.waitTaskFinal(t, beating).Type, "a handler that heartbeats runs on")
	require.Equal(t, events.TypeOperationSucceeded, b.waitTaskFinal(t, ticking).Type, "an exec that writes output runs on")
	for _, task := range []*events.Task{silent, quiet} {
		final := b.waitTaskFinal(t, task)
		require.Equal(t, events.TypeOperationFailed, final.Type, task.Kind)
		f := final.Data.(*events.OperationFailed)
		require.True(t, f.Lost, "a silent operation fails as lost: %s", f.Error)
		require.Contains(t, f.Error, agent.ErrNoHeartbeat.Error())
		require.Contains(t, f.Error, "its step's heartbeat is 500ms")
		t.Logf("%s: %s", task.Kind, f.Error)
	}
	require.True(t, errors.Is(<-causes, agent.ErrNoHeartbeat), "the handler's context is cancelled with ErrNoHeartbeat")
}
