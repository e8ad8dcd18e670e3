// Command jetflow-dispatcher runs jetflow's dispatcher service against a NATS server.
package main

import "jetflow.dev/services/internal/svcrun"

func main() { svcrun.Main("jetflow-dispatcher", run) }
