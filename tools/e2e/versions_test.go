package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestResumeOnANewDefinitionVersion: executions that failed on version 1
// of a workflow are resumed on version 2, over HTTP, as a CloudEvent on
// NATS and with the CLI: the step version 2 kept is not run again (its
// result stays), the step it added runs, the failed step it removed and
// the step it no longer has are retired, and the switch is in the
// history and in jetflow show. Bad versions are refused, naming the
// field, and change nothing.
func TestResumeOnANewDefinitionVersion(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `name: evolve
steps:
  - {id: prep, kind: exec, command: sh, args: ["-c", "echo prepared at $$"], output: "${trim(result.stdout)}"}
  - {id: flaky, kind: exec, command: sh, args: ["-c", "exit 3"]}
  - {id: old, kind: log, message: version 1 only}
output: ${steps.prep.output}
`)
	for _, id := range []string{"ev-http", "ev-nats", "ev-cli"} {
		x := s.runToEnd(t, client.StartRequest{Workflow: "evolve", ID: id})
		require.Equal(t, projections.StatusFailed, x.Status, describe(x))
	}
	v2 := s.apply(t, `name: evolve
steps:
  - {id: prep, kind: exec, command: sh, args: ["-c", "echo prepared again"], output: "${trim(result.stdout)}"}
  - {id: added, kind: let, vars: {added: true}}
  - {id: fixed, kind: exec, command: echo, args: [fixed], output: "${trim(result.stdout)}"}
output: {prep: "${steps.prep.output}", fixed: "${steps.fixed.output}", flaky: "${steps.flaky?.output ?? 'gone'}"}
`)
	require.Equal(t, 2, v2.Version)

	t.Log("bad versions are refused, naming the field")
	for _, c := range []struct {
		body, field, msg string
		status           int
	}{
		{`{"action":"resume","version":0}`, "version", `must be a version number (1, 2, ...) or "latest", not 0`, http.StatusBadRequest},
		{`{"action":"resume","version":"newest"}`, "version", `must be a version number (1, 2, ...) or "latest", not "newest"`, http.StatusBadRequest},
		{`{"action":"cancel","version":2}`, "version", "version applies to resume, force-resume and replay only", http.StatusBadRequest},
	} {
		resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions/ev-http/actions", "application/json", bytes.NewReader([]byte(c.body)))
		require.NoError(t, err)
		var body struct {
			Error struct {
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, decodeJSON(resp, &body))
		require.Equal(t, c.status, resp.StatusCode, "%s: %s", c.body, body.Error.Message)
		require.Equal(t, c.field, body.Error.Field, "%s: %s", c.body, body.Error.Message)
		require.Contains(t, body.Error.Message, c.msg)
	}
	_, err := s.c.Act(ctx, "ev-http", client.ActionRequest{Action: events.ActionResume, Version: 9})
	var apiErr *client.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, http.StatusNotFound, apiErr.Status, apiErr.Message)
	require.Contains(t, apiErr.Message, "workflow evolve has no version 9")
	x, err := s.c.Execution(ctx, "ev-http")
	require.NoError(t, err)
	require.Equal(t, projections.StatusFailed, x.Status, "a refused move changes nothing")
	require.Equal(t, 1, x.Version)

	check := func(id string) {
		t.Helper()
		var x projections.Execution
		poll(t, doneAtLeast, id+" runs on version 2 to its end", func() (bool, string) {
			var err error
			x, err = s.c.Execution(ctx, id)
			if err != nil {
				return false, err.Error()
			}
			return x.Version == 2 && x.Resumes > 0 && x.Status.Terminal(), describe(x)
		})
		require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
		require.Equal(t, 2, x.Version)
		var out map[string]string
		require.NoError(t, json.Unmarshal(x.Output, &out))
		require.Regexp(t, `^prepared at \d+$`, out["prep"], "prep kept version 1's result")
		require.Equal(t, "fixed", out["fixed"])
		require.Equal(t, "gone", out["flaky"], "the removed step's result is not seen")
		prep := stepByID(t, x, "prep")
		require.Equal(t, 1, prep.Attempt, "prep was not run again")
		require.Equal(t, projections.OpSucceeded, stepByID(t, x, "added").Status)
		require.Len(t, x.VersionChanges, 1)
		require.Equal(t, 1, x.VersionChanges[0].From)
		require.Equal(t, 2, x.VersionChanges[0].To)
		require.ElementsMatch(t, []string{"flaky", "old"}, x.VersionChanges[0].Retired)
		var retired []string
		for _, st := range x.RetiredSteps {
			retired = append(retired, st.ID)
		}
		require.ElementsMatch(t, []string{"flaky", "old"}, retired)
		n := countTypes(s.history(t, id))
		require.Equal(t, 1, n[string(events.TypeDefinitionChanged)])
	}

	t.Log("over HTTP")
	acted, err := s.c.Act(ctx, "ev-http", client.ActionRequest{Action: events.ActionResume, Version: 2, Reason: "flaky replaced by fixed"})
	require.NoError(t, err)
	require.Equal(t, events.ActionResume, acted.Action)
	check("ev-http")

	t.Log("as a CloudEvent on NATS, to the latest version")
	ev := events.Event{ID: "resume-ev-nats", Type: events.TypeExecutionAction, Source: "urn:test:ops", Time: time.Now().UTC(),
		Data: &events.ExecutionAction{ExecutionID: "ev-nats", Action: events.ActionResume, Version: events.LatestVersion}}
	msg, err := bus.Encode(bus.SubjectAction, ev)
	require.NoError(t, err)
	require.Contains(t, string(msg.Data), `"version":"latest"`)
	require.NoError(t, s.nc.PublishMsg(msg))
	check("ev-nats")
	s.requireNoRejection(t, events.CommandKey(ev.Source, ev.ID))

	t.Log("with the CLI")
	cli := buildJetflow(t)
	out, err := runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "resume", "ev-cli", "--version", "soon")
	require.Error(t, err, out)
	require.Contains(t, out, `"soon" is not a version`)
	out, err = runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "resume", "ev-cli", "--version", "2")
	require.NoError(t, err, out)
	check("ev-cli")
	out, err = runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "ev-cli")
	require.NoError(t, err, out)
	require.Contains(t, out, "evolve (version 2)")
	require.Regexp(t, `version\s+1 -> 2 \(resume\) by `, out)
	require.Contains(t, out, "no longer has flaky, old")
	require.Regexp(t, `flaky\s+exec\s+failed, retired`, out)
}
