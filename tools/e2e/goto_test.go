package e2e

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
)

func TestGotoLoopsAndEnds(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: loop
output: {n: "${vars.n}", said: "${steps.work.output}"}
steps:
  - {id: init, kind: let, vars: {n: 0}}
  - {id: bump, kind: let, vars: {n: "${vars.n + 1}"}}
  - {id: again, kind: goto, target: bump, condition: "${vars.n < input.times}"}
  - {id: work, kind: exec, command: echo, args: ["n=${vars.n}"], output: "${trim(result.stdout)}"}
  - {id: out, kind: goto, target: end}
  - {id: never, kind: fail, message: unreachable}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "loop", Input: map[string]any{"times": 3}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"n":3,"said":"n=3"}`, string(x.Output))
	// Each round's steps are new instances; nothing was rewritten.
	for _, id := range []string{"bump", "bump~1", "bump~2", "again", "again~1"} {
		require.Equal(t, projections.OpSucceeded, stepByID(t, x, id).Status, id)
	}
	require.Equal(t, projections.OpSkipped, stepByID(t, x, "again~2").Status)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "work~2").Status)
	require.Equal(t, projections.OpNone, stepByID(t, x, "never").Status)
	requireLinear(t, s.history(t, x.ID))

	// A goto inside a foreach body loops within its item: count to the item.
	s.apply(t, `
name: innerloop
output: ${steps.each.output}
steps:
  - id: each
    kind: foreach
    items: [2, 3]
    steps:
      - {id: reset, kind: let, vars: {c: 0}}
      - {id: tick, kind: let, vars: {c: "${vars.c + 1}"}}
      - {id: back, kind: goto, target: tick, condition: "${vars.c < item}"}
      - {id: report, kind: exec, command: echo, args: ["${vars.c}"], output: "${int(trim(result.stdout))}"}
`)
	x = s.runToEnd(t, client.StartRequest{Workflow: "innerloop"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `[2,3]`, string(x.Output))
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "each[1]/tick~2").Status)
	require.Equal(t, projections.OpSkipped, stepByID(t, x, "each[1]/back~2").Status)

	// A goto to a step of another list is refused at apply time.
	_, err := s.c.ApplyWorkflow(ctx, []byte("name: badgoto\nsteps:\n  - id: a\n    kind: goto\n    target: nowhere\n"))
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "steps[0].target", apiErr.Field)
}
