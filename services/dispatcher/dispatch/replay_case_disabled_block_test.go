package dispatch_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// replayOutcome waits for the replay command to be rejected or recorded.
func replayOutcome(t *testing.T, b *testBundle, wf, id, key string) (*events.CommandRejected, *events.ExecutionReplayed) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		rejs, err := history.ReadStream(t.Context(), b.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
		require.NoError(t, err)
		if len(rejs) > 0 {
			return rejs[0].Data.(*events.CommandRejected), nil
		}
		for _, ev := range readHistory(t, b.js, wf, id) {
			if p, ok := ev.Data.(*events.ExecutionReplayed); ok && p.Command == key {
				return nil, p
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("replay neither rejected nor recorded")
	return nil, nil
}

// A block replayable: disabled is, per the seed, idempotent: no. When the
// failure is inside it (hidden from replays), a replay resuming must not
// resume at the block, which runs its non-idempotent steps again; with no
// replay point, it is refused.
func TestReplayCaseResumeAtDisabledBlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: dis
steps:
  - id: blk
    kind: workflow
    replayable: disabled
    steps:
      - {id: create, kind: call, operation: create}
      - {id: check, kind: call, operation: check}
`)
	b.start(t, "dis", "d1")
	c := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: c.task.Ref("test-agent", 1)})
	k := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: k.task.Ref("test-agent", 1), Error: "boom"})
	waitStatus(t, b.js, "dis", "d1", projections.StatusFailed)

	rej, rp := replayOutcome(t, b, "dis", "d1", b.replay(t, "d1", events.ReplayResume, false))
	if rp != nil {
		t.Errorf("replay resuming accepted: point %q mode %s resume %v reset %v", rp.Point, rp.Mode, rp.Resume, rp.Reset)
		next := b.nextTask(t)
		require.NotEqual(t, "blk/create", next.task.StepID, "the non-idempotent create runs again without force")
	}
	require.NotNil(t, rej)
}

// A block whose on-error retries it (attempt 2, instances blk@2/...): the
// replay point blk/mark of attempt 1 is stale, yet a replay resuming
// after blk@2/pre failed goes "from" it, which runs nothing again.
func TestReplayCaseStaleAttemptReplayPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: stale
steps:
  - id: blk
    kind: workflow
    on-error:
      - {id: again, kind: retry, retry: {limit: 2}}
    steps:
      - {id: pre, kind: call, operation: pre}
      - {id: mark, kind: replayable, replayable: from here}
      - {id: work, kind: call, operation: work}
`)
	b.start(t, "stale", "s1")
	p1 := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: p1.task.Ref("test-agent", 1)})
	w1 := b.nextTask(t)
	require.Equal(t, "blk/work", w1.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: w1.task.Ref("test-agent", 1), Error: "boom"})
	p2 := b.nextTask(t)
	require.Equal(t, "blk@2/pre", p2.task.StepID)
	b.report(t, &events.OperationFailed{TaskRef: p2.task.Ref("test-agent", 1), Error: "boom"})
	waitStatus(t, b.js, "stale", "s1", projections.StatusFailed)

	rej, rp := replayOutcome(t, b, "stale", "s1", b.replay(t, "s1", events.ReplayResume, false))
	if rej != nil {
		return // refused: no replay point in the current attempt
	}
	t.Logf("replay: point %q resume %v reopen %v reset %v", rp.Point, rp.Resume, rp.Reopen, rp.Reset)
	s, _ := waitStatus(t, b.js, "stale", "s1", projections.StatusFailed)
	require.Failf(t, "replay from a stale point ran nothing again", "the execution failed again at once: %s", s.Error)
}
