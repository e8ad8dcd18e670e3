// Command jetflow-manifests checks the deployment files offline (make
// lint): jetflow-manifests [DIR], DIR the deployments directory.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"jetflow.dev/tools/internal/manifests"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := manifests.Main(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "jetflow-manifests:", err)
		os.Exit(1)
	}
}
