package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
)

func (a *app) authCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Make jetflow's NATS identities: the operator, an account per namespace, a user per role (init, user, revoke)",
		Long: `jetflow runs NATS in operator mode: an operator signs one account per
namespace, and each account signs a user per role (admin, dispatcher,
agent, api, janitor, client) whose JWT carries that role's permissions
(docs/security.md). jetflow dev does this by itself in DATA/auth; a
deployment runs jetflow auth init once and gives each service its creds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.authInitCmd(), a.authUserCmd(), a.authRevokeCmd())
	return cmd
}

func (a *app) authInitCmd() *cobra.Command {
	var dir string
	var namespaces, queues []string
	var reissue bool
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--namespace NS]... [--agent-queues Q,...] [--reissue]",
		Short: "Make (or complete) an auth directory: keys, JWTs, every role's creds, and the server configuration",
		Long: `Makes the operator, the system account, an account per namespace and a
user of each role in each, in DIR (created 0700; seeds and creds 0600).
What exists is kept: run it again to add a namespace. It writes
DIR/server.conf, the nats-server configuration that trusts the operator
(include it from each server's configuration), and DIR/<namespace>/<role>.creds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usagef("--dir DIR is required: where to keep the keys and creds")
			}
			trust, err := auth.Init(dir, auth.InitConfig{Namespaces: namespaces, AgentQueues: queues, Reissue: reissue})
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(a.stdout, "operator and accounts in %s\nnats-server configuration: %s\n", dir, filepath.Join(dir, auth.ServerConf))
			for ns := range trust.Namespaces {
				fmt.Fprintf(a.stdout, "namespace %s: creds in %s\n", ns, filepath.Join(dir, ns))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory")
	cmd.Flags().StringSliceVar(&namespaces, "namespace", []string{auth.DefaultNamespace}, "namespaces to make accounts for (repeatable)")
	cmd.Flags().StringSliceVar(&queues, "agent-queues", []string{"default"}, "queues of the agent identity issued in each namespace")
	cmd.Flags().BoolVar(&reissue, "reissue", false, "issue every role's creds again (keys are kept)")
	return cmd
}

func (a *app) authUserCmd() *cobra.Command {
	var dir, ns, role, out string
	var queues []string
	cmd := &cobra.Command{
		Use:   "user --dir DIR --role ROLE [--namespace NS] [--queues Q,...] --out FILE",
		Short: "Issue one more identity of a role (an agent for other queues, a client per program)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || out == "" {
				return usagef("--dir DIR and --out FILE are required")
			}
			r, err := auth.ParseRole(role)
			if err != nil {
				return usageError{err}
			}
			acc, err := auth.LoadAccount(dir, ns)
			if err != nil {
				return usageError{err}
			}
			creds, err := auth.IssueUser(acc, ns, r, queues)
			if err != nil {
				return usageError{err}
			}
			if err := os.WriteFile(out, creds, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s identity of namespace %s written to %s\n", r, ns, out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the auth directory (jetflow auth init)")
	f.StringVar(&ns, "namespace", auth.DefaultNamespace, "the namespace (account) of the identity")
	f.StringVar(&role, "role", "", "admin, dispatcher, agent, api, janitor or client")
	f.StringSliceVar(&queues, "queues", []string{"default"}, "an agent's queues")
	f.StringVar(&out, "out", "", "where to write the creds file (0600)")
	return cmd
}

func (a *app) authRevokeCmd() *cobra.Command {
	var dir, ns string
	cmd := &cobra.Command{
		Use:   "revoke --dir DIR [--namespace NS] CREDS-FILE",
		Short: "Revoke an identity (a leaked creds file): servers refuse it once they load the account again",
		Long: `Records the revocation of the user in CREDS-FILE in its namespace's
account. Run jetflow auth init --dir DIR again to write the accounts, then
have every server load them (nats-server --signal reload, or restart
jetflow dev, which does both). Issue the service a new identity first
(jetflow auth user, or auth init --reissue).`,
		Args: exactlyOne("name the creds file to revoke: jetflow auth revoke --dir DIR CREDS-FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--dir DIR is required")
			}
			pub, err := auth.Revoke(dir, ns, args[0])
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(a.stdout, "revoked user %s of namespace %s: run jetflow auth init --dir %s, then reload the servers\n", pub, ns, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the auth directory (jetflow auth init)")
	cmd.Flags().StringVar(&ns, "namespace", auth.DefaultNamespace, "the namespace (account) of the identity")
	return cmd
}

func (a *app) bootstrapCmd() *cobra.Command {
	var nf natsFlags
	var replicas int
	var d bus.Durables
	cmd := &cobra.Command{
		Use:   "bootstrap [--nats URL] [--creds ADMIN.creds] [--replicas N] [--queues Q,...]",
		Short: "Create (or bring up to date) jetflow's streams, buckets and durable consumers, as the admin identity",
		Long: `Creates every stream, KV bucket and durable consumer jetflow uses, or
updates them to this version's settings: run it once per namespace with
the admin identity before (or while) the services start; they wait for it.
Services running with credentials never change the topology themselves.
jetflow dev runs it at every start; beside one (its data directory in
$JETFLOW_DATA, or .jetflow) it finds its NATS and admin creds by itself,
as jetflow admin does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := d.Validate(); err != nil {
				return usageError{err}
			}
			ctx, cancel, nc, url, err := nf.connect(cmd.Context(), a, "jetflow-bootstrap")
			defer cancel(nil)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			began := time.Now()
			waiting := func(err error) { fmt.Fprintf(a.stderr, "waiting for jetstream: %v\n", err) }
			if err := bus.Bootstrap(ctx, js, bus.Config{Replicas: replicas, Partitions: d.Partitions, OnRetry: waiting}, d); err != nil {
				return cause(ctx, err)
			}
			n, err := bus.Partitions(ctx, js)
			if err != nil {
				return cause(ctx, err)
			}
			d.Partitions = n
			fmt.Fprintf(a.stdout, "topology ready on %s in %s: %d streams, %d buckets, %d consumers (queues %s; %d dispatcher partitions)\n", url,
				time.Since(began).Round(time.Millisecond), len(bus.Streams(bus.Config{})), len(bus.Buckets(bus.Config{})),
				len(bus.AllConsumers(d)), strings.Join(d.Queues, ", "), n)
			return nil
		},
	}
	nf.add(cmd)
	f := cmd.Flags()
	f.IntVar(&replicas, "replicas", 1, "replicas of streams and buckets (3 in a cluster)")
	f.StringSliceVar(&d.Queues, "queues", []string{"default"}, "agent queues to make consumers for")
	f.IntVar(&d.Partitions, "partitions", 0, "dispatcher partitions of a new deployment (0: the number recorded, or 8 for a new deployment; fixed once recorded)")
	f.DurationVar(&d.TaskAckWait, "task-ack-wait", bus.DefaultTaskAckWait, "time without an agent's heartbeat before a task goes to another agent")
	f.IntVar(&d.MaxDeliver, "max-deliver", 5, "deliveries of a task before the janitor fails it")
	f.DurationVar(&d.DispatcherAckWait, "dispatch-ack-wait", bus.DefaultDispatcherAckWait, "how long a dispatcher may hold a command of its partitions, a result or a timer (the intake holds a command 2s at most)")
	return cmd
}
