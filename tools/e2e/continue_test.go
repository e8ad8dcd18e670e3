package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestContinueAsNewChain runs examples/countdown.yaml from 3: four runs,
// each a history of its own, linked both ways (read models, histories,
// jetflow show); a start that forges those links on NATS is rejected.
func TestContinueAsNewChain(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	def, err := os.ReadFile(filepath.Join("..", "..", "examples", "countdown.yaml"))
	require.NoError(t, err)
	s.apply(t, string(def))
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "countdown", ID: "cd", Input: map[string]any{"n": 3}})
	require.NoError(t, err)

	ids := []string{"cd", "cd-run2", "cd-run3", "cd-run4"}
	for i, id := range ids {
		x := s.waitDone(t, id, 30*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
		if i > 0 {
			require.Equal(t, "cd", x.Chain)
			require.Equal(t, i+1, x.Run)
			require.Equal(t, ids[i-1], x.ContinuedFrom)
		}
		if i < len(ids)-1 {
			require.Equal(t, ids[i+1], x.ContinuedAs)
			n := countTypes(s.history(t, id))
			require.Equal(t, 1, n[string(events.TypeExecutionSucceeded)])
		} else {
			require.Empty(t, x.ContinuedAs)
			require.JSONEq(t, `"reached zero in run 4"`, string(x.Output))
		}
	}
	cli := buildJetflow(t)
	out, err := runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "cd")
	require.NoError(t, err, out)
	require.Regexp(t, `continued\s+as cd-run2`, out)
	out, err = runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "cd-run4")
	require.NoError(t, err, out)
	require.Regexp(t, `chain\s+run 4 of cd, continued from cd-run3`, out)

	t.Log("a client may not forge a chain")
	ev := events.Event{ID: "forged-1", Type: events.TypeStartExecution, Source: "urn:test:ops", Time: time.Now().UTC(),
		Data: &events.StartExecution{Workflow: "countdown", ExecutionID: "cd-run9", Input: []byte(`{"n":0}`), Chain: "cd", Run: 9, ContinuedFrom: "cd-run4"}}
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(msg))
	stream, err := s.js.Stream(ctx, bus.StreamRejections)
	require.NoError(t, err)
	var rej events.Event
	poll(t, 30*time.Second, "the forged start is rejected", func() (bool, string) {
		m, err := stream.GetLastMsgForSubject(ctx, bus.RejectionSubject(events.CommandKey(ev.Source, ev.ID)))
		if err != nil {
			return false, err.Error()
		}
		rej, err = bus.Decode(m.Header, m.Data)
		return err == nil, "undecodable"
	})
	require.Contains(t, rej.Data.(*events.CommandRejected).Reason, "set by the dispatcher only")
	_, err = s.c.Execution(ctx, "cd-run9")
	require.Error(t, err, "nothing started")
}
