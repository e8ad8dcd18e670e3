package api

import (
	"net/http"
	"strconv"
	"time"

	"jetflow.dev/services/api/projector"
)

// rebuildProjections re-projects the read models from ?from_seq=N (0 =
// everything). It runs no step and can run beside the live projector.
func (s *Server) rebuildProjections(w http.ResponseWriter, r *http.Request) {
	var from uint64
	if v := r.URL.Query().Get("from_seq"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "from_seq", Message: "from_seq must be a non-negative integer"})
			return
		}
		from = n
	}
	began := time.Now()
	n, err := projector.Rebuild(r.Context(), s.js, from)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"from_seq": from, "written": n, "took_ms": time.Since(began).Milliseconds()})
}
