package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"jetflow.dev/pkg/auth"
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
	names, err := common.ServedNamespaces()
	if err != nil {
		return err
	}
	if len(names) != 1 || names[0] != auth.DefaultNamespace {
		return fmt.Errorf("-namespaces: this api serves the default namespace only (namespaces over HTTP are being built)")
	}
	return svcrun.Serve(ctx, common, auth.RoleAPI, log, func(ctx context.Context, ns svcrun.Namespace) error {
		return api.Serve(ctx, api.Config{Addr: *addr, StartWait: *startWait, BindOnly: common.Restricted()}, ns.NC, ns.JS, ns.Log)
	})
}
