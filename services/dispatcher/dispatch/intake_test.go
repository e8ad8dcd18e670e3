package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

// TestCommandActor: the api's subjects must carry an actor; every other
// command subject must not, and is attributed to the role that may
// publish there.
func TestCommandActor(t *testing.T) {
	t.Parallel()

	alice := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "k1"}
	for _, tt := range []struct {
		name    string
		subject string
		payload events.Payload
		want    *events.Actor
		why     string
	}{
		{"APIStart", events.SubjectAPIStart, &events.StartExecution{Actor: alice}, alice, ""},
		{"APISignal", events.SubjectAPISignal, &events.SignalExecution{Actor: alice}, alice, ""},
		{"APIAction", events.SubjectAPIAction, &events.ExecutionAction{Actor: alice}, alice, ""},
		{"APIClearLock", events.SubjectAPIClearLock, &events.ClearLock{Actor: alice}, alice, ""},
		{"APIWithoutActor", events.SubjectAPIAction, &events.ExecutionAction{}, nil, "carries the actor the api authenticated"},
		{"APIWithBadActor", events.SubjectAPIAction, &events.ExecutionAction{Actor: &events.Actor{Method: events.ActorOIDC}}, nil, "subject must be"},
		{"ClientStart", events.SubjectStart, &events.StartExecution{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"ClientSignal", events.SubjectSignal, &events.SignalExecution{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"ClientAction", events.SubjectAction, &events.ExecutionAction{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"JanitorClearLock", events.SubjectClearLock, &events.ClearLock{}, &events.Actor{Subject: "janitor", Method: events.ActorNATS}, ""},
		{"ForgedOnAction", events.SubjectAction, &events.ExecutionAction{Actor: alice}, nil, "actor is set by the api"},
		{"ForgedOnStart", events.SubjectStart, &events.StartExecution{Actor: alice}, nil, "actor is set by the api"},
		{"ForgedOnClearLock", events.SubjectClearLock, &events.ClearLock{Actor: alice}, nil, "actor is set by the api"},
		{"Reconcile", events.SubjectReconcile, &events.ReconcileExecution{}, nil, ""},
		{"Expire", events.SubjectExpire, &events.ExpireExecution{}, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, why := commandActor(tt.subject, tt.payload)
			if tt.why != "" {
				require.Contains(t, why, tt.why)
				require.Nil(t, got)
				return
			}
			require.Empty(t, why)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestMisroutedNamesTheClientSubject: a command on the wrong subject is
// told the client's subject for its type, whatever the map's order.
func TestMisroutedNamesTheClientSubject(t *testing.T) {
	t.Parallel()
	for range 20 {
		why := misrouted(events.SubjectSignal, events.Event{Type: events.TypeStartExecution}, 16, nil)
		require.Contains(t, why, "publish it on "+events.SubjectStart)
	}
	require.Empty(t, misrouted(events.SubjectAPIStart, events.Event{Type: events.TypeStartExecution}, 16, nil))
	require.Contains(t, misrouted(events.SubjectAPISignal, events.Event{Type: events.TypeStartExecution}, 16, nil), "takes "+string(events.TypeSignalExecution))
}
