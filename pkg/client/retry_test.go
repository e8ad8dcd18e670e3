package client_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
)

// flaky answers 503 with Retry-After 0 to the first fails requests, then
// 200 {}; it records each request's Idempotency-Key and body.
type flaky struct {
	mu     sync.Mutex
	fails  int
	keys   []string
	bodies []string
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
	f.bodies = append(f.bodies, string(body))
	w.Header().Set("Content-Type", "application/json")
	if len(f.keys) <= f.fails {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"code":"unavailable","message":"no response from stream"}}`)
		return
	}
	_, _ = io.WriteString(w, `{}`)
}

// TestCommandsAreRetriedWithTheSameKey: a start answered 503 (a NATS node
// failing over) is sent again with the same body and Idempotency-Key, so
// the api runs it once; a key from the context is the one sent.
func TestCommandsAreRetriedWithTheSameKey(t *testing.T) {
	f := &flaky{fails: 2}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := client.New(srv.URL)

	_, err := c.Start(t.Context(), client.StartRequest{Workflow: "hello", ID: "x1"})
	require.NoError(t, err)
	require.Len(t, f.keys, 3)
	require.NotEmpty(t, f.keys[0])
	require.Equal(t, []string{f.keys[0], f.keys[0], f.keys[0]}, f.keys, "every attempt is the same command")
	require.Equal(t, []string{f.bodies[0], f.bodies[0], f.bodies[0]}, f.bodies)
	require.Contains(t, f.bodies[0], `"id":"x1"`)

	f.keys, f.bodies, f.fails = nil, nil, 1
	_, err = c.Signal(client.WithIdempotencyKey(t.Context(), "mine"), "x1", "go", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"mine", "mine"}, f.keys)

	f.keys, f.fails = nil, 0
	_, err = c.Act(t.Context(), "x1", client.ActionRequest{Action: "cancel"})
	require.NoError(t, err)
	_, err = c.Act(t.Context(), "x1", client.ActionRequest{Action: "cancel"})
	require.NoError(t, err)
	require.Len(t, f.keys, 2)
	require.NotEqual(t, f.keys[0], f.keys[1], "two calls are two commands")
}

// TestRetryIsBounded: retries stop after RetryFor, with the 503's error;
// a negative RetryFor sends once; readiness is never retried (its 503 is
// the answer).
func TestRetryIsBounded(t *testing.T) {
	f := &flaky{fails: 1 << 30}
	srv := httptest.NewServer(f)
	defer srv.Close()

	c := client.New(srv.URL)
	c.RetryFor = 300 * time.Millisecond
	_, err := c.Execution(t.Context(), "x1")
	require.True(t, client.IsStatus(err, http.StatusServiceUnavailable), "%v", err)
	require.Greater(t, len(f.keys), 1, "a read is retried")

	f.keys = nil
	c.RetryFor = -1
	_, err = c.Execution(t.Context(), "x1")
	require.True(t, client.IsStatus(err, http.StatusServiceUnavailable), "%v", err)
	require.Len(t, f.keys, 1)

	f.keys = nil
	c.RetryFor = 0 // the default: 30 s, but readiness is not retried
	_, err = c.Ready(t.Context())
	require.True(t, client.IsStatus(err, http.StatusServiceUnavailable), "%v", err)
	require.Len(t, f.keys, 1)

	f.keys = nil
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Execution(ctx, "x1")
	require.Error(t, err, "a cancelled context ends the retries")
}
