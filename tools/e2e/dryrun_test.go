package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestDryRunWalksContainersLocksAndWaits dry-runs a workflow with a lock,
// a foreach, a switch, a parallel with a sleep, a block with its own lock
// and a wait for a signal: the items and the case are evaluated and every
// operation's input is rendered, but nothing runs, sleeps, waits or
// locks. Nothing reaches the tasks or timers streams or the lock bucket,
// and every skipped step says why.
func TestDryRunWalksContainersLocksAndWaits(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir() // the exec steps would leave files in it
	s.apply(t, strings.ReplaceAll(`
name: rollout
lock: env-${input.env}
steps:
  - id: each
    kind: foreach
    items: ${input.hosts}
    steps:
      - {id: push, kind: exec, command: touch, args: ["DIR/push-${item}-${index}"]}
  - id: route
    kind: switch
    cases:
      - when: ${input.env == "prod"}
        steps:
          - {id: page, kind: exec, command: touch, args: ["DIR/page"]}
    default:
      - {id: note, kind: log, message: "${input.env} is not prod"}
  - id: both
    kind: parallel
    branches:
      - id: build
        steps:
          - {id: compile, kind: exec, command: touch, args: ["DIR/compile"]}
      - id: cool
        steps:
          - {id: nap, kind: sleep, duration: 1h}
  - id: guarded
    kind: workflow
    lock: db-${input.env}
    semaphore: 2
    steps:
      - {id: migrate, kind: exec, command: touch, args: ["DIR/migrate"]}
  - {id: approve, kind: wait, signal: go, timeout: 1h}
`, "DIR", dir))
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "rollout", ID: "dry-1", DryRun: true,
		Input: map[string]any{"env": "staging", "hosts": []any{"web-a", "web-b", "web-c"}}})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.True(t, x.DryRun)

	skipped := func(id, reason string) projections.Step {
		t.Helper()
		step := stepByID(t, x, id)
		require.Equal(t, projections.OpSkipped, step.Status, id)
		require.Equal(t, reason, step.Error, id)
		return step
	}
	t.Log("the foreach's items are evaluated: one instance each, its input rendered")
	for i, host := range []string{"web-a", "web-b", "web-c"} {
		push := skipped(fmt.Sprintf("each[%d]/push", i), "dry run: would run exec with the input recorded")
		require.Contains(t, string(push.Input), fmt.Sprintf("push-%s-%d", host, i))
	}
	requireNoStep(t, x, "each[3]/push")
	t.Log("the switch's cases are evaluated: the default is taken, the prod case is not")
	note := skipped("route/default/note", "dry run: would run log with the input recorded")
	require.Contains(t, string(note.Input), "staging is not prod")
	requireNoStep(t, x, "route/case0/page")
	t.Log("both branches are walked; the sleep, the locked block's step and the wait are skipped")
	skipped("both/build/compile", "dry run: would run exec with the input recorded")
	skipped("both/cool/nap", "dry run: would sleep")
	skipped("guarded/migrate", "dry run: would run exec with the input recorded")
	skipped("approve", "dry run: would wait for a signal")
	require.Empty(t, x.Locks, "no lock is asked for")
	require.Empty(t, x.Timers, "no timer is armed")

	hist := s.history(t, "dry-1")
	requireLinear(t, hist)
	n := countTypes(hist)
	for _, typ := range []events.Type{events.TypeStepSending, events.TypeStepDispatched, events.TypeStepSent, events.TypeStepStarted,
		events.TypeTimerArmed, events.TypeLockRequested, events.TypeLockAcquired, events.TypeStepWaiting} {
		for key, c := range n {
			require.False(t, strings.HasPrefix(key, string(typ)), "%d %s in a dry run", c, key)
		}
	}
	skips := map[string]int{}
	for _, ev := range hist {
		if p, ok := ev.Data.(*events.StepSkipped); ok {
			require.True(t, p.DryRun, "%s skipped by the dry run", p.StepID)
			require.True(t, strings.HasPrefix(p.Reason, "dry run: would "), "%s: %s", p.StepID, p.Reason)
			skips[p.StepID]++
		}
	}
	require.Equal(t, map[string]int{"each[0]/push": 1, "each[1]/push": 1, "each[2]/push": 1, "route/default/note": 1,
		"both/build/compile": 1, "both/cool/nap": 1, "guarded/migrate": 1, "approve": 1}, skips,
		"each operation, sleep and wait is skipped once, and nothing else")

	t.Log("nothing reached an agent, a timer or the lock bucket: their streams never held a message")
	for _, stream := range []string{bus.StreamTasks, bus.StreamTimers, "KV_" + bus.BucketLocks} {
		str, err := s.js.Stream(ctx, stream)
		require.NoError(t, err)
		info, err := str.Info(ctx)
		require.NoError(t, err)
		require.Zero(t, info.State.LastSeq, "stream %s", stream)
	}
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, files, "no command ran")
}
