package e2e

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// lockedBuffer is a log sink every service of a stack may write to at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestOperatorEventsRecordTheAuthenticatedActor: over HTTP, each key does
// what its scope allows, and the history records who did it as
// authenticated (the key's name, api-key, its id), whatever requested_by
// says; a client that names an actor on NATS is rejected; and no token
// is in the services' log (at debug level), the events or the commands.
func TestOperatorEventsRecordTheAuthenticatedActor(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	s := startStack(t, func(c *devstack.Config) {
		c.Log = zerolog.New(io.MultiWriter(logs, zerolog.NewTestWriter(t))).Level(zerolog.DebugLevel)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.apply(t, gated)
	tokens := []string{s.info.AdminToken}
	keyClient := func(name string, scopes ...string) (*client.Client, string) {
		k, err := s.c.CreateKey(ctx, client.KeyRequest{Name: name, Scopes: scopes, Namespaces: []string{"default"}})
		require.NoError(t, err)
		tokens = append(tokens, k.Token)
		return client.New(s.info.APIURL, client.WithToken(k.Token)), k.ID
	}
	starter, starterID := keyClient("ci-bot", "start", "read")
	signaller, signallerID := keyClient("approver", "signal")
	operator, operatorID := keyClient("oncall", "operate")

	_, err := signaller.Start(ctx, client.StartRequest{Workflow: "gated", ID: "a1"})
	require.True(t, client.IsStatus(err, 403), "a signal key cannot start: %v", err)
	_, err = starter.Start(ctx, client.StartRequest{Workflow: "gated", ID: "a1"})
	require.NoError(t, err)
	_, err = starter.Start(ctx, client.StartRequest{Workflow: "gated", ID: "a2"})
	require.NoError(t, err)
	s.waitStepStatus(t, "a1", "gate", projections.OpWaiting)
	s.waitStepStatus(t, "a2", "gate", projections.OpWaiting)

	_, err = signaller.Signal(ctx, "a1", "go", nil)
	require.NoError(t, err)
	x := s.waitDone(t, "a1", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status)
	_, err = starter.Act(ctx, "a2", client.ActionRequest{Action: events.ActionCancel})
	require.True(t, client.IsStatus(err, 403), "a start key cannot cancel: %v", err)
	acted, err := operator.Act(ctx, "a2", client.ActionRequest{Action: events.ActionCancel, Reason: "not today", RequestedBy: "the boss"})
	require.NoError(t, err)
	require.True(t, acted.Recorded)

	key := func(name, id string) *events.Actor {
		return &events.Actor{Subject: name, Method: events.ActorAPIKey, KeyID: id}
	}
	var started *events.ExecutionStarted
	var signal *events.SignalReceived
	for _, ev := range s.history(t, "a1") {
		switch p := ev.Data.(type) {
		case *events.ExecutionStarted:
			started = p
		case *events.SignalReceived:
			signal = p
		}
	}
	require.Equal(t, key("ci-bot", starterID), started.Actor)
	require.Equal(t, "ci-bot", started.StartedBy)
	require.Equal(t, key("approver", signallerID), signal.Actor)
	var cancelling *events.ExecutionCancelling
	for _, ev := range s.history(t, "a2") {
		if p, ok := ev.Data.(*events.ExecutionCancelling); ok {
			cancelling = p
		}
	}
	require.NotNil(t, cancelling)
	require.Equal(t, key("oncall", operatorID), cancelling.Actor)
	require.Equal(t, "the boss", cancelling.RequestedBy, "requested_by stays, as a remark")
	// The read model follows the history (the projector may not have
	// written this event yet).
	natstest.Eventually(t, 15*time.Second, func() bool {
		x, err = s.c.Execution(ctx, "a2")
		return err == nil && x.Cancellation != nil
	}, "the read model of a2 shows its cancellation")
	require.Equal(t, key("oncall", operatorID), x.Cancellation.Actor)

	t.Log("a client on NATS cannot publish on the api's subjects, and cannot name an actor on its own")
	cl := s.as(t, auth.RoleClient)
	rej := s.watchRejections(t)
	forged := events.New("mallory", "a2", "gated", time.Now(), &events.ExecutionAction{ExecutionID: "a2", Action: events.ActionResume,
		Actor: key("oncall", operatorID)})
	msg, err := bus.Encode(bus.SubjectAPIAction, forged)
	require.NoError(t, err)
	cl.denied(t, msg)
	before := len(s.history(t, "a2"))
	msg, err = bus.Encode(bus.SubjectAction, forged)
	require.NoError(t, err)
	_, err = cl.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	r := rej.next(t)
	require.Equal(t, events.CodeInvalid, r.Code)
	require.Contains(t, r.Reason, "actor is set by the api")
	require.Len(t, s.history(t, "a2"), before, "the forged resume changed nothing")

	t.Log("no token in the log, the events or the commands")
	all := logs.String()
	require.Contains(t, all, `"subject":"oncall"`, "the api's debug log names who asked")
	for _, tok := range tokens {
		require.NotContains(t, all, tok)
	}
	for _, name := range []string{bus.StreamEvents, bus.StreamCommands} {
		st, err := s.js.Stream(ctx, name)
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		require.NotZero(t, info.State.Msgs)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			raw := m.Subject + string(m.Data)
			for k, v := range m.Header {
				raw += k + strings.Join(v, ",")
			}
			for _, tok := range tokens {
				require.NotContains(t, raw, tok, "%s holds a token at %d", name, seq)
			}
		}
	}
}
