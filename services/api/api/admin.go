package api

import (
	"net/http"
	"time"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/services/api/projector"
)

// rebuildProjections re-projects the read models from ?from_seq=N (0 =
// everything, and the visibility index with them). It runs no step and
// can run beside the live projector.
func (s *Server) rebuildProjections(w http.ResponseWriter, r *http.Request) {
	from, ok := querySeq(w, r, "from_seq")
	if !ok {
		return
	}
	began := time.Now()
	res, err := projector.Rebuild(r.Context(), s.at(r).js, from, s.cfg.MaxReadModel)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	// A rebuild from the start rebuilds this api's visibility index too:
	// dropped, and fed again from the read models (lists in another
	// order than id answer 503 until it is live). Other replicas' indexes
	// follow the read models the rebuild wrote, as they always do.
	if feed := s.feeds[s.at(r).name]; feed != nil && from == 0 {
		if err := feed.Rebuild(r.Context()); err != nil {
			s.internal(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, apiv1.Rebuilt{FromSeq: from, Written: res.Written, Unchanged: res.Unchanged, Failed: res.Failed,
		Damaged: res.Damaged, TookMS: time.Since(began).Milliseconds()})
}

// parkedProjections lists the executions of the caller's namespace whose
// read model the projector has parked.
func (s *Server) parkedProjections(w http.ResponseWriter, r *http.Request) {
	out := apiv1.ParkedList{Parked: []apiv1.Parked{}}
	if p := s.projectors[s.at(r).name]; p != nil {
		for _, pk := range p.Parked() {
			out.Parked = append(out.Parked, pk.Parked)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
