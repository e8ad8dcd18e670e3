package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// TestStartProblemsAnsweredBeforePublishing: the api refuses a bad start
// with the field and message of the start check (the dispatcher's
// rejection carries the same, see the e2e test
// TestStartRefusedAlikeOverHTTPAndNATS), as a JSON request (which names
// the execution id "id") and as a CloudEvent, and publishes nothing.
func TestStartProblemsAnsweredBeforePublishing(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", `name: typed
input:
  type: object
  required: [count]
  properties: {count: {type: integer, minimum: 1}}
steps:
  - {id: a, kind: noop}
`)
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "x-taken", claim.Record{CommandKey: "other#1", Workflow: "typed", ClaimedAt: time.Now()})
	require.NoError(t, err)

	for _, c := range []struct {
		name, json, ce string
		status         int
		code           string
		// field and message of the JSON request; the CloudEvent's are the
		// same with "execution_id" for "id".
		field, message string
	}{
		{"SchemaMismatch", `{"workflow":"typed","input":{"count":0}}`, `{"workflow":"typed","input":{"count":0}}`,
			http.StatusBadRequest, "invalid_input", "input.count", "the input does not match workflow typed's input schema: input.count minimum: got 0, want 1"},
		{"BadID", `{"workflow":"typed","id":"a b","input":{"count":1}}`, `{"workflow":"typed","execution_id":"a b","input":{"count":1}}`,
			http.StatusBadRequest, "invalid", "id", `id "a b" is not a valid execution id: ` + events.ExecutionIDRule},
		{"NotRegistered", `{"workflow":"nope"}`, `{"workflow":"nope"}`,
			http.StatusNotFound, "not_found", "workflow", `workflow "nope" is not registered`},
		{"IDTaken", `{"workflow":"typed","id":"x-taken","input":{"count":1}}`, `{"workflow":"typed","execution_id":"x-taken","input":{"count":1}}`,
			http.StatusConflict, "conflict", "id", `execution id "x-taken" is already used (workflow typed); execution ids are unique forever`},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := b.call(t, http.MethodPost, "/v1/executions", b.admin, "", c.json)
			require.Equal(t, c.status, a.status, "%s", a.body)
			require.Equal(t, c.code, a.err.Code)
			require.Equal(t, c.field, a.err.Field)
			require.Equal(t, c.message, a.err.Message)
			if c.code == "invalid_input" {
				require.NotEmpty(t, a.err.Problems)
			}

			ce := b.postCloudEvent(t, "ce-"+c.name, c.ce)
			field, message := c.field, c.message
			if field == "id" { // `id "a b" is not...` is `execution_id "a b" is not...` in a CloudEvent
				field = "execution_id"
				if c.code != "conflict" {
					message = "execution_" + message
				}
			}
			require.Equal(t, c.status, ce.status, ce.err.Message)
			require.Equal(t, c.code, ce.err.Code)
			require.Equal(t, field, ce.err.Field)
			require.Equal(t, message, ce.err.Message)
		})
	}

	cmds, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.CommandsPrefix+".>", 0, 0)
	require.NoError(t, err)
	require.Empty(t, cmds, "a refused start publishes nothing")
}

// postCloudEvent posts a start CloudEvent in binary mode with the admin
// token.
func (b *authBundle) postCloudEvent(t *testing.T, id, data string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+"/v1/executions", strings.NewReader(data))
	require.NoError(t, err)
	for k, v := range map[string]string{"Authorization": "Bearer " + b.admin, "Content-Type": "application/json",
		"Ce-Specversion": "1.0", "Ce-Id": id, "Ce-Source": "urn:test", "Ce-Type": string(events.TypeStartExecution)} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var wrapper struct {
		Error apiError `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&wrapper))
	return answer{status: resp.StatusCode, header: resp.Header, err: wrapper.Error}
}

// TestCommandsForAPendingExecutionAreNotRefused: an action for an
// execution whose start is accepted but not yet recorded (here: no
// dispatcher runs; in the cluster drills, the events stream was electing a
// leader after the dispatcher claimed the id) is passed on to the dispatcher, which handles it once the start
// is, instead of being refused as "has already pending".
func TestCommandsForAPendingExecutionAreNotRefused(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: later\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	// The dispatcher claimed the id for the start; its history has no
	// event yet.
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "p1", claim.Record{CommandKey: "user#start-p1", Workflow: "later", ClaimedAt: time.Now()})
	require.NoError(t, err)
	for _, action := range []string{"resume", "replay"} {
		a = b.call(t, http.MethodPost, "/v1/executions/p1/actions", b.admin, "", `{"action":"`+action+`","reason":"drill"}`)
		require.Equal(t, http.StatusAccepted, a.status, "%s: %s", action, a.body)
	}
}

