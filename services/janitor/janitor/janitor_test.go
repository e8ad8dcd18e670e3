package janitor_test

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/janitor/janitor"
)

const idleAfter = 2 * time.Minute

var now = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

type testBundle struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	janitor *janitor.Janitor
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	j, err := janitor.New(janitor.Config{IdleAfter: idleAfter, Now: func() time.Time { return now }},
		js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	return &testBundle{js: js, kv: kv, janitor: j}
}

// execution returns a started read model of workflow wf with steps
// "build" and "ship", last updated age ago.
func execution(id string, age time.Duration) projections.Execution {
	return projections.Execution{ID: id, Workflow: "wf", Version: 1, Status: projections.StatusStarted, Token: "tok-" + id,
		Steps: []projections.Step{
			{ID: "build", Kind: "exec", Status: projections.OpSucceeded, Attempt: 1, TaskID: events.TaskID(id, "build", 1), TaskSeq: 1},
			{ID: "ship", Kind: "noop"},
		},
		StartedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-age), LastSeq: 17, Events: 6}
}

func (b *testBundle) put(t *testing.T, x projections.Execution) {
	t.Helper()
	v, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = b.kv.Put(t.Context(), x.ID, v)
	require.NoError(t, err)
}

// publishTask stores a task for step of x in the default queue and returns
// its stream sequence.
func (b *testBundle) publishTask(t *testing.T, x projections.Execution, step string, attempt int) (string, uint64) {
	t.Helper()
	taskID := events.TaskID(x.ID, step, attempt)
	ev := events.New("test-dispatcher", x.ID, x.Workflow, now, &events.Task{TaskID: taskID, ExecutionID: x.ID,
		Workflow: x.Workflow, StepID: step, Attempt: attempt, Token: x.Token, Kind: "noop", Queue: "default"})
	ev.ID = taskID
	msg, err := bus.Encode(bus.TaskSubject("default"), ev)
	require.NoError(t, err)
	ack, err := b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(taskID))
	require.NoError(t, err)
	return taskID, ack.Sequence
}

// sentStep returns x with step "ship" sent as task (taskID, seq).
func sentStep(x projections.Execution, status projections.OpStatus, taskID string, seq uint64) projections.Execution {
	x.Steps[1] = projections.Step{ID: "ship", Kind: "noop", Status: status, Attempt: 1, TaskID: taskID, TaskSeq: seq, Queue: "default"}
	return x
}

func (b *testBundle) deleteTask(t *testing.T, seq uint64) {
	t.Helper()
	stream, err := b.js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	require.NoError(t, stream.DeleteMsg(t.Context(), seq))
}

func (b *testBundle) reconciles(t *testing.T) []events.Event {
	t.Helper()
	evs, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.SubjectReconcile, 0, 0)
	require.NoError(t, err)
	return evs
}

func (b *testBundle) results(t *testing.T, execID string) []events.Event {
	t.Helper()
	evs, err := history.ReadStream(t.Context(), b.js, bus.StreamResults, bus.ExecutionResults(execID), 0, 0)
	require.NoError(t, err)
	return evs
}

// runOnce sweeps once and returns what the sweep counted (its timings,
// which vary, are checked and left out).
func (b *testBundle) runOnce(t *testing.T) janitor.Result {
	t.Helper()
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Positive(t, res.IdleTook)
	require.Positive(t, res.RetentionTook)
	res.IdleTook, res.RetentionTook = 0, 0
	return res
}

func TestRunOnceEmpty(t *testing.T) {
	t.Parallel()

	b := setup(t)
	require.Equal(t, janitor.Result{}, b.runOnce(t))
}

