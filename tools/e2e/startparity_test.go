package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// verdict is how a start was refused: over HTTP, the error's code, field
// and message; over NATS, the rejection's.
type verdict struct {
	code, field, message string
}

// postCloudEvent posts a start CloudEvent in binary mode (the data as the
// body) and returns the status and the error it is answered with.
func postCloudEvent(t *testing.T, url, source, id, data string) (int, client.Error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/executions", strings.NewReader(data))
	require.NoError(t, err)
	for k, v := range map[string]string{"Ce-Specversion": "1.0", "Ce-Id": id, "Ce-Source": source,
		"Ce-Type": string(events.TypeStartExecution), "Content-Type": "application/json"} {
		req.Header.Set(k, v)
	}
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e struct {
		Error client.Error `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	return resp.StatusCode, e.Error
}

// rejectionOf publishes a start CloudEvent on NATS, as any client may, and
// returns the dispatcher's rejection of it.
func (s *stack) rejectionOf(t *testing.T, source, id, data string) *events.CommandRejected {
	t.Helper()
	m := nats.NewMsg(bus.SubjectStart)
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": id, "ce-source": source,
		"ce-type": string(events.TypeStartExecution), "content-type": "application/json"} {
		m.Header.Set(k, v)
	}
	m.Data = []byte(data)
	require.NoError(t, s.nc.PublishMsg(m))
	key := events.CommandKey(source, id)
	var rej *events.CommandRejected
	poll(t, 30*time.Second, "the rejection of "+key, func() (bool, string) {
		evs, err := history.ReadStream(context.Background(), s.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
		require.NoError(t, err)
		if len(evs) == 0 {
			return false, "no rejection yet"
		}
		var ok bool
		rej, ok = evs[0].Data.(*events.CommandRejected)
		require.True(t, ok, "the rejections stream holds %s", evs[0].Type)
		return true, ""
	})
	return rej
}

// TestStartRefusedAlikeOverHTTPAndNATS: a bad start is refused with the
// same field and message whether it comes to the api (as a CloudEvent,
// refused before anything is published; as a JSON request, which names
// the execution id "id") or straight on NATS to the dispatcher (a
// rejection): both run the one start check.
func TestStartRefusedAlikeOverHTTPAndNATS(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `name: typed
input:
  type: object
  required: [count]
  properties:
    count: {type: integer, minimum: 1}
    name: {type: string, maxLength: 3}
steps:
  - {id: a, kind: noop}
`)
	s.apply(t, "name: grouped\nretention: 2 hash ${input.team}\nsteps:\n  - {id: a, kind: noop}\n")
	s.apply(t, fmt.Sprintf("name: big\ndescription: %s\nsteps:\n  - {id: a, kind: noop}\n", strings.Repeat("x", 200_000)))
	taken, err := s.c.Start(ctx, client.StartRequest{Workflow: "typed", ID: "x-taken", Input: map[string]any{"count": 1}})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, taken.HTTPStatus)
	commands, err := history.ReadStream(ctx, s.js, bus.StreamCommands, bus.SubjectAPIStart, 0, 0)
	require.NoError(t, err)

	for _, c := range []struct {
		name, data string
		status     int
		want       verdict
		// json is the same start as a JSON request ("" when it cannot be one).
		json string
	}{
		{"SchemaMismatch", `{"workflow":"typed","input":{"count":"three"}}`, http.StatusBadRequest,
			verdict{"invalid", "input.count", "the input does not match workflow typed's input schema: input.count got string, want integer"},
			`{"workflow":"typed","input":{"count":"three"}}`},
		{"SchemaTwoProblems", `{"workflow":"typed","input":{"count":0,"name":"long"}}`, http.StatusBadRequest,
			verdict{"invalid", "input.count", "the input does not match workflow typed's input schema: input.count minimum: got 0, want 1; input.name maxLength: got 4, want 3"},
			`{"workflow":"typed","input":{"count":0,"name":"long"}}`},
		{"InputNotAnObject", `{"workflow":"typed","input":[1,2]}`, http.StatusBadRequest,
			verdict{"invalid", "input", "input must be a JSON object"}, `{"workflow":"typed","input":[1,2]}`},
		{"UnknownMember", `{"workflow":"typed","inptu":{"count":1}}`, http.StatusBadRequest,
			verdict{"invalid", "inptu", `data: unknown member "inptu"`}, ""},
		{"BadExecutionID", `{"workflow":"typed","execution_id":"no spaces allowed","input":{"count":1}}`, http.StatusBadRequest,
			verdict{"invalid", "execution_id", `execution_id "no spaces allowed" is not a valid execution id: ` + events.ExecutionIDRule},
			`{"workflow":"typed","id":"no spaces allowed","input":{"count":1}}`},
		{"NoWorkflow", `{"input":{"count":1}}`, http.StatusBadRequest,
			verdict{"invalid", "workflow", "workflow is required"}, `{"input":{"count":1}}`},
		{"BadVersion", `{"workflow":"typed","version":-1}`, http.StatusBadRequest,
			verdict{"invalid", "version", "version must be 0 (latest) or a positive version"}, `{"workflow":"typed","version":-1}`},
		{"NotRegistered", `{"workflow":"nope"}`, http.StatusNotFound,
			verdict{"not_found", "workflow", `workflow "nope" is not registered`}, `{"workflow":"nope"}`},
		{"NoSuchVersion", `{"workflow":"typed","version":9,"input":{"count":1}}`, http.StatusNotFound,
			verdict{"not_found", "version", `workflow "typed" has no version 9`}, `{"workflow":"typed","version":9,"input":{"count":1}}`},
		{"RetentionHashEmpty", `{"workflow":"grouped","input":{"team":" "}}`, http.StatusBadRequest,
			verdict{"invalid", "input", `retention hash "${input.team}" gives an empty key`}, `{"workflow":"grouped","input":{"team":" "}}`},
		// The first history event (the input and the pinned definition)
		// would not fit in a message (the message is checked below).
		{"TooLarge", fmt.Sprintf(`{"workflow":"big","execution_id":"big-1","input":{"blob":%q}}`, strings.Repeat("y", 900_000)), http.StatusBadRequest,
			verdict{"invalid", "input", ""}, fmt.Sprintf(`{"workflow":"big","id":"big-1","input":{"blob":%q}}`, strings.Repeat("y", 900_000))},
		{"IDTaken", `{"workflow":"typed","execution_id":"x-taken","input":{"count":2}}`, http.StatusConflict,
			verdict{"conflict", "execution_id", `execution id "x-taken" is already used (workflow typed); execution ids are unique forever`},
			`{"workflow":"typed","id":"x-taken","input":{"count":2}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			rej := s.rejectionOf(t, "urn:test:nats", "parity-"+c.name, c.data)
			overNATS := verdict{rej.Code, rej.Field, rej.Reason}
			want := c.want
			if want.message == "" {
				want.message = fmt.Sprintf("the input (%d bytes) and the pinned definition (", len(`{"blob":"`)+900_000+len(`"}`))
				require.True(t, strings.HasPrefix(rej.Reason, want.message), rej.Reason)
				require.True(t, strings.HasSuffix(rej.Reason, "bytes) make the execution's first event larger than the 1048576 bytes a message may hold; make the input smaller"), rej.Reason)
				want.message = rej.Reason
			}
			require.Equal(t, want, overNATS, "over NATS")

			status, e := postCloudEvent(t, s.info.APIURL, "urn:test:http", "parity-"+c.name, c.data)
			require.Equal(t, c.status, status, e.Message)
			code := e.Code
			if code == "invalid_input" { // the api's code for the input schema, with every problem
				code = events.CodeInvalid
				require.NotEmpty(t, e.Problems)
			}
			require.Equal(t, overNATS, verdict{code, e.Field, e.Message}, "a CloudEvent over HTTP")

			if c.json == "" {
				return
			}
			status, e = postJSON(t, s.info.APIURL+"/v1/executions", c.json, nil)
			require.Equal(t, c.status, status, e.Message)
			if want.field == "execution_id" { // the JSON request's name for it
				want.field = "id"
				want.message = strings.Replace(want.message, "execution_id ", "id ", 1)
			}
			if e.Code == "invalid_input" {
				e.Code = events.CodeInvalid
			}
			require.Equal(t, want, verdict{e.Code, e.Field, e.Message}, "a JSON request")
		})
	}

	// The api refused each before publishing anything.
	after, err := history.ReadStream(ctx, s.js, bus.StreamCommands, bus.SubjectAPIStart, 0, 0)
	require.NoError(t, err)
	require.Len(t, after, len(commands), "the api published none of the refused starts")
}
