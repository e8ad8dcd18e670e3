package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) projectionsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "projections", Short: "Manage read models (projections of the events stream)"}
	var from uint64
	rebuild := &cobra.Command{
		Use:   "rebuild [--from-seq N]",
		Short: "Rebuild every read model by replaying the events stream from sequence N (0 = all); runs no step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := a.client().RebuildProjections(cmd.Context(), from)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "rebuilt from sequence %d: %d read models written in %d ms\n", res.FromSeq, res.Written, res.TookMS)
			return nil
		},
	}
	rebuild.Flags().Uint64Var(&from, "from-seq", 0, "replay from this stream sequence (0 = everything)")
	cmd.AddCommand(rebuild)
	return cmd
}
