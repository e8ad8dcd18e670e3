package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/api/visibility/pgstore"
	"jetflow.dev/services/janitor/janitor"
	"jetflow.dev/tools/internal/backup"
	"jetflow.dev/tools/internal/devstack"
)

// The dev stack's services log times to the nanosecond, as the service
// binaries do (svcrun). Set once, before anything logs: a command that
// set it would race with the loggers of another running in the same
// process (the tests run several).
func init() {
	zerolog.TimeFieldFormat = time.RFC3339Nano
	zerolog.DurationFieldFormat = zerolog.DurationFormatString // took=1.52ms, not took=1.52
}

func (a *app) devCmd() *cobra.Command {
	var cfg devstack.Config
	var level string
	var jsonLogs bool
	policy := agent.Policy{AllowExec: true}
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
				return usagef("--log-level %q: use debug, info, warn or error", level)
			}
			w := zerolog.ConsoleWriter{Out: a.stderr, TimeFormat: "15:04:05.000", NoColor: !isTerminal(a.stderr)}
			if jsonLogs {
				cfg.Log = zerolog.New(a.stderr)
			} else {
				cfg.Log = zerolog.New(w)
			}
			cfg.Log = cfg.Log.Level(lvl).With().Timestamp().Logger()
			cfg.VisibilityPostgres = cmp.Or(cfg.VisibilityPostgres, a.getenv("JETFLOW_VISIBILITY_POSTGRES"))
			if err := checkDevInput(cfg); err != nil { // refused before anything starts, as jetflow admin restore does
				return err
			}
			if cfg.VisibilityPostgres != "" { // reachable, before anything starts or says it runs
				if err := pgstore.Ping(cmd.Context(), cfg.VisibilityPostgres); err != nil {
					return fmt.Errorf("--visibility-postgres (JETFLOW_VISIBILITY_POSTGRES): %w", err)
				}
			}
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				return fmt.Errorf("--data %s: %w", cfg.DataDir, err)
			}
			if cfg.Insecure {
				cfg.Log.Warn().Msg("--insecure: NATS runs without authentication; anyone who reaches it can write histories, purge streams and run commands on the agents")
				cfg.Log.Warn().Msg("--insecure: the api runs without authentication; anyone who reaches it can register workflows and run them")
			}
			cfg.AgentPolicy = &policy
			tp, flush, err := tracing.FromEnv(cmd.Context(), "dev", a.getenv) // the OTEL_* variables (docs/observability.md)
			if err != nil {
				return err
			}
			defer flush()
			cfg.Tracer = tp
			if cfg.StartedAfter == 0 {
				cfg.StartedAfter = agent.StartedAtOnce
			}
			err = devstack.Run(cmd.Context(), cfg, func(info devstack.Info) {
				fmt.Fprintf(a.stdout, "jetflow dev is running (process %d, in %s)\n  NATS: %s   (try: nats sub 'jf.events.>')\n  api:  %s\n  UI:   %s/   (log in with the admin token below)\n  data: %s\n",
					os.Getpid(), filepath.Join(cfg.DataDir, devstack.PIDFile), info.NATSURL, info.APIURL, info.APIURL, cfg.DataDir)
				if info.MetricsURL != "" {
					fmt.Fprintf(a.stdout, "  metrics: %s   (every service's, for Prometheus; dashboard: deployments/grafana)\n", info.MetricsURL)
				}
				if c := info.Creds(auth.RoleClient); c != "" {
					pub, _, _ := auth.CredsUser(c)
					fmt.Fprintf(a.stdout, "  NATS clients authenticate: nats --server %s --creds %s --inbox-prefix %s ...\n"+
						"  (client role: publish commands, read events; each role's creds are in %s)\n",
						info.NATSURL, c, auth.Inbox(pub), info.CredsDir)
				} else {
					fmt.Fprintln(a.stdout, "  NATS: no authentication (--insecure)")
				}
				if info.AdminTokenPath != "" {
					fmt.Fprintf(a.stdout, "  HTTP callers authenticate: the admin token is in %s\n"+
						"  (make keys for programs with jetflow keys create; curl -H \"Authorization: Bearer $JETFLOW_TOKEN\" after jetflow env)\n",
						info.AdminTokenPath)
				} else {
					fmt.Fprintln(a.stdout, "  api: no authentication (--insecure)")
				}
				abs, err := filepath.Abs(cfg.DataDir)
				if err != nil {
					abs = cfg.DataDir
				}
				secrets := cmp.Or(cfg.SecretsDir, devstack.SecretsDir(cfg.DataDir))
				fmt.Fprintf(a.stdout, "  secrets: a file NAME in %s (or a variable %sNAME) is ${secret.NAME} for the agent\n",
					secrets, cmp.Or(cfg.SecretsEnvPrefix, devstack.DefaultSecretsEnvPrefix))
				if !policy.AllowExec {
					fmt.Fprintln(a.stdout, "  exec steps are off (--allow-exec=false): they fail without running")
				}
				if filepath.Clean(cfg.DataDir) == ".jetflow" {
					fmt.Fprintln(a.stdout, "The jetflow CLI run from this directory finds it by itself.")
				}
				self, err := os.Executable()
				if err != nil {
					self = "jetflow"
				}
				fmt.Fprintf(a.stdout, "Point other shells (and the nats CLI) at it: eval \"$(%s env --data %s)\"\n", self, abs)
				fmt.Fprintf(a.stdout, "Stop with Ctrl-C, or from another shell: kill -INT $(cat %s)\n", filepath.Join(abs, "jetflow.pid"))
			})
			if err == nil {
				fmt.Fprintln(a.stdout, "jetflow dev stopped")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data", ".jetflow", "data directory (JetStream file store)")
	f.StringVar(&cfg.NATSAddr, "nats-addr", "127.0.0.1:4222", "embedded NATS listen address")
	f.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8080", "api listen address")
	// The variable is read when the command runs, not given as the flag's
	// default: --help prints defaults, and the URL may hold a password.
	f.StringVar(&cfg.VisibilityPostgres, "visibility-postgres", "",
		"URL of a PostgreSQL database for the api's visibility index, instead of DATA/visibility (default: $JETFLOW_VISIBILITY_POSTGRES)")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", DefaultDevMetricsAddr, "where every service's Prometheus metrics are served, on /metrics (\"\": none)")
	f.StringSliceVar(&cfg.Apply, "apply", nil, "workflow files or directories to register at start (repeatable)")
	f.DurationVar(&cfg.TaskAckWait, "task-ack-wait", bus.DefaultTaskAckWait, "time without agent heartbeat before a task is redelivered")
	f.IntVar(&cfg.MaxDeliver, "max-deliver", 5, "deliveries of a task before the janitor fails it")
	f.DurationVar(&cfg.KillGrace, "kill-grace", 5*time.Second, "time between SIGTERM and SIGKILL for exec steps")
	f.DurationVar(&cfg.JanitorInterval, "janitor-interval", 30*time.Second, "time between janitor sweeps")
	f.DurationVar(&cfg.IdleAfter, "idle-after", 2*time.Minute, "inactivity before the janitor checks an execution")
	f.StringVar(&cfg.RetentionDefault, "retention-default", janitor.DefaultRetention, "system retention rule for executions whose workflow sets none (e.g. 3, 7d, max(3, 7d), forever)")
	f.DurationVar(&cfg.StartedAfter, "report-started-after", agent.DefaultStartedAfter,
		"how long an operation runs before it is reported started; one that ends sooner is reported started with its result (0: at once)")
	f.BoolVar(&policy.AllowExec, "allow-exec", true, "let the agent run exec steps (--allow-exec=false: they fail without running)")
	f.StringSliceVar(&policy.ExecAllow, "exec-allow", nil, "commands exec steps may run: base names (looked up in PATH) or absolute paths (default any)")
	f.StringSliceVar(&policy.HTTPAllowHosts, "http-allow-hosts", nil, "hosts http steps may reach: host, host:port, *.domain, IP (default any)")
	f.StringVar(&cfg.SecretsDir, "secrets-dir", "", "the agent's secrets directory: the file NAME is ${secret.NAME} (default DATA/secrets)")
	f.StringVar(&cfg.SecretsEnvPrefix, "secrets-env-prefix", devstack.DefaultSecretsEnvPrefix, "environment variables <prefix>NAME are secrets too (- for none)")
	f.BoolVar(&cfg.LogNATS, "log-nats", false, "include the NATS server's own log")
	f.StringVar(&level, "log-level", "info", "log level: debug, info, warn, error")
	f.BoolVar(&jsonLogs, "log-json", false, "log JSON lines instead of console text")
	f.StringVar(&cfg.Restore, "restore", "", "restore this backup (jetflow admin backup) before the services start; the data directory must be new")
	f.BoolVar(&cfg.Insecure, "insecure", false, "run NATS and the api without authentication (experiments only: anyone who reaches them owns jetflow)")
	f.StringSliceVar(&cfg.Namespaces, "namespaces", []string{"default"},
		"namespaces to serve, each a NATS account with its own streams and services (the api serves them all)")
	return cmd
}

