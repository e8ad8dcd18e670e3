package dispatch_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// natsClient is the actor of a command published on a client subject.
var natsClient = &events.Actor{Subject: "client", Method: events.ActorNATS}

// publishOn publishes a command on subject and returns its command key.
func (b *testBundle) publishOn(t *testing.T, subject string, p events.Payload) string {
	t.Helper()
	ev := events.New("test-publisher", "", "", time.Now(), p)
	msg, err := bus.Encode(subject, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	return events.CommandKey(ev.Source, ev.ID)
}

// TestActorsAreTheAPIsOnly: a command on the api's subjects is recorded
// with the actor it carries; one published on a client subject is
// recorded as from the client role, and rejected if it names an actor
// (anyone with the client identity could write any name there).
func TestActorsAreTheAPIsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "gated", "build")
	alice := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}

	t.Log("a start from the api records its actor as who started it")
	b.publishOn(t, bus.SubjectAPIStart, &events.StartExecution{Workflow: "gated", ExecutionID: "a1", Actor: alice})
	evs := waitHistory(t, b.js, "gated", "a1", "started", func(evs []events.Event) bool { return len(evs) > 0 })
	started := evs[0].Data.(*events.ExecutionStarted)
	require.Equal(t, alice, started.Actor)
	require.Equal(t, "alice", started.StartedBy)

	t.Log("a start on jf.commands.start is the client role's")
	b.publishOn(t, bus.SubjectStart, &events.StartExecution{Workflow: "gated", ExecutionID: "n1"})
	evs = waitHistory(t, b.js, "gated", "n1", "started", func(evs []events.Event) bool { return len(evs) > 0 })
	require.Equal(t, natsClient, evs[0].Data.(*events.ExecutionStarted).Actor)
	require.Equal(t, "client", evs[0].Data.(*events.ExecutionStarted).StartedBy)

	t.Log("a signal from the api records its actor")
	b.publishOn(t, bus.SubjectAPISignal, &events.SignalExecution{ExecutionID: "a1", Name: "go", Actor: alice})
	evs = waitHistory(t, b.js, "gated", "a1", "signal", func(evs []events.Event) bool { return countType(evs, events.TypeSignalReceived) == 1 })
	for _, ev := range evs {
		if sig, ok := ev.Data.(*events.SignalReceived); ok {
			require.Equal(t, alice, sig.Actor)
			require.Equal(t, "test-publisher", sig.Sender)
		}
	}

	t.Log("an action with a forged actor on jf.commands.action is rejected and changes nothing")
	before := len(readHistory(t, b.js, "gated", "a1"))
	forged := b.publishOn(t, bus.SubjectAction, &events.ExecutionAction{ExecutionID: "a1", Action: events.ActionCancel,
		Actor: &events.Actor{Subject: "root", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}})
	rej := readRejection(t, b.js, forged)
	require.Equal(t, events.CodeInvalid, rej.Code)
	require.Contains(t, rej.Reason, "actor is set by the api")
	require.Equal(t, bus.SubjectAction, rej.Subject)
	waitCommandsHandled(t, b.js)
	require.Len(t, readHistory(t, b.js, "gated", "a1"), before)

	t.Log("a command on an api subject without its actor is rejected too")
	bare := b.publishOn(t, bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: "a1", Action: events.ActionCancel})
	rej = readRejection(t, b.js, bare)
	require.Equal(t, events.CodeInvalid, rej.Code)
	require.Contains(t, rej.Reason, "carries the actor the api authenticated")
	bad := b.publishOn(t, bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: "a1", Action: events.ActionCancel,
		Actor: &events.Actor{Subject: "x", Method: "password"}})
	require.Contains(t, readRejection(t, b.js, bad).Reason, `method "password"`)

	t.Log("the api's action records its actor; a client's is the client role's")
	b.publishOn(t, bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: "a1", Action: events.ActionCancel,
		RequestedBy: "a remark", Actor: alice})
	s, _ := waitStatus(t, b.js, "gated", "a1", projections.StatusCancelling)
	require.Equal(t, alice, s.Cancellation.Actor)
	require.Equal(t, "a remark", s.Cancellation.RequestedBy, "requested_by stays, as a remark")
	b.publishOn(t, bus.SubjectAction, &events.ExecutionAction{ExecutionID: "n1", Action: events.ActionCancel})
	s, _ = waitStatus(t, b.js, "gated", "n1", projections.StatusCancelling)
	require.Equal(t, natsClient, s.Cancellation.Actor)
	require.Equal(t, "test-publisher", s.Cancellation.RequestedBy)
}
