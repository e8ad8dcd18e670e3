package dispatch_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// logBuffer is a dispatcher's log, kept for the test to count lines in.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Count(l.buf.Bytes(), []byte(s))
}

// TestDamagedExecutionIsQuarantinedThenRepaired: a message that is no
// event lands in a running execution's history (an admin's mistake). The
// dispatcher quarantines that execution: it appends nothing to it, drops
// its results without retrying them, rejects commands for it with the
// code damaged, and logs the damage once, while another execution runs
// to its end. A repair published on the client's subject is refused; one
// from the api that names another event is refused; the admin's repair
// of the damaged event is recorded with who asked, the result that
// arrived meanwhile is applied, and the execution finishes. The bad
// message stays in the history where it was.
func TestDamagedExecutionIsQuarantinedThenRepaired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := &logBuffer{}
	d, err := dispatch.New(t.Context(), dispatch.Config{Workers: 2}, b.js, zerolog.New(logs))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)
	b.register(t, "deploy", "build", "ship")
	b.start(t, "deploy", "d1")
	build := b.nextTask(t)
	before := waitHistory(t, b.js, "deploy", "d1", "build sent", func(evs []events.Event) bool {
		return dispatches(evs) == 1
	})

	t.Log("an admin writes a message that is no event into d1's history")
	ack, err := b.js.Publish(t.Context(), bus.ExecutionSubject("deploy", "d1"), []byte(`{"by":"hand"}`),
		jetstream.WithExpectLastSequencePerSubject(before[len(before)-1].Seq))
	require.NoError(t, err)
	bad := ack.Sequence

	t.Log("its result is dropped, not retried; nothing is appended")
	b.report(t, &events.OperationSucceeded{TaskRef: build.task.Ref("test-agent", 1)})
	waitResultsHandled(t, b.js)
	evs := readHistory(t, b.js, "deploy", "d1")
	require.Len(t, evs, len(before)+1, "nothing appended after the bad message")
	require.Equal(t, bad, evs[len(evs)-1].Seq)
	require.NotEmpty(t, evs[len(evs)-1].Invalid)

	t.Log("a command for it is rejected, saying where the damage is")
	rej := readRejection(t, b.js, b.act(t, "d1", events.ActionCancel, "stop it"))
	require.Equal(t, events.CodeDamaged, rej.Code)
	require.Contains(t, rej.Reason, "damaged at sequence")
	require.Contains(t, rej.Reason, "--ignore-seq")

	t.Log("another execution is not held up")
	b.start(t, "deploy", "d2")
	for range 2 {
		task := b.nextTask(t)
		require.Equal(t, "d2", task.task.ExecutionID)
		b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
	}
	waitStatus(t, b.js, "deploy", "d2", projections.StatusSucceeded)

	t.Log("a repair on the client's subject is refused: it is an admin's action over the api")
	rej = readRejection(t, b.js, b.publishOn(t, bus.SubjectAction,
		&events.ExecutionAction{ExecutionID: "d1", Action: events.ActionRepair, IgnoreSeq: bad}))
	require.Equal(t, events.CodeForbidden, rej.Code)

	admin := &events.Actor{Subject: "ops-admin", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}
	t.Log("a repair that names another event than the damaged one is refused")
	rej = readRejection(t, b.js, b.publishOn(t, bus.SubjectAPIAction,
		&events.ExecutionAction{ExecutionID: "d1", Action: events.ActionRepair, IgnoreSeq: bad - 1, Actor: admin}))
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Contains(t, rej.Reason, fmt.Sprintf("damaged at sequence %d, not %d", bad, bad-1))

	waitCommandsHandled(t, b.js)
	require.Equal(t, 1, logs.count("execution damaged"), "the damage is logged once, however many messages met it")
	require.Zero(t, logs.count("will retry"), "nothing about it is retried")
	require.Len(t, readHistory(t, b.js, "deploy", "d1"), len(before)+1, "nothing appended while damaged")

	t.Log("the admin's repair: recorded with who asked; the result that arrived meanwhile is applied")
	key := b.publishOn(t, bus.SubjectAPIAction,
		&events.ExecutionAction{ExecutionID: "d1", Action: events.ActionRepair, IgnoreSeq: bad, Reason: "typo in a script", Actor: admin})
	ship := b.nextTask(t)
	require.Equal(t, "d1", ship.task.ExecutionID)
	require.Equal(t, "ship", ship.task.StepID)
	b.report(t, &events.OperationSucceeded{TaskRef: ship.task.Ref("test-agent", 1)})
	var s projections.Execution
	evs = waitHistory(t, b.js, "deploy", "d1", "succeeded", func(evs []events.Event) bool {
		s = projections.FoldQuarantined("d1", evs) // the bad message is still there: the strict fold refuses it
		return s.Status == projections.StatusSucceeded
	})
	require.Nil(t, s.Damaged)
	require.Equal(t, []uint64{bad}, s.Repairs)
	require.Contains(t, s.Actions, projections.ActionCommand{Command: key, Action: events.ActionRepair, Actor: admin})
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status, "the result dropped while damaged")

	t.Log("the history is not rewritten: the bad message is where it was")
	for i, ev := range before {
		require.Equal(t, ev.ID, evs[i].ID)
	}
	require.Equal(t, bad, evs[len(before)].Seq)
	require.NotEmpty(t, evs[len(before)].Invalid)
	repaired, ok := evs[len(before)+1].Data.(*events.ExecutionRepaired)
	require.True(t, ok, "the repair follows it: %s", evs[len(before)+1].Type)
	require.Equal(t, bad, repaired.IgnoreSeq)
	require.Equal(t, "typo in a script", repaired.Reason)
	require.Equal(t, admin, repaired.Actor)

	t.Log("the repair again (redelivered after an outage) changes nothing")
	source, id, _ := strings.Cut(key, "#")
	again := events.Event{ID: id, Type: events.TypeExecutionAction, Source: source, Time: time.Now(),
		Data: &events.ExecutionAction{ExecutionID: "d1", Action: events.ActionRepair, IgnoreSeq: bad, Reason: "typo in a script", Actor: admin}}
	msg, err := bus.Encode(bus.SubjectAPIAction, again)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID("redelivered"))
	require.NoError(t, err)
	waitCommandsHandled(t, b.js)
	rejected, err := history.ReadStream(t.Context(), b.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
	require.NoError(t, err)
	require.Empty(t, rejected)
	require.Len(t, readHistory(t, b.js, "deploy", "d1"), len(evs))

	t.Log("a repaired execution can be replayed: the state at its point passes over the bad message too")
	b.publishOn(t, bus.SubjectAction, &events.ExecutionAction{ExecutionID: "d1", Action: events.ActionReplay, From: "ship", Force: true})
	again2 := b.nextTask(t)
	require.Equal(t, "ship", again2.task.StepID)
	require.Equal(t, 2, again2.task.Attempt)
	b.report(t, &events.OperationSucceeded{TaskRef: again2.task.Ref("test-agent", 1)})
	waitHistory(t, b.js, "deploy", "d1", "succeeded again", func(evs []events.Event) bool {
		s = projections.FoldQuarantined("d1", evs)
		return s.Status == projections.StatusSucceeded && len(s.Replays) == 1
	})
	require.Nil(t, s.Damaged)
}

