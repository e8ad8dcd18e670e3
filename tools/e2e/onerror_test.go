package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
)

func TestOnError(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	s.apply(t, `
name: recover
output: {note: "${vars.note}", after: "${steps.after.status}"}
steps:
  - id: risky
    kind: exec
    command: sh
    args: ["-c", "echo broken >&2; exit 4"]
    on-error:
      - {id: note, kind: let, vars: {note: "recovered from ${error.step}: ${error.message}"}}
  - {id: after, kind: noop}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "recover"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"note":"recovered from risky: command sh: exit status 4","after":"succeeded"}`, string(x.Output))
	require.Equal(t, projections.OpFailed, stepByID(t, x, "risky").Status, "the failure stays recorded")

	// retry within on-error runs the failed step again (the command
	// succeeds on its third run); fail within on-error fails it.
	_, err := s.c.ApplyWorkflow(ctx, []byte(strings.ReplaceAll(fmt.Sprintf(`
name: again
steps:
  - id: flaky
    kind: exec
    command: sh
    args: ["-c", "n=$(cat %[1]s/$JETFLOW_EXECUTION_ID 2>/dev/null || echo 0); echo $((n+1)) > %[1]s/$JETFLOW_EXECUTION_ID; [ $n -ge ${input.needed} ]"]
    on-error:
      - {id: log, kind: log, message: "attempt ${error.attempt} failed"}
      - {id: retry, kind: retry, retry: {limit: 3, backoff: {initial: 100ms}}}
      - {id: give-up, kind: fail, message: "unreachable: retry ends the on-error steps"}
`, dir), "\t", "  ")))
	require.NoError(t, err)
	x = s.runToEnd(t, client.StartRequest{Workflow: "again", ID: "again-ok", Input: map[string]any{"needed": 2}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, 3, stepByID(t, x, "flaky").Attempt)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "flaky/on-error1/retry").Status)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "flaky/on-error2/retry").Status)
	b, err := os.ReadFile(filepath.Join(dir, "again-ok"))
	require.NoError(t, err)
	require.Equal(t, "3", strings.TrimSpace(string(b)))

	x = s.runToEnd(t, client.StartRequest{Workflow: "again", ID: "again-no", Input: map[string]any{"needed": 10}})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "no retries left")
	require.Equal(t, 3, stepByID(t, x, "flaky").Attempt)

	// goto within on-error moves in the failed step's list; the workflow's
	// on-error runs before it fails, and a return there rescues it.
	s.apply(t, `
name: detour
on-error:
  - {id: cleanup, kind: let, vars: {cleaned: true}}
  - {id: rescue, kind: return, condition: "${input.rescue}", output: "rescued after: ${error.message}"}
steps:
  - id: first
    kind: exec
    command: "false"
    on-error:
      - {id: skip, kind: goto, target: fallback}
  - {id: never, kind: fail, message: skipped over}
  - {id: fallback, kind: fail, message: "fallback failed too"}
`)
	for rescue, want := range map[bool]projections.Status{true: projections.StatusSucceeded, false: projections.StatusFailed} {
		st, err := s.c.Start(ctx, client.StartRequest{Workflow: "detour", Input: map[string]any{"rescue": rescue}})
		require.NoError(t, err)
		x = s.waitDone(t, st.ID, 20*time.Second)
		require.Equal(t, want, x.Status, "rescue=%v: %s", rescue, x.Error)
		require.Equal(t, projections.OpNone, stepByID(t, x, "never").Status)
		require.JSONEq(t, `true`, string(x.Vars["cleaned"]), "the workflow's on-error ran")
		if rescue {
			require.Contains(t, string(x.Output), "fallback failed too")
		} else {
			require.Contains(t, x.Error, "fallback failed too")
		}
	}

	// retry outside on-error, and goto in the workflow's on-error, are refused.
	_, err = s.c.ApplyWorkflow(ctx, []byte("name: badretry\nsteps:\n  - id: r\n    kind: retry\n    retry: {limit: 2}\n"))
	require.Error(t, err)
	_, err = s.c.ApplyWorkflow(ctx, []byte("name: badgoto2\non-error:\n  - {id: g, kind: goto, target: a}\nsteps:\n  - {id: a, kind: noop}\n"))
	require.Error(t, err)
}
