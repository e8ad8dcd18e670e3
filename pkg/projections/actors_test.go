package projections_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestActorsAreFolded: who started an execution, signalled it, acted on
// it and cleared its locks, as authenticated, is in the read model.
func TestActorsAreFolded(t *testing.T) {
	t.Parallel()

	alice := &events.Actor{Subject: "alice", Method: events.ActorOIDC}
	bot := &events.Actor{Subject: "ci-bot", Method: events.ActorAPIKey, KeyID: "k1"}
	start := started("a")
	start.Data.(*events.ExecutionStarted).Actor = alice
	start.Data.(*events.ExecutionStarted).StartedBy = "alice"
	s, err := projections.Fold([]events.Event{
		start,
		at(1, &events.SignalReceived{SignalID: "s1", Name: "go", Actor: bot}),
		at(2, &events.LockRequested{Lock: "db", Limit: 1}),
		at(3, &events.LockCleared{ActionRecord: events.ActionRecord{Action: "clear-lock", Actor: bot, RequestedBy: "a remark"}, Lock: "db"}),
		at(4, &events.ExecutionCancelling{ActionRecord: events.ActionRecord{Action: events.ActionCancel, Command: "api#1", Actor: bot}}),
	})
	require.NoError(t, err)
	require.Equal(t, "alice", s.StartedBy)
	require.Equal(t, alice, s.StartedByActor)
	require.Equal(t, bot, s.Signals[0].Actor)
	l, _ := s.LockAt("")
	require.Equal(t, bot, l.ClearedByActor)
	require.Equal(t, "a remark", l.ClearedBy)
	require.Equal(t, bot, s.Cancellation.Actor)
	require.Equal(t, []projections.ActionCommand{{Command: "api#1", Action: events.ActionCancel, Actor: bot}}, s.Actions)
}