// TestABadVersionIsRefusedNamingIt: an action's version that is no
// version is a 400 naming the member "version", with either
// implementation of encoding/json (the v2 one, Go 1.27's, does not name
// the member of an unmarshal method's error itself; make test/go1.26
// runs this with Go 1.26's v1 one).
func TestABadVersionIsRefusedNamingIt(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	for _, v := range []string{`0`, `"newest"`} {
		a := b.call(t, http.MethodPost, "/v1/executions/p1/actions", b.admin, "", `{"action":"resume","version":`+v+`}`)
		require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
		require.Equal(t, "invalid_json", a.err.Code)
		require.Equal(t, "version", a.err.Field)
		require.Equal(t, `must be a version number (1, 2, ...) or "latest", not `+v, a.err.Message)
	}
}

// TestStructuredStartWithAnyJSONMediaType: a structured CloudEvent's data
// is read inline as JSON for every JSON media type, as the CloudEvents
// JSON format says (sdk-go alone reads it so for application/json and
// text/json only, and wants a string for the others); a JSON string is
// then a string, not a start; a type that is not JSON is refused naming
// datacontenttype, whatever data holds.
func TestStructuredStartWithAnyJSONMediaType(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: media\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)

	for i, c := range []struct {
		contentType, data string
		status            int
		field, message    string
	}{
		{"application/vnd.acme.order+json", `{"workflow":"media"}`, http.StatusAccepted, "", ""},
		{"Application/JSON", `{"workflow":"media"}`, http.StatusAccepted, "", ""},
		{"application/json; charset=utf-8", `{"workflow":"media"}`, http.StatusAccepted, "", ""},
		{"text/json", `{"workflow":"media"}`, http.StatusAccepted, "", ""},
		{"application/vnd.acme.order+json", `"{\"workflow\":\"media\"}"`, http.StatusBadRequest, "data", "must be a JSON object"},
		{"text/plain", `{"workflow":"media"}`, http.StatusBadRequest, "datacontenttype",
			`datacontenttype "text/plain" is not JSON, yet data is not a string: jetflow reads data as JSON; set datacontenttype to application/json, or leave it out`},
		{"text/plain", `"{\"workflow\":\"media\"}"`, http.StatusBadRequest, "datacontenttype",
			`datacontenttype "text/plain" is not JSON: jetflow reads data as JSON; set it to application/json, or leave it out`},
	} {
		ce := fmt.Sprintf(`{"specversion":"1.0","id":"media-%d","source":"urn:test","type":%q,"datacontenttype":%q,"data":%s}`,
			i, events.TypeStartExecution, c.contentType, c.data)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+"/v1/executions", strings.NewReader(ce))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/cloudevents+json")
		req.Header.Set("Authorization", "Bearer "+b.admin)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var answer struct {
			ID    string   `json:"id"`
			Error apiError `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s: %+v", ce, answer)
		if c.status != http.StatusAccepted {
			require.Equal(t, c.field, answer.Error.Field, ce)
			require.Contains(t, answer.Error.Message, c.message, ce)
			continue
		}
		require.Equal(t, events.DerivedExecutionID(events.CommandKey("urn:test", fmt.Sprintf("media-%d", i))), answer.ID, ce)
	}

	cmds, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.CommandsPrefix+".>", 0, 0)
	require.NoError(t, err)
	require.Len(t, cmds, 4, "the four JSON starts published, nothing else")
	for _, c := range cmds {
		require.Equal(t, "media", c.Data.(*events.StartExecution).Workflow)
	}
}

// TestTheLatestShownIsTheOneStarted: a version stored by an apply that
// stopped before moving the latest pointer (its process killed between
// the two writes) is listed, readable by its number, and neither shown as
// the latest nor started by name; a workflow whose first apply stopped so
// is not registered.
func TestTheLatestShownIsTheOneStarted(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: half\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	kv, err := b.js.KeyValue(t.Context(), bus.BucketDefinitions)
	require.NoError(t, err)
	stopped := func(name, version string) {
		t.Helper()
		rec := fmt.Sprintf(`{"name":%q,"version":%s,"digest":"x","created_at":"2026-12-04T00:00:00Z","definition":{"name":%q,"steps":[{"id":"b","kind":"noop"}]}}`, name, version, name)
		_, err := kv.Create(t.Context(), "def."+name+"."+version, []byte(rec))
		require.NoError(t, err)
	}
	stopped("half", "2")

	a = b.call(t, http.MethodGet, "/v1/workflows/half", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var wf struct {
		Latest   struct{ Version int } `json:"latest"`
		Versions []int                 `json:"versions"`
	}
	require.NoError(t, json.Unmarshal(a.body, &wf))
	require.Equal(t, 1, wf.Latest.Version, "the version a start by name takes")
	require.Equal(t, []int{1, 2}, wf.Versions)
	a = b.call(t, http.MethodGet, "/v1/workflows/half/versions/2", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)

	stopped("never", "1")
	a = b.call(t, http.MethodGet, "/v1/workflows/never", b.admin, "", "")
	require.Equal(t, http.StatusNotFound, a.status, "%s", a.body)
	require.Contains(t, a.err.Message, "no apply of it completed")
	a = b.call(t, http.MethodPost, "/v1/executions", b.admin, "", `{"workflow":"never"}`)
	require.Equal(t, http.StatusNotFound, a.status, "%s", a.body)
}

// TestWholeNumbersAreNotCut: a version with a fraction is refused with the
// field at fault, in a definition and in a start, rather than cut to the
// whole number below it; a definition's version 0 is refused, not taken as
// no version.
func TestWholeNumbersAreNotCut(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	for _, c := range []struct{ body, field, message string }{
		{`{"name":"frac","version":3.7,"steps":[{"id":"a","kind":"noop"}]}`, "version", "must be a whole number, not 3.7"},
		{"name: frac\nversion: 0\nsteps:\n  - {id: a, kind: noop}\n", "version", "must be a positive version number"},
		{"name: frac\nsteps:\n  - {id: a, kind: noop, retry: {limit: 2.5}}\n", "steps[0].retry.limit", "must be a whole number, not 2.5"},
	} {
		a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", c.body)
		require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
		require.Equal(t, c.field, a.err.Field, "%s", a.body)
		require.Contains(t, a.err.Message, c.message)
	}
	a := b.call(t, http.MethodGet, "/v1/workflows/frac", b.admin, "", "")
	require.Equal(t, http.StatusNotFound, a.status, "nothing was stored: %s", a.body)

	a = b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: frac\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	a = b.call(t, http.MethodPost, "/v1/executions", b.admin, "", `{"workflow":"frac","version":2.5}`)
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	require.Equal(t, "version", a.err.Field)
	require.Equal(t, "must be a whole number, not 2.5", a.err.Message)
}

// TestNoVersionLeftIsAConflict: a workflow given the highest version
// number takes no new version without one (the registry numbers past the
// highest): 409 on the field version, nothing stored; one given a
// version goes in.
func TestNoVersionLeftIsAConflict(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: top\nversion: 9007199254740991\nsteps:\n  - {id: a, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	a = b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: top\nsteps:\n  - {id: b, kind: noop}\n")
	require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
	require.Equal(t, "version", a.err.Field)
	require.Contains(t, a.err.Message, "workflow top holds version 9007199254740991, the highest a version can have")
	a = b.call(t, http.MethodGet, "/v1/workflows/top", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var wf struct {
		Versions []int `json:"versions"`
	}
	require.NoError(t, json.Unmarshal(a.body, &wf))
	require.Equal(t, []int{9007199254740991}, wf.Versions, "nothing stored")
	a = b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", "name: top\nversion: 2\nsteps:\n  - {id: b, kind: noop}\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
}

// TestStartBodyEmptyOrCutShort: a start whose JSON body is empty or ends
// before its value does is told so, and where, not "EOF".
func TestStartBodyEmptyOrCutShort(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	for body, want := range map[string]string{
		"":                     "the body is empty (no JSON value)",
		"  \n":                 "the body is empty (no JSON value)",
		`{"workflow":"hello",`: "the body is not valid JSON at byte 20: unexpected end of JSON input",
	} {
		a := b.call(t, http.MethodPost, "/v1/executions", b.admin, "", body)
		require.Equal(t, http.StatusBadRequest, a.status, "%q: %s", body, a.body)
		require.Equal(t, "invalid_json", a.err.Code)
		require.Equal(t, want, a.err.Message, "%q", body)
	}
}
