package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
)

// TestReadyzSaysWhatIsMissing: /readyz is 200 with the parked count while
// the streams and buckets are there, and 503 naming what is missing while
// one is not; /healthz (liveness) stays 200.
func TestReadyzSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	ns := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, ns)
	var missing atomic.Value
	missing.Store([]string(nil))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true},
		Missing: func() []string { return missing.Load().([]string) }}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	get := func(path string) (int, []byte) {
		resp, err := http.Get(hs.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var raw json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
		return resp.StatusCode, raw
	}

	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code)
	var ready apiv1.Ready
	require.NoError(t, json.Unmarshal(body, &ready))
	require.Equal(t, apiv1.Ready{Status: "ok", Parked: 0}, ready)

	missing.Store([]string{"stream JF_REJECTIONS"})
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, string(body), "stream JF_REJECTIONS")
	require.Contains(t, string(body), "jetflow bootstrap")
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not depend on it")

	// NATS away: not ready, but alive (a restart would cure nothing).
	missing.Store([]string(nil))
	natsserver.Stop(ns)
	natstest.Eventually(t, 10*time.Second, func() bool {
		code, _ := get("/readyz")
		return code == http.StatusServiceUnavailable
	}, "not ready while NATS is away")
	code, body = get("/healthz")
	require.Equal(t, http.StatusOK, code)
	var health apiv1.Health
	require.NoError(t, json.Unmarshal(body, &health))
	require.Equal(t, "ok", health.Status)
	require.NotEqual(t, "CONNECTED", health.NATS, "it says the connection's state")
}
