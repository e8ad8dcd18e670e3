package dispatch_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// A dispatcher records a step's sending with the step's next event, not
// with an io.jetflow.step.sent of its own (docs/adr/0007). These tests
// hold the guarantees that must survive it: a task that may have been
// stored is never stored again, one that was not is sent, and the
// history still shows when each task was stored.

// countTasks is how many copies of task id its queue holds.
func countTasks(t *testing.T, js jetstream.JetStream, id string) int {
	t.Helper()
	n := 0
	err := history.ScanReports(t.Context(), js, bus.StreamTasks, bus.TasksPrefix+".>", func(ev events.Event) error {
		if ev.ID == id {
			n++
		}
		return nil
	})
	require.NoError(t, err)
	return n
}

// sentBy runs a dispatcher named source until the task id is stored,
// then stops it: it published the task and recorded nothing after.
func sentBy(t *testing.T, b *testBundle, source, id string) {
	t.Helper()
	d, err := dispatch.New(t.Context(), dispatch.Config{Source: source, Workers: 2}, b.js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	runUntil(t, d, func() bool { return taskStored(t, b.js, id) })
}

// reconcile asks the dispatchers to decide about execution id again, and
// waits until they have.
func reconcile(t *testing.T, b *testBundle, wf, id string) {
	t.Helper()
	publishPayload(t, b.js, bus.SubjectReconcile, events.New("test", id, wf, time.Now(), &events.ReconcileExecution{ExecutionID: id, Workflow: wf, Reason: "test"}))
	waitCommandsHandled(t, b.js)
	waitConsumerCaughtUp(t, b.js, bus.StreamInbox)
}

// shortenTaskDedupe makes the tasks stream forget message ids after
// window, and returns a wait for the moment it has forgotten those of
// the tasks stored so far: a probe published now is published again
// until the stream stores it anew (ids are forgotten oldest first).
func shortenTaskDedupe(t *testing.T, js jetstream.JetStream, window time.Duration) (waitForgotten func()) {
	t.Helper()
	s, err := js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.Duplicates = window
	_, err = js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	return func() {
		probe := bus.TaskSubject("dedupe-probe")
		_, err := js.Publish(t.Context(), probe, nil, jetstream.WithMsgID("probe"))
		require.NoError(t, err)
		natstest.Eventually(t, waitFor, func() bool {
			ack, err := js.Publish(t.Context(), probe, nil, jetstream.WithMsgID("probe"))
			return err == nil && !ack.Duplicate
		}, "the tasks stream forgets the ids older than %s", window)
	}
}

// sentLong makes a bundle whose tasks stream forgets message ids after a
// second, starts execution exec of a one-step workflow and has a
// dispatcher that then stops publish its task: it returns the bundle, the
// task's id and a wait for the stream to have forgotten that id.
func sentLong(t *testing.T, exec string) (*testBundle, string, func()) {
	t.Helper()
	b := setup(t)
	forgotten := shortenTaskDedupe(t, b.js, time.Second)
	b.register(t, "deploy", "build")
	b.start(t, "deploy", exec)
	id := events.TaskID(exec, "build", 1)
	sentBy(t, b, "A", id)
	return b, id, forgotten
}

// TestARestartedDispatcherRecordsTheSendingFromTheReport: the dispatcher
// that sent a task died before the task's report; the next one records
// the sending from the report (the task's sequence and stored time).
func TestARestartedDispatcherRecordsTheSendingFromTheReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register(t, "deploy", "build")
	b.start(t, "deploy", "s1")
	id := events.TaskID("s1", "build", 1)
	sentBy(t, b, "A", id)
	task := b.nextTask(t)

	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.report(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1), StartedAt: time.Now().UTC()})
	s, evs := waitStatus(t, b.js, "deploy", "s1", projections.StatusSucceeded)
	require.Equal(t, []events.Type{events.TypeExecutionStarted, events.TypeExecutionSucceeded},
		typesOf(evs), "the start carries the dispatch, the end the success")
	done := succeededOf(evs[1])
	require.Equal(t, task.seq, done.TaskSeq)
	require.True(t, task.stored.Equal(done.SentAt), "sent at %s, the task was stored at %s", done.SentAt, task.stored)
	require.Equal(t, task.seq, s.Steps[0].TaskSeq)
	require.True(t, task.stored.Equal(s.Steps[0].SentAt) || s.Steps[0].SentAt.Equal(s.Steps[0].ScheduledAt), "clocks apart: never before the schedule")
}

