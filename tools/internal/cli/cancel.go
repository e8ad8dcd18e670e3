package cli

import (
	"errors"
	"fmt"
	"os/user"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
)

func (a *app) cancelCmd() *cobra.Command {
	var force bool
	var reason string
	cmd := &cobra.Command{
		Use:   "cancel ID [--force] [--reason TEXT]",
		Short: "Cancel an execution: it stops at the next step boundary (--force: at once)",
		Long: `Cancel an execution. Without --force, running steps finish (their
results are recorded) and no further step starts; the execution is
"cancelling" until then and "cancelled" after. With --force, it is
cancelled at once and late results are ignored. Who asked, when and why
are recorded in the execution's history.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("name the execution to cancel: jetflow cancel ID [--force] [--reason TEXT]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			action := events.ActionCancel
			if force {
				action = events.ActionForceCancel
			}
			by := "jetflow-cli"
			if u, err := user.Current(); err == nil && u.Username != "" {
				by = u.Username
			}
			res, err := a.client().Act(cmd.Context(), args[0], client.ActionRequest{Action: action, Reason: reason, RequestedBy: by})
			if err != nil {
				return err
			}
			if res.Recorded {
				fmt.Fprintf(a.stdout, "%s of execution %s recorded\n", res.Action, res.ExecutionID)
			} else {
				fmt.Fprintf(a.stdout, "%s of execution %s sent (not recorded yet)\n", res.Action, res.ExecutionID)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "cancel at once, without waiting for running steps")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the execution's history")
	return cmd
}
