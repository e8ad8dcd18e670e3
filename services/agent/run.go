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
		AckWait: *ackWait, MaxDeliver: *maxDeliver, KillGrace: *grace, BindOnly: common.Restricted()}
	return svcrun.Serve(ctx, common, auth.RoleAgent, log, func(ctx context.Context, ns svcrun.Namespace) error {
		a, err := agent.New(cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
}
