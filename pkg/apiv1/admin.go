package apiv1

import (
	"time"

	"jetflow.dev/pkg/projections"
)

// Settings answers GET /v1/settings: system-wide values services
// recorded. A value no service recorded yet is left out.
type Settings struct {
	// RetentionDefault is the janitor's system retention rule.
	RetentionDefault string `json:"retention_default,omitempty"`
}

// Rebuilt answers POST /v1/admin/projections/rebuild.
type Rebuilt struct {
	// Damaged maps the executions whose history holds an event that does
	// not fold to where and why.
	Damaged map[string]projections.Damage `json:"damaged"`
	FromSeq uint64                        `json:"from_seq"`
	TookMS  int64                         `json:"took_ms"`
	// Unchanged counts the read models that were right (or newer) already,
	// Written those that were behind and were replaced.
	Unchanged int `json:"unchanged"`
	Written   int `json:"written"`
	// Failed are the executions whose read model could not be written
	// (absent when none): the others are written all the same.
	Failed []string `json:"failed,omitempty"`
}

// KeyRequest is the body of POST /v1/admin/keys: a new api key. Unknown
// members are an error.
type KeyRequest struct {
	Name       string   `json:"name"`
	Scopes     []string `json:"scopes"`
	Namespaces []string `json:"namespaces"`
	// ExpiresIn is a duration (720h) or days (30d); "" for a key that
	// does not expire.
	ExpiresIn string `json:"expires_in,omitempty"`
}

// Key is an api key as the api shows it: never its hash, and its token
// only once.
type Key struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Scopes     []string  `json:"scopes"`
	Namespaces []string  `json:"namespaces"`
	CreatedAt  time.Time `json:"created_at"`
	// CreatedBy is the subject of whoever created it.
	CreatedBy string    `json:"created_by"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// Status is active, expired or revoked.
	Status string `json:"status"`
	// Token is set only in the answer to POST /v1/admin/keys: it is shown
	// once.
	Token string `json:"token,omitempty"`
}

// KeyList answers GET /v1/admin/keys: the keys the caller could have
// made, oldest first.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// Parked is an execution whose read model the projector could not write:
// it is projected again from its history, on its own, with a growing
// delay, while every other execution's goes on.
type Parked struct {
	ID       string    `json:"id"`
	Workflow string    `json:"workflow"`
	Reason   string    `json:"reason"`
	Since    time.Time `json:"since"`
	Tries    int       `json:"tries"`
	NextTry  time.Time `json:"next_try"`
}

// ParkedList answers GET /v1/admin/projections/parked.
type ParkedList struct {
	Parked []Parked `json:"parked"`
}

// Whoami answers GET /v1/whoami: the caller, as the api authenticated
// its token. It holds nothing secret: no token, no hash.
type Whoami struct {
	// Subject is who: an api key's name, an OIDC token's subject,
	// "admin-token" for a bootstrap admin token, "anonymous" when the api
	// runs without authentication.
	Subject string `json:"subject"`
	// Method is how it authenticated: api-key (an api key or an admin
	// token), oidc, or none (authentication is off).
	Method string `json:"method"`
	// KeyID is the api key's id (admin-token-<hash prefix> for an admin
	// token; absent for an OIDC token): the id its actions are recorded
	// under, and the one to revoke.
	KeyID string `json:"key_id,omitempty"`
	// Scopes are the scopes it holds (read, start, signal, operate,
	// admin); admin holds every other.
	Scopes []string `json:"scopes"`
	// Namespaces are the namespaces it may use ("*": every one).
	Namespaces []string `json:"namespaces"`
}
