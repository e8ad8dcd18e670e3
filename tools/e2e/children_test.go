package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// childWorkflows: nap waits for a signal (or sleeps input.nap) and
// returns what it got; parent runs it as a child, cancelled when the
// parent ends; drifter runs it as a child left running.
const childWorkflows = `name: nap
steps:
  - id: wait
    kind: wait
    signal: go
  - id: done
    kind: return
    output: "woke with ${steps.wait.output.data.word}"
---
name: parent
steps:
  - id: call
    kind: workflow
    workflow: nap
    child: true
    output: "child said: ${result}"
  - id: after
    kind: return
    output: ${steps.call.output}
---
name: drifter
steps:
  - id: call
    kind: workflow
    workflow: nap
    child: true
    on_parent_end: abandon
  - id: after
    kind: return
    output: ${steps.call.output}
`

// childOf waits until step call of parent has started its child, and
// returns the child's id.
func (s *stack) childOf(t *testing.T, parent string) string {
	t.Helper()
	var child string
	poll(t, doneAtLeast, "the child of "+parent+" starts", func() (bool, string) {
		x, err := s.c.Execution(context.Background(), parent)
		if err != nil {
			return false, err.Error()
		}
		st, ok := findStep(x, "call")
		child = st.Child
		if !ok || child == "" {
			return false, describe(x)
		}
		c, err := s.c.Execution(context.Background(), child)
		if err != nil {
			return false, err.Error()
		}
		return c.Status == projections.StatusStarted, describe(c)
	})
	return child
}

// startParent starts an execution id of workflow wf and returns the id
// of its child, once that runs.
func (s *stack) startParent(t *testing.T, wf, id string) string {
	t.Helper()
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: wf, ID: id})
	require.NoError(t, err)
	return s.childOf(t, id)
}

