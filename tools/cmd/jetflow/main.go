// Command jetflow is jetflow's command line: `jetflow dev` runs the whole
// system on one machine; the other commands talk to the api.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"jetflow.dev/tools/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
