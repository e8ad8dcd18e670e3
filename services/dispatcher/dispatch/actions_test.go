package dispatch_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// act publishes an operator's action and returns its command key.
func (b *testBundle) act(t *testing.T, execID, action, reason string) string {
	t.Helper()
	ev := events.New("test-operator", "", "", time.Now(), &events.ExecutionAction{ExecutionID: execID, Action: action, Reason: reason})
	b.publishCommand(t, ev, ev.ID)
	return events.CommandKey(ev.Source, ev.ID)
}

func (b *testBundle) publishCommand(t *testing.T, ev events.Event, msgID string) {
	t.Helper()
	msg, err := bus.Encode(bus.SubjectAction, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(msgID))
	require.NoError(t, err)
}

func TestCancelWaitsForTheRunningStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build", "ship")
	b.start(t, "deploy", "c1")
	task := b.nextTask(t)
	b.report(t, &events.OperationStarted{TaskRef: task.task.Ref("test-agent", 1)})
	waitHistory(t, b.js, "deploy", "c1", "step started", func(evs []events.Event) bool {
		return countType(evs, events.TypeStepStarted) == 1
	})

	key := b.act(t, "c1", events.ActionCancel, "wrong version")
	s, _ := waitStatus(t, b.js, "deploy", "c1", projections.StatusCancelling)
	require.Equal(t, projections.OpStarted, s.Steps[0].Status, "the running step is left to finish")
	require.Equal(t, &projections.Cancellation{Action: "cancel", Reason: "wrong version", RequestedBy: "test-operator",
		Actor: natsClient, RequestedAt: s.Cancellation.RequestedAt}, s.Cancellation)
	require.Equal(t, []projections.ActionCommand{{Command: key, Action: "cancel", Actor: natsClient}}, s.Actions)

	t.Log("the running step's result is recorded, and no other step starts")
	b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
	s, evs := waitStatus(t, b.js, "deploy", "c1", projections.StatusCancelled)
	historytest.RequireLinear(t, evs)
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)
	require.Equal(t, projections.OpNone, s.Steps[1].Status, "ship never ran")
	require.Equal(t, 1, dispatches(evs), "build scheduled and sending in one event")
	require.Zero(t, countType(evs, events.TypeStepScheduled), "nothing else scheduled")
	require.Equal(t, events.TypeExecutionCancelled, evs[len(evs)-1].Type)
	require.Equal(t, "wrong version", s.Cancellation.Reason)
	require.False(t, s.EndedAt.IsZero())

	t.Log("the same command delivered again changes nothing; a new cancel is refused")
	again := events.New("test-operator", "", "", time.Now(), &events.ExecutionAction{ExecutionID: "c1", Action: events.ActionCancel})
	source, id, _ := strings.Cut(key, "#")
	again.Source, again.ID = source, id
	b.publishCommand(t, again, "redelivered") // past the duplicate window, as after a long outage
	waitCommandsHandled(t, b.js)
	evs2, err := history.ReadStream(t.Context(), b.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
	require.NoError(t, err)
	require.Empty(t, evs2, "a command seen again is not rejected")
	rej := readRejection(t, b.js, b.act(t, "c1", events.ActionCancel, ""))
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Contains(t, rej.Reason, "already cancelled")
	require.Len(t, readHistory(t, b.js, "deploy", "c1"), len(evs))
}

func TestCancelWithNothingRunningEndsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build", "ship")
	b.start(t, "deploy", "c2")
	task := b.nextTask(t)
	b.report(t, &events.OperationSucceeded{TaskRef: task.task.Ref("test-agent", 1)})
	second := b.nextTask(t) // ship is sent: it is running as far as the history knows
	waitHistory(t, b.js, "deploy", "c2", "ship sent", func(evs []events.Event) bool { return dispatches(evs) == 2 })

	b.act(t, "c2", events.ActionForceCancel, "stuck")
	s, evs := waitStatus(t, b.js, "deploy", "c2", projections.StatusCancelled)
	require.Equal(t, projections.OpSending, s.Steps[1].Status, "force-cancel does not wait for the running step")
	require.Equal(t, "force-cancel", s.Cancellation.Action)

	t.Log("a late result changes nothing: it is noted after the end, once")
	b.report(t, &events.OperationSucceeded{TaskRef: second.task.Ref("test-agent", 1)})
	waitResultsHandled(t, b.js)
	b.report(t, &events.OperationSucceeded{TaskRef: second.task.Ref("test-agent", 1)}) // another report of it
	waitResultsHandled(t, b.js)
	after := readHistory(t, b.js, "deploy", "c2")
	require.Len(t, after, len(evs)+1)
	noted, ok := after[len(evs)].Data.(*events.ResultAfterEnd)
	require.True(t, ok, "%T", after[len(evs)].Data)
	require.NotEmpty(t, noted.ResultID)
	noted.ResultID = ""
	require.Equal(t, events.ResultAfterEnd{ResultType: events.TypeOperationSucceeded, TaskID: second.task.TaskID,
		StepID: "ship", Attempt: 1, Agent: "test-agent"}, *noted)
	s, err := projections.Fold(after)
	require.NoError(t, err)
	require.Equal(t, projections.StatusCancelled, s.Status)
	require.Equal(t, projections.OpSending, s.Steps[1].Status, "the ended execution's step keeps its status")
	require.NotNil(t, s.Steps[1].AfterEnd)
	require.Equal(t, projections.OpSucceeded, s.Steps[1].AfterEnd.Outcome)
}

func TestForceCancelAfterCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build")
	b.start(t, "deploy", "c3")
	b.nextTask(t)
	waitHistory(t, b.js, "deploy", "c3", "build sent", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	first := b.act(t, "c3", events.ActionCancel, "first")
	waitStatus(t, b.js, "deploy", "c3", projections.StatusCancelling)

	rej := readRejection(t, b.js, b.act(t, "c3", events.ActionCancel, "again"))
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Contains(t, rej.Reason, "force-cancel")

	second := b.act(t, "c3", events.ActionForceCancel, "")
	s, _ := waitStatus(t, b.js, "deploy", "c3", projections.StatusCancelled)
	require.Equal(t, []projections.ActionCommand{{Command: first, Action: "cancel", Actor: natsClient},
		{Command: second, Action: "force-cancel", Actor: natsClient}}, s.Actions)
	require.Equal(t, "first", s.Cancellation.Reason, "the first request's reason is kept")
}

func TestActionRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	for name, tc := range map[string]struct {
		exec, action, code, reason string
	}{
		"UnknownAction":    {"c4", "pause", events.CodeInvalid, `action "pause" is not known; use one of: cancel, force-cancel, kill, resume, force-resume`},
		"UnknownExecution": {"nope", events.ActionCancel, events.CodeNotFound, `execution "nope" does not exist`},
		"InvalidID":        {"-x", events.ActionCancel, events.CodeInvalid, `execution_id "-x" is not valid`},
	} {
		t.Run(name, func(t *testing.T) {
			rej := readRejection(t, b.js, b.act(t, tc.exec, tc.action, ""))
			require.Equal(t, tc.code, rej.Code)
			require.Contains(t, rej.Reason, tc.reason)
			require.Equal(t, events.TypeExecutionAction, rej.CommandType)
		})
	}
}

// waitCommandsHandled waits until the dispatcher acknowledged every command.
func waitCommandsHandled(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitConsumerCaughtUp(t, js, bus.StreamCommands)
}

// TestActionCommandReusedForAnotherAction: a command (source and id) is
// one action; the same id carrying another action is refused, and changes
// nothing.
func TestActionCommandReusedForAnotherAction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "deploy", "build")
	b.start(t, "deploy", "c5")
	b.nextTask(t)
	waitHistory(t, b.js, "deploy", "c5", "build sent", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	key := b.act(t, "c5", events.ActionCancel, "")
	_, evs := waitStatus(t, b.js, "deploy", "c5", projections.StatusCancelling)

	source, id, _ := strings.Cut(key, "#")
	reused := events.New(source, "", "", time.Now(), &events.ExecutionAction{ExecutionID: "c5", Action: events.ActionKill})
	reused.ID = id
	b.publishCommand(t, reused, "reused-for-kill")
	rej := readRejection(t, b.js, key)
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Contains(t, rej.Reason, "already recorded as a cancel")
	require.Len(t, readHistory(t, b.js, "deploy", "c5"), len(evs))
	kills, err := history.ReadStream(t.Context(), b.js, bus.StreamKills, bus.KillSubject("c5"), 0, 0)
	require.NoError(t, err)
	require.Empty(t, kills, "no kill notice went out")
}
