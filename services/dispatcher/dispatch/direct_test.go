package dispatch_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// directReport is report p, handed straight to the holder of its
// execution's partition, answered on an agent's answer subject.
func directReport(t *testing.T, p events.Payload) *nats.Msg {
	t.Helper()
	ref, _ := events.ResultRef(p)
	ev := events.New("test-agent", ref.ExecutionID, ref.Workflow, time.Now(), p)
	msg, err := bus.Encode(bus.DirectResultSubject(ref.Queue, partition.Of(ref.ExecutionID, partition.DefaultCount), ref.ExecutionID), ev)
	require.NoError(t, err)
	return msg
}

// handDirect hands report p straight to the holder of its execution's
// partition and returns the answer.
func handDirect(t *testing.T, nc *nats.Conn, p events.Payload) *nats.Msg {
	t.Helper()
	answers := bus.AnswersPrefix + "." + nc.NewInbox()
	sub, err := nc.SubscribeSync(answers + ".*")
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	msg := directReport(t, p)
	// Until the dispatcher holds the partition, nobody answers ("no
	// responders"); the report is handed again.
	deadline := time.Now().Add(waitFor)
	for i := 0; time.Now().Before(deadline); i++ {
		msg.Reply = answers + "." + strconv.Itoa(i)
		require.NoError(t, nc.PublishMsg(msg))
		answer, err := sub.NextMsg(5 * time.Second)
		if errors.Is(err, nats.ErrNoResponders) { // how a sync subscription takes "no responders"
			time.Sleep(50 * time.Millisecond)
			continue
		}
		require.NoError(t, err, "no answer to a direct report")
		require.Equal(t, msg.Reply, answer.Subject)
		return answer
	}
	t.Fatal("no dispatcher took a direct report")
	return nil
}

// TestDirectReports: the dispatcher takes the reports agents hand straight
// to the holder of their execution's partition, records them as reports
// stored on the results stream would be, and answers. Every task it sends
// says it takes them. To the started report of a task delivered again it
// answers whether the task's attempt is over.
func TestDirectReports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	nc := b.connect().Conn()
	b.register(t, "direct", "one", "two")
	b.start(t, "direct", "x-direct")

	first := b.nextTask(t)
	require.Equal(t, partition.DefaultCount, first.task.Partitions, "the task says its dispatcher takes direct reports")

	t.Log("the success, handed straight, is recorded before the answer")
	a := handDirect(t, nc, &events.OperationSucceeded{TaskRef: first.ref("test-agent", 1)})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader), "%s", a.Data)
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader))
	evs := readHistory(t, b.js, "direct", "x-direct")
	require.Equal(t, 1, countType(evs, events.TypeStepSucceeded), "recorded before the answer: %v", typesOf(evs))

	t.Log("a started report of a task delivered again: in flight, then over")
	second := b.nextTask(t)
	require.Equal(t, "two", second.task.StepID)
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: second.ref("test-agent", 2), StartedAt: time.Now().UTC()})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader), "two is still in flight")

	t.Log("a report about another queue's step, on that queue's subject, is recorded as ignored")
	foreign := second.ref("rogue", 1)
	foreign.Queue = "gpu"
	a = handDirect(t, nc, &events.OperationFailed{TaskRef: foreign, Error: "forged"})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))

	a = handDirect(t, nc, &events.OperationSucceeded{TaskRef: second.ref("test-agent", 2)})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: second.ref("test-agent", 3), StartedAt: time.Now().UTC()})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Equal(t, bus.DirectAttemptOver, a.Header.Get(bus.DirectAttemptHeader), "two's attempt is over")

	_, evs = waitStatus(t, b.js, "direct", "x-direct", projections.StatusSucceeded)
	require.Equal(t, 2, countType(evs, events.TypeStepSucceeded), "each success recorded once")
	require.Equal(t, 1, countType(evs, events.TypeStepStarted), "the start of two's second delivery")
	require.Zero(t, countType(evs, events.TypeStepFailed))
	require.Equal(t, 1, countType(evs, events.TypeResultIgnored), "the foreign report")
}

// TestDirectReportOfAnEndedExecutionIsStored: a report that comes while
// its execution is not running (here force-cancelled with the step in
// flight) is refused, for its agent to store: a resume finds it on the
// results stream, and the execution goes on from it.
func TestDirectReportOfAnEndedExecutionIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	nc := b.connect().Conn()
	b.register(t, "ended", "one", "two")
	b.start(t, "ended", "x-ended")
	first := b.nextTask(t)
	b.act(t, "x-ended", events.ActionForceCancel, "")
	waitStatus(t, b.js, "ended", "x-ended", projections.StatusCancelled)

	success := &events.OperationSucceeded{TaskRef: first.ref("test-agent", 1)}
	a := handDirect(t, nc, success)
	require.Equal(t, bus.DirectRefused, a.Header.Get(bus.DirectOutcomeHeader))
	require.Contains(t, string(a.Data), "has ended")
	t.Log("a started report of a task delivered again: the attempt is not over, a resume waits for its report")
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: first.ref("test-agent", 2), StartedAt: time.Now().UTC()})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader))

	b.report(t, success) // as the agent does, refused
	b.act(t, "x-ended", events.ActionResume, "")
	second := b.nextTask(t)
	require.Equal(t, "two", second.task.StepID, "one's stored report was found by the resume")
	b.report(t, &events.OperationSucceeded{TaskRef: second.ref("test-agent", 1)})
	_, evs := waitStatus(t, b.js, "ended", "x-ended", projections.StatusSucceeded)
	require.Equal(t, 2, countType(evs, events.TypeStepSucceeded))
}

// TestDirectReportAnsweredOnlyOnAnswerSubjects: a report whose reply
// subject is not an agent's answer subject (the reply subject is its
// sender's to choose) is neither answered nor handled: the dispatcher
// publishes nowhere else.
func TestDirectReportAnsweredOnlyOnAnswerSubjects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	nc := b.connect().Conn()
	b.register(t, "elsewhere", "one")
	b.start(t, "elsewhere", "x-elsewhere")
	task := b.nextTask(t)
	handDirect(t, nc, &events.OperationStarted{TaskRef: task.ref("test-agent", 1), StartedAt: time.Now().UTC()}) // it holds the partition

	elsewhere := nc.NewInbox()
	sub, err := nc.SubscribeSync(elsewhere)
	require.NoError(t, err)
	msg := directReport(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1)})
	msg.Reply = elsewhere
	require.NoError(t, nc.PublishMsg(msg))
	_, err = sub.NextMsg(time.Second)
	require.ErrorIs(t, err, nats.ErrTimeout, "answered outside the answer subjects")
	a := handDirect(t, nc, &events.OperationStarted{TaskRef: task.ref("test-agent", 2), StartedAt: time.Now().UTC()})
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader), "the success was not handled: the attempt is in flight")
	s, _ := waitStatus(t, b.js, "elsewhere", "x-elsewhere", projections.StatusStarted)
	require.Equal(t, projections.OpStarted, s.Steps[0].Status)
}

// TestNoDirectReports: a dispatcher set not to take direct reports says
// so in its tasks (no partitions: their agents store every report).
func TestNoDirectReports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4, NoDirectReports: true})
	b.register(t, "stored", "one")
	b.start(t, "stored", "x-stored")
	task := b.nextTask(t)
	require.Zero(t, task.task.Partitions)
	b.report(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1)})
	waitStatus(t, b.js, "stored", "x-stored", projections.StatusSucceeded)
}
