package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/tools/internal/backup"
	"jetflow.dev/tools/internal/devstack"
	"jetflow.dev/tools/internal/notices"
)

// natsFlags are how a command that talks to NATS itself (as the admin
// identity) finds it: --nats, --creds and --nats-ca, else the environment,
// else the jetflow dev running on the data directory.
type natsFlags struct {
	url, creds, ca string
}

func (n *natsFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&n.url, "nats", "", "NATS server URL (default: $JETFLOW_NATS_URL, else that of the jetflow dev running on $JETFLOW_DATA or .jetflow, else nats://127.0.0.1:4222)")
	f.StringVar(&n.creds, "creds", "", "the admin identity's creds file (default: $JETFLOW_NATS_CREDS, else the admin creds of that jetflow dev)")
	f.StringVar(&n.ca, "nats-ca", "", "PEM file of the CA of the servers' TLS certificates (default: $JETFLOW_NATS_CA)")
}

// ErrNotAdmin means the server refused the identity a subject of the
// JetStream API: only the admin identity may snapshot and restore.
var ErrNotAdmin = errors.New("the server refused this identity the JetStream API (snapshots, restores, clearing notices and the bootstrap need the admin identity: give its creds with --creds)")

// connect dials NATS as the admin identity. The context it returns ends
// as soon as the server refuses the identity a subject (a refused request
// gets no answer, so it would otherwise wait for ever): context.Cause
// then says so.
func (n *natsFlags) connect(ctx context.Context, a *app, name string) (context.Context, context.CancelCauseFunc, *nats.Conn, string, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	nc, url, err := n.dial(a, name, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			cancel(fmt.Errorf("%w: %w", ErrNotAdmin, err))
		}
	}))
	if err != nil {
		cancel(err)
		return ctx, cancel, nil, url, err
	}
	return ctx, cancel, nc, url, nil
}

// cause is err, or why ctx (from connect) ended when that is what ended it.
func cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); err != nil && c != nil && errors.Is(c, ErrNotAdmin) {
		return c
	}
	return err
}

func (n *natsFlags) dial(a *app, name string, extra ...nats.Option) (*nats.Conn, string, error) {
	url := cmp.Or(n.url, a.getenv("JETFLOW_NATS_URL"))
	creds := cmp.Or(n.creds, a.getenv("JETFLOW_NATS_CREDS"))
	if c, err := devstack.ReadConn(a.dataDir()); err == nil && (url == "" || url == c.NATS) {
		url = c.NATS
		creds = cmp.Or(creds, c.AdminCreds)
	}
	url = cmp.Or(url, "nats://127.0.0.1:4222")
	opts := append([]nats.Option{nats.Name(name)}, extra...)
	if ca := cmp.Or(n.ca, a.getenv("JETFLOW_NATS_CA")); ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	if creds != "" {
		o, err := auth.ConnectOptions(creds)
		if err != nil {
			return nil, url, usageError{err}
		}
		opts = append(opts, o...)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, url, fmt.Errorf("connect to nats at %s: %w (give --nats and the admin identity's --creds)", url, err)
	}
	return nc, url, nil
}

func (a *app) adminCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Operate a deployment through NATS as the admin identity: backup, restore, clear-notices",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.backupCmd(), a.restoreCmd(), a.clearNoticesCmd())
	return cmd
}

