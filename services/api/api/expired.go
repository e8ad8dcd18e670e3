package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"jetflow.dev/pkg/claim"
)

// expiredError is an execution that the janitor deleted under its
// retention rule: its id stays claimed, its history and read model are gone.
type expiredError struct {
	id string
	at time.Time
}

func (e *expiredError) Error() string {
	return fmt.Sprintf("execution %q expired under its retention rule at %s; its history was deleted", e.id, e.at.UTC().Format(time.RFC3339))
}

// expired returns an *expiredError if the claim says the execution
// expired, else nil.
func expired(id string, c claim.Record) error {
	if !c.Expired() {
		return nil
	}
	return &expiredError{id: id, at: c.ExpiredAt}
}

// claimOf returns the claim of the execution id in the path, answering
// 404 (unknown), 410 (expired and deleted) or 5xx itself when there is
// nothing to serve.
func (s *Server) claimOf(w http.ResponseWriter, r *http.Request, id string) (claim.Record, bool) {
	c, err := s.at(r).ids.Get(r.Context(), id)
	switch {
	case errors.Is(err, claim.ErrNotFound):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: fmt.Sprintf("execution %q does not exist", id)})
		return c, false
	case err != nil:
		s.internal(w, r, err)
		return c, false
	case c.Expired():
		writeExpired(w, &expiredError{id: id, at: c.ExpiredAt})
		return c, false
	}
	return c, true
}

// writeExpired answers 410 Gone for an expired execution.
func writeExpired(w http.ResponseWriter, e *expiredError) {
	writeError(w, http.StatusGone, apiError{Code: "expired", Field: "id", Message: e.Error()})
}
