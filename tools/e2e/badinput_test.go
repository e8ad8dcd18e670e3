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
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
)

func postJSON(t *testing.T, url, body string, hdr map[string]string) (int, client.Error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var e struct {
		Error client.Error `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error
}

func TestOversizedAndRetriedRequests(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	// A definition of ~200 KB and an input of ~900 KB each fit in a message,
	// but the first history event would not: the start is refused, and the
	// id stays free for a corrected request.
	s.apply(t, fmt.Sprintf("name: big\ndescription: %s\nsteps:\n  - id: a\n    kind: noop\n", strings.Repeat("x", 200_000)))
	huge := fmt.Sprintf(`{"workflow":"big","id":"big-1","input":{"blob":%q}}`, strings.Repeat("y", 900_000))
	status, e := postJSON(t, s.info.APIURL+"/v1/executions", huge, map[string]string{"Idempotency-Key": "huge-1"})
	require.Equal(t, http.StatusBadRequest, status, e.Message)
	require.Contains(t, e.Message, "larger than the")
	// Retrying the same request gets the same answer, not a 202 for a
	// command that will never run.
	status, e = postJSON(t, s.info.APIURL+"/v1/executions", huge, map[string]string{"Idempotency-Key": "huge-1"})
	require.Equal(t, http.StatusBadRequest, status, e.Message)
	require.Contains(t, e.Message, "larger than the")
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "big", ID: "big-1"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, st.HTTPStatus)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, "big-1", 20*time.Second).Status)

	// A body over the api's limit is a 413.
	status, e = postJSON(t, s.info.APIURL+"/v1/executions", `{"workflow":"big","input":{"b":"`+strings.Repeat("z", 1100_000)+`"}}`, nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "too_large", e.Code)

	// The wrong method on a known path is a 405 that says what is allowed.
	req, _ := http.NewRequest(http.MethodDelete, s.info.APIURL+"/v1/workflows", nil)
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, "GET, POST", resp.Header.Get("Allow"))

	// A retried JSON start with the same Idempotency-Key gets the same execution.
	body := `{"workflow":"big","input":{"n":1}}`
	status, _ = postJSON(t, s.info.APIURL+"/v1/executions", body, map[string]string{"Idempotency-Key": "req-7"})
	require.Equal(t, http.StatusCreated, status)
	status, _ = postJSON(t, s.info.APIURL+"/v1/executions", body, map[string]string{"Idempotency-Key": "req-7"})
	require.Equal(t, http.StatusOK, status)
	s.waitProjected(t) // the list comes from the read models
	list, _, err := s.c.ListExecutions(ctx, client.ListOptions{Workflow: "big"})
	require.NoError(t, err)
	require.Len(t, list, 2, "big-1 and the one idempotent start")

	// A CloudEvent without a source names no wrong field and is one line.
	req, _ = http.NewRequest(http.MethodPost, s.info.APIURL+"/v1/executions", strings.NewReader(`{"workflow":"big"}`))
	req.Header.Set("Ce-Specversion", "1.0")
	req.Header.Set("Ce-Id", "x")
	req.Header.Set("Ce-Type", "io.jetflow.execution.start")
	req.Header.Set("Content-Type", "application/json")
	resp, err = apiHTTP.Do(req)
	require.NoError(t, err)
	var ce struct {
		Error client.Error `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ce))
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.NotEqual(t, "type", ce.Error.Field)
	require.Contains(t, ce.Error.Message, "source")
	require.NotContains(t, ce.Error.Message, "\n")
}

// TestStartOverNATSWithBadInputIsRejected publishes start CloudEvents
// straight on NATS (no api in between to check them): each bad one gets a
// rejection with code invalid on the rejections stream, saying why, and
// leaves nothing behind (no claimed id, no history, no read model).
func TestStartOverNATSWithBadInputIsRejected(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `name: typed
input:
  type: object
  required: [count]
  properties: {count: {type: integer, minimum: 1}}
steps:
  - {id: a, kind: noop}
`)
	ids, err := claim.Open(ctx, s.js)
	require.NoError(t, err)
	for _, c := range []struct {
		name, data, execID, reason string
	}{
		{"SchemaMismatch", `{"workflow":"typed","execution_id":"bad-1","input":{"count":"three"}}`, "bad-1", "the input does not match workflow typed's input schema: input.count"},
		{"BelowMinimum", `{"workflow":"typed","execution_id":"bad-2","input":{"count":0}}`, "bad-2", "input.count"},
		{"InputNotAnObject", `{"workflow":"typed","execution_id":"bad-3","input":[1,2]}`, "bad-3", "input"},
		{"UnknownMember", `{"workflow":"typed","execution_id":"bad-4","inptu":{"count":1}}`, "bad-4", "inptu"},
		{"BadExecutionID", `{"workflow":"typed","execution_id":"no spaces allowed","input":{"count":1}}`, "no spaces allowed", "execution_id"},
		{"NoWorkflow", `{"execution_id":"bad-6","input":{"count":1}}`, "bad-6", "workflow is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := nats.NewMsg(bus.SubjectStart)
			for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "start-" + c.name, "ce-source": "urn:test:nats",
				"ce-type": string(events.TypeStartExecution), "content-type": "application/json"} {
				m.Header.Set(k, v)
			}
			m.Data = []byte(c.data)
			require.NoError(t, s.nc.PublishMsg(m))
			key := events.CommandKey("urn:test:nats", "start-"+c.name)
			var rej *events.CommandRejected
			poll(t, 20*time.Second, "the rejection of "+key, func() (bool, string) {
				evs, err := history.ReadStream(ctx, s.js, bus.StreamRejections, bus.RejectionSubject(key), 0, 0)
				require.NoError(t, err)
				if len(evs) == 0 {
					return false, "no rejection yet"
				}
				require.Len(t, evs, 1)
				var ok bool
				rej, ok = evs[0].Data.(*events.CommandRejected)
				require.True(t, ok, "the rejections stream holds %s", evs[0].Type)
				return true, ""
			})
			require.Equal(t, events.CodeInvalid, rej.Code, rej.Reason)
			require.Equal(t, key, rej.CommandKey)
			require.Equal(t, events.TypeStartExecution, rej.CommandType)
			require.Equal(t, c.execID, rej.ExecutionID)
			require.Contains(t, rej.Reason, c.reason)

			if events.ValidExecutionID(c.execID) { // (an invalid id cannot even be a key)
				_, err := ids.Get(ctx, c.execID)
				require.ErrorIs(t, err, claim.ErrNotFound, "a rejected start claims no id")
				require.Empty(t, s.history(t, c.execID), "a rejected start writes no history")
				_, err = s.c.Execution(ctx, c.execID)
				require.True(t, client.IsStatus(err, http.StatusNotFound), "%v", err)
			}
		})
	}
}
