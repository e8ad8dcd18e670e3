package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/svc"
)

// versionCmd prints the CLI's version and the api's, so that an operator
// sees which build each runs (docs/upgrades.md).
func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print this command line's version and the api's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(a.stdout, "jetflow", svc.Version())
			h, err := a.client().Health(cmd.Context())
			if err != nil {
				fmt.Fprintf(a.stdout, "api     unknown (%v)\n", err)
				return nil // the CLI's own version is the answer asked for
			}
			fmt.Fprintf(a.stdout, "api     %s (%s)\n", h.Version, a.api())
			return nil
		},
	}
}