func (a *app) clearNoticesCmd() *cobra.Command {
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "clear-notices [--nats URL] [--creds ADMIN.creds]",
		Short: "Set every pending long timer's notice back to its firing at its due time, before rolling the dispatchers back past notices (docs/upgrades.md)",
		Long: `A timer due more than two minutes after its arming has, until a minute
before its due time, a schedule in JF_TIMERS that fires a notice on a
subject dispatchers older than notices do not read (docs/adr/0019). This
replaces each such schedule with its timer's firing at its due time, as a
dispatcher without notices sets it, so that an older dispatcher fires it.
A schedule a dispatcher changes meanwhile is left as it is. Restart the
dispatchers with -timer-notices=false first, or they set new notices;
running it again sets those set since. It needs the admin identity.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel, nc, url, err := nf.connect(cmd.Context(), a, "jetflow-clear-notices")
			defer cancel(nil)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			res, err := notices.ToFirings(ctx, js, time.Now)
			line := fmt.Sprintf("%s: timers' schedules read %d, notices among them %d, set back to their firings %d, changed meanwhile by a dispatcher (left) %d, unreadable (left) %d",
				url, res.Schedules, res.Notices, res.Set, res.Changed, res.Unreadable)
			if err != nil {
				fmt.Fprintf(a.stderr, "stopped part-way (%s)\n", line)
				return cause(ctx, err)
			}
			fmt.Fprintln(a.stdout, line)
			if res.Left > 0 {
				return fmt.Errorf("%d notices still found after %d passes (dispatchers still setting them? restart them with -timer-notices=false): run it again", res.Left, res.Passes)
			}
			if res.Fired > 0 {
				fmt.Fprintf(a.stdout, "%d notices have fired and wait for a dispatcher that knows notices: roll the dispatchers back once this says none\n", res.Fired)
				return nil
			}
			fmt.Fprintln(a.stdout, "no notice left: the dispatchers may be rolled back")
			return nil
		},
	}
	nf.add(cmd)
	return cmd
}

func (a *app) backupCmd() *cobra.Command {
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "backup DIR [--nats URL] [--creds ADMIN.creds]",
		Short: "Back up the streams and buckets that hold the truth into a new directory (docs/backup.md)",
		Long: `Takes a JetStream snapshot of each stream and KV bucket that holds the
truth (histories, execution ids, definitions, timers, locks, api keys and
the work in flight), one directory each, in an order that keeps them
consistent with each other, then writes DIR/manifest.json. Read models,
dispatcher leases and kill notices are left out: they are rebuilt or
safe to lose. The services may keep running. It needs the admin identity.`,
		Args: exactlyOne("name the directory to write the backup into: jetflow admin backup DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel, nc, url, err := nf.connect(cmd.Context(), a, "jetflow-backup")
			defer cancel(nil)
			if err != nil {
				return err
			}
			defer nc.Close()
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			m, err := backup.Backup(ctx, nc, args[0], backup.Options{
				Starting: func(backup.Manifest) { // not before a refusal (a directory in use)
					fmt.Fprintf(a.stdout, "backing up %s into %s\n", url, args[0])
					fmt.Fprintln(tw, "STREAM\tMESSAGES\tLAST SEQ\tCONSUMERS\tSIZE\tTOOK")
				},
				Progress: func(s backup.Snapshot) {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", s.Stream, s.Messages, s.LastSeq, s.ConsumerCount, size(s.SnapshotBytes),
						(time.Duration(s.TookMS) * time.Millisecond).String())
				},
			})
			_ = tw.Flush()
			if err != nil {
				return cause(ctx, err)
			}
			var n uint64
			var b int64
			for _, s := range m.Streams {
				n += s.Messages
				b += s.SnapshotBytes
			}
			fmt.Fprintf(a.stdout, "backup done in %s: %d streams, %d messages, %s (jetflow %s, schema %d, %d partitions)\n",
				m.FinishedAt.Sub(m.StartedAt).Round(time.Millisecond), len(m.Streams), n, size(b), m.Jetflow, m.SchemaVersion, m.Partitions)
			for _, s := range m.Skipped {
				fmt.Fprintf(a.stdout, "  not backed up: %s: %s\n", s.Stream, s.Why)
			}
			return nil
		},
	}
	nf.add(cmd)
	return cmd
}

func (a *app) restoreCmd() *cobra.Command {
	var nf natsFlags
	var replace bool
	cmd := &cobra.Command{
		Use:   "restore DIR [--nats URL] [--creds ADMIN.creds] [--replace]",
		Short: "Restore a backup into a deployment whose jetflow services are stopped, then run jetflow bootstrap",
		Long: `Checks the backup in DIR (its manifest: a jetflow backup, of an events
schema this jetflow reads, with every snapshot present) and the server
(no stream it would restore holds data, the same number of dispatcher
partitions), then restores each stream with the backup's configuration.
Without --replace it never deletes data: a stream that holds messages
stops it before anything changes. With --replace those streams, and the
read models, are deleted and replaced by the backup's.

Stop every jetflow service first. Then run jetflow bootstrap (jetflow dev
does it at its start): it makes the durable consumers a backup leaves out,
among them the projector's, which re-projects every read model from the
restored histories when the api starts. For jetflow dev, start it on a new
data directory with --restore DIR instead.`,
		Args: exactlyOne("name the backup directory: jetflow admin restore DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := backup.ReadManifest(args[0]); err != nil { // before connecting: a wrong directory is said at once
				return err
			}
			ctx, cancel, nc, url, err := nf.connect(cmd.Context(), a, "jetflow-restore")
			defer cancel(nil)
			if err != nil {
				return err
			}
			defer nc.Close()
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			// Nothing is printed before every check has passed: a refusal
			// is the only thing said.
			r, err := backup.Restore(ctx, nc, args[0], replace, backup.Options{
				Starting: func(backup.Manifest) {
					fmt.Fprintf(a.stdout, "restoring %s into %s\n", args[0], url)
					fmt.Fprintln(tw, "STREAM\tMESSAGES\tLAST SEQ\tCONSUMERS\tTOOK")
				},
				Progress: func(s backup.Snapshot) {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", s.Stream, s.Messages, s.LastSeq, s.ConsumerCount,
						(time.Duration(s.TookMS) * time.Millisecond).String())
				},
			})
			_ = tw.Flush()
			if err != nil {
				switch err = cause(ctx, err); { // not the admin: that, and nothing else
				case errors.Is(err, backup.ErrInTheWay):
					return fmt.Errorf("%w, or give --replace to delete it and put the backup's in its place (stop every jetflow service first)", err)
				case errors.Is(err, backup.ErrPartway):
					return fmt.Errorf("%w: once the cause is fixed, run it again with --replace", err)
				}
				return err
			}
			for _, d := range r.Deleted {
				if d.Messages > 0 {
					fmt.Fprintf(a.stdout, "  replaced: %s held %d messages\n", d.Stream, d.Messages)
				}
			}
			var events uint64
			for _, s := range r.Streams {
				if s.Stream == bus.StreamEvents {
					events = s.Messages
				}
			}
			fmt.Fprintf(a.stdout, "restored in %s: the backup of %s (jetflow %s, %d partitions)\n",
				r.Took.Round(time.Millisecond), r.Manifest.StartedAt.Local().Format(time.RFC3339), r.Manifest.Jetflow, r.Manifest.Partitions)
			fmt.Fprintf(a.stdout, "next: jetflow bootstrap --nats %s --creds ADMIN.creds (with the deployment's --replicas and --queues), then start the services:\n"+
				"  the projector re-projects every read model from the %d restored events as the api starts (or run jetflow projections rebuild)\n", url, events)
			return nil
		},
	}
	nf.add(cmd)
	cmd.Flags().BoolVar(&replace, "replace", false, "delete the streams that hold data (and the read models) and put the backup's in their place")
	return cmd
}

// size is a byte count for people.
func size(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
