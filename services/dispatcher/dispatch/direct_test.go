package dispatch_test

import (
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

// handDirect hands report p straight to the holder of its execution's
// partition and returns the answer.
func handDirect(t *testing.T, nc *nats.Conn, p events.Payload) *nats.Msg {
	t.Helper()
	ref, _ := events.ResultRef(p)
	ev := events.New("test-agent", ref.ExecutionID, ref.Workflow, time.Now(), p)
	msg, err := bus.Encode(bus.DirectResultSubject(ref.Queue, partition.Of(ref.ExecutionID, partition.DefaultCount), ref.ExecutionID), ev)
	require.NoError(t, err)
	var answer *nats.Msg
	// Until the dispatcher holds the partition, nobody answers.
	require.Eventually(t, func() bool {
		answer, err = nc.RequestMsg(msg, 5*time.Second)
		return err == nil
	}, waitFor, 50*time.Millisecond, "an answer to a direct report: %v", err)
	return answer
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
	a = handDirect(t, nc, &events.OperationSucceeded{TaskRef: second.ref("test-agent", 2)})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: second.ref("test-agent", 3), StartedAt: time.Now().UTC()})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Equal(t, bus.DirectAttemptOver, a.Header.Get(bus.DirectAttemptHeader), "two's attempt is over")

	t.Log("a report about another queue's step, on that queue's subject, is recorded as ignored")
	foreign := second.ref("rogue", 1)
	foreign.Queue = "gpu"
	a = handDirect(t, nc, &events.OperationFailed{TaskRef: foreign, Error: "forged"})
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))

	_, evs = waitStatus(t, b.js, "direct", "x-direct", projections.StatusSucceeded)
	require.Equal(t, 2, countType(evs, events.TypeStepSucceeded), "each success recorded once")
	require.Equal(t, 1, countType(evs, events.TypeStepStarted), "the start of two's second delivery")
	require.Zero(t, countType(evs, events.TypeStepFailed))
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
