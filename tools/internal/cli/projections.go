package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) projectionsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "projections", Short: "Manage read models (projections of the events stream)",
		Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
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
			fmt.Fprintf(a.stdout, "rebuilt from sequence %d in %d ms: %s written, %d already right\n",
				res.FromSeq, res.TookMS, plural(res.Written, "read model", "read models"), res.Unchanged)
			damaged := 0
			for id, d := range res.Damaged {
				if d.Unknown { // a newer version's event: not damage to repair
					fmt.Fprintf(a.stderr, "  %s: stops at sequence %d, an event of type %s this version does not know\n", id, d.Seq, d.Type)
					continue
				}
				damaged++
				fmt.Fprintf(a.stderr, "  %s: damaged at sequence %d: %s (jetflow repair %s --ignore-seq %d)\n", id, d.Seq, d.Reason, id, d.Seq)
			}
			for _, id := range res.Failed {
				fmt.Fprintf(a.stderr, "  %s: its read model could not be written (the projector parks it: GET /v1/admin/projections/parked)\n", id)
			}
			if damaged > 0 || len(res.Failed) > 0 {
				return exitError{code: 1}
			}
			return nil
		},
	}
	rebuild.Flags().Uint64Var(&from, "from-seq", 0, "replay from this stream sequence (0 = everything)")
	cmd.AddCommand(rebuild)
	return cmd
}

// plural is n with the noun that goes with it: 1 read model, 2 read models.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