func TestRunOnceReconcilesIdleExecution(t *testing.T) {
	t.Parallel()

	b := setup(t)
	idle := execution("x-idle", idleAfter+time.Second)
	b.put(t, idle)
	b.put(t, execution("x-recent", idleAfter-time.Second))
	done := execution("x-done", time.Hour)
	done.Status = projections.StatusSucceeded
	b.put(t, done)
	failed := execution("x-failed", time.Hour)
	failed.Status = projections.StatusFailed
	b.put(t, failed)
	_, err := b.kv.Put(t.Context(), "x-garbage", []byte("not json"))
	require.NoError(t, err)

	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1}, b.runOnce(t))
	cmds := b.reconciles(t)
	require.Len(t, cmds, 1)
	require.Equal(t, "reconcile-x-idle-17", cmds[0].ID)
	require.Equal(t, events.TypeReconcileExecution, cmds[0].Type)
	require.Equal(t, "jetflow/janitor", cmds[0].Source)
	require.Equal(t, "x-idle", cmds[0].Subject)
	require.True(t, now.Equal(cmds[0].Time))
	require.Equal(t, &events.ReconcileExecution{ExecutionID: "x-idle", Workflow: "wf", Reason: "idle"}, cmds[0].Data)

	t.Log("a second sweep before anything changed publishes the same command, deduplicated")
	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1}, b.runOnce(t))
	require.Len(t, b.reconciles(t), 1)

	t.Log("once the execution moved on, a new command is published")
	idle.LastSeq = 18
	b.put(t, idle)
	b.runOnce(t)
	cmds = b.reconciles(t)
	require.Len(t, cmds, 2)
	require.Equal(t, "reconcile-x-idle-18", cmds[1].ID)
	require.Empty(t, b.results(t, "x-idle"))
}

func TestRunOnceReconcilesPendingStep(t *testing.T) {
	t.Parallel()

	b := setup(t)
	for _, status := range []projections.OpStatus{projections.OpPending, projections.OpSending} {
		x := sentStep(execution("x-"+string(status), time.Hour), status, "", 0)
		b.put(t, x)
	}
	require.Equal(t, janitor.Result{Checked: 2, Reconciled: 2}, b.runOnce(t))
	require.Len(t, b.reconciles(t), 2)
}

func TestRunOnceVanishedTask(t *testing.T) {
	t.Parallel()

	for _, status := range []projections.OpStatus{projections.OpSent, projections.OpStarted} {
		t.Run(string(status), func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			x := execution("x-lost", idleAfter+time.Second)
			taskID, seq := b.publishTask(t, x, "ship", 1)
			b.deleteTask(t, seq) // taken from the queue, and no result came
			b.put(t, sentStep(x, status, taskID, seq))

			require.Equal(t, janitor.Result{Checked: 1, LostTasks: 1}, b.runOnce(t))
			rs := b.results(t, "x-lost")
			require.Len(t, rs, 1)
			require.Equal(t, taskID+".vanished", rs[0].ID)
			require.Equal(t, "jetflow/janitor", rs[0].Source)
			failed, ok := rs[0].Data.(*events.OperationFailed)
			require.True(t, ok, "result is %s", rs[0].Type)
			require.Equal(t, events.TaskRef{TaskID: taskID, ExecutionID: "x-lost", Workflow: "wf", StepID: "ship",
				Attempt: 1, Token: "tok-x-lost", Queue: "default", Agent: "janitor"}, failed.TaskRef)
			require.Contains(t, failed.Error, "without a result")
			require.Empty(t, b.reconciles(t), "a step in flight is not reconciled")

			t.Log("a second sweep reports the same failure, deduplicated")
			b.runOnce(t)
			require.Len(t, b.results(t, "x-lost"), 1)
		})
	}
}

func TestRunOnceVanishedTaskWithResult(t *testing.T) {
	t.Parallel()

	for _, final := range []events.Type{events.TypeOperationSucceeded, events.TypeOperationFailed} {
		t.Run(string(final), func(t *testing.T) {
			t.Parallel()

			b := setup(t)
			x := execution("x-reported", idleAfter+time.Second)
			taskID, seq := b.publishTask(t, x, "ship", 1)
			b.deleteTask(t, seq)
			b.put(t, sentStep(x, projections.OpStarted, taskID, seq))

			ref := events.TaskRef{TaskID: taskID, ExecutionID: x.ID, Workflow: x.Workflow, StepID: "ship", Attempt: 1,
				Token: x.Token, Agent: "a1", Delivery: 1}
			var p events.Payload = &events.OperationSucceeded{TaskRef: ref}
			if final == events.TypeOperationFailed {
				p = &events.OperationFailed{TaskRef: ref, Error: "boom"}
			}
			// Another task's result first, so the janitor must match the task id.
			other := ref
			other.TaskID = events.TaskID(x.ID, "build", 1)
			for _, r := range []events.Payload{&events.OperationStarted{TaskRef: ref}, &events.OperationSucceeded{TaskRef: other}, p} {
				msg, err := bus.Encode(bus.ResultSubject("default", x.ID), events.New("agent", x.ID, x.Workflow, now, r))
				require.NoError(t, err)
				_, err = b.js.PublishMsg(t.Context(), msg)
				require.NoError(t, err)
			}

			require.Equal(t, janitor.Result{Checked: 1}, b.runOnce(t))
			rs := b.results(t, x.ID)
			require.Len(t, rs, 3, "the janitor published nothing")
			require.Empty(t, b.reconciles(t))
		})
	}
}