// checkDevInput checks what jetflow dev is given before it starts or
// makes anything: the addresses it listens on are free (a busy one was
// found only after the data directory, its keys and store were made),
// each --apply path exists, and --restore names a finished backup this
// jetflow can restore (backup.ErrNotBackup and backup.ErrRefused give
// the exit statuses of jetflow admin restore).
func checkDevInput(cfg devstack.Config) error {
	addrs := []struct{ flag, addr string }{{"--nats-addr", cfg.NATSAddr}, {"--http", cfg.HTTPAddr}, {"--metrics-addr", cfg.MetricsAddr}}
	// The form first: two flags given the same port number alone are told
	// to give HOST:PORT, not to give each its own port.
	for _, addr := range addrs {
		if addr.addr == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(addr.addr); err != nil || port == "" {
			sample := map[string]string{"--nats-addr": "4223", "--http": "8081", "--metrics-addr": "9465"}[addr.flag]
			return usagef("%s %q: give HOST:PORT, e.g. 127.0.0.1:%s", addr.flag, addr.addr, portHint(addr.addr, sample))
		}
	}
	for i, a := range addrs {
		for _, b := range addrs[:i] {
			if a.addr == "" || a.addr != b.addr {
				continue
			}
			if _, port, _ := net.SplitHostPort(a.addr); port != "0" {
				return usagef("%s and %s are both %s: give each its own port", b.flag, a.flag, a.addr)
			}
		}
	}
	for _, addr := range addrs {
		if addr.addr == "" {
			continue
		}
		if err := addressFree(addr.addr); errors.Is(err, errAddressInUse) {
			hint := ""
			if addr.flag == "--metrics-addr" {
				hint = ` (or --metrics-addr "" to serve none)`
			}
			return fmt.Errorf("%s %s: %w: another jetflow dev, or another program, listens there; stop it, or give %s 127.0.0.1:PORT%s",
				addr.flag, addr.addr, err, addr.flag, hint)
		} else if err != nil {
			return usagef("%s %s: %w", addr.flag, addr.addr, err)
		}
	}
	for _, p := range cfg.Apply {
		if _, err := os.Stat(p); err != nil {
			return usagef("--apply %s: %w", p, err)
		}
	}
	if cfg.VisibilityPostgres != "" {
		if err := pgstore.CheckURL(cfg.VisibilityPostgres); err != nil {
			return usagef("--visibility-postgres (JETFLOW_VISIBILITY_POSTGRES): %w", err)
		}
	}
	if cfg.Restore != "" {
		if _, err := backup.ReadManifest(cfg.Restore); err != nil {
			return fmt.Errorf("--restore: %w", err)
		}
	}
	return nil
}

