package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"time"

	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-api", getenv)
	common := f.AddCommon()
	addr := f.String("http", "JETFLOW_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	startWait := f.Duration("start-wait", "JETFLOW_START_WAIT", 5*time.Second, "how long a start request waits for the dispatcher")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log, err := svcrun.Logger(stderr, common, "api")
	if err != nil {
		return err
	}
	nc, js, err := svcrun.Open(ctx, common, "jetflow-api", log)
	if err != nil {
		return err
	}
	defer nc.Drain()
	return api.Serve(ctx, api.Config{Addr: *addr, StartWait: *startWait, BindOnly: common.Restricted()}, nc, js, log)
}