func TestRunOnceOnlyStartedReportIsLost(t *testing.T) {
	t.Parallel()

	b := setup(t)
	x := execution("x-started", idleAfter+time.Second)
	taskID, seq := b.publishTask(t, x, "ship", 1)
	b.deleteTask(t, seq)
	b.put(t, sentStep(x, projections.OpStarted, taskID, seq))
	ref := events.TaskRef{TaskID: taskID, ExecutionID: x.ID, Workflow: x.Workflow, StepID: "ship", Attempt: 1, Token: x.Token, Queue: "default"}
	msg, err := bus.Encode(bus.ResultSubject("default", x.ID), events.New("agent", x.ID, x.Workflow, now, &events.OperationStarted{TaskRef: ref}))
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)

	require.Equal(t, janitor.Result{Checked: 1, LostTasks: 1}, b.runOnce(t), "a started report is not a result")
}

func TestRunOnceLeavesQueuedTask(t *testing.T) {
	t.Parallel()

	b := setup(t)
	x := execution("x-queued", time.Hour)
	taskID, seq := b.publishTask(t, x, "ship", 1)
	b.put(t, sentStep(x, projections.OpSent, taskID, seq))
	noSeq := sentStep(execution("x-noseq", time.Hour), projections.OpSent, events.TaskID("x-noseq", "ship", 1), 0)
	b.put(t, noSeq)

	require.Equal(t, janitor.Result{Checked: 2}, b.runOnce(t), "a task still in its queue is left alone, however long it takes")
	require.Empty(t, b.results(t, "x-queued"))
	require.Empty(t, b.results(t, "x-noseq"))
	require.Empty(t, b.reconciles(t))
}

// TestLostTaskAdvisory exhausts a task's deliveries on a consumer with
// MaxDeliver 1: JetStream's advisory, kept in the advisories stream, makes
// the running janitor fail the task and remove it from the queue.
// With its consumer deleted first (by hand, or by a tool), the janitor
// makes it again and still handles the advisory.
func TestLostTaskAdvisory(t *testing.T) {
	t.Parallel()
	t.Run("Consumer", func(t *testing.T) { t.Parallel(); lostTaskAdvisory(t, false) })
	t.Run("ConsumerDeletedFirst", func(t *testing.T) { t.Parallel(); lostTaskAdvisory(t, true) })
}

func lostTaskAdvisory(t *testing.T, deleteFirst bool) {
	b := setup(t)
	natstest.Serve(t, b.janitor.Run)
	if deleteFirst {
		name := bus.JanitorConsumerSpec().Config.Durable
		// Deleted under a running Consume (a delete while the janitor
		// still made it is answered "consumer closed", which Bind takes
		// as a reason to make it again).
		natstest.Eventually(t, 10*time.Second, func() bool { return b.janitor.Ready() == nil }, "the janitor consumes")
		require.NoError(t, b.js.DeleteConsumer(t.Context(), bus.StreamAdvisories, name))
		natstest.Eventually(t, 10*time.Second, func() bool {
			_, err := b.js.Consumer(t.Context(), bus.StreamAdvisories, name)
			return err == nil
		}, "the janitor's consumer made again")
	}

	x := execution("x-adv", 0)
	taskID, seq := b.publishTask(t, x, "ship", 1)
	cons, err := b.js.CreateOrUpdateConsumer(t.Context(), bus.StreamTasks, jetstream.ConsumerConfig{
		Durable: "agent-default", FilterSubject: bus.TaskSubject("default"), AckPolicy: jetstream.AckExplicitPolicy,
		MaxDeliver: 1, AckWait: time.Second,
	})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	n := 0
	for m := range batch.Messages() {
		n++
		require.NoError(t, m.Nak()) // the agent gave up; no delivery is left
	}
	require.NoError(t, batch.Error())
	require.Equal(t, 1, n)
	// The consumer notices the exhausted deliveries (and raises the
	// advisory) when it next looks for a message to deliver.
	batch, err = cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
	require.NoError(t, err)
	for range batch.Messages() {
		t.Fatal("a task with no delivery left was delivered again")
	}

	var rs []events.Event
	natstest.Eventually(t, 10*time.Second, func() bool {
		rs = b.results(t, x.ID)
		return len(rs) > 0
	}, "lost task reported")
	require.Len(t, rs, 1)
	require.Equal(t, taskID+".lost", rs[0].ID)
	failed, ok := rs[0].Data.(*events.OperationFailed)
	require.True(t, ok, "result is %s", rs[0].Type)
	require.Equal(t, taskID, failed.TaskID)
	require.Equal(t, "janitor", failed.Agent)
	require.Equal(t, x.Token, failed.Token)
	require.Contains(t, failed.Error, "agent-default")

	stream, err := b.js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, err := stream.GetMsg(t.Context(), seq)
		return err != nil
	}, "lost task removed from the queue")
}

