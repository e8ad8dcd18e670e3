package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"time"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-agent", getenv)
	common := f.AddCommon()
	name := f.String("name", "JETFLOW_AGENT_NAME", "", "agent name (default hostname-pid)")
	queues := f.String("queues", "JETFLOW_QUEUES", "default", "comma-separated queues to serve")
	concurrency := f.Int("concurrency", "JETFLOW_CONCURRENCY", 16, "tasks run at once per queue")
	ackWait := f.Duration("task-ack-wait", "JETFLOW_TASK_ACK_WAIT", 30*time.Second,
		"time without heartbeat before a task goes to another agent (with -creds, the bootstrap's consumers decide)")
	maxDeliver := f.Int("max-deliver", "JETFLOW_TASK_MAX_DELIVER", 5, "deliveries of a task before the janitor fails it (likewise)")
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
	log, err := svcrun.Logger(stderr, common, "agent")
	if err != nil {
		return err
	}
	cfg := agent.Config{Name: *name, Queues: strings.Split(*queues, ","), Concurrency: *concurrency,
		AckWait: *ackWait, MaxDeliver: *maxDeliver, KillGrace: *grace, BindOnly: common.Restricted(),
		Policy:     agent.Policy{AllowExec: *allowExec, ExecAllow: svc.List(*execAllow), HTTPAllowHosts: svc.List(*httpHosts)},
		SecretsDir: *secretsDir, SecretsEnvPrefix: *secretsEnv,
		LookupEnv: func(k string) (string, bool) { v := getenv(k); return v, v != "" }}
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	if !cfg.Policy.AllowExec {
		log.Info().Msg("exec steps are off: they fail without running (enable them with -allow-exec)")
	}
	return svcrun.Serve(ctx, common, auth.RoleAgent, log, func(ctx context.Context, ns svcrun.Namespace) error {
		a, err := agent.New(cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
}
