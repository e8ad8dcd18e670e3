// Package events defines jetflow's wire vocabulary: the CloudEvents types
// of execution history events, commands, tasks and results, their JSON
// payloads, the NATS subjects and streams they travel on, and the
// CloudEvents envelope ([Event], its sdk-go conversion, structured JSON).
// The binary-mode codec that puts events on NATS messages is in package
// bus, so that this package does not depend on NATS.
//
// Every payload type implements [Payload]; the set is closed by an
// unexported marker method so that a type switch over payloads in
// pkg/projections is exhaustive by construction.
package events
