package ui_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/services/api/ui"
)

func get(t *testing.T, path string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	ui.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w
}

// TestThePageAndItsFiles: / is the page, its script and style are under
// /ui/, each with its type and the headers that keep the page to its own
// files; anything else is a 404.
func TestThePageAndItsFiles(t *testing.T) {
	for path, typ := range map[string]string{"/": "text/html", "/ui/app.js": "text/javascript", "/ui/app.css": "text/css"} {
		w := get(t, path)
		require.Equal(t, http.StatusOK, w.Code, path)
		require.True(t, strings.HasPrefix(w.Header().Get("Content-Type"), typ), "%s: %s", path, w.Header().Get("Content-Type"))
		csp := w.Header().Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"), path)
		require.NotEmpty(t, w.Body.String(), path)
	}
	require.Contains(t, get(t, "/").Body.String(), `src="/ui/app.js"`)
	for _, path := range []string{"/ui/", "/ui/nope.js", "/ui/static/app.js", "/ui/../ui.go", "/ui/index"} {
		require.Equal(t, http.StatusNotFound, get(t, path).Code, path)
	}
}

// TestThePageRunsNoInlineScript: the policy forbids inline script and
// style, so the page must have none (it would silently not run).
func TestThePageRunsNoInlineScript(t *testing.T) {
	page := get(t, "/").Body.String()
	require.NotContains(t, page, "<script>")
	require.NotContains(t, page, "<style")
	require.NotContains(t, page, " style=")
	require.NotContains(t, page, " onclick=")
	script := get(t, "/ui/app.js").Body.String()
	require.NotContains(t, script, ".innerHTML", "values must be set as text")
	require.NotContains(t, script, "insertAdjacentHTML")
}
