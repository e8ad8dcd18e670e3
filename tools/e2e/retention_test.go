package e2e

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// expired reports whether the api answers 410 expired for execution id.
func (s *stack) expired(t *testing.T, id string) bool {
	t.Helper()
	_, err := s.c.Execution(context.Background(), id)
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status == http.StatusGone {
		require.Equal(t, "expired", ce.Code)
		return true
	}
	return false
}

func (s *stack) waitExpired(t *testing.T, id string) {
	t.Helper()
	require.Eventually(t, func() bool { return s.expired(t, id) }, 20*time.Second, 50*time.Millisecond, "execution %s did not expire", id)
}

// TestRetention runs every service: the system default (2 here) keeps the
// two most recent executions of a workflow, a hash groups two workflows,
// a step changes an execution's rule and group, and a waiting execution
// with retention disabled is left alone until it ends. An expired
// execution's id stays taken.
func TestRetention(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) {
		c.RetentionDefault = "2"
		c.JanitorInterval = 200 * time.Millisecond
	})
	ctx := context.Background()
	s.apply(t, "name: plain\nsteps:\n  - id: a\n    kind: let\n    vars: {x: 1}\n")
	for _, name := range []string{"start", "stop"} {
		s.apply(t, "name: "+name+"\nretention: 1 hash start-stop\nsteps:\n  - id: a\n    kind: let\n    vars: {x: 1}\n")
	}
	s.apply(t, `name: prov
retention: disabled
steps:
  - id: keep-failures
    kind: workflow
    condition: ${input.fail == true}
    retention: forever hash ${workflow.name} failed
  - id: check
    kind: fail
    condition: ${input.fail == true}
    message: provisioning denied
`)
	s.apply(t, "name: waiter\nretention: disabled\nsteps:\n  - id: w\n    kind: wait\n    signal: go\n")

	// A waiting execution is never expired, whatever its rule.
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "waiter", ID: "waiter-1"})
	require.NoError(t, err)

	for _, id := range []string{"plain-1", "plain-2", "plain-3"} {
		s.runToEnd(t, client.StartRequest{Workflow: "plain", ID: id})
	}
	s.waitExpired(t, "plain-1")
	for _, id := range []string{"plain-2", "plain-3"} {
		x, err := s.c.Execution(ctx, id)
		require.NoError(t, err)
		require.Equal(t, projections.StatusSucceeded, x.Status)
	}
	evs, err := s.c.Events(ctx, "plain-1", 0)
	require.Error(t, err, "the history is gone")
	require.Contains(t, err.Error(), "expired under its retention rule")
	require.Empty(t, evs)
	// Nothing is left to act on.
	_, err = s.c.Act(ctx, "plain-1", client.ActionRequest{Action: events.ActionResume})
	var gone *client.Error
	require.ErrorAs(t, err, &gone)
	require.Equal(t, http.StatusGone, gone.Status)
	_, err = s.c.Signal(ctx, "plain-1", "go", nil)
	require.ErrorAs(t, err, &gone)
	require.Equal(t, http.StatusGone, gone.Status)
	// The id stays taken: ids are unique forever.
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "plain", ID: "plain-1"})
	var ce *client.Error
	require.ErrorAs(t, err, &ce)
	require.Equal(t, http.StatusConflict, ce.Status)

	s.runToEnd(t, client.StartRequest{Workflow: "start", ID: "start-1"})
	s.runToEnd(t, client.StartRequest{Workflow: "stop", ID: "stop-1"})
	s.waitExpired(t, "start-1") // one is kept across start and stop

	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "prov", ID: "prov-ok"})
	require.NoError(t, err)
	failed := s.runToEnd(t, client.StartRequest{Workflow: "prov", ID: "prov-denied", Input: map[string]any{"fail": true}})
	require.Equal(t, projections.StatusFailed, failed.Status)
	require.Equal(t, "forever", failed.Retention)
	require.Equal(t, "prov failed", failed.RetentionKey)
	s.waitExpired(t, "prov-ok") // disabled: gone once finished

	// Sweeps have passed over the waiting execution all along.
	x, err := s.c.Execution(ctx, "waiter-1")
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, x.Status)
	require.Equal(t, "disabled", x.Retention)
	_, err = s.c.Signal(ctx, "waiter-1", "go", nil)
	require.NoError(t, err)
	s.waitExpired(t, "waiter-1")

	// Kept: the two most recent plain runs, the last of start-stop and the
	// denied provisioning, with their histories.
	for _, id := range []string{"plain-2", "plain-3", "stop-1", "prov-denied"} {
		require.NotEmpty(t, s.history(t, id), id)
		_, err := s.c.Execution(ctx, id)
		require.NoError(t, err, id)
	}
	// The claims of expired executions are kept, marked expired.
	ids, err := claim.Open(ctx, s.js)
	require.NoError(t, err)
	c, err := ids.Get(ctx, "prov-ok")
	require.NoError(t, err)
	require.True(t, c.Expired(), "the claim of prov-ok is marked expired")
}

// TestExpiredRefusesActionsBeforeDeletion: once the dispatcher recorded an
// execution's expiry (at the janitor's request), the execution can no
// longer be resumed, even before the janitor deletes it: the api answers
// 410 expired, and the history ends with the expiry.
func TestExpiredRefusesActionsBeforeDeletion(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.JanitorInterval = time.Hour })
	ctx := context.Background()
	s.apply(t, "name: denied\nsteps:\n  - id: check\n    kind: fail\n    message: no\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "denied", ID: "denied-1"})
	require.Equal(t, projections.StatusFailed, x.Status)

	// What the janitor publishes when the rule no longer keeps it.
	ev := events.New("jetflow/janitor", "denied-1", "denied", time.Now(), &events.ExpireExecution{
		ExecutionID: "denied-1", Workflow: "denied", LastSeq: x.LastSeq, Rule: "1"})
	msg, err := bus.Encode(bus.SubjectExpire, ev)
	require.NoError(t, err)
	_, err = s.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, "denied-1")
		return err == nil && !x.ExpiredAt.IsZero()
	}, 10*time.Second, 20*time.Millisecond, "expiry recorded and projected")

	_, err = s.c.Act(ctx, "denied-1", client.ActionRequest{Action: events.ActionResume, Reason: "fixed"})
	var gone *client.Error
	require.ErrorAs(t, err, &gone)
	require.Equal(t, http.StatusGone, gone.Status)
	require.Equal(t, events.CodeExpired, gone.Code)
	evs := s.history(t, "denied-1")
	require.Equal(t, events.TypeExecutionExpired, evs[len(evs)-1].Type, "nothing was added after the expiry")
}
