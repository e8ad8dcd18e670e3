package cli

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProbe: jetflow probe exits 0 on a 2xx answer and 1 otherwise,
// saying why; a URL that is not one is a usage error.
func TestProbe(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"unavailable","namespaces":{"default":"starting"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(srv.Close)

	code, out, stderr := jetflow(t, "", "probe", srv.URL+"/healthz")
	require.Equal(t, ExitOK, code, stderr)
	require.Equal(t, "{\"status\":\"ok\"}\n", out)

	code, _, stderr = jetflow(t, "", "probe", srv.URL+"/readyz")
	require.Equal(t, ExitFailed, code)
	require.Contains(t, stderr, "503 Service Unavailable")
	require.Contains(t, stderr, `"default":"starting"`, "the reason the service gave is shown")

	addr := srv.Listener.Addr().String()
	srv.Close()
	code, _, stderr = jetflow(t, "", "probe", "http://"+addr+"/healthz")
	require.Equal(t, ExitFailed, code, "nothing listening is a failure")
	require.Contains(t, stderr, "connection refused")

	code, _, stderr = jetflow(t, "", "probe", "127.0.0.1:9481/readyz")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, "give an http URL")
}
