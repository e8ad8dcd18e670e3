// Command jetflow-janitor runs jetflow's janitor service against a NATS server.
package main

import "jetflow.dev/services/internal/svcrun"

func main() { svcrun.Main("jetflow-janitor", run) }
