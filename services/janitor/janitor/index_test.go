package janitor_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/janitor/janitor"
)

// bucketRequests records the requests the janitor makes of the read
// models' bucket's stream: the consumers it makes (their configuration)
// and the read models it gets one by one. Its subscriptions are
// synchronous: once the connection is flushed, every request made before
// is counted.
type bucketRequests struct {
	creates, gets []*nats.Subscription
}

func watchBucketRequests(t *testing.T, nc *nats.Conn) *bucketRequests {
	t.Helper()
	r := &bucketRequests{}
	subscribe := func(to *[]*nats.Subscription, subjects ...string) {
		for _, subj := range subjects {
			sub, err := nc.SubscribeSync(subj)
			require.NoError(t, err)
			require.NoError(t, sub.SetPendingLimits(-1, -1))
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			*to = append(*to, sub)
		}
	}
	stream := "KV_" + bus.BucketExecutions
	subscribe(&r.creates, "$JS.API.CONSUMER.CREATE."+stream, "$JS.API.CONSUMER.CREATE."+stream+".>")
	subscribe(&r.gets, "$JS.API.DIRECT.GET."+stream+".>", "$JS.API.STREAM.MSG.GET."+stream)
	require.NoError(t, nc.Flush())
	return r
}

// since returns the consumers made and the gets made since the last
// call. The janitor shares the test's connection, so a flush comes after
// all its requests so far.
func (r *bucketRequests) since(t *testing.T, nc *nats.Conn) ([]jetstream.ConsumerConfig, int) {
	t.Helper()
	require.NoError(t, nc.Flush())
	var made []jetstream.ConsumerConfig
	for _, sub := range r.creates {
		for range pending(t, sub) {
			m, err := sub.NextMsg(time.Second)
			require.NoError(t, err)
			var req struct {
				Config jetstream.ConsumerConfig `json:"config"`
			}
			require.NoError(t, json.Unmarshal(m.Data, &req))
			made = append(made, req.Config)
		}
	}
	gets := 0
	for _, sub := range r.gets {
		for range pending(t, sub) {
			_, err := sub.NextMsg(time.Second)
			require.NoError(t, err)
			gets++
		}
	}
	return made, gets
}

func pending(t *testing.T, sub *nats.Subscription) int {
	t.Helper()
	n, _, err := sub.Pending()
	require.NoError(t, err)
	return n
}

// TestASweepReadsWhatWasWrittenSince: the first sweep reads every read
// model; the next read those written since (their consumer starts past
// the last revision read) and act on the bucket as it is: a model added
// is looked at, a deleted one forgotten.
func TestASweepReadsWhatWasWrittenSince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nc := b.js.Conn()
	reqs := watchBucketRequests(t, nc)

	b.put(t, execution("idle-a", idleAfter+time.Minute))
	done := execution("done", time.Hour)
	done.Status, done.EndedAt = projections.StatusSucceeded, now.Add(-time.Hour)
	b.put(t, done)
	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1, Finished: 1}, b.runOnce(t))
	made, _ := reqs.since(t, nc)
	require.Len(t, made, 1)
	require.Equal(t, jetstream.DeliverLastPerSubjectPolicy, made[0].DeliverPolicy, "the first sweep reads them all")

	b.put(t, execution("idle-b", idleAfter+time.Minute))
	require.Equal(t, janitor.Result{Checked: 2, Reconciled: 2, Finished: 1}, b.runOnce(t))
	made, _ = reqs.since(t, nc)
	require.Len(t, made, 1)
	require.Equal(t, jetstream.DeliverByStartSequencePolicy, made[0].DeliverPolicy)
	require.EqualValues(t, 3, made[0].OptStartSeq, "read from the revision after the two the first sweep read")

	require.NoError(t, b.kv.Delete(t.Context(), "idle-a"))
	require.NoError(t, b.kv.Purge(t.Context(), "done"))
	require.Equal(t, janitor.Result{Checked: 1, Reconciled: 1}, b.runOnce(t))
	made, _ = reqs.since(t, nc)
	require.Len(t, made, 1)
	require.EqualValues(t, 4, made[0].OptStartSeq)
}

