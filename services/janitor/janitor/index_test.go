package janitor_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
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
