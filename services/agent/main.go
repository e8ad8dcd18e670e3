// Command jetflow-agent runs jetflow's agent service against a NATS server.
package main

import "jetflow.dev/services/internal/svcrun"

func main() { svcrun.Main("jetflow-agent", run) }
