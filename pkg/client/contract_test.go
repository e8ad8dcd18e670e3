package client_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/apiv1/apiv1test"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
)

// TestStartRequestIsTheWireRequest: StartRequest, the one request type
// of its own (its input is a map, to fill in), has the members of
// apiv1.StartRequest, which the api decodes strictly, and encodes into
// it without losing a value.
func TestStartRequestIsTheWireRequest(t *testing.T) {
	t.Parallel()
	require.NoError(t, apiv1test.SameMembers(client.StartRequest{}, apiv1.StartRequest{}, nil, nil))
	var req client.StartRequest
	require.NoError(t, apiv1test.Fill(&req))
	req.Input = map[string]any{"who": "ada", "n": 3}
	data, err := json.Marshal(req)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var wire apiv1.StartRequest
	require.NoError(t, dec.Decode(&wire))
	require.NoError(t, apiv1test.SameJSON(req, wire))
}

// TestAnswersCarryTheirStatus: the HTTP status, which is no member of the
// body, is set on answers and errors that carry it.
func TestAnswersCarryTheirStatus(t *testing.T) {
	t.Parallel()
	// The answer to a start of x1 (the same request again), or a refusal.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.StartRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if req.ID != "x1" {
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"error": {"code": "forbidden", "message": "this needs the scope start", "scope": "start"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"id": "x1", "workflow": "hello", "status": "succeeded", "created": false,
			"links": {"self": "/v1/executions/x1"}, "execution": {"id": "x1", "workflow": "hello", "status": "succeeded"}}`)
	}))
	c := client.New(srv.URL)
	t.Cleanup(func() {
		c.HTTP.CloseIdleConnections()
		srv.Close()
	})

	st, err := c.Start(t.Context(), client.StartRequest{Workflow: "hello", ID: "x1"})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, st.HTTPStatus)
	require.Equal(t, "/v1/executions/x1", st.Links["self"])
	require.NotNil(t, st.Execution, "the same request again gets the execution")
	require.Equal(t, projections.StatusSucceeded, st.Execution.Status)

	_, err = c.Start(t.Context(), client.StartRequest{Workflow: "hello", ID: "x2"})
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusForbidden, apiErr.Status)
	require.Equal(t, "forbidden", apiErr.Code)
	require.Equal(t, "start", apiErr.Scope)
	require.True(t, client.IsDenied(err))
	require.Equal(t, "this needs the scope start (HTTP 403)", err.Error())
}
