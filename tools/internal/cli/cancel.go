package cli

import (
	"fmt"
	"os/user"
	"strconv"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
)

func (a *app) cancelCmd() *cobra.Command {
	var force bool
	var reason string
	cmd := &cobra.Command{
		Use:        "cancel ID [--force] [--reason TEXT]",
		SuggestFor: []string{"force-cancel"}, // the action's name over HTTP and NATS
		Short:      "Cancel an execution: it stops at the next step boundary (--force: at once)",
		Long: `Cancel an execution. Without --force, running steps finish (their
results are recorded) and no further step starts; the execution is
"cancelling" until then and "cancelled" after. With --force, it is
cancelled at once and late results are ignored. Who asked, when and why
are recorded in the execution's history.`,
		Args: oneExecution("cancel ID [--force] [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			action := events.ActionCancel
			if force {
				action = events.ActionForceCancel
			}
			return a.act(cmd, args[0], client.ActionRequest{Action: action, Reason: reason})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "cancel at once, without waiting for running steps")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

func (a *app) killCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "kill ID [--reason TEXT]",
		Short: "Cancel an execution at once and terminate its running operations",
		Long: `Kill an execution: it is cancelled at once, and every agent running one
of its operations terminates it: SIGTERM to an exec step's process group,
SIGKILL after the agent's kill grace (5s by default); a Go handler's
context is cancelled. Who asked, when and why are recorded in the
execution's history.`,
		Args: oneExecution("kill ID [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.act(cmd, args[0], client.ActionRequest{Action: events.ActionKill, Reason: reason})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

// versionFlag is --version N|latest of resume and replay.
type versionFlag struct{ v *events.TargetVersion }

func (f versionFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return ""
	}
	return f.v.String()
}

// Set reads latest, or a number from 1.
func (f versionFlag) Set(s string) error {
	if s == "latest" {
		*f.v = events.LatestVersion
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("%q is not a version: give a version number (1, 2, ...) or latest", s)
	}
	*f.v = events.TargetVersion(n)
	return nil
}

func (versionFlag) Type() string { return "N|latest" }

func addVersionFlag(cmd *cobra.Command, v *events.TargetVersion) {
	cmd.Flags().Var(versionFlag{v}, "version", "move the execution to this version of its workflow first (a number, or latest); steps are matched by id")
}

func (a *app) resumeCmd() *cobra.Command {
	var force bool
	var reason string
	var version events.TargetVersion
	cmd := &cobra.Command{
		Use:        "resume ID [--force] [--version N|latest] [--reason TEXT]",
		SuggestFor: []string{"force-resume"},
		Short:      "Resume a started, failed or cancelled execution (--force: also re-run operations whose agents may have died)",
		Long: `Resume an execution that is started, failed or cancelled. Its failed and
rescheduled steps run again with their recorded input and fresh retry
counts; operations still with an agent are waited for, not sent again.
With --force, operations that were sending, sent or started run again too
(use it when their agent died). A new execution token is issued. Who
asked, when and why are recorded in the execution's history.

With --version N (or latest) the execution first moves to that version of
its workflow: steps are matched by id, a step the version still has keeps
its result, a step new in it runs when it is reached, a step it removed
is ignored. A move that would lose an operation still with an agent, or
keep the result of a step whose kind changed, is refused, saying why.`,
		Args: oneExecution("resume ID [--force] [--version N|latest] [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			action := events.ActionResume
			if force {
				action = events.ActionForceResume
			}
			return a.act(cmd, args[0], client.ActionRequest{Action: action, Reason: reason, Version: version})
		},
	}
	addVersionFlag(cmd, &version)
	cmd.Flags().BoolVar(&force, "force", false, "also run again the operations that were sending, sent or started")
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

func (a *app) replayCmd() *cobra.Command {
	var req client.ActionRequest
	cmd := &cobra.Command{
		Use:   "replay ID [--from resume|last|start|STEP] [--force] [--version N|latest] [--reason TEXT]",
		Short: "Replay an execution from a replay point, or resuming at its last incomplete step",
		Long: `Replay an execution (failed, cancelled, suspended, succeeded or started).

  --from resume  (default) run the last incomplete step again if it is
                 idempotent, with the variables as they were there and its
                 recorded input; else replay from the last replay point
                 before it
  --from last    replay from the last replay point (a step marked
                 replayable: from here that ran, or the start)
  --from start   replay from the start (the workflow must say
                 replayable: from start)
  --from STEP    replay from STEP (an id, or a path such as blk/x) if it
                 is a replay point, else from the last one before it

Replaying from a point restores the variables as they were when it was
entered and re-checks conditions and re-evaluates inputs. --force ignores
idempotency and replay points (and replays over operations still
running). --version N (or latest) first moves the execution to that
version of its workflow, steps matched by id (see resume). A new
execution token is issued. Who asked, when and why are recorded in the
execution's history.`,
		Args: oneExecution("replay ID [--from resume|last|start|STEP] [--force] [--version N|latest] [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Action = events.ActionReplay
			return a.act(cmd, args[0], req)
		},
	}
	cmd.Flags().StringVar(&req.From, "from", events.ReplayResume, "resume, last, start, or a step's id or path")
	cmd.Flags().BoolVar(&req.Force, "force", false, "ignore idempotency and replay points")
	addVersionFlag(cmd, &req.Version)
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

func (a *app) compensateCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "compensate ID [--reason TEXT]",
		Short: "Undo what an execution that is over did: run the compensate steps of its steps that succeeded",
		Long: `Compensate an execution that failed, was cancelled or succeeded (the saga
pattern): the compensate steps of its steps that succeeded run, the
latest completed first, each durable and retried by its own policy. The
execution runs again (with a new token) until they are done, then ends as
it was. A workflow with compensate_on compensates by itself on failure
or cancel. An execution is compensated once; replay it to run it again.
Who asked, when and why are recorded in the execution's history.`,
		Args: oneExecution("compensate ID [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.act(cmd, args[0], client.ActionRequest{Action: events.ActionCompensate, Reason: reason})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

func (a *app) repairCmd() *cobra.Command {
	var req client.ActionRequest
	cmd := &cobra.Command{
		Use:   "repair ID --ignore-seq N [--reason TEXT]",
		Short: "Have a damaged execution go on without the event at sequence N (admin)",
		Long: `Repair a damaged execution. An execution is damaged when its history holds
an event that cannot be decoded or is illegal where it stands (written by
hand, or by a bug): nothing acts on it then, and jetflow show says where
(the sequence) and why. Repair records that every fold passes over that
event from now on; the history itself is not rewritten. The execution
then goes on: results that arrived meanwhile are applied and timers that
came due fire. N must be the damaged event's sequence. Needs a token with
the admin scope. Who asked, when and why are recorded.`,
		Args: oneExecution("repair ID --ignore-seq N [--reason TEXT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.IgnoreSeq == 0 {
				return usagef("name the damaged event: jetflow repair %s --ignore-seq N (jetflow show %s says N)", args[0], args[0])
			}
			req.Action = events.ActionRepair
			return a.act(cmd, args[0], req)
		},
	}
	cmd.Flags().Uint64Var(&req.IgnoreSeq, "ignore-seq", 0, "the stream sequence of the damaged event (jetflow show names it)")
	cmd.Flags().StringVar(&req.Reason, "reason", "", "why, kept in the execution's history")
	return cmd
}

func oneExecution(usage string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usagef("name one execution: jetflow %s", usage)
		}
		return nil
	}
}

// act asks for an action and says whether the history records it.
func (a *app) act(cmd *cobra.Command, id string, req client.ActionRequest) error {
	req.RequestedBy = "jetflow-cli"
	if u, err := user.Current(); err == nil && u.Username != "" {
		req.RequestedBy = u.Username
	}
	res, err := a.client().Act(cmd.Context(), id, req)
	if err != nil {
		return err
	}
	if res.Recorded {
		fmt.Fprintf(a.stdout, "%s of execution %s recorded\n", res.Action, res.ExecutionID)
	} else {
		fmt.Fprintf(a.stdout, "%s of execution %s sent (not recorded yet)\n", res.Action, res.ExecutionID)
	}
	return nil
}
