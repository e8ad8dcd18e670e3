package dispatch_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// replay asks for a replay as an operator would.
func (b *testBundle) replay(t *testing.T, execID, from string, force bool) string {
	t.Helper()
	ev := events.New("test-operator", "", "", time.Now(), &events.ExecutionAction{ExecutionID: execID, Action: events.ActionReplay,
		Reason: "test", From: from, Force: force})
	b.publishCommand(t, ev, ev.ID)
	return events.CommandKey(ev.Source, ev.ID)
}

// counter is the outside resource of the seed's atomic increment: the
// test plays the agent that reads and writes it.
type counter struct{ value int }

// serve runs one counter task: get answers the value, set stores the
// input's value; a set may "lose its agent" after storing (the janitor's
// lost-task failure).
func (c *counter) serve(t *testing.T, b *testBundle, loseAfterSet bool) fetchedTask {
	t.Helper()
	task := b.nextTask(t)
	var spec struct {
		Operation string          `json:"operation"`
		Input     json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal(task.task.Spec, &spec))
	ref := task.task.Ref("test-agent", 1)
	switch spec.Operation {
	case "counter-get":
		b.report(t, &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{"count":` + strconv.Itoa(c.value) + `}`)})
	case "counter-set":
		var in struct {
			Value int `json:"value"`
		}
		require.NoError(t, json.Unmarshal(spec.Input, &in))
		c.value = in.Value
		if loseAfterSet {
			ref.Agent = "janitor"
			b.report(t, &events.OperationFailed{TaskRef: ref, Error: "task delivered 5 times to agents without a result", Lost: true})
		} else {
			b.report(t, &events.OperationSucceeded{TaskRef: ref})
		}
	default:
		t.Fatalf("unexpected operation %q in task %s", spec.Operation, task.task.StepID)
	}
	return task
}

const incrementSteps = `
  - {id: read, kind: call, operation: counter-get}
  - {id: load, kind: let, vars: {x: "${steps.read.output.count}"}}
  - {id: inc, kind: let, replayable: from here only, vars: {x: "${vars.x + 1}"}}
  - {id: write, kind: call, operation: counter-set, input: {value: "${vars.x}"}}
  - {id: done, kind: replayable, replayable: from here}
`

// The seed's atomic increment, under a lock: interrupted on the write
// after the value was stored, an operator's replay resuming does not resume at the write
// (not idempotent) but replays from inc, the only replay point, with x as
// it was there: the count is incremented once.
func TestReplayAtomicIncrement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: inc\nlock: counter\nreplayable: from start\nsteps:"+incrementSteps)
	c := &counter{value: 41}
	b.start(t, "inc", "i1")
	c.serve(t, b, false)
	c.serve(t, b, true)
	s, _ := waitStatus(t, b.js, "inc", "i1", projections.StatusFailed)
	require.Equal(t, 42, c.value)
	require.JSONEq(t, `42`, string(s.Vars["x"]))

	rej := readRejection(t, b.js, b.replay(t, "i1", events.ReplayStart, false))
	require.Contains(t, rej.Reason, "cleared the start", "from here only on inc removed the start as a replay point")
	require.Contains(t, rej.Reason, "; accepted now: replay from resume, from last or from start with force", "the replays it would accept instead")

	b.replay(t, "i1", "", false) // resume (the default)
	write := c.serve(t, b, false)
	require.Equal(t, "write", write.task.StepID)
	require.Equal(t, 2, write.task.Attempt)
	s, evs := waitStatus(t, b.js, "inc", "i1", projections.StatusSucceeded)
	require.Equal(t, 42, c.value, "incremented once")
	rp := evs[indexOfType(evs, events.TypeExecutionReplayed)].Data.(*events.ExecutionReplayed)
	require.Equal(t, "inc", rp.Point)
	require.Equal(t, events.ReplayModeReplay, rp.Mode)
	require.Equal(t, []string{"inc", "write"}, rp.Reset)
	require.JSONEq(t, `41`, string(rp.Vars["x"]), "x as it was when inc was entered")
	require.Equal(t, "test-operator", rp.RequestedBy)
	require.Len(t, s.Replays, 1)
	// The lock was released when the execution failed and is taken again
	// before the replay runs a step.
	acquired := 0
	for i, ev := range evs {
		switch ev.Type {
		case events.TypeLockAcquired:
			acquired++
		case events.TypeStepScheduled, events.TypeStepDispatched, events.TypeStepSucceeded:
			if ok, isOK := ev.Data.(*events.StepSucceeded); isOK && ok.Then == nil {
				continue // no dispatch with it
			}
			if i > indexOfType(evs, events.TypeExecutionReplayed) {
				require.Equal(t, 2, acquired, "a step was scheduled after the replay before the lock was held again")
			}
		}
	}
	require.Equal(t, 2, acquired)
	require.Equal(t, projections.LockReleased, s.Locks[0].Status)
	historytest.RequireLinear(t, evs)
}

// The same increment in a block under a lock whose on-error retries by
// replaying (the seed's second example): the write's failure replays the
// block from inc, without an operator, and the lock stays held.
func TestReplayRetryStepInOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: incblk
steps:
  - id: blk
    kind: workflow
    lock: single-entry-workflow-incrementing-count
    replayable: from start
    on-error:
      - {id: again, kind: retry, replay: true, retry: {limit: 3}}
    steps:`+strings.ReplaceAll(incrementSteps, "\n  - ", "\n      - "))
	c := &counter{value: 7}
	b.start(t, "incblk", "b1")
	c.serve(t, b, false)
	c.serve(t, b, true) // stored 8, then reported lost: the block fails, again replays
	w2 := c.serve(t, b, true)
	require.Equal(t, "blk/write", w2.task.StepID)
	require.Equal(t, 2, w2.task.Attempt)
	require.JSONEq(t, `{"value":8}`, string(specInput(t, w2)), "x restored at inc: 7+1 again")
	c.serve(t, b, true) // third attempt also lost: limit 3 attempts in all is reached
	s, evs := waitStatus(t, b.js, "incblk", "b1", projections.StatusFailed)
	require.Contains(t, s.Error, "no replays left")
	require.Equal(t, 2, countType(evs, events.TypeExecutionReplayed))
	require.Equal(t, 8, c.value)
	for _, r := range s.Replays {
		require.Equal(t, "blk/inc", r.Point)
		require.Equal(t, "blk/on-error/again", r.Cause)
	}
	require.Equal(t, 1, countType(evs, events.TypeLockAcquired), "the lock is held through on-error and the replays")
	require.Less(t, indexOfType(evs, events.TypeLockAcquired), indexOfType(evs, events.TypeExecutionReplayed))
	require.Len(t, s.Locks, 1)
	require.Equal(t, projections.LockReleased, s.Locks[0].Status, "released when the execution ended")
	historytest.RequireLinear(t, evs)
}

// replayable: automatically: a step whose task was lost (its agents died)
// is resumed at without an operator when it is idempotent.
func TestReplayAutomaticallyAfterLostTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: auto
replayable: automatically
steps:
  - {id: first, kind: let, vars: {n: 5}}
  - {id: probe, kind: call, operation: probe, idempotent: yes, input: {n: "${vars.n}"}}
`)
	b.start(t, "auto", "a1")
	t1 := b.nextTask(t)
	ref := t1.task.Ref("janitor", 1)
	b.report(t, &events.OperationFailed{TaskRef: ref, Error: "task left its queue without a result", Lost: true})
	t2 := b.nextTask(t)
	require.Equal(t, "probe", t2.task.StepID)
	require.Equal(t, 2, t2.task.Attempt)
	require.NotEqual(t, t1.task.Token, t2.task.Token, "a replay issues a new token")
	require.JSONEq(t, string(specInput(t, t1)), string(specInput(t, t2)), "resuming uses the recorded input")
	b.report(t, &events.OperationSucceeded{TaskRef: t2.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "auto", "a1", projections.StatusSucceeded)
	rp := evs[indexOfType(evs, events.TypeExecutionReplayed)].Data.(*events.ExecutionReplayed)
	require.True(t, rp.Automatic)
	require.Equal(t, events.ReplayModeResume, rp.Mode)
	require.Equal(t, []string{"probe"}, rp.Resume)
	require.Equal(t, 1, s.Resumes)

	// A failure that is not a lost task is not replayed.
	b.start(t, "auto", "a2")
	t3 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: t3.task.Ref("test-agent", 1), Error: "probe said no"})
	_, evs = waitStatus(t, b.js, "auto", "a2", projections.StatusFailed)
	require.Zero(t, countType(evs, events.TypeExecutionReplayed))
}

// Replay from a step that is not a replay point searches backwards for
// one and restores the variables as they were there; force replays from
// the step itself.
func TestReplayFromStepRestoresVariables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: vars
output: "${vars.n}"
steps:
  - {id: one, kind: let, vars: {n: 1}}
  - {id: mark, kind: replayable, replayable: from here}
  - {id: bump, kind: let, vars: {n: "${vars.n + 10}"}}
  - {id: work, kind: call, operation: work, input: {n: "${vars.n}"}}
`)
	b.start(t, "vars", "v1")
	w1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: w1.task.Ref("test-agent", 1), Error: "disk full"})
	s, _ := waitStatus(t, b.js, "vars", "v1", projections.StatusFailed)
	require.JSONEq(t, `11`, string(s.Vars["n"]))

	// work is not idempotent and is not a replay point: resume refuses
	// nothing here, it replays from mark.
	b.replay(t, "v1", "bump", false)
	w2 := b.nextTask(t)
	require.JSONEq(t, `{"n":11}`, string(specInput(t, w2)), "n restored to 1 at mark, bumped once: 11, not 21")
	b.report(t, &events.OperationFailed{TaskRef: w2.task.Ref("test-agent", 1), Error: "disk full again"})
	waitStatus(t, b.js, "vars", "v1", projections.StatusFailed)

	// Forced from bump itself: n as it was when bump was entered (1).
	b.replay(t, "v1", "bump", true)
	w3 := b.nextTask(t)
	require.JSONEq(t, `{"n":11}`, string(specInput(t, w3)))
	require.Equal(t, 3, w3.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: w3.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "vars", "v1", projections.StatusSucceeded)
	require.JSONEq(t, `11`, string(s.Output))
	var points []string
	for _, r := range s.Replays {
		points = append(points, r.Point)
	}
	require.Equal(t, []string{"mark", "bump"}, points)
	historytest.RequireLinear(t, evs)

	// A replay that cannot be done is rejected and changes nothing.
	before := len(evs)
	for from, why := range map[string]string{
		"nosuch":            `no step "nosuch"`,
		events.ReplayStart:  "not replayable from start",
		events.ReplayResume: "nothing to resume",
	} {
		rej := readRejection(t, b.js, b.replay(t, "v1", from, false))
		require.Equal(t, events.CodeConflict, rej.Code)
		require.Contains(t, rej.Reason, why)
	}
	require.Len(t, readHistory(t, b.js, "vars", "v1"), before)
}

