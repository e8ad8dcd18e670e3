package dispatch_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

// handDirect hands report p straight to the holder of its execution's
// partition, with the task acknowledgement subject ack ("" for none), and
// returns the answer.
func handDirect(t *testing.T, nc *nats.Conn, p events.Payload, ack string) *nats.Msg {
	t.Helper()
	ref, _ := events.ResultRef(p)
	ev := events.New("test-agent", ref.ExecutionID, ref.Workflow, time.Now(), p)
	msg, err := bus.Encode(bus.DirectResultSubject(ref.Queue, partition.Of(ref.ExecutionID, partition.DefaultCount), ref.ExecutionID), ev)
	require.NoError(t, err)
	if ack != "" {
		msg.Header.Set(bus.DirectTaskAckHeader, ack)
	}
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
// stored on the results stream would be, acknowledges the task a final
// report names (only a delivery to a consumer of the report's queue) and
// answers. Every task it sends says it takes them. To the started report
// of a task delivered again it answers whether the task's attempt is
// over.
func TestDirectReports(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	nc := b.connect().Conn()
	// The queue's own agents' consumer: its deliveries' acknowledgement
	// subjects name it.
	const queue = "q2"
	cons, err := b.js.CreateOrUpdateConsumer(t.Context(), bus.StreamTasks, jetstream.ConsumerConfig{
		Durable: bus.AgentConsumer(queue), FilterSubject: bus.TaskSubject(queue), AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	require.NoError(t, err)
	take := func() (*events.Task, jetstream.Msg) {
		t.Helper()
		m, err := cons.Next(jetstream.FetchMaxWait(waitFor))
		require.NoError(t, err)
		ev, err := bus.Decode(m.Headers(), m.Data())
		require.NoError(t, err)
		task, ok := ev.Data.(*events.Task)
		require.True(t, ok)
		return task, m
	}
	def := workflow.Definition{Name: "direct", Steps: []workflow.Step{
		{ID: "one", Kind: workflow.KindNoop, Queue: queue}, {ID: "two", Kind: workflow.KindNoop, Queue: queue}}}
	_, _, err = b.defs.Apply(t.Context(), def)
	require.NoError(t, err)
	b.start(t, "direct", "x-direct")

	task, m := take()
	require.Equal(t, partition.DefaultCount, task.Partitions, "the task says its dispatcher takes direct reports")
	md, err := m.Metadata()
	require.NoError(t, err)
	ref := task.Ref("test-agent", 1)
	ref.TaskSeq, ref.StoredAt = md.Sequence.Stream, md.Timestamp.UTC()

	t.Log("a final report naming another queue's consumer is refused, and its task left where it is")
	foreign := "$JS.ACK." + bus.StreamTasks + "." + bus.AgentConsumer("default") + ".1." + strconv.FormatUint(md.Sequence.Stream, 10) + ".1.1700000000000000000.0"
	a := handDirect(t, nc, &events.OperationSucceeded{TaskRef: ref}, foreign)
	require.Equal(t, bus.DirectRefused, a.Header.Get(bus.DirectOutcomeHeader), "%s", a.Data)
	require.Contains(t, string(a.Data), "not one of queue")
	require.True(t, taskStored(t, b.js, task.TaskID), "the task is still in its queue")

	t.Log("the success, handed straight with its delivery's acknowledgement subject, is recorded and its task acknowledged")
	a = handDirect(t, nc, &events.OperationSucceeded{TaskRef: ref}, m.Reply())
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader), "%s", a.Data)
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader))
	require.False(t, taskStored(t, b.js, task.TaskID), "acknowledged by the dispatcher before it answered")
	waitHistory(t, b.js, "direct", "x-direct", "one succeeded", func(evs []events.Event) bool {
		return countType(evs, events.TypeStepSucceeded) == 1
	})

	t.Log("a started report of a task delivered again: in flight, then over")
	second, _ := take()
	require.Equal(t, "two", second.StepID)
	ref2 := second.Ref("test-agent", 2)
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: ref2, StartedAt: time.Now().UTC()}, "")
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Empty(t, a.Header.Get(bus.DirectAttemptHeader), "two is still in flight")
	a = handDirect(t, nc, &events.OperationSucceeded{TaskRef: ref2}, "")
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	ref2.Delivery = 3
	a = handDirect(t, nc, &events.OperationStarted{TaskRef: ref2, StartedAt: time.Now().UTC()}, "")
	require.Equal(t, bus.DirectRecorded, a.Header.Get(bus.DirectOutcomeHeader))
	require.Equal(t, bus.DirectAttemptOver, a.Header.Get(bus.DirectAttemptHeader), "two's attempt is over")

	_, evs := waitStatus(t, b.js, "direct", "x-direct", projections.StatusSucceeded)
	require.Equal(t, 2, countType(evs, events.TypeStepSucceeded), "each success recorded once")
	require.Equal(t, 1, countType(evs, events.TypeStepStarted), "the start of two's second delivery")
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
