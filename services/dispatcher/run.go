package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"time"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-dispatcher", getenv)
	common := f.AddCommon()
	workers := f.Int("workers", "JETFLOW_WORKERS", 32, "goroutines handling executions")
	ackWait := f.Duration("ack-wait", "JETFLOW_DISPATCH_ACK_WAIT", 30*time.Second,
		"redelivery timeout of commands and results (with -creds, the bootstrap's consumers decide)")
	member := f.String("member", "JETFLOW_DISPATCHER_MEMBER", "",
		"this dispatcher's name among those sharing the partitions, unique per process (default: host, pid and a random suffix)")
	apiURL := f.String("api-url", "JETFLOW_API_URL", "", "the api's base URL as workflows reach it (workflow.api_url in expressions)")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := svcrun.Logger(stderr, common, "dispatcher")
	if err != nil {
		return err
	}
	cfg := dispatch.Config{Workers: *workers, AckWait: *ackWait, APIURL: *apiURL, BindOnly: common.Restricted(), Member: *member}
	if err := cfg.Validate(); err != nil {
		return err
	}
	return svcrun.Serve(ctx, common, auth.RoleDispatcher, log, func(ctx context.Context, ns svcrun.Namespace) error {
		d, err := dispatch.New(ctx, cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		return d.Run(ctx)
	})
}
