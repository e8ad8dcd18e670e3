package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/ui"
)

// uiTable reads the JSON between /* begin name */ and /* end name */ in
// the UI's script, as the api serves it.
func uiTable(t *testing.T, name string, v any) {
	t.Helper()
	rec := httptest.NewRecorder()
	ui.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, ui.Prefix+"app.js", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	js := rec.Body.String()
	_, rest, ok := strings.Cut(js, "/* begin "+name+" */")
	require.True(t, ok, "app.js has no /* begin %s */", name)
	table, _, ok := strings.Cut(rest, "/* end "+name+" */")
	require.True(t, ok, "app.js has no /* end %s */", name)
	require.NoError(t, json.Unmarshal([]byte(table), v), "app.js's %s is not JSON", name)
}

// TestUIOffersWhatTheServerAccepts: the UI offers an action only for the
// statuses the dispatcher accepts it in (projections.Status.ActionRefused,
// and signalRefused for a signal), for every status a list shows, and
// asks for the scope the route table asks for. The api still refuses what
// it refuses: this keeps the UI from offering what would be refused, or
// hiding what would not.
func TestUIOffersWhatTheServerAccepts(t *testing.T) {
	t.Parallel()
	var scopeOf map[string]access.Scope
	uiTable(t, "scope-of", &scopeOf)
	routeScope := map[string]access.Scope{}
	for _, rt := range (&Server{}).routes() {
		routeScope[rt.pattern] = rt.scope
	}
	offered := []string{events.ActionCancel, events.ActionForceCancel, events.ActionKill, events.ActionResume, events.ActionForceResume, events.ActionReplay}
	want := map[string]access.Scope{
		"signal":     routeScope["POST /v1/executions/{id}/signals/{name}"],
		"start":      routeScope["POST /v1/executions"],
		"clear-lock": routeScope["DELETE /v1/locks/{name}"],
	}
	for _, a := range offered {
		require.Contains(t, events.Actions, a)
		want[a] = routeScope["POST /v1/executions/{id}/actions"]
	}
	require.Equal(t, want, scopeOf, "app.js's SCOPE_OF is not the route table's")

	var byStatus map[string][]string
	uiTable(t, "status-actions", &byStatus)
	var statuses []string
	for _, st := range projections.ListedStatuses {
		statuses = append(statuses, string(st))
		var accepted []string
		for _, a := range offered {
			if st.ActionRefused(a) == "" {
				accepted = append(accepted, a)
			}
		}
		if signalRefused(st) == "" {
			accepted = append(accepted, "signal")
		}
		require.ElementsMatch(t, accepted, byStatus[string(st)], "app.js's STATUS_ACTIONS for a %s execution", st)
	}
	var keys []string
	for k := range byStatus {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Sort(statuses)
	require.Equal(t, statuses, keys, "app.js's STATUS_ACTIONS has a row for each status a list shows, and none other")
}
