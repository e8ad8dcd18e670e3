// Package events defines jetflow's wire vocabulary: the CloudEvents types
// of execution history events, commands, tasks and results, their JSON
// payloads, the NATS subjects and streams they travel on, and the binary
// CloudEvents encoding used on every JetStream message.
//
// Every payload type implements [Payload]; the set is closed by an
// unexported marker method so that a type switch over payloads in
// pkg/projections is exhaustive by construction.
package events
