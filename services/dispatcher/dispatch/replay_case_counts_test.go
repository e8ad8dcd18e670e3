package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// A retry step's replays are counted over the whole history: after an
// operator's replay, the retry step has no replays left at its first use
// (a plain retry's count starts afresh after a resume or replay).
func TestReplayCaseRetryReplayCountAfterOperatorReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: rcount
steps:
  - id: blk
    kind: workflow
    replayable: from start
    on-error:
      - {id: again, kind: retry, replay: true, retry: {limit: 2}}
    steps:
      - {id: work, kind: call, operation: op}
`)
	b.start(t, "rcount", "r1")
	for range 2 {
		w := b.nextTask(t)
		b.report(t, &events.OperationFailed{TaskRef: w.task.Ref("test-agent", 1), Error: "flaky"})
	}
	s, _ := waitStatus(t, b.js, "rcount", "r1", projections.StatusFailed)
	require.Contains(t, s.Error, "no replays left")

	b.replay(t, "r1", events.ReplayLast, false) // the operator fixed the cause
	w := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: w.task.Ref("test-agent", 1), Error: "flaky once more"})
	w2 := b.nextTask(t) // the retry step replays (its limit is 2 attempts)
	require.Equal(t, "blk@4/work", w2.task.StepID)
}

// The docs: "A replay refuses to start over an operation still with an
// agent unless forced". Replay resuming at an idempotent step that is
// still with an agent sends it again without force.
func TestReplayCaseReplayResumeInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: infl
steps:
  - {id: probe, kind: call, operation: op, idempotent: yes}
`)
	b.start(t, "infl", "f1")
	t1 := b.nextTask(t)
	b.report(t, &events.OperationStarted{TaskRef: t1.task.Ref("test-agent", 1)})
	waitHistory(t, b.js, "infl", "f1", "started", func(evs []events.Event) bool { return countType(evs, events.TypeStepStarted) > 0 })
	rej, rp := replayOutcome(t, b, "infl", "f1", b.replay(t, "f1", events.ReplayResume, false))
	if rp != nil {
		t2 := b.nextTask(t)
		t.Errorf("replay accepted while probe runs: mode %s resume %v; task %s attempt %d sent while attempt 1 runs", rp.Mode, rp.Resume, t2.task.StepID, t2.task.Attempt)
		return
	}
	require.Contains(t, rej.Reason, "still running")
}