// TestUnknownEventWaitsForANewerDispatcher: an event of a type this
// dispatcher does not know (written by a newer one, during a rolling
// upgrade) is not treated as damage to reject commands over: a command
// waits, redelivered, for a dispatcher that knows it. If no newer one
// comes (it was written by mistake), an admin's repair passes over it and
// the waiting command is carried out.
func TestUnknownEventWaitsForANewerDispatcher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, AckWait: time.Second})
	b.register(t, "deploy", "build")
	b.start(t, "deploy", "u1")
	b.nextTask(t)
	before := waitHistory(t, b.js, "deploy", "u1", "build sent", func(evs []events.Event) bool {
		return dispatches(evs) == 1
	})
	future := events.New("jetflow/dispatcher-v9", "u1", "deploy", time.Now(), &events.StepSent{StepID: "build", Attempt: 1})
	future.Type = "io.jetflow.step.paused"
	future.PrevSeq = before[len(before)-1].Seq
	unknown, err := history.Append(t.Context(), b.js, bus.ExecutionSubject("deploy", "u1"), future.PrevSeq, future)
	require.NoError(t, err)

	key := b.act(t, "u1", events.ActionForceCancel, "")
	natstest.Eventually(t, waitFor, func() bool {
		// Handled from the intake (this dispatcher holds u1's partition)
		// or from the partition's inbox: either way, delivered again.
		n := 0
		for _, c := range []struct{ stream, name string }{
			{bus.StreamCommands, dispatch.CommandsConsumer},
			{bus.StreamInbox, bus.PartitionInboxConsumer(partition.Of("u1", partition.DefaultCount))},
		} {
			cons, err := b.js.Consumer(t.Context(), c.stream, c.name)
			require.NoError(t, err)
			info, err := cons.Info(t.Context())
			require.NoError(t, err)
			n += info.NumRedelivered
		}
		return n > 0
	}, "the command is redelivered, waiting")
	rejected, err := history.ReadStream(t.Context(), b.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
	require.NoError(t, err)
	require.Empty(t, rejected, "not rejected: a newer dispatcher may carry it out")

	admin := &events.Actor{Subject: "ops-admin", Method: events.ActorOIDC}
	b.publishOn(t, bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: "u1", Action: events.ActionRepair, IgnoreSeq: unknown, Actor: admin})
	var s projections.Execution
	waitHistory(t, b.js, "deploy", "u1", "cancelled", func(evs []events.Event) bool {
		s = projections.FoldQuarantined("u1", evs)
		return s.Status == projections.StatusCancelled
	})
	require.Equal(t, []uint64{unknown}, s.Repairs)
	require.Nil(t, s.Damaged)
}

