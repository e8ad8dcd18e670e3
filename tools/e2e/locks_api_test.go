package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/projections"
)

// TestLocksThroughTheAPI: GET /v1/locks shows holders and waiters, a
// waiting execution shows its lock in its read model and in jetflow show,
// bad requests are refused naming the field, and DELETE /v1/locks/{name}
// (and jetflow locks clear) force-clears the holder, recorded in its
// history, so the waiter acquires the lock.
func TestLocksThroughTheAPI(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: gated
lock: gate-${input.env}
steps:
  - {id: hold, kind: wait, signal: go}
`)
	for _, id := range []string{"g1", "g2", "g3"} {
		_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: id, Input: map[string]any{"env": "prod"}})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			l, err := s.c.Lock(ctx, "gate-prod")
			return err == nil && len(l.Holders)+len(l.Waiters) == map[string]int{"g1": 1, "g2": 2, "g3": 3}[id]
		}, 10*time.Second, 20*time.Millisecond)
	}
	locks, err := s.c.Locks(ctx)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	require.Equal(t, "gate-prod", locks[0].Name)
	require.Equal(t, 1, locks[0].Limit)
	require.Equal(t, []string{"g1"}, entryIDs(locks[0].Holders))
	require.Equal(t, []string{"g2", "g3"}, entryIDs(locks[0].Waiters))
	require.False(t, locks[0].Holders[0].Since.IsZero())

	var x projections.Execution
	require.Eventually(t, func() bool {
		x, err = s.c.Execution(ctx, "g2")
		return err == nil && len(x.WaitingLocks()) == 1
	}, 10*time.Second, 20*time.Millisecond, "the read model shows the wait")
	require.Equal(t, projections.StatusStarted, x.Status)
	out, err := runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "g2")
	require.NoError(t, err, out)
	require.Contains(t, out, "gate-prod")
	require.Contains(t, out, "waiting")

	out, err = runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "locks", "ls")
	require.NoError(t, err, out)
	require.Regexp(t, `gate-prod\s+1\s+holder\s+g1`, out)
	require.Regexp(t, `gate-prod\s+1\s+waiter 2\s+g3`, out)

	t.Log("bad requests change nothing")
	for _, c := range []struct {
		path, body, field string
		status            int
	}{
		{"/v1/locks/a..b", "", "name", http.StatusBadRequest},
		{"/v1/locks/nobody-holds-this", "", "name", http.StatusNotFound},
		{"/v1/locks/gate-prod", `{"bogus":1}`, "bogus", http.StatusBadRequest},
		{"/v1/locks/gate-prod", `{"execution_id":"g3"}`, "execution_id", http.StatusNotFound},
		{"/v1/locks/gate-prod", `{"execution_id":"no such id!"}`, "execution_id", http.StatusBadRequest},
		{"/v1/locks/gate-prod", `{"reason":"` + strings.Repeat("x", events.MaxActionReason+1) + `"}`, "reason", http.StatusBadRequest},
	} {
		req, err := http.NewRequest(http.MethodDelete, s.info.APIURL+c.path, strings.NewReader(c.body))
		require.NoError(t, err)
		resp, err := apiHTTP.Do(req)
		require.NoError(t, err)
		var body struct {
			Error struct {
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, decodeJSON(resp, &body))
		require.Equal(t, c.status, resp.StatusCode, "%s %s: %s", c.path, c.body, body.Error.Message)
		require.Equal(t, c.field, body.Error.Field, c.path)
		require.NotEmpty(t, body.Error.Message)
	}
	l, err := s.c.Lock(ctx, "gate-prod")
	require.NoError(t, err)
	require.Equal(t, []string{"g1"}, entryIDs(l.Holders))

	t.Log("force-clear through the api: g2 acquires")
	cleared, err := s.c.ClearLock(ctx, "gate-prod", client.ClearLockRequest{Reason: "g1 is stuck", RequestedBy: "alice"})
	require.NoError(t, err)
	require.True(t, cleared.Recorded)
	require.Equal(t, "g1", cleared.Cleared[0].ExecutionID)
	var rec *events.LockCleared
	for _, ev := range s.history(t, "g1") {
		if c, ok := ev.Data.(*events.LockCleared); ok {
			rec = c
		}
	}
	require.NotNil(t, rec, "the holder's history records the clear")
	require.Equal(t, "alice", rec.RequestedBy)
	require.Equal(t, "admin-token", rec.Actor.Subject, "the actor is who authenticated, not requested_by")
	require.Equal(t, events.ActorAPIKey, rec.Actor.Method)
	require.Equal(t, "g1 is stuck", rec.Reason)
	require.Eventually(t, func() bool {
		l, err := s.c.Lock(ctx, "gate-prod")
		return err == nil && len(l.Holders) == 1 && l.Holders[0].ExecutionID == "g2"
	}, 10*time.Second, 20*time.Millisecond)

	t.Log("g1 (still waiting for its signal) does not ask again; jetflow locks clear hands the lock to g3")
	out, err = runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "locks", "clear", "gate-prod", "--execution", "g2", "--reason", "testing")
	require.NoError(t, err, out)
	require.Contains(t, out, "cleared lock gate-prod held by g2")
	require.Eventually(t, func() bool {
		l, err = s.c.Lock(ctx, "gate-prod")
		return err == nil && len(l.Holders) == 1 && l.Holders[0].ExecutionID == "g3"
	}, 10*time.Second, 20*time.Millisecond, "g3 holds")
	require.Empty(t, l.Waiters, "the cleared holders wait for their signals, not for the lock")

	t.Log("the cleared holders end without the lock (no step of theirs needs it again); the holder releases it")
	for _, id := range []string{"g1", "g2", "g3"} {
		_, err := s.c.Signal(ctx, id, "go", nil)
		require.NoError(t, err)
		require.Equal(t, projections.StatusSucceeded, s.waitDone(t, id, 10*time.Second).Status)
	}
	for _, id := range []string{"g1", "g2"} {
		n := countTypes(s.history(t, id))
		require.Equal(t, 1, n[string(events.TypeLockRequested)], "%s asked for the lock once: not again after its clear", id)
		require.Equal(t, 1, n[string(events.TypeLockCleared)], id)
	}
	_, err = s.c.Lock(ctx, "gate-prod")
	require.True(t, client.IsStatus(err, http.StatusNotFound), "%v", err)
}

// TestJanitorClearsLockOfEndedHolder: a holder whose execution ended
// without releasing (as if its dispatcher died in between) is cleared by
// the janitor, and the waiter acquires the lock.
func TestJanitorClearsLockOfEndedHolder(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: j\nsteps:\n  - {id: a, kind: noop}\n")
	s.apply(t, "name: jw\nlock: jlock\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, projections.StatusSucceeded, s.runToEnd(t, client.StartRequest{Workflow: "j", ID: "ended"}).Status)
	tb, err := lock.Open(ctx, s.js, nil)
	require.NoError(t, err)
	held, err := tb.Enqueue(ctx, "jlock", 1, lock.Entry{ExecutionID: "ended", Workflow: "j", Request: 1})
	require.NoError(t, err)
	require.True(t, held)
	x := s.runToEnd(t, client.StartRequest{Workflow: "jw", ID: "waiter"})
	require.Equal(t, projections.StatusSucceeded, x.Status, "the janitor cleared the ended holder, so the waiter ran")
	_, err = s.c.Lock(ctx, "jlock")
	require.True(t, client.IsStatus(err, http.StatusNotFound), "%v", err)
}

func entryIDs(es []client.LockEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ExecutionID
	}
	return out
}

func decodeJSON(resp *http.Response, v any) error {
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}
