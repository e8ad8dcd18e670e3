package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// maxInFlight replays a history and returns the largest number of
// operations under prefix that were with an agent at the same time.
func maxInFlight(evs []events.Event, prefix string) int {
	inFlight, most := map[string]bool{}, 0
	set := func(id string, on bool) {
		if !strings.HasPrefix(id, prefix) {
			return
		}
		if on {
			inFlight[id] = true
		} else {
			delete(inFlight, id)
		}
		most = max(most, len(inFlight))
	}
	for _, ev := range evs {
		switch p := ev.Data.(type) {
		case *events.ExecutionStarted:
			if p.Then != nil { // the first operation's dispatch, in the same event
				set(p.Then.StepID, true)
			}
		case *events.StepSending:
			set(p.StepID, true)
		case *events.StepDispatched: // scheduled and sending as one event
			set(p.StepID, true)
		case *events.StepSucceeded:
			set(p.StepID, false)
			if p.Then != nil { // the next operation's dispatch, in the same event
				set(p.Then.StepID, true)
			}
		case *events.StepFailed:
			set(p.StepID, false)
		}
	}
	return most
}

func TestForeachRunsAtMostConcurrencyAtOnce(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: fanout
steps:
  - id: each
    kind: foreach
    items: ${input.hosts}
    concurrency: 2
    steps:
      - id: deploy
        kind: exec
        command: sh
        args: ["-c", "sleep 0.3; echo deployed-$0", "${item}"]
        output: ${trim(result.stdout)}
      - id: check
        kind: let
        vars: {last: "${item}"}
    output: ${result}
  - id: after
    kind: return
    output: {deployed: "${steps.each.output}", count: "${len(steps.each.output)}"}
`)
	hosts := []any{"a", "b", "c", "d", "e"}
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "fanout", Input: map[string]any{"hosts": hosts}})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	// Each item's output is its last step's (the let has none, so deploy's).
	require.JSONEq(t, `{"deployed":["deployed-a","deployed-b","deployed-c","deployed-d","deployed-e"],"count":5}`, string(x.Output))
	evs := s.history(t, st.ID)
	requireLinear(t, evs)
	require.Equal(t, 2, maxInFlight(evs, "each["), "never more than concurrency operations at once, and it did use 2")
	for i := range 5 {
		require.Equal(t, 1, countTypes(evs)[string(events.TypeStepSucceeded)+"/"+"each["+string(rune('0'+i))+"]/deploy"])
	}

	// An empty list is done at once; a non-list is a clear failure.
	x = s.runToEnd(t, client.StartRequest{Workflow: "fanout", Input: map[string]any{"hosts": []any{}}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"deployed":[],"count":0}`, string(x.Output))
	x = s.runToEnd(t, client.StartRequest{Workflow: "fanout", Input: map[string]any{"hosts": "a"}})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "not a list")
}

func TestParallelSwitchAndBlocks(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: shapes
steps:
  - id: both
    kind: parallel
    branches:
      - id: slow
        steps:
          - {id: s, kind: exec, command: sh, args: ["-c", "sleep 0.5; echo slow"], output: "${trim(result.stdout)}"}
      - id: fast
        steps:
          - {id: f, kind: exec, command: echo, args: [fast], output: "${trim(result.stdout)}"}
  - id: race
    kind: parallel
    mode: first
    branches:
      - id: tortoise
        steps:
          - {id: t, kind: sleep, duration: 1h}
      - id: hare
        steps:
          - {id: h, kind: let, vars: {won: hare}}
  - id: route
    kind: switch
    cases:
      - when: ${input.env == "prod"}
        steps:
          - {id: p, kind: let, vars: {target: production}}
          - {id: pout, kind: return, output: "prod route, ${steps.both.output.fast}"}
      - when: ${input.env == "test"}
        steps:
          - {id: q, kind: let, vars: {target: testing}}
    default:
      - {id: d, kind: let, vars: {target: nowhere}}
  - id: block
    kind: workflow
    steps:
      - {id: inner, kind: let, vars: {inner: "${vars.target}"}}
  - id: end
    kind: return
    output: {both: "${steps.both.output}", race: "${steps.race.output.branch}", target: "${vars.target}", inner: "${vars.inner}"}
`)
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "shapes", Input: map[string]any{"env": "test"}})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"both":{"slow":"slow","fast":"fast"},"race":"hare","target":"testing","inner":"testing"}`, string(x.Output))
	// The tortoise sleeps an hour: that the execution ended at all shows
	// first-of did not wait for it, and its sleep stays waiting.
	require.Equal(t, projections.OpWaiting, stepByID(t, x, "race/tortoise/t").Status, "first-of did not wait for the slow branch")

	// A return inside a switch case ends the execution there.
	st, err = s.c.Start(ctx, client.StartRequest{Workflow: "shapes", Input: map[string]any{"env": "prod"}})
	require.NoError(t, err)
	x = s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `"prod route, fast"`, string(x.Output))
	require.Equal(t, projections.OpNone, stepByID(t, x, "block").Status, "steps after the return never ran")

	st, err = s.c.Start(ctx, client.StartRequest{Workflow: "shapes", Input: map[string]any{"env": "dev"}})
	require.NoError(t, err)
	x = s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	var out map[string]any
	require.NoError(t, json.Unmarshal(x.Output, &out))
	require.Equal(t, "nowhere", out["target"])
}

func TestCallingAnotherWorkflow(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: child
input:
  type: object
  required: [n]
  properties: {n: {type: integer}}
steps:
  - {id: double, kind: let, vars: {doubled: "${input.n * 2}"}}
  - {id: give, kind: exec, command: echo, args: ["${vars.doubled}"], output: "${int(trim(result.stdout))}"}
`)
	s.apply(t, `
name: parent
steps:
  - id: call
    kind: workflow
    workflow: child
    input: {n: "${input.n}"}
    output: ${result + 1}
  - id: done
    kind: return
    output: ${steps.call.output}
`)
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "parent", Input: map[string]any{"n": 20}})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `41`, string(x.Output))
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "call/give").Status)
	first := st.ID

	// The called workflow's input schema applies.
	st, err = s.c.Start(ctx, client.StartRequest{Workflow: "parent", Input: map[string]any{"n": "twenty"}})
	require.NoError(t, err)
	x = s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "input of workflow child")

	// Changing the called workflow does not change a running call: it was
	// pinned when the step started (checked through the recorded input).
	ev := s.history(t, first)
	var pinned bool
	for _, e := range ev {
		if p, ok := e.Data.(*events.StepScheduled); ok && p.StepID == "call" {
			pinned = strings.Contains(string(p.Input), `"definition"`)
		}
	}
	require.True(t, pinned)
}