// TestSweepLeavesTimedWaitsAlone: an execution sleeping (or waiting for a
// signal, or for a retry's backoff) is not idle; only one whose timer is
// long overdue (its schedule was lost) is nudged, so that the reconcile
// re-arms it, and one whose timer fired while its step still waits.
func TestSweepLeavesTimedWaitsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sleeping := func(id string, due time.Time) projections.Execution {
		x := execution(id, 2*idleAfter)
		x.Steps[1] = projections.Step{ID: "ship", Kind: "sleep", Status: projections.OpWaiting, Attempt: 1, WaitUntil: due}
		x.Timers = map[string]projections.Timer{"t1": {Purpose: events.TimerSleep, StepID: "ship", Attempt: 1, Due: due}}
		return x
	}
	b.put(t, sleeping("in-a-day", now.Add(24*time.Hour)))
	b.put(t, sleeping("lost-timer", now.Add(-time.Hour)))
	unacted := sleeping("fired-not-acted-on", now.Add(-2*idleAfter))
	unacted.Timers["t1"] = projections.Timer{Purpose: events.TimerSleep, StepID: "ship", Attempt: 1, Due: now.Add(-2 * idleAfter), Fired: true}
	b.put(t, unacted)
	timedOut := sleeping("workflow-timed-out", now.Add(24*time.Hour))
	timedOut.Timers["t2"] = projections.Timer{Purpose: events.TimerWorkflowTimeout, Due: now.Add(-2 * idleAfter), Fired: true}
	b.put(t, timedOut)
	signal := execution("for-a-signal", 2*idleAfter)
	signal.Steps[1] = projections.Step{ID: "ship", Kind: "wait", Status: projections.OpWaiting, Attempt: 1}
	b.put(t, signal)
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Reconciled)
	var nudged []string
	for _, c := range b.reconciles(t) {
		nudged = append(nudged, c.Data.(*events.ReconcileExecution).ExecutionID)
	}
	require.ElementsMatch(t, []string{"lost-timer", "fired-not-acted-on", "workflow-timed-out"}, nudged)
}

// TestRunOnceLeavesDamagedAlone: an idle damaged execution waits for an
// admin's repair, not for a reconcile (which the dispatcher would drop).
func TestRunOnceLeavesDamagedAlone(t *testing.T) {
	t.Parallel()

	b := setup(t)
	damaged := execution("x-damaged", time.Hour)
	damaged.Damaged = &projections.Damage{Seq: 18, Reason: "illegal"}
	b.put(t, damaged)
	b.put(t, execution("x-idle", time.Hour))

	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1}, b.runOnce(t))
	cmds := b.reconciles(t)
	require.Len(t, cmds, 1)
	require.Equal(t, "x-idle", cmds[0].Subject)
}

