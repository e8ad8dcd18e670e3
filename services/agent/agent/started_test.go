package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestAShortOperationIsReportedStartedWithItsResult: an operation that
// ends within StartedAfter is not reported started on its own; its final
// report says when it started, in which delivery, by which agent.
func TestAShortOperationIsReportedStartedWithItsResult(t *testing.T) {
	t.Parallel()

	// A minute: however loaded the machine, a noop ends sooner.
	b := setupAgentWith(t, agent.Config{StartedAfter: time.Minute})
	before := time.Now()
	task := b.publishTask(t, "x-short", workflow.Step{ID: "nothing", Kind: workflow.KindNoop})
	evs := b.waitFinal(t, "x-short")
	require.Len(t, evs, 1, "one report: the result")
	ok, isOK := evs[0].Data.(*events.OperationSucceeded)
	require.True(t, isOK, "result is %s", evs[0].Type)
	requireRef(t, task, ok.TaskRef)
	require.False(t, ok.StartedAt.Before(before.Truncate(time.Microsecond)), "started %s, task published %s", ok.StartedAt, before)
	require.False(t, ok.StartedAt.After(evs[0].Time), "started %s, reported %s", ok.StartedAt, evs[0].Time)

	b.waitQueueEmpty(t)
	// Nothing comes later either: the queue is empty, so the task's
	// worker is done with it.
	require.Len(t, readResults(t, b.js, "x-short"), 1)
}

// TestALongOperationIsReportedStartedAfterTheGrace: an operation still
// running after StartedAfter is reported started while it runs (here:
// it runs until its start report is stored), before its result.
func TestALongOperationIsReportedStartedAfterTheGrace(t *testing.T) {
	t.Parallel()

	var b *agentBundle
	b = setupAgentWith(t, agent.Config{StartedAfter: time.Millisecond, Handlers: map[string]operation.Handler{
		"slow": operation.HandlerFunc(func(ctx context.Context, tk operation.Task) (any, error) {
			// Not natstest.Eventually: this runs on the agent's goroutine.
			for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				evs, err := history.ReadStream(ctx, b.js, bus.StreamResults, bus.ExecutionResults(tk.ExecutionID), 0, 0)
				if err != nil {
					return nil, err
				}
				for _, ev := range evs {
					if ev.Type == events.TypeOperationStarted {
						return "done", nil
					}
				}
			}
			return nil, errors.New("no started report while the operation ran")
		}),
	}})
	task := b.publishTask(t, "x-long", workflow.Step{ID: "wait", Kind: "slow"})
	final := requireStartedThen(t, task, b.waitFinal(t, "x-long"), events.TypeOperationSucceeded)
	require.JSONEq(t, `"done"`, string(final.Data.(*events.OperationSucceeded).Output))
	b.waitQueueEmpty(t)
}
