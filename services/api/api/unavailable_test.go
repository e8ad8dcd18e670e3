package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
)

// TestTransientFailuresAreRetryable: a request that failed because NATS
// was away or between leaders (what a start saw during a node's failover:
// "no response from stream") answers 503 unavailable with Retry-After,
// which clients retry; any other failure stays a 500.
func TestTransientFailuresAreRetryable(t *testing.T) {
	s := &Server{log: zerolog.Nop()}
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("publish start: %w", jetstream.ErrNoStreamResponse), http.StatusServiceUnavailable, "unavailable"},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, http.StatusServiceUnavailable, "unavailable"},
		{errors.New("decode read model: unexpected end of JSON input"), http.StatusInternalServerError, "internal"},
	} {
		rec := httptest.NewRecorder()
		s.internal(rec, httptest.NewRequest(http.MethodPost, "/v1/executions", nil), tc.err)
		require.Equal(t, tc.status, rec.Code, "%v", tc.err)
		var body apiv1.ErrorBody
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
		require.NotNil(t, body.Error)
		require.Equal(t, tc.code, body.Error.Code)
		if tc.status == http.StatusServiceUnavailable {
			require.Equal(t, RetryAfter, rec.Header().Get("Retry-After"))
		} else {
			require.Empty(t, rec.Header().Get("Retry-After"))
		}
	}
}
