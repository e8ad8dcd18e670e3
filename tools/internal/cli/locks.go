package cli

import (
	"cmp"
	"fmt"
	"io"
	"os/user"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
)

func (a *app) locksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "List workflow locks and force-clear them (ls, clear)",
		Long: `Workflow locks (lock: NAME on a workflow or a workflow step) are kept
in the JF_LOCKS bucket: per lock its holders and its waiters, in the
order they asked. See docs/locks.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.locksLsCmd(), a.locksClearCmd())
	return cmd
}

func (a *app) locksLsCmd() *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "ls [-o json]",
		Short: "List locks: holders (since when) and waiters (in order)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			locks, err := a.client().Locks(cmd.Context())
			if err != nil {
				return err
			}
			if out.json() {
				if locks == nil {
					locks = []client.Lock{}
				}
				return printJSON(a.stdout, map[string]any{"locks": locks})
			}
			if len(locks) == 0 {
				fmt.Fprintln(a.stdout, "no lock is held or waited for")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LOCK\tLIMIT\tROLE\tEXECUTION\tSCOPE\tSINCE")
			for _, l := range locks {
				for _, h := range l.Holders {
					fmt.Fprintf(tw, "%s\t%d\tholder\t%s\t%s\t%s\n", l.Name, l.Limit, h.ExecutionID, scope(h.Path), ago(h.Since))
				}
				for i, w := range l.Waiters {
					fmt.Fprintf(tw, "%s\t%d\twaiter %d\t%s\t%s\t%s\n", l.Name, l.Limit, i+1, w.ExecutionID, scope(w.Path), ago(w.Since))
				}
			}
			return tw.Flush()
		},
	}
	out.add(cmd)
	return cmd
}

func (a *app) locksClearCmd() *cobra.Command {
	var execID, reason string
	cmd := &cobra.Command{
		Use:   "clear NAME [--execution ID] [--reason TEXT]",
		Short: "Force-clear a lock's holders (or one of them): the first waiters acquire it",
		Long: `Force-clear a lock: its holders (or only --execution's) are removed, and
each holder's history records lock.cleared with who asked and why. The
first waiters acquire the lock. A cleared holder that still runs asks for
the lock again before its next step inside the lock; a step it is
running meanwhile is not stopped (cancel or kill the execution for that).`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("name one lock: jetflow locks clear NAME (see jetflow locks ls)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			by := "jetflow-cli"
			if u, err := user.Current(); err == nil && u.Username != "" {
				by = u.Username
			}
			res, err := a.client().ClearLock(cmd.Context(), args[0], client.ClearLockRequest{ExecutionID: execID, Reason: reason, RequestedBy: by})
			if err != nil {
				return err
			}
			for _, e := range res.Cleared {
				fmt.Fprintf(a.stdout, "cleared lock %s held by %s %s\n", res.Lock, e.ExecutionID, scope(e.Path))
			}
			if !res.Recorded {
				fmt.Fprintln(a.stdout, "(sent; not recorded in the holders' histories yet)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&execID, "execution", "", "clear only this execution's hold")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the holders' histories")
	return cmd
}

func scope(path string) string {
	if path == "" {
		return "(workflow)"
	}
	return path
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), time.Since(t).Round(time.Second))
}

// printLocks prints an execution's locks for jetflow show.
func printLocks(w io.Writer, x projections.Execution) {
	if len(x.Locks) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCK\tSCOPE\tSTATUS\tSINCE\tDETAIL")
	for _, l := range x.Locks {
		since, detail := l.RequestedAt, ""
		switch l.Status {
		case projections.LockHeld:
			since = l.AcquiredAt
		case projections.LockReleased, projections.LockCleared:
			since, detail = l.ReleasedAt, l.Reason
			if l.ClearedBy != "" || l.ClearedByActor != nil {
				detail = "by " + who(l.ClearedByActor, l.ClearedBy) + cmp.Or(": "+l.Reason, "")
			}
		case projections.LockWaiting:
			detail = "waiting: no step inside the lock runs until it is acquired (jetflow locks ls)"
		}
		name := l.Name
		if l.Limit > 1 {
			name = fmt.Sprintf("%s (semaphore %d)", l.Name, l.Limit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, scope(l.Path), l.Status, since.Local().Format(time.RFC3339Nano), detail)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
}