// TestExecutionsWaitingOnTimeAreNotReadAgain: an idle execution that
// waits for a timer still to come, or for a signal, is left alone by
// every sweep without its read model being read again (it is read whole
// once, the first time it is idle); one that is stuck is read again at
// each sweep and nudged. Once the sleep's timer is overdue, it is read
// again and nudged too.
func TestExecutionsWaitingOnTimeAreNotReadAgain(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	nc := b.js.Conn()
	reqs := watchBucketRequests(t, nc)
	put := func(x projections.Execution) {
		v, err := json.Marshal(x)
		require.NoError(t, err)
		_, err = b.kv.Put(t.Context(), x.ID, v)
		require.NoError(t, err)
	}
	due := now.Add(time.Hour)
	sleeping := execution("sleeping", 2*idleAfter)
	sleeping.Steps[1] = projections.Step{ID: "ship", Kind: "sleep", Status: projections.OpWaiting, Attempt: 1, WaitUntil: due}
	sleeping.Timers = map[string]projections.Timer{"t1": {Purpose: events.TimerSleep, StepID: "ship", Attempt: 1, Due: due}}
	put(sleeping)
	signal := execution("for-a-signal", 2*idleAfter)
	signal.Steps[1] = projections.Step{ID: "ship", Kind: "wait", Status: projections.OpWaiting, Attempt: 1}
	put(signal)
	put(execution("stuck", 2*idleAfter))

	for i := range 3 {
		res, err := b.janitor.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 3, res.Checked, "%+v", res)
		require.Equal(t, 1, res.Reconciled, "%+v: only the stuck one", res)
		_, gets := reqs.since(t, nc)
		if i == 0 {
			require.Equal(t, 3, gets, "each idle one read whole, once")
		} else {
			require.Equal(t, 1, gets, "read models read again: only the stuck one's")
		}
	}

	b.now = due.Add(time.Minute + time.Second)
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Checked, "%+v", res)
	require.Equal(t, 2, res.Reconciled, "%+v: the sleep's timer is overdue", res)
	_, gets := reqs.since(t, nc)
	require.Equal(t, 2, gets)
}

// TestTasksInFlightAreCheckedWithoutReadingTheModelAgain: an idle
// execution whose only business is a task in flight (an operation of an
// hour) is read whole once; the sweeps after check that its task is
// still in its queue without reading its read model, until the task is
// gone (read again, and reported lost, as before) or the model is written
// again (read again, once).
func TestTasksInFlightAreCheckedWithoutReadingTheModelAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nc := b.js.Conn()
	reqs := watchBucketRequests(t, nc)
	x := execution("long-task", 2*idleAfter)
	taskID, seq := b.publishTask(t, x, "ship", 1)
	b.put(t, sentStep(x, projections.OpStarted, taskID, seq))
	noSeq := sentStep(execution("no-seq", 2*idleAfter), projections.OpSent, events.TaskID("no-seq", "ship", 1), 0)
	b.put(t, noSeq)

	for i := range 3 {
		require.Equal(t, janitor.Result{Checked: 2}, b.runOnce(t), "sweep %d", i)
		_, gets := reqs.since(t, nc)
		if i == 0 {
			require.Equal(t, 2, gets, "each read whole, once")
		} else {
			require.Zero(t, gets, "sweep %d: tasks in flight checked without their read models", i)
		}
	}

	otherID, otherSeq := b.publishTask(t, noSeq, "ship", 1)
	b.put(t, sentStep(noSeq, projections.OpSent, otherID, otherSeq)) // its sequence recorded: written again
	b.deleteTask(t, seq)                                             // taken, and no result came
	require.Equal(t, janitor.Result{Checked: 2, LostTasks: 1}, b.runOnce(t))
	_, gets := reqs.since(t, nc)
	require.Equal(t, 2, gets, "the model written since and the one whose task is gone are read again")
	rs := b.results(t, "long-task")
	require.Len(t, rs, 1)
	require.Equal(t, taskID+".vanished", rs[0].ID)
	require.Empty(t, b.results(t, "no-seq"))

	require.Equal(t, janitor.Result{Checked: 2}, b.runOnce(t), "the lost task's failure is reported once")
	_, gets = reqs.since(t, nc)
	require.Equal(t, 1, gets, "only the one whose task is gone is read again: its failure is in the results")
	require.Len(t, b.results(t, "long-task"), 1)
	require.Empty(t, b.reconciles(t), "an execution with a task in flight is not reconciled")

	// Its task done, its next step not sent: nothing in flight, and idle,
	// it is nudged at every sweep, its task (still in its queue here)
	// checked no more.
	done := noSeq
	done.Steps[1] = projections.Step{ID: "ship", Kind: "noop", Status: projections.OpSucceeded, Attempt: 1, TaskID: otherID, TaskSeq: otherSeq}
	done.Steps = append(done.Steps, projections.Step{ID: "notify", Kind: "noop"})
	done.LastSeq++
	b.put(t, done)
	for i := range 2 {
		require.Equal(t, janitor.Result{Checked: 2, Reconciled: 1}, b.runOnce(t), "sweep %d", i)
		_, gets = reqs.since(t, nc)
		require.Equal(t, 2, gets, "sweep %d: both read again", i)
	}
	require.Len(t, b.reconciles(t), 1, "the same nudge, deduplicated")
}

