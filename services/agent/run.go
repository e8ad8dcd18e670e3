package main

import (
	"context"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/internal/metrics"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	p := svcrun.New(auth.RoleAgent, getenv, stderr)
	name := p.String("name", "JETFLOW_AGENT_NAME", "", "agent name (default hostname-pid)")
	queues := p.String("queues", "JETFLOW_QUEUES", "default", "comma-separated queues to serve")
	concurrency := p.IntIn("concurrency", "JETFLOW_CONCURRENCY", 16, agent.Ranges.Concurrency, "tasks run at once per queue")
	ackWait := p.DurationIn("task-ack-wait", "JETFLOW_TASK_ACK_WAIT", bus.DefaultTaskAckWait, agent.Ranges.AckWait,
		"time without heartbeat before a task goes to another agent (with -creds, the bootstrap's consumers decide)")
	maxDeliver := p.IntIn("max-deliver", "JETFLOW_TASK_MAX_DELIVER", 5, agent.Ranges.MaxDeliver,
		"deliveries of a task before the janitor fails it (likewise)")
	grace := p.DurationIn("kill-grace", "JETFLOW_KILL_GRACE", 5*time.Second, agent.Ranges.KillGrace,
		"time between SIGTERM and SIGKILL for exec steps")
	startedAfter := p.DurationIn("report-started-after", "JETFLOW_AGENT_REPORT_STARTED_AFTER", agent.DefaultStartedAfter, agent.Ranges.StartedAfter,
		"how long an operation runs before it is reported started; one that ends sooner is reported started with its result (0: at once)")
	direct := p.Bool("direct-reports", "JETFLOW_AGENT_DIRECT_REPORTS", true,
		"hand reports straight to the dispatcher holding their execution (a core NATS request), stored on the results stream only when it does not answer that it recorded them; -direct-reports=false stores every report")
	directWait := p.DurationIn("direct-wait", "JETFLOW_AGENT_DIRECT_WAIT", agent.DefaultDirectWait, agent.Ranges.DirectWait,
		"how long a report handed straight to a dispatcher waits for its answer before it is stored instead")
	allowExec := p.Bool("allow-exec", "JETFLOW_AGENT_ALLOW_EXEC", false, "run exec steps (off: they fail without running)")
	execAllow := p.String("exec-allow", "JETFLOW_AGENT_EXEC_ALLOW", "",
		"comma-separated commands exec steps may run: base names (looked up in PATH) or absolute paths; empty: any")
	httpHosts := p.String("http-allow-hosts", "JETFLOW_AGENT_HTTP_ALLOW_HOSTS", "",
		"comma-separated hosts http steps may reach: host, host:port, *.domain, IP; empty: any")
	secretsDir := p.String("secrets-dir", "JETFLOW_AGENT_SECRETS_DIR", "", "directory whose file NAME is the secret ${secret.NAME}")
	secretsEnv := p.String("secrets-env-prefix", "JETFLOW_AGENT_SECRETS_ENV_PREFIX", "",
		"environment variables <prefix>NAME are the secrets ${secret.NAME} (e.g. JETFLOW_SECRET_)")
	metricsAddr := p.String("metrics-addr", "JETFLOW_AGENT_METRICS_ADDR", "",
		"host:port of the Prometheus /metrics endpoint, e.g. 127.0.0.1:9467 (empty: off)")
	if err := p.Parse(args); err != nil {
		return err
	}
	cfg := agent.Config{Name: *name, Queues: svc.List(*queues), Concurrency: *concurrency,
		AckWait: *ackWait, MaxDeliver: *maxDeliver, KillGrace: *grace, BindOnly: p.Common.Restricted(),
		Policy:     agent.Policy{AllowExec: *allowExec, ExecAllow: svc.List(*execAllow), HTTPAllowHosts: svc.List(*httpHosts)},
		SecretsDir: *secretsDir, SecretsEnvPrefix: *secretsEnv, NoDirectReports: !*direct, DirectWait: *directWait,
		LookupEnv: func(k string) (string, bool) { v := getenv(k); return v, v != "" }}
	if cfg.StartedAfter = *startedAfter; cfg.StartedAfter == 0 {
		cfg.StartedAfter = agent.StartedAtOnce
	}
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	tp, flush, err := tracing.FromEnv(ctx, "agent", getenv) // the OTEL_* variables (docs/observability.md)
	if err != nil {
		return err
	}
	defer flush()
	cfg.Tracer = tp
	if !cfg.Policy.AllowExec {
		p.Log.Info().Msg("exec steps are off: they fail without running (enable them with -allow-exec)")
	}
	var reg *prometheus.Registry
	if *metricsAddr != "" { // listening before waiting for NATS: a busy port stops the program at once
		reg = metrics.Registry()
		stop, err := metrics.Serve("-metrics-addr", *metricsAddr, reg, p.Log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return p.Serve(ctx, func(ctx context.Context, ns svcrun.Namespace) error {
		cfg := cfg
		if reg != nil {
			m, err := agent.NewMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"namespace": ns.Name}, reg))
			if err != nil {
				return err
			}
			cfg.Metrics = m
		}
		a, err := agent.New(cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		ns.Ready(a.Ready)
		return a.Run(ctx)
	})
}
