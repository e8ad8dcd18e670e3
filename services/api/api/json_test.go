package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/workflow"
)

// TestBodiesKeepAngleBrackets: the api's JSON, its raw fields included,
// writes < > & as they are (people read bodies too), and says it is not
// HTML whatever a browser guesses.
func TestBodiesKeepAngleBrackets(t *testing.T) {
	def, err := workflow.Parse([]byte("name: cmp\ndescription: a <b> & c >= d\nsteps:\n  - {id: a, kind: noop}\n"))
	require.NoError(t, err)
	v, err := workflowVersion(catalog.Record{Name: "cmp", Version: 1, Definition: def})
	require.NoError(t, err)
	require.Contains(t, string(v.Definition), "a <b> & c >= d")

	w := httptest.NewRecorder()
	writeJSON(w, http.StatusOK, v)
	require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	require.Equal(t, 2, strings.Count(w.Body.String(), "a <b> & c >= d"), "in the definition and its YAML: %s", w.Body)
	require.NotContains(t, w.Body.String(), `\u003c`)
}
