package events_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

func TestActorCheck(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name  string
		actor events.Actor
		err   string
	}{
		{"APIKey", events.Actor{Subject: "ci-bot", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}, ""},
		{"OIDC", events.Actor{Subject: "alice@example.com", Method: events.ActorOIDC}, ""},
		{"NATS", events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"None", events.Actor{Subject: "anonymous", Method: events.ActorNone}, ""},
		{"UnknownMethod", events.Actor{Subject: "x", Method: "password"}, `method "password"`},
		{"NoSubject", events.Actor{Method: events.ActorOIDC}, "subject must be"},
		{"LongSubject", events.Actor{Subject: strings.Repeat("a", events.MaxActorSubject+1), Method: events.ActorOIDC}, "subject must be"},
		{"TwoLines", events.Actor{Subject: "a\nb", Method: events.ActorOIDC}, "subject must be"},
		{"LongKeyID", events.Actor{Subject: "a", Method: events.ActorAPIKey, KeyID: strings.Repeat("k", 65)}, "key_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.actor.Check()
			if tt.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestCommandActor(t *testing.T) {
	t.Parallel()

	a := &events.Actor{Subject: "alice", Method: events.ActorOIDC}
	for _, p := range []events.Payload{&events.StartExecution{}, &events.SignalExecution{}, &events.ExecutionAction{}, &events.ClearLock{}} {
		require.Nil(t, events.CommandActor(p))
		require.True(t, events.SetCommandActor(p, a), "%T", p)
		require.Same(t, a, events.CommandActor(p))
	}
	for _, p := range []events.Payload{&events.ReconcileExecution{}, &events.ExpireExecution{}, &events.ExecutionStarted{}} {
		require.False(t, events.SetCommandActor(p, a), "%T", p)
		require.Nil(t, events.CommandActor(p))
	}
	require.Equal(t, "alice (oidc)", a.String())
	require.Equal(t, "k (api-key 01)", (&events.Actor{Subject: "k", Method: events.ActorAPIKey, KeyID: "01"}).String())
	require.Empty(t, (*events.Actor)(nil).String())
}