// An idempotent step that failed is resumed at with its recorded input;
// one that is not idempotent, with no replay point before it, is refused.
func TestReplayResumeIdempotency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: idem
idempotent: all
steps:
  - {id: a, kind: call, operation: op}
  - {id: b, kind: call, operation: op, idempotent: no}
`)
	b.start(t, "idem", "d1")
	a1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: a1.task.Ref("test-agent", 1), Error: "flaky"})
	waitStatus(t, b.js, "idem", "d1", projections.StatusFailed)
	b.replay(t, "d1", events.ReplayResume, false)
	a2 := b.nextTask(t)
	require.Equal(t, "a", a2.task.StepID, "idempotent: all makes a idempotent")
	require.Equal(t, 2, a2.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: a2.task.Ref("test-agent", 1)})
	b1 := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: b1.task.Ref("test-agent", 1), Error: "flaky"})
	waitStatus(t, b.js, "idem", "d1", projections.StatusFailed)
	rej := readRejection(t, b.js, b.replay(t, "d1", events.ReplayResume, false))
	require.Contains(t, rej.Reason, "step b is not idempotent")
	b.replay(t, "d1", events.ReplayResume, true)
	b2 := b.nextTask(t)
	require.Equal(t, "b", b2.task.StepID, "forced")
	b.report(t, &events.OperationSucceeded{TaskRef: b2.task.Ref("test-agent", 1)})
	waitStatus(t, b.js, "idem", "d1", projections.StatusSucceeded)
}

func specInput(t *testing.T, task fetchedTask) json.RawMessage {
	t.Helper()
	var spec struct {
		Input json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal(task.task.Spec, &spec))
	return spec.Input
}
