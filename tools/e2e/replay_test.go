package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// incrementWorkflow is the seed's atomic increment on a counter file: the
// write crashes once (after writing) while the file crash exists, and the
// read waits while the file hold exists.
func incrementWorkflow(dir string) string {
	count, crash, hold := filepath.Join(dir, "count"), filepath.Join(dir, "crash"), filepath.Join(dir, "hold")
	return `name: increment
replayable: from start
steps:
  - id: read
    kind: exec
    command: sh
    args: ["-c", "i=0; while [ -e '` + hold + `' ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; cat '` + count + `'"]
  - {id: load, kind: let, vars: {x: "${int(trim(steps.read.output.stdout))}"}}
  - {id: inc, kind: let, replayable: from here only, vars: {x: "${vars.x + 1}"}}
  - id: write
    kind: exec
    command: sh
    args: ["-c", "echo ${vars.x} > ` + count + `; if [ -e ` + crash + ` ]; then rm ` + crash + `; exit 1; fi"]
  - {id: after, kind: replayable, replayable: from here}
`
}

func readCount(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "count"))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// TestReplayAtomicIncrementOverHTTP: the write fails after it wrote; a
// replay resuming (over HTTP) replays from inc with x as it was there, so
// the counter is incremented once. A replay from start (a CloudEvent,
// forced past the "from here only") reads the counter again and
// increments it again; the CLI replays from a step.
func TestReplayAtomicIncrementOverHTTP(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "count"), []byte("41\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "crash"), nil, 0o600))
	s.apply(t, incrementWorkflow(dir))
	x := s.runToEnd(t, client.StartRequest{Workflow: "increment", ID: "inc1"})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Equal(t, "42", readCount(t, dir), "the write wrote before it failed")

	code, body := postAction(t, s, "inc1", `{"action":"replay","from":"start","reason":"try"}`)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body["error"].(map[string]any)["message"], "cleared the start")
	// It names what would be accepted instead, and the next replay is one of those.
	require.Contains(t, body["error"].(map[string]any)["message"], "; accepted now: replay from resume, from last or from start with force")

	code, body = postAction(t, s, "inc1", `{"action":"replay","reason":"the counter service was restarted","requested_by":"ops"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool {
		var err error
		x, err = s.c.Execution(ctx, "inc1")
		return err == nil && len(x.Replays) == 1 && x.Status.Terminal()
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, "42", readCount(t, dir), "incremented exactly once")
	require.Equal(t, "inc", x.Replays[0].Point)
	require.Equal(t, "ops", x.Replays[0].RequestedBy)
	require.Equal(t, 1, stepByID(t, x, "read").Attempt, "read did not run again")
	require.Equal(t, 2, stepByID(t, x, "write").Attempt)
	require.JSONEq(t, `42`, string(x.Vars["x"]))

	t.Log("replay from start, forced, as a CloudEvent: the counter is read again")
	// The replayed read is held, so that the copy of the event arrives
	// while the execution runs again (where another replay is allowed).
	hold := filepath.Join(dir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o600))
	t.Cleanup(func() { _ = os.Remove(hold) })
	ev := events.Event{ID: "replay-inc1", Type: events.TypeExecutionAction, Source: "urn:test:ops", Time: time.Now().UTC(),
		Data: &events.ExecutionAction{ExecutionID: "inc1", Action: events.ActionReplay, From: events.ReplayStart, Force: true}}
	msg, err := bus.Encode(bus.SubjectAction, ev)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(msg))
	require.NoError(t, s.nc.PublishMsg(msg)) // the same event twice is one replay
	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, "inc1")
		st, ok := findStep(x, "read")
		return err == nil && ok && st.Attempt >= 2 && st.Status == projections.OpStarted
	}, 20*time.Second, 20*time.Millisecond, "the replayed read runs")
	s.waitCommandsHandled(t)
	s.requireNoRejection(t, events.CommandKey(ev.Source, ev.ID))
	s.requireCountStays(t, "inc1", string(events.TypeExecutionReplayed), 2)
	require.NoError(t, os.Remove(hold))
	require.Eventually(t, func() bool {
		x, err = s.c.Execution(ctx, "inc1")
		return err == nil && len(x.Replays) == 2 && x.Status.Terminal()
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, "43", readCount(t, dir))
	require.Equal(t, 2, stepByID(t, x, "read").Attempt)

	t.Log("the CLI replays from a step; inc is the replay point before write")
	out, err := runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "replay", "inc1", "--from", "write", "--reason", "rewrite")
	require.NoError(t, err, out)
	require.Contains(t, out, "replay of execution inc1 recorded")
	require.Eventually(t, func() bool {
		x, err = s.c.Execution(ctx, "inc1")
		return err == nil && len(x.Replays) == 3 && x.Status.Terminal()
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, "43", readCount(t, dir), "x restored to 42 at inc: 43 written again")
	require.Equal(t, "inc", x.Replays[2].Point)
	out, err = runCmd(ctx, buildJetflow(t), "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "inc1")
	require.NoError(t, err, out)
	require.Contains(t, out, "replayed")
	requireLinear(t, s.history(t, "inc1"))
}

func TestReplayBadInput(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: small\nsteps:\n  - {id: a, kind: noop}\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "small", ID: "sm1"})
	require.Equal(t, projections.StatusSucceeded, x.Status)
	before := len(s.history(t, "sm1"))
	for _, c := range []struct {
		body, field string
		code        int
	}{
		{`{"action":"replay","from":"a b"}`, "from", http.StatusBadRequest},
		{`{"action":"cancel","from":"a"}`, "from", http.StatusBadRequest},
		{`{"action":"resume","force":true}`, "force", http.StatusBadRequest},
		{`{"action":"replay","force":"yes"}`, "force", http.StatusBadRequest},
		{`{"action":"replay","from":"nosuch"}`, "", http.StatusConflict},
		{`{"action":"replay"}`, "", http.StatusConflict}, // nothing to resume in a succeeded execution
	} {
		code, body := postAction(t, s, "sm1", c.body)
		require.Equal(t, c.code, code, "%s: %v", c.body, body)
		if c.field != "" {
			require.Equal(t, c.field, body["error"].(map[string]any)["field"], c.body)
		}
	}
	require.Len(t, s.history(t, "sm1"), before, "refused replays change nothing")
}
