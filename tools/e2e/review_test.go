package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestLetIsOneEvent: setting variables and finishing the let step is one
// event, so re-deciding after any interruption cannot apply it twice.
func TestLetIsOneEvent(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: letone\noutput: ${vars.n}\nsteps:\n  - {id: init, kind: let, vars: {n: 0}}\n  - {id: inc, kind: let, vars: {n: \"${vars.n + 1}\"}}\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "letone"})
	require.JSONEq(t, `1`, string(x.Output))
	n := 0
	for _, ev := range s.history(t, x.ID) {
		data := ev.Data
		if end, ok := data.(*events.ExecutionSucceeded); ok && end.Step != nil {
			data = end.Step // the last step's success, carried by the end (docs/adr/0015)
		}
		switch p := data.(type) {
		case *events.VariablesSet:
			t.Fatalf("variables set in a separate event: %+v", p)
		case *events.StepSucceeded:
			if p.StepID == "inc" {
				require.JSONEq(t, `1`, string(p.Vars["n"]))
				n++
			}
		}
	}
	require.Equal(t, 1, n)
}

// TestOversizedOutputFailsClearly: a foreach whose collected outputs are
// too large for one event fails with that reason instead of retrying an
// append that can never fit.
func TestOversizedOutputFailsClearly(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: bigfan
steps:
  - id: each
    kind: foreach
    items: [1, 2, 3, 4, 5, 6]
    concurrency: 6
    steps:
      - {id: gen, kind: exec, command: sh, args: ["-c", "head -c 200000 /dev/zero | tr '\\0' x"], output: "${result.stdout}"}
`)
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "bigfan"})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "the step's output is")
}

// TestHandlersSeeTheRightError: error.step is the failed step's own id,
// and output mappings in the workflow's on-error see error.message.
func TestHandlersSeeTheRightError(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: errnames
on-error:
  - {id: note, kind: wait, signal: never, timeout: 1s, output: "${error.message}", condition: "${false}"}
  - {id: ret, kind: return, output: {direct: "${error.message}", inner: "${vars.inner}"}}
steps:
  - id: each
    kind: foreach
    items: [a]
    steps:
      - id: op
        kind: exec
        command: "false"
        on-error:
          - {id: remember, kind: let, vars: {inner: "${error.step}"}}
  - {id: boom, kind: fail, message: kaboom}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "errnames"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"direct":"step boom failed: kaboom","inner":"op"}`, string(x.Output))

	// Ids that on-error steps' paths use are reserved.
	_, err := s.c.ApplyWorkflow(ctx, []byte("name: reserved\nsteps:\n  - {id: on-error1, kind: noop}\n"))
	require.Error(t, err)
	_, err = s.c.ApplyWorkflow(ctx, []byte("name: reserved2\nsteps:\n  - id: p\n    kind: parallel\n    branches:\n      - {id: on-error, steps: [{id: a, kind: noop}]}\n"))
	require.Error(t, err)
}
