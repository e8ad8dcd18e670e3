package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"jetflow.dev/tools/internal/devstack"
)

func (a *app) devCmd() *cobra.Command {
	var cfg devstack.Config
	var level string
	var jsonLogs bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded NATS server with JetStream and all four services in one process",
		Long: `Runs jetflow on this machine: an embedded nats-server with JetStream on disk
(in --data, which survives restarts) listening on 127.0.0.1 so that any NATS
client can connect, plus the api, dispatcher, agent and janitor services, each
with its own NATS connection. Stop it with Ctrl-C; start it again on the same
--data and every unfinished execution carries on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lvl, err := zerolog.ParseLevel(level)
			if err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
			}
			zerolog.TimeFieldFormat = time.RFC3339Nano
			w := zerolog.ConsoleWriter{Out: a.stderr, TimeFormat: "15:04:05.000", NoColor: !isTerminal(a.stderr)}
			if jsonLogs {
				cfg.Log = zerolog.New(a.stderr)
			} else {
				cfg.Log = zerolog.New(w)
			}
			cfg.Log = cfg.Log.Level(lvl).With().Timestamp().Logger()
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				return fmt.Errorf("--data %s: %w", cfg.DataDir, err)
			}
			return devstack.Run(cmd.Context(), cfg, func(info devstack.Info) {
				fmt.Fprintf(a.stdout, "jetflow dev is running\n  NATS: %s   (try: nats sub 'jf.events.>')\n  api:  %s\n  data: %s\nStop with Ctrl-C.\n",
					info.NATSURL, info.APIURL, cfg.DataDir)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data", ".jetflow", "data directory (JetStream file store)")
	f.StringVar(&cfg.NATSAddr, "nats-addr", "127.0.0.1:4222", "embedded NATS listen address")
	f.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8080", "api listen address")
	f.StringSliceVar(&cfg.Apply, "apply", nil, "workflow files or directories to register at start (repeatable)")
	f.DurationVar(&cfg.TaskAckWait, "task-ack-wait", 30*time.Second, "time without agent heartbeat before a task is redelivered")
	f.IntVar(&cfg.MaxDeliver, "max-deliver", 5, "deliveries of a task before the janitor fails it")
	f.DurationVar(&cfg.KillGrace, "kill-grace", 5*time.Second, "time between SIGTERM and SIGKILL for exec steps")
	f.DurationVar(&cfg.JanitorInterval, "janitor-interval", 30*time.Second, "time between janitor sweeps")
	f.DurationVar(&cfg.IdleAfter, "idle-after", 2*time.Minute, "inactivity before the janitor checks an execution")
	f.StringVar(&cfg.RetentionDefault, "retention-default", "3", "system retention rule for executions whose workflow sets none (e.g. 3, 7d, forever)")
	f.BoolVar(&cfg.LogNATS, "log-nats", false, "include the NATS server's own log")
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&jsonLogs, "log-json", false, "log JSON lines instead of console text")
	return cmd
}

// isTerminal reports whether w is a character device (colours only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
