// Package e2e holds jetflow's end-to-end tests: the whole system (embedded
// JetStream and the four services) started in-process or as a separate
// process, driven through its public interfaces (HTTP, NATS subjects, the
// CLI binary).
package e2e