// TestSweepReconcilesAParentWaitingForItsChild: a parent whose step
// waits for a child execution is reconciled when idle, even while
// another of its steps waits for a signal: its child's end may not have
// reached it, and the reconcile reads the child's history.
func TestSweepReconcilesAParentWaitingForItsChild(t *testing.T) {
	t.Parallel()

	b := setup(t)
	x := execution("a-parent", 2*idleAfter)
	x.Steps[1] = projections.Step{ID: "ship", Kind: "workflow", Status: projections.OpPending, Attempt: 1,
		Child: "a-parent-ship-0123456789", ChildWorkflow: "shipping"}
	x.Steps = append(x.Steps, projections.Step{ID: "approve", Kind: "wait", Status: projections.OpWaiting, Attempt: 1})
	b.put(t, x)
	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1}, b.runOnce(t))
	cmds := b.reconciles(t)
	require.Len(t, cmds, 1)
	require.Equal(t, "a-parent", cmds[0].Subject)

	t.Log("once the step has the child's end, only the signal is waited for")
	x.Steps[1].Status, x.LastSeq = projections.OpSucceeded, 18
	b.put(t, x)
	require.Equal(t, janitor.Result{Checked: 1}, b.runOnce(t))
	require.Len(t, b.reconciles(t), 1)
}

// TestSweepNudgesALocalStepLeftSending: a local step (run by its
// dispatcher) sending for LocalIdleAfter is nudged, long before
// IdleAfter: a dispatcher that died while it ran the step leaves nothing
// else to run it again. Agents' steps wait for IdleAfter as before.
func TestSweepNudgesALocalStepLeftSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	local := func(id string, age time.Duration) projections.Execution {
		x := execution(id, age)
		x.Steps[1] = projections.Step{ID: "ship", Kind: "noop", Status: projections.OpSending, Attempt: 1,
			TaskID: events.TaskID(id, "ship", 1), Queue: workflow.LocalQueue}
		return x
	}
	b.put(t, local("local-quiet", janitor.LocalIdleAfter+time.Second))
	b.put(t, local("local-busy", janitor.LocalIdleAfter-time.Second))
	withAgent := local("local-beside-an-agent", janitor.LocalIdleAfter+time.Second)
	withAgent.Steps = append(withAgent.Steps, projections.Step{ID: "deploy", Kind: "exec", Status: projections.OpSent, Attempt: 1,
		TaskID: events.TaskID(withAgent.ID, "deploy", 1), TaskSeq: 99, Queue: "default"})
	b.put(t, withAgent)
	b.put(t, sentStep(execution("agent-sending", janitor.LocalIdleAfter+time.Second), projections.OpSending, "", 0))
	done := local("local-ran", janitor.LocalIdleAfter+time.Second) // its step ran: nothing to nudge yet
	done.Steps[1].Status = projections.OpSucceeded
	b.put(t, done)

	res := b.runOnce(t)
	require.Equal(t, 2, res.Reconciled, "%+v", res)
	var nudged []string
	for _, c := range b.reconciles(t) {
		nudged = append(nudged, c.Data.(*events.ReconcileExecution).ExecutionID)
	}
	require.ElementsMatch(t, []string{"local-quiet", "local-beside-an-agent"}, nudged)

	t.Log("nudged again at the next sweep, though nothing changed: the holder that took the first nudge may have lost the partition")
	now := now.Add(30 * time.Second)
	j, err := janitor.New(janitor.Config{IdleAfter: idleAfter, Now: func() time.Time { return now }}, b.js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	res, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Reconciled, "%+v (local-busy is now quiet too)", res)
	require.Len(t, b.reconciles(t), 5)
}

// TestASweepReadsTheReadModelsOnce: the idle part and retention decide
// from one pass over the read models (one watcher, so one consumer made
// on the bucket's stream), not one pass each: a sweep's cost grows with
// every execution kept.
func TestASweepReadsTheReadModelsOnce(t *testing.T) {
	t.Parallel()

	b := setup(t)
	b.put(t, execution("idle", idleAfter+time.Minute))
	done := execution("done", time.Hour)
	done.Status, done.EndedAt = projections.StatusSucceeded, now.Add(-time.Hour)
	b.put(t, done)

	var made atomic.Int32
	nc := b.js.Conn()
	stream := "KV_" + bus.BucketExecutions
	for _, subj := range []string{"$JS.API.CONSUMER.CREATE." + stream, "$JS.API.CONSUMER.CREATE." + stream + ".>"} {
		sub, err := nc.Subscribe(subj, func(*nats.Msg) { made.Add(1) })
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, nc.Flush())

	res := b.runOnce(t)
	require.Equal(t, 1, res.Checked, "the idle execution")
	require.Equal(t, 1, res.Finished, "the finished one")
	require.NoError(t, nc.Flush())
	require.EqualValues(t, 1, made.Load(), "consumers made on %s in one sweep", stream)
}
