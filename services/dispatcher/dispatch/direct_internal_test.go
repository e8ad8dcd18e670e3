package dispatch

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

// TestDirectReportOfABusyExecutionIsRefusedAtOnce: a report handed
// straight to the dispatcher about an execution with directBacklog
// messages waiting for their turn is refused at once (its agent stores
// it), instead of waiting behind them while its agent waits for the
// answer; another execution's report is handed to the workers.
func TestDirectReportOfABusyExecutionIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	d := &Dispatcher{js: js}
	work := newTurns()
	d.work.Store(work)
	for i := range directBacklog + 1 { // one handled, directBacklog waiting
		require.True(t, work.add(job{key: "busy", ev: events.Event{ID: string(rune('a' + i%26))}}))
	}
	_, ok := work.next()
	require.True(t, ok)
	require.Equal(t, directBacklog, work.backlog("busy"))

	handed := make(chan jetstream.Msg, 4)
	sub, err := d.listenDirect(3, &consuming{part: 3}, func(m jetstream.Msg, _ *consuming) { handed <- m })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	answers := bus.AnswersPrefix + "." + nc.NewInbox()
	sub2, err := nc.SubscribeSync(answers + ".*")
	require.NoError(t, err)
	ask := func(subject, n string) *nats.Msg {
		t.Helper()
		require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: subject, Reply: answers + "." + n, Data: []byte("{}")}))
		answer, err := sub2.NextMsg(5 * time.Second)
		require.NoError(t, err)
		return answer
	}
	answer := ask(bus.DirectResultSubject("default", 3, "busy"), "1")
	require.Equal(t, bus.DirectRefused, answer.Header.Get(bus.DirectOutcomeHeader))
	require.Contains(t, string(answer.Data), "store the report")
	require.Empty(t, handed, "not handed to the workers")

	go func() {
		m := <-handed
		_ = m.Nak() // as process does when the partition moved on
	}()
	answer = ask(bus.DirectResultSubject("default", 3, "quiet"), "2")
	require.Equal(t, bus.DirectRefused, answer.Header.Get(bus.DirectOutcomeHeader), "a Nak refuses")
	require.Equal(t, "not handled here now", string(answer.Data))

	// A report whose reply subject is not an answer subject is not taken.
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: bus.DirectResultSubject("default", 3, "quiet"), Reply: nc.NewInbox(), Data: []byte("{}")}))
	require.NoError(t, nc.Flush())
	answer = ask(bus.DirectResultSubject("default", 3, "busy"), "3") // after it: the subscription's order
	require.Equal(t, bus.DirectRefused, answer.Header.Get(bus.DirectOutcomeHeader))
	require.Empty(t, handed, "the report without an answer subject was not handed to the workers")
}
