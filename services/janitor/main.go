// Command jetflow-janitor runs jetflow's janitor service against a NATS server.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// An error after a stop was asked for is the stop itself, not a failure.
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "jetflow-janitor:", err)
		os.Exit(1)
	}
}
