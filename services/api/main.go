// Command jetflow-api runs jetflow's api service against a NATS server.
package main

import "jetflow.dev/services/internal/svcrun"

func main() { svcrun.Main("jetflow-api", run) }
