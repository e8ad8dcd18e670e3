// Package apiv1 holds the wire types of jetflow's HTTP API v1
// (docs/api.md): the JSON bodies of its requests and answers, written
// once. The api (services/api) encodes its answers from them and decodes
// its requests into them; pkg/client encodes its requests from them and
// decodes the answers into them (most of its types are aliases of these).
//
// The package holds data only: no NATS, no HTTP, no behaviour beyond
// [Error.Error]. It imports pkg/projections and pkg/events for the types
// that the API shows as they are stored: an execution's state
// ([projections.Execution]), its damage, event types and lock entries.
//
// The members of each type are in the order the api sends them; answers
// that the api once built as JSON maps keep their members sorted by name,
// as the maps had them, so that the wire stays the same byte for byte.
// A member of a type here is a promise to callers: add one in a
// backward-compatible way (optional, omitted when empty) or not at all in
// v1. Server-side types that hold more than the wire (an api key's hash,
// a stored lock entry) are converted into these, and tests hold the two
// in step.
package apiv1
