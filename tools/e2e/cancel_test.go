package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/tools/internal/devstack"
)

// cancelWorkflow is a build held running until g opens, then a step
// that a cancel must keep from running.
func cancelWorkflow(g *gate) string {
	return `name: rollout
steps:
  - {id: build, kind: exec, command: sh, args: ["-c", "` + g.then("echo built") + `"]}
  - {id: ship, kind: log, message: shipped}
`
}

// waitStepStatus polls the api until a step reaches status st.
func (s *stack) waitStepStatus(t *testing.T, id, step string, st projections.OpStatus) projections.Execution {
	t.Helper()
	var x projections.Execution
	poll(t, 20*time.Second, fmt.Sprintf("step %s of %s %s", step, id, st), func() (bool, string) {
		var err error
		x, err = s.c.Execution(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		got, ok := findStep(x, step)
		return ok && got.Status == st, describe(x)
	})
	return x
}

func postAction(t *testing.T, s *stack, id, body string) (int, map[string]any) {
	t.Helper()
	resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions/"+id+"/actions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestCancelOverHTTP cancels an execution while its exec step runs: the
// step finishes and is recorded, the next step never runs.
func TestCancelOverHTTP(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	build := newGate(t)
	s.apply(t, cancelWorkflow(build))
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "rollout", ID: "r1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "r1", "build", projections.OpStarted)

	code, body := postAction(t, s, "r1", `{"action":"cancel","reason":"bad build","requested_by":"alice"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, true, body["recorded"])
	require.Equal(t, 1, countTypes(s.history(t, "r1"))[string(events.TypeExecutionCancelling)], "recorded means in the history")
	x, err := s.c.Execution(ctx, "r1")
	require.NoError(t, err)
	require.False(t, x.Status.Terminal(), "a cancel waits for the running build (held until the test lets it end)")

	build.open()
	x = s.waitDone(t, "r1", 20*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "build").Status, "the running step finished")
	require.Equal(t, projections.OpNone, stepByID(t, x, "ship").Status, "no step started after the cancel")
	require.Equal(t, "alice", x.Cancellation.RequestedBy)
	require.Equal(t, "bad build", x.Cancellation.Reason)
	evs := s.history(t, "r1")
	requireLinear(t, evs)
	n := countTypes(evs)
	require.Equal(t, 1, n[string(events.TypeExecutionCancelling)])
	require.Equal(t, 1, n[string(events.TypeExecutionCancelled)])
	require.Zero(t, n[string(events.TypeStepScheduled)+"/ship"])
	require.Zero(t, n[string(events.TypeStepDispatched)+"/ship"])

	t.Log("a finished execution cannot be cancelled again")
	code, body = postAction(t, s, "r1", `{"action":"force-cancel"}`)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body["error"].(map[string]any)["message"], "already cancelled")
	require.Len(t, s.history(t, "r1"), len(evs), "a refused action changes nothing")
}

// TestForceCancelAsCloudEvent cancels then force-cancels over NATS, the
// way any client can, while a step runs (held until the test ends): the
// force-cancel does not wait for it. Each CloudEvent is sent twice; the
// copy of the cancel arrives while the execution still waits for its
// running step, and each copy is recognised as the same command: recorded
// once, never refused as a second cancel.
func TestForceCancelAsCloudEvent(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, cancelWorkflow(newGate(t)))
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "rollout", ID: "r2"})
	require.NoError(t, err)
	s.waitStepStatus(t, "r2", "build", projections.OpStarted)
	sendTwice := func(id, action string) events.Event {
		ev := events.Event{ID: id, Type: events.TypeExecutionAction, Source: "urn:test:ops", Time: time.Now().UTC(),
			Data: &events.ExecutionAction{ExecutionID: "r2", Action: action, Reason: "hung"}}
		msg, err := bus.Encode(bus.SubjectAction, ev)
		require.NoError(t, err)
		require.NoError(t, s.nc.PublishMsg(msg))
		require.NoError(t, s.nc.PublishMsg(msg)) // the same event twice is one action
		return ev
	}

	cancel := sendTwice("op-0", events.ActionCancel)
	s.waitProjected(t) // the read model, not only the history: a loaded machine's projector lags
	x, err := s.c.Execution(ctx, "r2")
	require.NoError(t, err)
	require.Equal(t, projections.StatusCancelling, x.Status, "the cancel waits for build")
	s.requireNoRejection(t, events.CommandKey(cancel.Source, cancel.ID))
	s.requireCountStays(t, "r2", string(events.TypeExecutionCancelling), 1)

	force := sendTwice("op-1", events.ActionForceCancel)
	x = s.waitDone(t, "r2", 20*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Equal(t, projections.OpStarted, stepByID(t, x, "build").Status, "force-cancel did not wait for build")
	require.Equal(t, "urn:test:ops", x.Cancellation.RequestedBy)
	nats := &events.Actor{Subject: "client", Method: events.ActorNATS} // a NATS command is the client role's
	require.Equal(t, []projections.ActionCommand{
		{Command: events.CommandKey(cancel.Source, cancel.ID), Action: events.ActionCancel, Actor: nats},
		{Command: events.CommandKey(force.Source, force.ID), Action: events.ActionForceCancel, Actor: nats},
	}, x.Actions)
	s.waitCommandsHandled(t)
	s.requireNoRejection(t, events.CommandKey(force.Source, force.ID))
	s.requireCountStays(t, "r2", string(events.TypeExecutionCancelled), 1)
}

func TestActionBadInput(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: tiny\nsteps:\n  - {id: a, kind: sleep, duration: 30s}\n")
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: "tiny", ID: "t1"})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		id, body string
		code     int
		field    string
		message  string
	}{
		"NoAction":      {"t1", `{"reason":"x"}`, 400, "action", "action is required"},
		"UnknownAction": {"t1", `{"action":"pause"}`, 400, "action", `action "pause" is not known; use one of: cancel, force-cancel, kill, resume, force-resume`},
		"UnknownField":  {"t1", `{"action":"cancel","force":true}`, 400, "force", ""},
		"NotJSON":       {"t1", `cancel`, 400, "", "the body must be JSON"},
		"LongRequester": {"t1", `{"action":"cancel","requested_by":"` + strings.Repeat("x", 300) + `"}`, 400, "requested_by", "at most 256"},
		"NoExecution":   {"nobody", `{"action":"cancel"}`, 404, "id", `execution "nobody" does not exist`},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := postAction(t, s, tc.id, tc.body)
			require.Equal(t, tc.code, code, body)
			e, ok := body["error"].(map[string]any)
			require.True(t, ok, body)
			if tc.field != "" {
				require.Equal(t, tc.field, e["field"], body)
			}
			require.Contains(t, e["message"], tc.message)
		})
	}
	x, err := s.c.Execution(context.Background(), "t1")
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, x.Status, "bad requests changed nothing")

	t.Log("the CLI cancels a sleeping execution at once: nothing runs on an agent")
	out, err := runCmd(context.Background(), buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "cancel", "t1", "--reason", "not needed")
	require.NoError(t, err, out)
	require.Contains(t, out, "cancel of execution t1 recorded")
	x = s.waitDone(t, "t1", 10*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Equal(t, "not needed", x.Cancellation.Reason)
	out, err = runCmd(context.Background(), buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "cancel", "t1")
	require.Error(t, err)
	require.Contains(t, out, "already cancelled")
}

// TestKillTerminatesAnExecThatIgnoresSIGTERM kills an execution whose exec
// step ignores SIGTERM: the agent sends SIGTERM to its process group, then
// SIGKILL after the grace period.
func TestKillTerminatesAnExecThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.KillGrace = time.Second })
	ctx := context.Background()
	pidFile := filepath.Join(t.TempDir(), "pid")
	s.apply(t, `name: stubborn
steps:
  - id: hang
    kind: exec
    command: sh
    args: ["-c", "trap '' TERM; echo $$ > `+pidFile+`; sleep 60; echo finished"]
  - {id: after, kind: log, message: never}
`)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "stubborn", ID: "k1"})
	require.NoError(t, err)
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the exec step never ran")
	require.NoError(t, syscall.Kill(pid, 0), "the process runs")

	// The clock starts before the request: SIGTERM cannot come before it,
	// so the grace ends at least a second later however late the answer.
	killedAt := time.Now()
	code, body := postAction(t, s, "k1", `{"action":"kill","reason":"runaway"}`)
	require.Equal(t, http.StatusOK, code, body)
	x := s.waitDone(t, "k1", 10*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Equal(t, events.ActionKill, x.Cancellation.Action)

	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 15*time.Second, 20*time.Millisecond,
		"the process outlived the kill")
	took := time.Since(killedAt)
	require.GreaterOrEqual(t, took, time.Second, "SIGTERM is ignored: only SIGKILL, after the grace, ends it")
	t.Logf("process %d ended %s after the kill (grace 1s)", pid, took.Round(time.Millisecond))

	t.Log("the terminated step's failure arrives after the end: noted, changing nothing")
	s.waitResult(t, "k1", "hang")
	evs := s.history(t, "k1")
	require.GreaterOrEqual(t, len(evs), 2)
	require.Equal(t, events.TypeExecutionCancelled, evs[len(evs)-2].Type)
	late, ok := evs[len(evs)-1].Data.(*events.ResultAfterEnd)
	require.True(t, ok, "the last event is %s", evs[len(evs)-1].Type)
	require.Equal(t, "hang", late.StepID)
	require.Equal(t, events.TypeOperationFailed, late.ResultType)
	require.Contains(t, late.Error, agent.ErrKilled.Error())
	require.Contains(t, late.Error, "ended by SIGKILL", "SIGTERM was ignored: the grace ran out")
	t.Logf("recorded after the end: %s", late.Error)
	require.Zero(t, countTypes(evs)[string(events.TypeStepScheduled)+"/after"])
	require.Zero(t, countTypes(evs)[string(events.TypeStepDispatched)+"/after"])
	x = s.waitProjectedStep(t, "k1", "hang")
	st, _ := findStep(x, "hang")
	require.True(t, st.Status.InFlight(), "the ended execution's step keeps its status: %s", st.Status)
	require.Equal(t, projections.OpFailed, st.AfterEnd.Outcome)
}

// TestActionIdempotencyKey: a retried request is answered like the first,
// even when the first ended the execution; a key reused for another action
// is refused.
func TestActionIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: idle\nsteps:\n  - {id: a, kind: sleep, duration: 30s}\n")
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: "idle", ID: "i1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "i1", "a", projections.OpWaiting)
	post := func(body string) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodPost, s.info.APIURL+"/v1/executions/i1/actions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "stop-i1")
		resp, err := apiHTTP.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	for range 2 {
		code, body := post(`{"action":"force-cancel"}`)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, true, body["recorded"])
		require.Equal(t, "jetflow/api#idem-stop-i1", body["command"])
	}
	code, body := post(`{"action":"kill"}`)
	require.Equal(t, http.StatusConflict, code, body)
	e := body["error"].(map[string]any)
	require.Equal(t, "Idempotency-Key", e["field"])
	require.Contains(t, e["message"], "already asked for force-cancel")
	require.Equal(t, 1, countTypes(s.history(t, "i1"))[string(events.TypeExecutionCancelled)])
}

// TestResumeAfterTheOperatorFixedTheCause: a step fails because a file is
// missing; the operator creates it and resumes over HTTP: the failed step
// runs again and the execution succeeds. A cancelled execution is resumed
// with a CloudEvent.
func TestResumeAfterTheOperatorFixedTheCause(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	s.apply(t, `name: needsfile
steps:
  - {id: prepare, kind: log, message: preparing}
  - {id: read, kind: exec, command: cat, args: ["`+filepath.Join(dir, "config")+`"]}
  - {id: done, kind: noop}
`)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "needsfile", ID: "f1"})
	require.NoError(t, err)
	x := s.waitDone(t, "f1", 20*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)

	t.Log("the operator restores the file and resumes")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config"), []byte("fixed\n"), 0o600))
	code, body := postAction(t, s, "f1", `{"action":"resume","reason":"config restored"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool { // the read model follows the history
		x, err = s.c.Execution(ctx, "f1")
		return err == nil && x.Resumes == 1 && x.Status.Terminal()
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, 1, stepByID(t, x, "prepare").Attempt, "prepare did not run again")
	require.Equal(t, 2, stepByID(t, x, "read").Attempt)
	require.Contains(t, string(stepByID(t, x, "read").Output), "fixed")
	require.Equal(t, 1, x.Resumes)

	code, body = postAction(t, s, "f1", `{"action":"resume"}`)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body["error"].(map[string]any)["message"], "only started, failed, suspended and cancelled executions can be resumed")

	t.Log("a cancelled execution resumed with a CloudEvent")
	s.apply(t, "name: pausable\nsteps:\n  - {id: nap, kind: sleep, duration: 1s}\n  - {id: after, kind: noop}\n")
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "pausable", ID: "p1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "p1", "nap", projections.OpWaiting)
	code, body = postAction(t, s, "p1", `{"action":"cancel"}`)
	require.Equal(t, http.StatusOK, code, body)
	x = s.waitDone(t, "p1", 10*time.Second)
	require.Equal(t, projections.StatusCancelled, x.Status)
	require.Len(t, x.Timers, 1)
	for id := range x.Timers {
		s.waitTimerHandled(t, id) // the sleep's timer fires while the execution is cancelled
	}
	ev := events.Event{ID: "resume-p1", Type: events.TypeExecutionAction, Source: "urn:test:ops", Time: time.Now().UTC(),
		Data: &events.ExecutionAction{ExecutionID: "p1", Action: events.ActionResume}}
	msg, err := bus.Encode(bus.SubjectAction, ev)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(msg))
	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, "p1")
		return err == nil && x.Status == projections.StatusSucceeded
	}, 20*time.Second, 20*time.Millisecond, "the resumed execution finishes: its overdue sleep ends")
}

