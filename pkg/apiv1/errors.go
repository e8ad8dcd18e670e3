package apiv1

import (
	"encoding/json"
	"fmt"
)

// Error is the body of every 4xx and 5xx answer, under "error" (see
// [ErrorBody]): a stable code for programs and a sentence for people.
type Error struct {
	// Status is the answer's HTTP status. It is not in the body: a client
	// sets it from the answer.
	Status int `json:"-"`
	// Code is stable, for programs: invalid, invalid_json, not_found,
	// conflict, forbidden, ... (docs/api.md#errors).
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the request field at fault, when there is one.
	Field string `json:"field,omitempty"`
	// Problems lists every problem of an invalid_definition (each with
	// field, line, column, message) or an invalid_input (each with field
	// and message).
	Problems json.RawMessage `json:"problems,omitempty"`
	// Scope and Namespace name what a 403 says is missing: the scope the
	// route needs, or the namespace not granted.
	Scope     string `json:"scope,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// Error returns the message with the field at fault and the HTTP status.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (field %s, HTTP %d)", e.Message, e.Field, e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// ErrorBody is the body of an error answer: {"error": {...}}.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// Health answers GET /healthz while the api is connected to NATS.
type Health struct {
	// Status is "ok".
	Status string `json:"status"`
	// NATS is the api's connection to NATS: CONNECTED, RECONNECTING...
	// (it does not make /healthz fail: /readyz does).
	NATS string `json:"nats,omitempty"`
	// Version is the api's build (module version, commit, commit time).
	Version string `json:"version,omitempty"`
}

// Ready answers GET /readyz: the api is connected and serving; Parked
// counts the executions whose read model the projector has set aside
// (GET /v1/admin/projections/parked lists them). The figures are over
// every namespace the api serves (the answer is public: it names none).
type Ready struct {
	// Status is "ok".
	Status string `json:"status"`
	Parked int    `json:"parked"`
	// ProjectorLagSeconds is how long the oldest event not yet projected
	// into the read models has waited, the most of any namespace (0:
	// caught up). Every api of a namespace shares the projector's
	// consumer, so they all see the same.
	ProjectorLagSeconds float64 `json:"projector_lag_seconds"`
	// ProjectorPending counts the events not yet projected (delivered or
	// not), in every namespace.
	ProjectorPending uint64 `json:"projector_pending"`
	// IndexLive says this api's visibility index of every namespace has
	// caught up with the read models (until then, GET /v1/executions with
	// a time range, an order by time or attr answers 503).
	IndexLive bool `json:"index_live"`
}
