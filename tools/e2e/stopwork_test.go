package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/agent/agent"
)

// readPID waits for a process to write its pid to path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	poll(t, 30*time.Second, "the exec step to run", func() (bool, string) {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, err.Error()
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil, string(b)
	})
	return pid
}

// runHanging starts execution id of workflow wf, whose step writes its
// pid to pidFile and hangs until a timeout fails the execution, and
// returns the pid and the failed execution.
func (s *stack) runHanging(t *testing.T, wf, id, pidFile string) (int, projections.Execution) {
	t.Helper()
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: wf, ID: id})
	require.NoError(t, err)
	pid := readPID(t, pidFile)
	x := s.waitDone(t, id, 60*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	return pid, x
}

// finalReport returns the final report the agents stored for step of
// execution id (its failure when the execution was over), once there is
// one.
func (s *stack) finalReport(t *testing.T, id, step string) *events.OperationFailed {
	t.Helper()
	s.waitResult(t, id, step)
	evs, err := history.ReadStream(context.Background(), s.js, bus.StreamResults, bus.ExecutionResults(id), 0, 0)
	require.NoError(t, err)
	for _, ev := range evs {
		if f, ok := ev.Data.(*events.OperationFailed); ok && f.StepID == step {
			return f
		}
	}
	t.Fatalf("no failure of step %s of %s stored", step, id)
	return nil
}

