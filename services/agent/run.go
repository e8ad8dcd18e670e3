package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/agent/agent"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-agent", getenv)
	natsURL := f.String("nats", "JETFLOW_NATS_URL", svc.DefaultNATSURL, "NATS server URL")
	replicas := f.Int("replicas", "JETFLOW_REPLICAS", 1, "replicas of streams and buckets (3 in a cluster)")
	level := f.String("log-level", "JETFLOW_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	name := f.String("name", "JETFLOW_AGENT_NAME", "", "agent name (default hostname-pid)")
	queues := f.String("queues", "JETFLOW_QUEUES", "default", "comma-separated queues to serve")
	concurrency := f.Int("concurrency", "JETFLOW_CONCURRENCY", 16, "tasks run at once per queue")
	ackWait := f.Duration("task-ack-wait", "JETFLOW_TASK_ACK_WAIT", 30*time.Second, "time without heartbeat before a task goes to another agent")
	maxDeliver := f.Int("max-deliver", "JETFLOW_TASK_MAX_DELIVER", 5, "deliveries of a task before the janitor fails it")
	grace := f.Duration("kill-grace", "JETFLOW_KILL_GRACE", 5*time.Second, "time between SIGTERM and SIGKILL for exec steps")
	allowExec := f.Bool("allow-exec", "JETFLOW_AGENT_ALLOW_EXEC", false, "run exec steps (off: they fail without running)")
	execAllow := f.String("exec-allow", "JETFLOW_AGENT_EXEC_ALLOW", "",
		"comma-separated commands exec steps may run: base names (looked up in PATH) or absolute paths; empty: any")
	httpHosts := f.String("http-allow-hosts", "JETFLOW_AGENT_HTTP_ALLOW_HOSTS", "",
		"comma-separated hosts http steps may reach: host, host:port, *.domain, IP; empty: any")
	secretsDir := f.String("secrets-dir", "JETFLOW_AGENT_SECRETS_DIR", "", "directory whose file NAME is the secret ${secret.NAME}")
	secretsEnv := f.String("secrets-env-prefix", "JETFLOW_AGENT_SECRETS_ENV_PREFIX", "",
		"environment variables <prefix>NAME are the secrets ${secret.NAME} (e.g. JETFLOW_SECRET_)")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("-log-level %q: %w", *level, err)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	log := zerolog.New(stderr).Level(lvl).With().Timestamp().Str("service", "agent").Logger()
	cfg := agent.Config{Name: *name, Queues: strings.Split(*queues, ","), Concurrency: *concurrency,
		AckWait: *ackWait, MaxDeliver: *maxDeliver, KillGrace: *grace,
		Policy:     agent.Policy{AllowExec: *allowExec, ExecAllow: svc.List(*execAllow), HTTPAllowHosts: svc.List(*httpHosts)},
		SecretsDir: *secretsDir, SecretsEnvPrefix: *secretsEnv,
		LookupEnv: func(k string) (string, bool) { v := getenv(k); return v, v != "" }}
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	if !cfg.Policy.AllowExec {
		log.Info().Msg("exec steps are off: they fail without running (enable them with -allow-exec)")
	}
	nc, js, err := bus.Open(ctx, *natsURL, "jetflow-agent", bus.Config{Replicas: *replicas,
		OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }})
	if err != nil {
		return err
	}
	defer nc.Drain()
	a, err := agent.New(cfg, js, log)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