// portHint is the port an address without one may have meant: itself
// when it is a number (--http 8081), else sample.
func portHint(addr, sample string) string {
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		return addr
	}
	return sample
}

// DefaultDevMetricsAddr is where jetflow dev serves its metrics unless
// told otherwise: on by default, as its api is, so that a Prometheus (and
// the dashboard of deployments/grafana) can be pointed at a development
// stack at once; a port of its own, beside the api's 8080 and NATS's
// 4222, so a second jetflow dev on one machine gives --metrics-addr too
// (or "" for none), as it gives --http and --nats-addr.
const DefaultDevMetricsAddr = "127.0.0.1:9464"

// errAddressInUse: jetflow dev's address is taken (exit status 4, as a
// data directory another jetflow dev uses).
var errAddressInUse = errors.New("the address is in use")

// addressFree reports whether addr can be listened on now ("" or port 0:
// any free port will be taken, nothing to check). The stack listens
// there itself a moment later; a program that takes the address in
// between still gets the stack's own error.
func addressFree(addr string) error {
	if addr == "" {
		return nil
	}
	if _, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		var se *os.SyscallError
		if errors.As(err, &se) && errors.Is(se.Err, syscall.EADDRINUSE) {
			return errAddressInUse
		}
		return err
	}
	return ln.Close()
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

func (a *app) envCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "env [--data DIR]",
		Short: "Print the environment that points clients at a running jetflow dev (eval \"$(jetflow env)\")",
		Long: `Print shell export lines for the jetflow dev running on a data directory:
JETFLOW_API and JETFLOW_TOKEN (its admin token) for the jetflow command
line and curl, and NATS_URL and NATS_CREDS (the client identity) for the
nats command line, so that they reach it whatever ports it listens on:

  eval "$(bin/jetflow env)"

The jetflow command line finds a jetflow dev running on .jetflow (or on
$JETFLOW_DATA) by itself; the nats command line needs NATS_URL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir = cmp.Or(dir, a.dataDir())
			c, err := devstack.ReadConn(dir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no jetflow dev is running on %s (start one with make dev, or name its directory with --data)", dir)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "export JETFLOW_API=%s\nexport NATS_URL=%s\n", shellQuote(c.API), shellQuote(c.NATS))
			if c.TokenFile != "" {
				tok, err := devstack.ReadToken(c.TokenFile)
				if err != nil {
					return fmt.Errorf("the admin token of the jetflow dev on %s: %w", dir, err)
				}
				fmt.Fprintf(a.stdout, "export JETFLOW_TOKEN=%s\n", shellQuote(tok))
			}
			if c.ClientCreds != "" {
				fmt.Fprintf(a.stdout, "export NATS_CREDS=%s\n# for nats stream/consumer commands add: --inbox-prefix %s (this identity reads JF_EVENTS and JF_REJECTIONS, e.g. nats stream info JF_EVENTS; it cannot list or change streams: docs/security.md)\n",
					shellQuote(c.ClientCreds), c.ClientInbox)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "data", "", "data directory of the jetflow dev (default $JETFLOW_DATA, else .jetflow)")
	return cmd
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