// TestAFullReadForgetsWhatLeftNoMarker: read models that vanished with
// no marker (the bucket purged by hand) are forgotten at the next full
// read, FullReadEvery after the last; those written since are kept.
func TestAFullReadForgetsWhatLeftNoMarker(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	b.finished(t, "wf", 3, now.Add(-time.Hour), nil)
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Finished)

	stream, err := b.js.Stream(t.Context(), "KV_"+bus.BucketExecutions)
	require.NoError(t, err)
	require.NoError(t, stream.Purge(t.Context()))
	b.store(t, run{wf: "wf", id: "wf-after", status: projections.StatusSucceeded, ended: now.Add(-time.Minute)})
	b.now = now.Add(janitor.FullReadEvery - time.Second)
	res, err = b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 4, res.Finished, "not yet read whole again: the three purged are still counted")

	b.now = now.Add(janitor.FullReadEvery)
	res, err = b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Finished, "read whole again")
}

// TestOldMarkersAreRemoved: the marker a deleted read model leaves is
// removed from the bucket once older than 30 minutes, and only it: a
// read model written again under the same key stays.
func TestOldMarkersAreRemoved(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	b.finished(t, "wf", 2, now.Add(-time.Hour), nil)
	model, err := b.kv.Get(t.Context(), "wf-2")
	require.NoError(t, err)
	require.NoError(t, b.kv.Delete(t.Context(), "wf-1"))
	require.NoError(t, b.kv.Delete(t.Context(), "wf-2"))
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, res.Finished)
	status, err := b.kv.Status(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 2, status.Values(), "two markers, young: kept")

	_, err = b.kv.Put(t.Context(), "wf-2", model.Value())
	require.NoError(t, err)
	b.now = time.Now().Add(31 * time.Minute) // markers are dated by the server's clock
	res, err = b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Finished, "wf-2 written again")
	status, err = b.kv.Status(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, status.Values(), "wf-1's marker removed, wf-2's model kept")
	_, err = b.kv.Get(t.Context(), "wf-2")
	require.NoError(t, err)
}

// TestManyIdleAtOnceAreReadInOnePass: when many executions are idle for
// the first time at once (all fell asleep together), their read models
// are read whole in one pass over the bucket, not one request each, and
// not again at the next sweep.
func TestManyIdleAtOnceAreReadInOnePass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nc := b.js.Conn()
	due := now.Add(time.Hour)
	for i := range 150 {
		x := execution(fmt.Sprintf("sleeper-%d", i), 2*idleAfter)
		x.Steps[1] = projections.Step{ID: "ship", Kind: "sleep", Status: projections.OpWaiting, Attempt: 1, WaitUntil: due}
		x.Timers = map[string]projections.Timer{"t1": {Purpose: events.TimerSleep, StepID: "ship", Attempt: 1, Due: due}}
		b.put(t, x)
	}
	reqs := watchBucketRequests(t, nc)
	require.Equal(t, janitor.Result{Checked: 150}, b.runOnce(t))
	made, gets := reqs.since(t, nc)
	require.Zero(t, gets)
	require.Len(t, made, 2, "the sweep's read, and one pass for the idle ones")
	require.Equal(t, janitor.Result{Checked: 150}, b.runOnce(t))
	made, gets = reqs.since(t, nc)
	require.Zero(t, gets)
	require.Len(t, made, 1, "the sweep's read only")
}

