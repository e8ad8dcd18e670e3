package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// TestLongLoopsOfDispatcherSteps: a loop and a foreach made only of steps
// the dispatcher runs itself settle in one go (they used to stall until
// the janitor nudged them). The janitor never nudges here: it would only
// look at an execution idle for an hour. The test fails when the history
// stops growing for 10 s before the end (a stall), not on a slow machine
// where it keeps growing.
func TestLongLoopsOfDispatcherSteps(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.JanitorInterval, c.IdleAfter = time.Hour, time.Hour })
	ctx := context.Background()
	s.apply(t, `
name: spin
output: {n: "${vars.n}", each: "${len(steps.each.output)}"}
steps:
  - {id: init, kind: let, vars: {n: 0}}
  - {id: bump, kind: let, vars: {n: "${vars.n + 1}"}}
  - {id: again, kind: goto, target: bump, condition: "${vars.n < 40}"}
  - id: each
    kind: foreach
    items: ${0..29}
    concurrency: 30
    steps:
      - {id: v, kind: let, vars: {last: "${item}"}}
      - {id: r, kind: return, output: "${item}", condition: "${false}"}
`)
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "spin"})
	require.NoError(t, err)
	s.waitProgress(t, "spin", st.ID, 10*time.Second)
	x := s.waitDone(t, st.ID, 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"n":40,"each":30}`, string(x.Output))
}

// TestOutputMappingsSeeTheirFrame: an operation's output expression in a
// foreach sees item and index, in a block its sibling steps, in a wait the
// signal; they used to see only the top level.
func TestOutputMappingsSeeTheirFrame(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, `
name: frames
output: {each: "${steps.each.output}", block: "${steps.blk.output}"}
steps:
  - id: each
    kind: foreach
    items: [a, b]
    steps:
      - {id: say, kind: exec, command: echo, args: ["${item}"], output: "${trim(result.stdout) + '-' + string(index)}"}
  - id: blk
    kind: workflow
    steps:
      - {id: one, kind: exec, command: echo, args: ["1"], output: "${int(trim(result.stdout))}"}
      - {id: two, kind: exec, command: echo, args: ["2"], output: "${steps.one.output + int(trim(result.stdout))}"}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "frames"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"each":["a-0","b-1"],"block":3}`, string(x.Output))
}

// TestCalledWorkflowIsAWholeWorkflow: a workflow called by name keeps its
// own output expression, default retry policy and on-error steps, and a
// return in it ends it, not its caller.
func TestCalledWorkflowIsAWholeWorkflow(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	s.apply(t, fmt.Sprintf(`
name: child
output: {tries: "${steps.flaky.attempt}", note: "${vars.note}"}
retry: {limit: 3, backoff: {initial: 50ms}}
on-error:
  - {id: explain, kind: return, output: "child failed: ${error.message}"}
steps:
  - {id: early, kind: return, output: early-exit, condition: "${input.early}"}
  - id: flaky
    kind: exec
    command: sh
    args: ["-c", "n=$(cat %[1]s/$JETFLOW_EXECUTION_ID 2>/dev/null || echo 0); echo $((n+1)) > %[1]s/$JETFLOW_EXECUTION_ID; [ $n -ge 1 ]"]
  - {id: note, kind: let, vars: {note: done}}
  - {id: boom, kind: fail, message: "boom", condition: "${input.boom}"}
`, dir))
	s.apply(t, `
name: caller
steps:
  - {id: call, kind: workflow, workflow: child, input: {early: "${input.early}", boom: "${input.boom}"}}
  - {id: after, kind: return, output: {child: "${steps.call.output}", after: true}}
`)
	for name, tc := range map[string]struct {
		input map[string]any
		want  string
	}{
		"OutputAndRetry":  {map[string]any{"early": false, "boom": false}, `{"child":{"tries":2,"note":"done"},"after":true}`},
		"ReturnEndsChild": {map[string]any{"early": true, "boom": false}, `{"child":"early-exit","after":true}`},
		"OnErrorRescues":  {map[string]any{"early": false, "boom": true}, `{"child":"child failed: step call/boom failed: boom","after":true}`},
	} {
		st, err := s.c.Start(ctx, client.StartRequest{Workflow: "caller", Input: tc.input})
		require.NoError(t, err, name)
		x := s.waitDone(t, st.ID, 20*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status, "%s: %s", name, x.Error)
		require.JSONEq(t, tc.want, string(x.Output), name)
	}
}

// TestRetryAContainerFromOnError: a retry step in a container's on-error
// runs the container's steps again, as new instances.
func TestRetryAContainerFromOnError(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	dir := t.TempDir()
	s.apply(t, fmt.Sprintf(`
name: blockretry
steps:
  - id: blk
    kind: workflow
    steps:
      - id: once
        kind: exec
        command: sh
        args: ["-c", "n=$(cat %[1]s/$JETFLOW_EXECUTION_ID 2>/dev/null || echo 0); echo $((n+1)) > %[1]s/$JETFLOW_EXECUTION_ID; [ $n -ge 1 ]"]
    on-error:
      - {id: again, kind: retry, retry: {limit: 3, backoff: {initial: 50ms}}}
`, dir))
	x := s.runToEnd(t, client.StartRequest{Workflow: "blockretry"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, 2, stepByID(t, x, "blk").Attempt)
	require.Equal(t, projections.OpFailed, stepByID(t, x, "blk/once").Status)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "blk@2/once").Status)
	b, err := os.ReadFile(filepath.Join(dir, x.ID))
	require.NoError(t, err)
	require.Equal(t, "2", strings.TrimSpace(string(b)))
}

// TestSmallerFixes: versions that do not start at 1 are listed; the failed
// step of a failed handler is named by its path; expression failures of an
// operation are not retried.
func TestSmallerFixes(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: three\nversion: 3\nsteps:\n  - {id: a, kind: noop}\n")
	resp, err := apiHTTP.Get(s.info.APIURL + "/v1/workflows/three")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	s.apply(t, `
name: handlerfails
steps:
  - id: step
    kind: exec
    command: "false"
    on-error:
      - {id: inner, kind: fail, message: "handler gave up"}
`)
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "handlerfails"})
	require.NoError(t, err)
	s.waitDone(t, st.ID, 20*time.Second)
	var failedStep string
	for _, ev := range s.history(t, st.ID) {
		if p, ok := ev.Data.(*events.ExecutionFailed); ok {
			failedStep = p.StepID
		}
	}
	require.Equal(t, "step/on-error1/inner", failedStep)

	s.apply(t, "name: badexpr2\nsteps:\n  - {id: e, kind: exec, command: echo, args: [\"${input.a.b}\"], retry: {limit: 3, backoff: {initial: 10ms}}}\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "badexpr2"})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Equal(t, 1, stepByID(t, x, "e").Attempt, "an expression that cannot be evaluated is not retried")
}
