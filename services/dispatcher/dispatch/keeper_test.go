package dispatch_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestAKeeperIsStoredAheadOfATaskAndExpires: the first task a dispatcher
// publishes has a keeper stored just ahead of it, on a subject no agent
// takes, with a TTL; once no task follows, the keepers expire and the
// tasks stream empties (docs/benchmarks.md, "Keepers").
func TestAKeeperIsStoredAheadOfATaskAndExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Read as they are stored (a consumer waiting before the start; it
	// never acknowledges, which would remove them): a keeper read later
	// might have expired on a loaded machine.
	keepers := make(chan jetstream.Msg, 16)
	watch, err := b.js.CreateConsumer(t.Context(), bus.StreamTasks, jetstream.ConsumerConfig{
		FilterSubject: bus.TasksKeeperSubject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
	require.NoError(t, err)
	cc, err := watch.Consume(func(m jetstream.Msg) { keepers <- m })
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	runDispatcher(t, b.js, dispatch.Config{Source: "d1", Workers: 2})
	b.register(t, "kept", "a", "b")
	b.start(t, "kept", "kept-1")

	first := b.nextTask(t) // the test's agent takes both lanes of the queue: never a keeper
	var keeper jetstream.Msg
	select {
	case keeper = <-keepers:
	case <-time.After(waitFor):
		t.Fatal("no keeper was published with the first task")
	}
	md, err := keeper.Metadata()
	require.NoError(t, err)
	require.Less(t, md.Sequence.Stream, first.seq, "stored ahead of the task")
	require.Empty(t, keeper.Data())
	require.NotEmpty(t, keeper.Headers().Get("Nats-TTL"), "it expires by itself")
	tasks, err := b.js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)

	b.report(t, &events.OperationSucceeded{TaskRef: first.ref("agent", 1)})
	second := b.nextTask(t)
	require.Equal(t, "b", second.task.StepID)
	b.report(t, &events.OperationSucceeded{TaskRef: second.ref("agent", 1)})

	// Nothing is published any more: the keepers expire (5 s), and the
	// stream, whose tasks were all taken, holds nothing.
	natstest.Eventually(t, 30*time.Second, func() bool {
		info, err := tasks.Info(t.Context())
		return err == nil && info.State.Msgs == 0
	}, "the keepers expire and the tasks stream empties")
	_, err = tasks.GetLastMsgForSubject(t.Context(), bus.TasksKeeperSubject)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
}