// TestAStateReadAnewSendsTheTaskAgainOnlyIfItWasNotStored: a dispatcher
// that reads a history with a step sending, and does not know its task,
// publishes it again: within the tasks stream's dedupe window that
// stores nothing; past it, the dispatcher first looks for the task in
// its queue and for its reports, and publishes only if neither is there.
func TestAStateReadAnewSendsTheTaskAgainOnlyIfItWasNotStored(t *testing.T) {
	t.Parallel()
	later := func() time.Time { return time.Now().Add(3 * time.Minute) } // past the default window's half

	// A task published again within the dedupe window is a duplicate:
	// its sending is recorded when it was first stored, not now (with
	// group commit too, where a lone task is a plain publish, whose
	// acknowledgement says it was a duplicate).
	for name, groupCommit := range map[string]bool{"WithinTheWindow": false, "WithinTheWindowGroupCommit": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.register(t, "deploy", "build")
			b.start(t, "deploy", "w1")
			id := events.TaskID("w1", "build", 1)
			sentBy(t, b, "A", id)
			time.Sleep(time.Second) // the first publish well before the second
			runDispatcher(t, b.js, dispatch.Config{Workers: 2, GroupCommit: groupCommit})
			reconcile(t, b, "deploy", "w1")
			require.Equal(t, 1, countTasks(t, b.js, id), "published again, and dropped as a duplicate")
			evs := readHistory(t, b.js, "deploy", "w1")
			require.Equal(t, []events.Type{events.TypeExecutionStarted}, typesOf(evs), "nothing recorded after the start (with the dispatch)")

			t.Log("the duplicate's acknowledgement told the task's sequence: recorded even with a report that does not")
			task := b.nextTask(t)
			b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("older-agent", 1)})
			_, evs = waitStatus(t, b.js, "deploy", "w1", projections.StatusSucceeded)
			done := succeededOf(evs[1])
			require.Equal(t, task.seq, done.TaskSeq)
			require.False(t, done.SentAt.IsZero())
			require.False(t, done.SentAt.After(task.stored), "sent when first stored (%s), not when published again: recorded %s",
				task.stored.Format(time.RFC3339Nano), done.SentAt.Format(time.RFC3339Nano))
		})
	}

	t.Run("PastTheWindowStillInItsQueue", func(t *testing.T) {
		t.Parallel()
		b, id, forgotten := sentLong(t, "w2")
		forgotten()
		runDispatcher(t, b.js, dispatch.Config{Workers: 2, Now: later})
		reconcile(t, b, "deploy", "w2")
		require.Equal(t, 1, countTasks(t, b.js, id), "found in its queue: not stored again")

		t.Log("its report records it sent")
		task := b.nextTask(t)
		b.report(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1)})
		s, _ := waitStatus(t, b.js, "deploy", "w2", projections.StatusSucceeded)
		require.Equal(t, task.seq, s.Steps[0].TaskSeq)
	})

	t.Run("PastTheWindowReported", func(t *testing.T) {
		t.Parallel()
		b, id, forgotten := sentLong(t, "w3")
		task := b.nextTask(t)
		b.report(t, &events.OperationStarted{TaskRef: task.ref("test-agent", 1), StartedAt: time.Now().UTC()})
		forgotten()
		runDispatcher(t, b.js, dispatch.Config{Workers: 2, Now: later})
		reconcile(t, b, "deploy", "w3")
		waitResultsHandled(t, b.js)
		require.Zero(t, countTasks(t, b.js, id), "reported (it ran): not stored again")
		s := foldOf(t, b.js, "deploy", "w3")
		require.Equal(t, projections.OpStarted, s.Steps[0].Status)
		require.Equal(t, task.seq, s.Steps[0].TaskSeq)
	})

	t.Run("PastTheWindowNeverStored", func(t *testing.T) {
		t.Parallel()
		b, id, forgotten := sentLong(t, "w4")
		// Taken from its queue without a report: as far as anyone can
		// tell, it was never stored (a dispatcher that died between the
		// sending and the publish leaves the same).
		b.nextTask(t)
		forgotten()
		runDispatcher(t, b.js, dispatch.Config{Workers: 2, Now: later})
		reconcile(t, b, "deploy", "w4")
		// The look-up may still run when the consumers show the command
		// taken: wait for the task rather than read the queue once.
		natstest.Eventually(t, waitFor, func() bool { return countTasks(t, b.js, id) > 0 }, "task %s sent again", id)
		require.Equal(t, 1, countTasks(t, b.js, id), "sent again, once")
		again := b.nextTask(t)
		require.Equal(t, id, again.task.TaskID)
		b.report(t, &events.OperationSucceeded{TaskRef: again.ref("test-agent", 1)})
		s, _ := waitStatus(t, b.js, "deploy", "w4", projections.StatusSucceeded)
		require.Equal(t, again.seq, s.Steps[0].TaskSeq)
	})
}

// TestATaskThatLeftItsQueueIsSentAgainAfterANudge: the dispatcher that
// published a task keeps it sent in its memory; the task leaves its queue
// without a report (an operator purged it). The janitor's nudge for an
// idle execution (a reconcile) has the dispatcher check its memory again:
// past the look-up's delay it finds the task neither in its queue nor
// reported, and sends it again.
func TestATaskThatLeftItsQueueIsSentAgainAfterANudge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	forgotten := shortenTaskDedupe(t, b.js, time.Second)
	b.register(t, "deploy", "build")
	var ahead atomic.Int64
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }})
	b.start(t, "deploy", "v1")
	id := events.TaskID("v1", "build", 1)
	natstest.Eventually(t, waitFor, func() bool { return taskStored(t, b.js, id) }, "task %s stored", id)
	b.nextTask(t) // taken without a report
	forgotten()
	ahead.Store(int64(3 * time.Minute))
	reconcile(t, b, "deploy", "v1")
	natstest.Eventually(t, waitFor, func() bool { return countTasks(t, b.js, id) > 0 }, "task %s sent again", id)
	require.Equal(t, 1, countTasks(t, b.js, id), "sent again, once")
	again := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: again.ref("test-agent", 1)})
	s, _ := waitStatus(t, b.js, "deploy", "v1", projections.StatusSucceeded)
	require.Equal(t, again.seq, s.Steps[0].TaskSeq)
}