// TestResumeAfterKill: a killed execution resumed runs its operations
// again: the resume lifts the kill for the agents.
func TestResumeAfterKill(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.KillGrace = 200 * time.Millisecond })
	ctx := context.Background()
	s.apply(t, `name: killme
steps:
  - {id: work, kind: exec, command: sh, args: ["-c", "sleep 2; echo done"]}
  - {id: after, kind: log, message: after}
`)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "killme", ID: "k1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "k1", "work", projections.OpStarted)
	code, body := postAction(t, s, "k1", `{"action":"kill"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, projections.StatusCancelled, s.waitDone(t, "k1", 10*time.Second).Status)
	s.waitResult(t, "k1", "work") // the killed operation ended on its agent
	code, body = postAction(t, s, "k1", `{"action":"force-resume","reason":"try again"}`)
	require.Equal(t, http.StatusOK, code, body)
	var x projections.Execution
	require.Eventually(t, func() bool {
		x, err = s.c.Execution(ctx, "k1")
		return err == nil && x.Resumes == 1 && x.Status.Terminal()
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
}

// TestWaitAfterFailThenResumeWithTheCLI: an execution started over HTTP
// with wait_after_fail is suspended by a failure; the operator fixes the
// cause and resumes it from the command line.
func TestWaitAfterFailThenResumeWithTheCLI(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	s.apply(t, `name: careful
steps:
  - {id: read, kind: exec, command: cat, args: ["`+filepath.Join(dir, "token")+`"]}
`)
	resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/json",
		strings.NewReader(`{"workflow":"careful","id":"wf1","wait_after_fail":true}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300)
	var x projections.Execution
	require.Eventually(t, func() bool {
		x, err = s.c.Execution(ctx, "wf1")
		return err == nil && x.Status == projections.StatusSuspended
	}, 20*time.Second, 20*time.Millisecond)
	require.Contains(t, x.Error, "exit status 1")
	require.True(t, x.WaitAfterFail)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("s3cret\n"), 0o600))
	out, err := runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "resume", "wf1", "--reason", "token restored")
	require.NoError(t, err, out)
	require.Contains(t, out, "resume of execution wf1 recorded")
	x = s.waitDone(t, "wf1", 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Contains(t, string(stepByID(t, x, "read").Output), "s3cret")

	t.Log("--watch returns when the execution is suspended, with exit status 1")
	require.NoError(t, os.Remove(filepath.Join(dir, "token")))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err = runCmd(wctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "run", "careful", "--id", "wf2", "--wait-after-fail", "--watch")
	require.Error(t, err, out)
	require.NoError(t, wctx.Err(), "the watch did not return")
	require.Contains(t, out, "execution.suspended")
	require.Contains(t, out, "jetflow resume wf2")
}

// TestDryRunOverHTTP: a dry run started over HTTP records what would run
// and runs nothing.
func TestDryRunOverHTTP(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	marker := filepath.Join(t.TempDir(), "ran")
	s.apply(t, `name: risky
steps:
  - {id: touch, kind: exec, command: touch, args: ["`+marker+`"]}
`)
	resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/json",
		strings.NewReader(`{"workflow":"risky","id":"dry1","dry_run":true}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300)
	x := s.waitDone(t, "dry1", 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.True(t, x.DryRun)
	require.Equal(t, projections.OpSkipped, stepByID(t, x, "touch").Status)
	require.Contains(t, stepByID(t, x, "touch").Error, "dry run: would run exec")
	require.Contains(t, string(stepByID(t, x, "touch").Input), marker)
	_, err = os.Stat(marker)
	require.True(t, os.IsNotExist(err), "the command did not run")
}
