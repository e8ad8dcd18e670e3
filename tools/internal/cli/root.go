// Package cli implements the jetflow command line with cobra.
package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
)

// exitError carries a process exit code without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		fmt.Fprintln(stderr, "jetflow:", err)
		return 1
	}
	return 0
}

type app struct {
	apiURL string
	stdout io.Writer
	stderr io.Writer
}

func (a *app) client() *client.Client { return client.New(a.apiURL) }

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "jetflow",
		Short:         "Durable workflows, event-sourced over NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&a.apiURL, "api", cmp.Or(os.Getenv("JETFLOW_API"), "http://127.0.0.1:8080"),
		"jetflow api base URL (env JETFLOW_API)")
	root.AddCommand(a.devCmd(), a.workflowCmd(), a.runCmd(), a.showCmd(), a.lsCmd(), a.eventsCmd(), a.projectionsCmd(), a.signalCmd(), a.cancelCmd(), a.killCmd(), a.resumeCmd(), a.replayCmd(), a.locksCmd())
	return root
}