// TestRepairByAnotherDispatcher: dispatcher A holds x1 in its cache when
// a bad message lands in x1's history, and x1's sleep comes due while it
// is damaged: A drops the firing (and caches the damaged state).
// Dispatcher B carries out the admin's repair: the timer that came due
// fires, the sleep ends and the next step is sent. Then A, whose cache
// still says damaged, gets a command for x1: it checks the history,
// finds the repair, and carries the command out instead of rejecting it.
func TestRepairByAnotherDispatcher(t *testing.T) {
	t.Parallel()
	js, newDispatcher := napAndNoop(t)
	publishPayload(t, js, bus.SubjectStart,
		events.New("client", "", "", time.Now(), &events.StartExecution{Workflow: "wf", ExecutionID: "x1", Input: json.RawMessage(`{}`)}))
	a := newDispatcher("A")
	runUntil(t, a, func() bool { return stepIs(t, js, 0, projections.OpWaiting) })

	s := foldOf(t, js, "wf", "x1")
	ack, err := js.Publish(t.Context(), bus.ExecutionSubject("wf", "x1"), []byte("oops"),
		jetstream.WithExpectLastSequencePerSubject(s.LastSeq))
	require.NoError(t, err)
	bad := ack.Sequence
	var due time.Time
	for _, tm := range s.Timers {
		due = tm.Due
	}
	time.Sleep(time.Until(due)) // the firing is on its way while x1 is damaged
	timers := bus.PartitionTimersConsumer(partition.Of("x1", partition.DefaultCount))
	runUntil(t, a, func() bool { return consumerIdle(t, js, bus.StreamTimers, timers) })
	evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("wf", "x1"), 0)
	require.NoError(t, err)
	require.Equal(t, bad, evs[len(evs)-1].Seq, "A appended nothing: the firing was dropped")

	admin := &events.Actor{Subject: "ops-admin", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}
	publishPayload(t, js, bus.SubjectAPIAction, events.New("api", "", "", time.Now(),
		&events.ExecutionAction{ExecutionID: "x1", Action: events.ActionRepair, IgnoreSeq: bad, Actor: admin}))
	runUntil(t, newDispatcher("B"), func() bool {
		evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("wf", "x1"), 0)
		require.NoError(t, err)
		x := projections.FoldQuarantined("x1", evs)
		return len(x.Steps) == 2 && x.Steps[1].Status == projections.OpSending && taskStored(t, js, x.Steps[1].TaskID)
	})

	publishPayload(t, js, bus.SubjectAction, events.New("client", "", "", time.Now(),
		&events.ExecutionAction{ExecutionID: "x1", Action: events.ActionForceCancel}))
	runUntil(t, a, func() bool {
		evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("wf", "x1"), 0)
		require.NoError(t, err)
		return projections.FoldQuarantined("x1", evs).Status == projections.StatusCancelled
	})
	rejected, err := history.ReadStream(t.Context(), js, bus.StreamRejections, bus.RejectionsPrefix+".>", 0, 0)
	require.NoError(t, err)
	require.Empty(t, rejected, "A did not reject the command on its stale damaged state")
}

// consumerIdle reports whether a durable consumer has acknowledged every
// message of its stream.
func consumerIdle(t *testing.T, js jetstream.JetStream, stream, consumer string) bool {
	t.Helper()
	cons, err := js.Consumer(t.Context(), stream, consumer)
	if err != nil {
		return false
	}
	info, err := cons.Info(t.Context())
	require.NoError(t, err)
	caught, _, err := natstest.CaughtUp(t.Context(), js, info)
	require.NoError(t, err)
	return caught && info.Delivered.Stream > 0
}

// TestClearLockOfADamagedHolderIsRefusedWhole: a lock clear that names a
// damaged holder is refused with the code damaged before any of its
// entries is cleared (the holder's history cannot record the clearing);
// the lock stays with the holder and the waiter waits, until a repair.
func TestClearLockOfADamagedHolderIsRefusedWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: cl\nlock: stuck\nsteps:\n  - id: work\n    kind: noop\n")
	b.start(t, "cl", "h1")
	b.nextTask(t)
	b.start(t, "cl", "h2")
	lockStatus(t, b.js, "cl", "h2", "", projections.LockWaiting)
	evs := readHistory(t, b.js, "cl", "h1")
	_, err := b.js.Publish(t.Context(), bus.ExecutionSubject("cl", "h1"), []byte("oops"),
		jetstream.WithExpectLastSequencePerSubject(evs[len(evs)-1].Seq))
	require.NoError(t, err)

	clear := events.New("test-operator", "", "", time.Now(), &events.ClearLock{Lock: "stuck", Reason: "stuck",
		Entries: []events.LockEntry{{ExecutionID: "h2", Workflow: "cl", Request: 1}, {ExecutionID: "h1", Workflow: "cl", Request: 1}}})
	publishClear(t, b.js, clear)
	rej := readRejection(t, b.js, events.CommandKey(clear.Source, clear.ID))
	require.Equal(t, events.CodeDamaged, rej.Code)
	require.Contains(t, rej.Reason, `"h1"`)
	require.Zero(t, countType(readHistory(t, b.js, "cl", "h2"), events.TypeLockCleared), "h2, named first, was not cleared either")
	lockStatus(t, b.js, "cl", "h2", "", projections.LockWaiting)
}