// TestALocalStepLeftSendingIsNudgedAtEverySweep: the same janitor nudges
// an execution whose local step is left sending at every sweep while it
// is, though its read model does not change (what it knows of the model
// does not make it skip it).
func TestALocalStepLeftSendingIsNudgedAtEverySweep(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	x := execution("local-quiet", janitor.LocalIdleAfter+time.Second)
	x.Steps[1] = projections.Step{ID: "ship", Kind: "noop", Status: projections.OpSending, Attempt: 1,
		TaskID: events.TaskID(x.ID, "ship", 1), Queue: workflow.LocalQueue}
	v, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = b.kv.Put(t.Context(), x.ID, v)
	require.NoError(t, err)
	for i := range 3 {
		res, err := b.janitor.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, res.Reconciled, "sweep %d: %+v", i, res)
		b.now = b.now.Add(30 * time.Second)
	}
}

// TestABucketMadeAgainIsReadWhole: a read-model bucket deleted and made
// again (by hand) starts its revisions anew: the next sweep reads it
// whole, and never takes a new model for what it knew of the old
// bucket's (here: an old marker under the same key, which it would
// otherwise remove, and the new model with it).
func TestABucketMadeAgainIsReadWhole(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	for _, id := range []string{"a", "b", "c", "k"} {
		b.store(t, run{wf: "wf", id: id, status: projections.StatusSucceeded, ended: now.Add(-time.Hour)})
	}
	require.NoError(t, b.kv.Delete(t.Context(), "k"))
	b.now = time.Now().Add(29 * time.Minute) // the marker is dated by the server's clock
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Finished)

	model, err := b.kv.Get(t.Context(), "a")
	require.NoError(t, err)
	require.NoError(t, b.js.DeleteKeyValue(t.Context(), bus.BucketExecutions))
	cfg := bus.Buckets(bus.Config{})
	for _, c := range cfg {
		if c.Bucket == bus.BucketExecutions {
			b.kv, err = b.js.CreateKeyValue(t.Context(), c)
			require.NoError(t, err)
		}
	}
	_, err = b.kv.Put(t.Context(), "k", model.Value())
	require.NoError(t, err)

	b.now = b.now.Add(2 * time.Minute)
	res, err = b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Finished, "the new bucket's one model")
	_, err = b.kv.Get(t.Context(), "k")
	require.NoError(t, err, "the new model under k is kept")
}

// BenchmarkSweepTasksInFlight is a sweep over executions idle with a
// task in flight each (operations of an hour), after the first sweep
// read them: their tasks checked, their read models not read again.
func BenchmarkSweepTasksInFlight(b *testing.B) {
	const n = 2000
	_, js := natstest.Connect(b, natstest.RunJetStream(b))
	kv, err := js.KeyValue(b.Context(), bus.BucketExecutions)
	require.NoError(b, err)
	j, err := janitor.New(janitor.Config{IdleAfter: idleAfter, Now: func() time.Time { return now }}, js, zerolog.Nop())
	require.NoError(b, err)
	for i := range n {
		x := execution(fmt.Sprintf("x-%05d", i), 2*idleAfter)
		taskID := events.TaskID(x.ID, "ship", 1)
		ev := events.New("bench", x.ID, x.Workflow, now, &events.Task{TaskID: taskID, ExecutionID: x.ID,
			Workflow: x.Workflow, StepID: "ship", Attempt: 1, Token: x.Token, Kind: "noop", Queue: "default"})
		msg, err := bus.Encode(bus.TaskSubject("default"), ev)
		require.NoError(b, err)
		ack, err := js.PublishMsg(b.Context(), msg, jetstream.WithMsgID(taskID))
		require.NoError(b, err)
		v, err := json.Marshal(sentStep(x, projections.OpStarted, taskID, ack.Sequence))
		require.NoError(b, err)
		_, err = kv.Put(b.Context(), x.ID, v)
		require.NoError(b, err)
	}
	res, err := j.RunOnce(b.Context())
	require.NoError(b, err)
	require.Equal(b, n, res.Checked)
	for b.Loop() {
		res, err := j.RunOnce(b.Context())
		if err != nil || res.Checked != n || res.LostTasks != 0 || res.Reconciled != 0 {
			b.Fatalf("%+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/execution")
}
