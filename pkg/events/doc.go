// Package events defines jetflow's wire vocabulary: the CloudEvents types
// of execution history events, commands, tasks and results, their JSON
// payloads, the CloudEvents envelope ([Event], its sdk-go conversion,
// structured JSON) and the rules for the names and ids they carry.
//
// It does not depend on NATS, and neither do the pure packages built on
// it (pkg/projections, pkg/workflow, pkg/redact): the binary-mode codec
// that puts events on NATS messages, and the streams, subjects and
// buckets they travel on, are package bus's.
//
// Every payload type implements [Payload]; the set is closed by an
// unexported marker method so that a type switch over payloads in
// pkg/projections is exhaustive by construction.
package events
