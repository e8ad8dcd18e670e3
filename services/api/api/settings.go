package api

import (
	"net/http"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/catalog"
)

// settings answers GET /v1/settings: system-wide values the services
// recorded for others to show (today the janitor's system retention rule,
// which applies to executions whose workflow sets none). A value no
// service recorded yet is left out.
func (s *Server) settings(w http.ResponseWriter, r *http.Request) {
	var out apiv1.Settings
	rule, ok, err := s.at(r).defs.Setting(r.Context(), catalog.SettingRetentionDefault)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if ok {
		out.RetentionDefault = rule
	}
	writeJSON(w, http.StatusOK, out)
}
