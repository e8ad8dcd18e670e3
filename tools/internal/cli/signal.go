package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) signalCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "signal ID NAME [--data JSON]",
		Short: "Send a named signal to an execution (a wait step takes it, now or when it is reached)",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("name the execution and the signal: jetflow signal ID NAME [--data JSON]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			if data != "" {
				if !json.Valid([]byte(data)) {
					return usagef("--data must be JSON, e.g. --data '{\"approved\":true}'")
				}
				raw = json.RawMessage(data)
			}
			res, err := a.client().Signal(cmd.Context(), args[0], args[1], raw)
			if err != nil {
				return err
			}
			if res.Recorded {
				fmt.Fprintf(a.stdout, "signal %s recorded for execution %s\n", res.Signal, res.ExecutionID)
			} else {
				fmt.Fprintf(a.stdout, "signal %s sent to execution %s (not recorded yet)\n", res.Signal, res.ExecutionID)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the signal's data, as JSON")
	return cmd
}
