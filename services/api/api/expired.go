package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
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

// expired returns an *expiredError if the claim of id says the execution
// expired, else nil.
func expired(id string, claim []byte) error {
	var c struct {
		ExpiredAt time.Time `json:"expired_at"`
	}
	if json.Unmarshal(claim, &c) != nil || c.ExpiredAt.IsZero() {
		return nil
	}
	return &expiredError{id: id, at: c.ExpiredAt}
}

// writeExpired answers 410 Gone for an expired execution.
func writeExpired(w http.ResponseWriter, e *expiredError) {
	writeError(w, http.StatusGone, apiError{Code: "expired", Field: "id", Message: e.Error()})
}