// TestChildExecutions runs a workflow as a child execution of another:
// the parent waits for it and takes its output; each links to the
// other; an operator's cancel of the child fails the parent's step;
// cancelling the parent cancels its child, unless the step abandons it,
// and then a resume of the parent takes the child's result; nobody but
// the dispatcher may start a child.
func TestChildExecutions(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	for _, def := range strings.Split(childWorkflows, "\n---\n") {
		s.apply(t, def)
	}

	t.Log("the parent waits for its child and takes its output")
	child := s.startParent(t, "parent", "p1")
	c, err := s.c.Execution(ctx, child)
	require.NoError(t, err)
	require.Equal(t, &events.ParentRef{ExecutionID: "p1", Workflow: "parent", StepID: "call", Attempt: 1}, c.Parent)
	_, err = s.c.Signal(ctx, child, "go", []byte(`{"word":"hello"}`))
	require.NoError(t, err)
	x := s.waitDone(t, "p1", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.JSONEq(t, `"child said: woke with hello"`, string(x.Output))
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, child, 30*time.Second).Status)
	n := countTypes(s.history(t, "p1"))
	require.Equal(t, 1, n[string(events.TypeStepChildStarted)])
	require.Zero(t, n[string(events.TypeSignalReceived)], "the signal went to the child's history, not the parent's")

	cli := buildJetflow(t)
	out, err := runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "p1")
	require.NoError(t, err, out)
	require.Regexp(t, `child\s+`+child+` \(workflow nap\), started by step call: succeeded`, out)
	out, err = runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", child)
	require.NoError(t, err, out)
	require.Regexp(t, `parent\s+step call \(attempt 1\) of p1 \(workflow parent\)`, out)

	t.Log("an operator cancels the child: the parent's step fails")
	child = s.startParent(t, "parent", "p2")
	_, err = s.c.Act(ctx, child, client.ActionRequest{Action: events.ActionCancel, Reason: "not needed"})
	require.NoError(t, err)
	x = s.waitDone(t, "p2", 30*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Equal(t, "step call failed: child execution "+child+" was cancelled", x.Error)

	t.Log("cancelling the parent cancels its child")
	child = s.startParent(t, "parent", "p3")
	_, err = s.c.Act(ctx, "p3", client.ActionRequest{Action: events.ActionCancel, Reason: "customer left"})
	require.NoError(t, err)
	x = s.waitDone(t, "p3", 30*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	call := stepByID(t, x, "call")
	require.Equal(t, projections.OpFailed, call.Status)
	require.Contains(t, call.Error, "told to cancel, as its parent execution p3 was cancelled")
	c = s.waitDone(t, child, 30*time.Second)
	require.Equal(t, projections.StatusCancelled, c.Status, describe(c))
	require.NotNil(t, c.Cancellation)
	require.Equal(t, "its parent execution p3 was cancelled", c.Cancellation.Reason)
	require.Equal(t, "execution p3 (workflow parent), step call", c.Cancellation.RequestedBy)

	t.Log("a kill of the parent is passed on as a kill")
	child = s.startParent(t, "parent", "p4")
	_, err = s.c.Act(ctx, "p4", client.ActionRequest{Action: events.ActionKill})
	require.NoError(t, err)
	c = s.waitDone(t, child, 30*time.Second)
	require.Equal(t, projections.StatusCancelled, c.Status)
	require.Equal(t, events.ActionKill, c.Cancellation.Action)

	t.Log("an abandoned child runs on; a resume of its parent takes its result")
	child = s.startParent(t, "drifter", "d1")
	_, err = s.c.Act(ctx, "d1", client.ActionRequest{Action: events.ActionCancel})
	require.NoError(t, err)
	x = s.waitDone(t, "d1", 30*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Equal(t, projections.OpPending, stepByID(t, x, "call").Status, "abandoned: still its child's")
	_, err = s.c.Signal(ctx, child, "go", []byte(`{"word":"late"}`))
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, child, 30*time.Second).Status)
	x, err = s.c.Execution(ctx, "d1")
	require.NoError(t, err)
	require.Equal(t, projections.StatusCancelled, x.Status, "an ended parent records nothing")
	_, err = s.c.Act(ctx, "d1", client.ActionRequest{Action: events.ActionResume})
	require.NoError(t, err)
	poll(t, doneAtLeast, "d1 resumed runs to its end", func() (bool, string) {
		x, err = s.c.Execution(ctx, "d1")
		if err != nil {
			return false, err.Error()
		}
		return x.Resumes > 0 && x.Status.Terminal(), describe(x)
	})
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.JSONEq(t, `"woke with late"`, string(x.Output))
	require.Equal(t, 1, stepByID(t, x, "call").Attempt, "the same child, not a new one")

	t.Log("a client that takes a child's id first does not pass for the child")
	forged := events.ChildExecutionID("p9", "call", 1)
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "nap", ID: forged})
	require.NoError(t, err)
	_, err = s.c.Signal(ctx, forged, "go", []byte(`{"word":"forged"}`))
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, forged, 30*time.Second).Status)
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "parent", ID: "p9"})
	require.NoError(t, err)
	s.waitStepStatus(t, "p9", "call", projections.OpPending)
	poll(t, doneAtLeast, "p9's step fails once a reconcile looks", func() (bool, string) {
		// As the janitor's idle sweep does for a parent waiting for a child.
		ev := events.New("jetflow/janitor", "p9", "parent", time.Now(), &events.ReconcileExecution{ExecutionID: "p9", Workflow: "parent", Reason: "idle"})
		msg, err := bus.Encode(bus.SubjectReconcile, ev)
		require.NoError(t, err)
		require.NoError(t, s.nc.PublishMsg(msg))
		x, err = s.c.Execution(ctx, "p9")
		if err != nil {
			return false, err.Error()
		}
		return x.Status.Terminal(), describe(x)
	})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "child execution "+forged+" did not start: ")
	require.NotContains(t, string(x.Output), "forged")

	t.Log("a client may not start a child, over NATS or HTTP")
	rej := s.rejectionOf(t, "urn:test:ops", "forged-child",
		`{"workflow":"nap","execution_id":"forged","parent":{"execution_id":"p1","workflow":"parent","step_id":"call","attempt":1}}`)
	require.Contains(t, rej.Reason, "parent is set by the dispatcher only")
	code, e := postCloudEvent(t, s.info.APIURL, "urn:test:ops", "forged-child-http",
		`{"workflow":"nap","execution_id":"forged2","parent":{"execution_id":"p1","workflow":"parent","step_id":"call","attempt":1}}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "parent", e.Field)
	for _, id := range []string{"forged", "forged2"} {
		_, err = s.c.Execution(ctx, id)
		require.Error(t, err, "nothing started")
	}
}
