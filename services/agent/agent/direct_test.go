package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// partitions is the partition count the tests' tasks say their
// dispatcher has.
const partitions = 8

// publishDirect puts a task on the default queue that says its dispatcher
// takes direct reports.
func (b *agentBundle) publishDirect(t *testing.T, execID string, step workflow.Step) *events.Task {
	t.Helper()
	return b.publishWith(t, bus.TaskSubject(step.QueueName()), execID, step, func(task *events.Task) { task.Partitions = partitions })
}

// dispatcherStandIn plays the dispatchers' side of direct reports: it
// takes every report handed straight to a holder of a partition, decodes
// it and answers it as answer says.
type dispatcherStandIn struct {
	mu  sync.Mutex
	got []handed
}

// handed is a report a stand-in took.
type handed struct {
	subject string
	ev      events.Event
}

func (d *dispatcherStandIn) reports() []handed {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]handed(nil), d.got...)
}

// standIn subscribes a stand-in on its own connection; answer (nil: none)
// answers each report.
func standIn(t *testing.T, nc *nats.Conn, answer func(nc *nats.Conn, m *nats.Msg, h handed)) *dispatcherStandIn {
	t.Helper()
	d := &dispatcherStandIn{}
	sub, err := nc.QueueSubscribe(bus.DirectPrefix+".>", bus.DirectQueueGroup, func(m *nats.Msg) {
		ev, err := bus.Decode(m.Header, m.Data)
		if err != nil {
			t.Errorf("a direct report does not decode: %v", err)
			return
		}
		h := handed{subject: m.Subject, ev: ev}
		d.mu.Lock()
		d.got = append(d.got, h)
		d.mu.Unlock()
		if answer != nil {
			answer(nc, m, h)
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return d
}

// answerWith answers a report with outcome (and the attempt header, if
// over), as a dispatcher does once it handled it.
func answerWith(t *testing.T, outcome string, over bool) func(nc *nats.Conn, m *nats.Msg, h handed) {
	return func(nc *nats.Conn, m *nats.Msg, h handed) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(bus.DirectOutcomeHeader, outcome)
		r.Header.Set(bus.DirectReportHeader, h.ev.ID)
		if over {
			r.Header.Set(bus.DirectAttemptHeader, bus.DirectAttemptOver)
		}
		if err := nc.PublishMsg(r); err != nil {
			t.Errorf("answer: %v", err)
		}
	}
}

// finals returns the final reports among evs.
func finals(evs []events.Event) []events.Event {
	var out []events.Event
	for _, ev := range evs {
		if isFinal(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// TestDirectReportRecorded: a final report about a task whose dispatcher
// takes direct reports goes straight to the holder of its execution's
// partition; once that answers that it recorded it, the agent
// acknowledges the task, and nothing is stored on the results stream.
func TestDirectReportRecorded(t *testing.T) {
	t.Parallel()
	b := setupAgent(t, nil)
	d := standIn(t, b.js.Conn(), answerWith(t, bus.DirectRecorded, false))
	task := b.publishDirect(t, "x-direct", workflow.Step{ID: "s", Kind: workflow.KindNoop})

	natstest.Eventually(t, waitFor, func() bool { return len(d.reports()) > 0 }, "a report handed straight")
	b.waitQueueEmpty(t)
	got := d.reports()
	require.Len(t, got, 1)
	require.Equal(t, bus.DirectResultSubject("default", partition.Of("x-direct", partitions), "x-direct"), got[0].subject)
	require.Equal(t, events.TypeOperationSucceeded, got[0].ev.Type)
	require.Equal(t, task.TaskID+".done.1", got[0].ev.ID, "the id it would be stored under")
	requireRef(t, task, got[0].ev.Data.(*events.OperationSucceeded).TaskRef)
	require.Empty(t, finals(readResults(t, b.js, "x-direct")), "a report recorded directly is not stored")
}

// TestDirectReportStoredWhenNotRecorded: a report that no dispatcher
// takes (none holds the partition now, or none listens) or that the
// dispatcher refuses is stored on the results stream instead, and then
// its task acknowledged.
func TestDirectReportStoredWhenNotRecorded(t *testing.T) {
	t.Parallel()
	t.Run("NoDispatcher", func(t *testing.T) {
		t.Parallel()
		b := setupAgent(t, nil)
		b.publishDirect(t, "x-alone", workflow.Step{ID: "s", Kind: workflow.KindNoop})
		require.Len(t, finals(b.waitFinal(t, "x-alone")), 1)
		b.waitQueueEmpty(t)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		b := setupAgent(t, nil)
		d := standIn(t, b.js.Conn(), answerWith(t, bus.DirectRefused, false))
		b.publishDirect(t, "x-refused", workflow.Step{ID: "s", Kind: workflow.KindNoop})
		require.Len(t, finals(b.waitFinal(t, "x-refused")), 1)
		b.waitQueueEmpty(t)
		require.Len(t, d.reports(), 1, "handed straight first")
	})
}

// TestUnansweredDirectReportsPause: a report handed straight that gets no
// answer within DirectWait is stored; and for a while after, reports are
// stored at once instead of waiting for answers that do not come (busy
// dispatchers, or credentials that do not let the agent hand them).
func TestUnansweredDirectReportsPause(t *testing.T) {
	t.Parallel()
	b := setupAgentWith(t, agent.Config{DirectWait: 200 * time.Millisecond})
	d := standIn(t, b.js.Conn(), nil)
	b.publishDirect(t, "x-first", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	require.Len(t, finals(b.waitFinal(t, "x-first")), 1)
	b.publishDirect(t, "x-second", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	require.Len(t, finals(b.waitFinal(t, "x-second")), 1)
	b.waitQueueEmpty(t)
	got := d.reports()
	require.Len(t, got, 1, "only the first report was handed straight")
	require.Equal(t, "x-first", got[0].ev.Subject)
}

// TestRedeliveredTaskAsksWhetherItsAttemptIsOver: a task delivered again
// whose report no earlier delivery stored may still have been reported
// straight to the dispatcher, recorded, and left unacknowledged (its agent
// died between the answer and its acknowledgement). The agent asks with
// the operation's started report: when the dispatcher answers that the
// attempt is over, the task is acknowledged without running; when it is
// in flight, the operation runs; when nobody answers, the agent asks
// again (a partition moving), and only an agent that never had an answer
// (its credentials may not let it ask) runs it after a while.
func TestRedeliveredTaskAsksWhetherItsAttemptIsOver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		answer func(t *testing.T) func(nc *nats.Conn, m *nats.Msg, h handed)
		runs   int
		wait   time.Duration
	}{
		{"Over", func(t *testing.T) func(*nats.Conn, *nats.Msg, handed) { return answerWith(t, bus.DirectRecorded, true) }, 0, 2 * time.Second},
		{"InFlight", func(t *testing.T) func(*nats.Conn, *nats.Msg, handed) {
			return answerWith(t, bus.DirectRecorded, false)
		}, 1, 2 * time.Second},
		// An agent that never had an answer asks for 3 s (askFor), then runs it.
		{"NeverAnswered", nil, 1, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, js := natstest.Connect(t, natstest.RunJetStream(t))
			b := &agentBundle{js: js}
			var d *dispatcherStandIn
			if c.answer != nil {
				d = standIn(t, js.Conn(), c.answer(t))
			}
			task := b.publishDirect(t, "x-again", workflow.Step{ID: "s", Kind: "count"})
			takeWithoutAck(t, js, 1)
			var mu sync.Mutex
			var runs []int
			a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, DirectWait: c.wait,
				Handlers: map[string]operation.Handler{
					"count": operation.HandlerFunc(func(_ context.Context, tk operation.Task) (any, error) {
						mu.Lock()
						defer mu.Unlock()
						runs = append(runs, tk.Delivery)
						return nil, nil
					}),
				}}, js, zerolog.New(zerolog.NewTestWriter(t)))
			require.NoError(t, err)
			natstest.Serve(t, a.Run)
			b.waitQueueEmpty(t)
			mu.Lock()
			require.Len(t, runs, c.runs)
			mu.Unlock()
			if d == nil {
				return
			}
			got := d.reports()
			require.NotEmpty(t, got)
			started, ok := got[0].ev.Data.(*events.OperationStarted)
			require.True(t, ok, "the first report is the started one: %s", got[0].ev.Type)
			require.Equal(t, 2, started.Delivery)
			require.Equal(t, task.TaskID, started.TaskID)
		})
	}
}

// TestLateAnswerIsIgnored: an answer that comes after the agent stopped
// waiting for it (it stored the report meanwhile) is taken for nothing:
// the report was stored, the task acknowledged, and the answer settles no
// report a second time (a second settling would panic on the agent's
// count of reports being settled, or acknowledge the task twice).
func TestLateAnswerIsIgnored(t *testing.T) {
	t.Parallel()
	b := setupAgentWith(t, agent.Config{DirectWait: 100 * time.Millisecond})
	answer := answerWith(t, bus.DirectRecorded, false)
	answered := make(chan struct{})
	d := standIn(t, b.js.Conn(), func(nc *nats.Conn, m *nats.Msg, h handed) {
		go func() {
			time.Sleep(time.Second) // long after the agent's wait
			answer(nc, m, h)
			_ = nc.Flush()
			close(answered)
		}()
	})
	b.publishDirect(t, "x-late", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	require.Len(t, finals(b.waitFinal(t, "x-late")), 1)
	b.waitQueueEmpty(t)
	<-answered
	time.Sleep(200 * time.Millisecond) // for the agent to take the late answer
	require.Len(t, d.reports(), 1)
	require.Len(t, finals(readResults(t, b.js, "x-late")), 1, "stored once")
}

// TestAgentStopsWithReportsWaiting: an agent that stops while reports
// wait for their answers settles them first: not answered within its
// wait, they are stored, and their tasks acknowledged, before Run
// returns.
func TestAgentStopsWithReportsWaiting(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &agentBundle{js: js}
	d := standIn(t, js.Conn(), nil) // takes the reports, never answers
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, DirectWait: 500 * time.Millisecond},
		js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	b.publishDirect(t, "x-stopping", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	natstest.Eventually(t, waitFor, func() bool { return len(d.reports()) == 1 }, "the report handed straight")
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the agent did not stop")
	}
	require.Len(t, finals(readResults(t, js, "x-stopping")), 1, "stored before Run returned")
	b.waitQueueEmpty(t)
}

// TestAnAnswerForAnotherReportIsNotTaken: an answer that says recorded
// is taken only for the report it names (anyone who knows an agent's
// answer subject could make one up): the report is stored instead.
func TestAnAnswerForAnotherReportIsNotTaken(t *testing.T) {
	t.Parallel()
	b := setupAgentWith(t, agent.Config{DirectWait: 300 * time.Millisecond})
	d := standIn(t, b.js.Conn(), func(nc *nats.Conn, m *nats.Msg, h handed) {
		h.ev.ID = "some-other-report"
		answerWith(t, bus.DirectRecorded, false)(nc, m, h)
	})
	b.publishDirect(t, "x-other", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	require.Len(t, finals(b.waitFinal(t, "x-other")), 1, "stored: the answer was not its own")
	b.waitQueueEmpty(t)
	require.Len(t, d.reports(), 1)
}