// waitProjectedStep waits until the read model of execution id notes
// what became of step after the end.
func (s *stack) waitProjectedStep(t *testing.T, id, step string) projections.Execution {
	t.Helper()
	var x projections.Execution
	poll(t, 30*time.Second, "the read model of "+id+" to note "+step+" after the end", func() (bool, string) {
		var err error
		x, err = s.c.Execution(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		st, ok := findStep(x, step)
		return ok && st.AfterEnd != nil, describe(x)
	})
	return x
}

// terminatedReport waits until the read model of execution id holds the
// report of step's terminated attempt, recorded as its failure (the
// execution ran on) or noted after the end, and returns its error.
func (s *stack) terminatedReport(t *testing.T, id, step string) string {
	t.Helper()
	var why string
	poll(t, 30*time.Second, "the terminated step's report in the read model", func() (bool, string) {
		x, err := s.c.Execution(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		st, _ := findStep(x, step)
		switch {
		case st.AfterEnd != nil:
			why = st.AfterEnd.Error
		case st.Status == projections.OpFailed:
			why = st.Error
		}
		return why != "", describe(x)
	})
	return why
}

// TestStepTimeoutTerminatesItsProcess: when a step's timeout fires, its
// running attempt is terminated on the agent (SIGTERM to the exec's
// process group), not left to run on while the execution goes past it.
func TestStepTimeoutTerminatesItsProcess(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	s.apply(t, `name: slowpoke
steps:
  - id: hang
    kind: exec
    command: sh
    args: ["-c", "echo $$ > `+pidFile+`; sleep 120; echo finished"]
    timeout: 6s
`)
	pid, x := s.runHanging(t, "slowpoke", "t1", pidFile)
	require.Contains(t, x.Error, "attempt 1 timed out after 6s")

	poll(t, 30*time.Second, "the timed-out process to end", func() (bool, string) {
		return syscall.Kill(pid, 0) != nil, "process " + strconv.Itoa(pid) + " still runs"
	})
	f := s.finalReport(t, "t1", "hang")
	x = s.waitProjectedStep(t, "t1", "hang")
	st, _ := findStep(x, "hang")
	require.Equal(t, f.Error, st.AfterEnd.Error, "the termination is noted after the end")
	require.Contains(t, f.Error, agent.ErrTerminated.Error())
	require.Contains(t, f.Error, "attempt 1 timed out after 6s")
	require.Contains(t, f.Error, "SIGTERM sent")
	t.Logf("the terminated attempt reported: %s", f.Error)
}

// TestForceCancelledExecutionsTasksAreRefused: a task that waits in its
// queue when its execution is force-cancelled is refused by the agent
// that takes it later, without running; a resume runs the step again.
func TestForceCancelledExecutionsTasksAreRefused(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	s.apply(t, `name: queued
steps:
  - id: work
    kind: exec
    queue: later
    command: sh
    args: ["-c", "echo run >> `+marker+`"]
`)
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: "queued", ID: "q1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "q1", "work", projections.OpSending) // in queue later, which no agent serves yet
	code, body := postAction(t, s, "q1", `{"action":"force-cancel","reason":"not needed"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, projections.StatusCancelled, s.waitDone(t, "q1", 30*time.Second).Status)
	kills, err := s.js.Stream(context.Background(), bus.StreamKills)
	require.NoError(t, err)
	poll(t, 30*time.Second, "the notice that q1 ended", func() (bool, string) {
		m, err := kills.GetLastMsgForSubject(context.Background(), bus.KillSubject("q1"))
		if err != nil {
			return false, err.Error()
		}
		ev, err := bus.Decode(m.Header, m.Data)
		if err != nil {
			return false, err.Error()
		}
		_, ok := ev.Data.(*events.RefuseTasks)
		return ok, string(m.Data)
	})

	a, err := agent.New(agent.Config{Name: "later-agent", Queues: []string{"later"}, AckWait: 2 * time.Second,
		Policy: agent.Policy{AllowExec: true}}, s.js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	f := s.finalReport(t, "q1", "work")
	require.Contains(t, f.Error, agent.ErrEnded.Error())
	_, err = os.Stat(marker)
	require.ErrorIs(t, err, os.ErrNotExist, "the task of the cancelled execution ran")

	code, body = postAction(t, s, "q1", `{"action":"resume","reason":"needed after all"}`)
	require.Equal(t, http.StatusOK, code, body)
	var x projections.Execution
	poll(t, 60*time.Second, "the resumed execution to end", func() (bool, string) {
		x, err = s.c.Execution(context.Background(), "q1")
		return err == nil && x.Resumes == 1 && x.Status.Terminal(), describe(x)
	})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	b, err := os.ReadFile(marker)
	require.NoError(t, err)
	require.Equal(t, "run\n", string(b), "the step ran once, after the resume")
}

// TestWorkflowTimeoutTerminatesItsProcess: a workflow's timeout
// terminates the operation it abandons; its on-error steps run.
func TestWorkflowTimeoutTerminatesItsProcess(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	s.apply(t, `name: tooslow
timeout: 6s
on-error:
  - {id: note, kind: exec, command: echo, args: ["cleaned up"]}
steps:
  - id: hang
    kind: exec
    command: sh
    args: ["-c", "echo $$ > `+pidFile+`; sleep 120; echo finished"]
`)
	pid, x := s.runHanging(t, "tooslow", "w1", pidFile)
	require.Contains(t, x.Error, "the workflow timed out after 6s")
	note, ok := findStep(x, "on-error/note")
	require.True(t, ok, describe(x))
	require.Equal(t, projections.OpSucceeded, note.Status, "the on-error step ran")
	poll(t, 30*time.Second, "the abandoned process to end", func() (bool, string) {
		return syscall.Kill(pid, 0) != nil, "process " + strconv.Itoa(pid) + " still runs"
	})
	// Its report comes before the end (recorded as its failure, the on-error
	// step still running) or after it (noted after the end).
	why := s.terminatedReport(t, "w1", "hang")
	require.Contains(t, why, agent.ErrTerminated.Error())
	require.Contains(t, why, "the workflow timed out after 6s")
	require.Contains(t, why, "SIGTERM sent")
}

// TestHeartbeatRetriesAHungAttempt: an exec step with a heartbeat whose
// first attempt hangs without output is terminated and failed as lost,
// and its retry policy runs it again.
func TestHeartbeatRetriesAHungAttempt(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, `name: hangs
steps:
  - id: work
    kind: exec
    command: sh
    args: ["-c", "if [ \"$JETFLOW_ATTEMPT\" = 1 ]; then sleep 120; fi; echo done"]
    heartbeat: 3s
    retry: {limit: 3, backoff: {initial: 100ms}}
    output: ${trim(result.stdout)}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "hangs", ID: "h1"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	st, ok := findStep(x, "work")
	require.True(t, ok)
	require.GreaterOrEqual(t, st.Attempt, 2)
	var failed *events.StepFailed
	for _, ev := range s.history(t, "h1") {
		if f, ok := ev.Data.(*events.StepFailed); ok && failed == nil {
			failed = f // the first attempt's
		}
	}
	require.NotNil(t, failed, "the first attempt's failure is recorded")
	require.True(t, failed.Lost)
	require.Contains(t, failed.Error, agent.ErrNoHeartbeat.Error())
}

// TestCalledWorkflowTimeoutTerminatesItsProcess: a workflow called by name
// applies its own timeout: when it fires, the operation under way in the
// call is terminated, the called workflow's on-error steps run, the
// calling step fails with the timeout, and the caller's on-error handles
// it (the execution goes on and succeeds).
func TestCalledWorkflowTimeoutTerminatesItsProcess(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	s.apply(t, `name: slow-child
timeout: 6s
on-error:
  - {id: note, kind: log, message: "child: ${error.message}"}
steps:
  - id: hang
    kind: exec
    command: sh
    args: ["-c", "echo $$ > `+pidFile+`; sleep 120; echo finished"]
  - {id: never, kind: noop}
`)
	s.apply(t, `name: patient-parent
steps:
  - id: call
    kind: workflow
    workflow: slow-child
    on-error:
      - {id: saw, kind: let, vars: {why: "${error.message}"}}
  - {id: after, kind: noop}
output: ${vars.why}
`)
	_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: "patient-parent", ID: "c1"})
	require.NoError(t, err)
	pid := readPID(t, pidFile)
	x := s.waitDone(t, "c1", 60*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.JSONEq(t, `"workflow slow-child: the workflow timed out after 6s"`, string(x.Output))
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "call/on-error/note").Status, "the called workflow's on-error ran")
	never, ok := findStep(x, "call/never")
	require.True(t, !ok || never.Status == projections.OpNone, "the call's next step never ran")
	poll(t, 30*time.Second, "the abandoned process to end", func() (bool, string) {
		return syscall.Kill(pid, 0) != nil, "process " + strconv.Itoa(pid) + " still runs"
	})
	why := s.terminatedReport(t, "c1", "call/hang")
	require.Contains(t, why, agent.ErrTerminated.Error())
	require.Contains(t, why, "called by step call")
}
