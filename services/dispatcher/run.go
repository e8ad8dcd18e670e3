package main

import (
	"context"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/metrics"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	p := svcrun.New(auth.RoleDispatcher, getenv, stderr)
	workers := p.IntIn("workers", "JETFLOW_WORKERS", dispatch.DefaultWorkers, dispatch.Ranges.Workers,
		fmt.Sprintf("goroutines handling executions (with -group-commit, %d unless set)", dispatch.GroupCommitWorkers))
	ackWait := p.DurationIn("ack-wait", "JETFLOW_DISPATCH_ACK_WAIT", bus.DefaultDispatcherAckWait, dispatch.Ranges.AckWait,
		"redelivery timeout of commands and results (with -creds, the bootstrap's consumers decide)")
	cacheBytes := p.IntIn("cache-bytes", "JETFLOW_DISPATCH_CACHE_BYTES", dispatch.DefaultCacheBytes, dispatch.Ranges.CacheBytes,
		"bytes the cached execution states may hold, as estimated from their content (the least recently used go first; at most 10000 states)")
	member := p.String("member", "JETFLOW_DISPATCHER_MEMBER", "",
		"this dispatcher's name among those sharing the partitions, unique per process (default: host, pid and a random suffix)")
	apiURL := p.String("api-url", "JETFLOW_API_URL", "", "the api's base URL as workflows reach it (workflow.api_url in expressions)")
	bulkAfter := p.Int("bulk-after", "JETFLOW_BULK_AFTER", dispatch.DefaultBulkAfter,
		"send a task to its queue's bulk lane once its execution has this many others in flight there (-1: never; for agents older than the bulk lane)")
	split := p.Bool("split-dispatch", "JETFLOW_SPLIT_DISPATCH", false,
		"record each state in an event of its own, for older dispatchers and readers (during a rolling upgrade): an operation's schedule and sending, a task's sending, no next dispatch, last success, firing or arming carried by another event")
	direct := p.Bool("direct-reports", "JETFLOW_DIRECT_REPORTS", true,
		"take the reports agents hand straight to the holder of their execution's partition (core NATS requests), besides those on the results stream; -direct-reports=false: tasks tell agents to store every report")
	fromMemory := p.Bool("timers-from-memory", "JETFLOW_TIMERS_FROM_MEMORY", true,
		"fire the timers this dispatcher arms that are due within two minutes from memory at their due time, their schedules kept as the guarantee (-timers-from-memory=false: by their schedules only, up to 250 ms late)")
	notices := p.Bool("timer-notices", "JETFLOW_TIMER_NOTICES", true,
		"set the schedule of a timer due more than two minutes ahead a minute before its due time, with a notice that brings the timer into the memory of the dispatcher holding its execution then, to fire from memory (a burst of long sleeps fires on time); -timer-notices=false: for its due time, fired by its schedule")
	groupCommit := p.Bool("group-commit", "JETFLOW_GROUP_COMMIT", false,
		"gather the history appends and the task publishes made at once into atomic batches: for a single NATS server with sync_interval: always, which then fsyncs a batch once instead of each message (docs/adr/0020); JF_EVENTS and JF_TASKS must allow atomic batches (this release's jetflow bootstrap)")
	metricsAddr := p.String("metrics-addr", "JETFLOW_DISPATCHER_METRICS_ADDR", "",
		"host:port of the Prometheus /metrics endpoint, e.g. 127.0.0.1:9466 (empty: off)")
	if err := p.Parse(args); err != nil {
		return err
	}
	if r := dispatch.Ranges.BulkAfter; *bulkAfter != dispatch.NoBulkLane && (*bulkAfter < r.Min || *bulkAfter > r.Max) {
		return fmt.Errorf("-bulk-after (JETFLOW_BULK_AFTER) %d: out of range, use %d to %d, or %d for no bulk lane",
			*bulkAfter, r.Min, r.Max, dispatch.NoBulkLane)
	}
	if *groupCommit && !p.IsSet("workers", "JETFLOW_WORKERS") {
		*workers = 0 // the default with group commit
	}
	cfg := dispatch.Config{Workers: *workers, CacheBytes: *cacheBytes, AckWait: *ackWait, APIURL: *apiURL, BindOnly: p.Common.Restricted(), Member: *member, BulkAfter: *bulkAfter,
		SplitDispatch: *split, NoDirectReports: !*direct, NoTimersFromMemory: !*fromMemory, NoTimerNotices: !*notices,
		GroupCommit: *groupCommit}
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	tp, flush, err := tracing.FromEnv(ctx, "dispatcher", getenv) // the OTEL_* variables (docs/observability.md)
	if err != nil {
		return err
	}
	defer flush()
	cfg.Tracer = tp
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
			m, err := dispatch.NewMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"namespace": ns.Name}, reg))
			if err != nil {
				return err
			}
			cfg.Metrics = m
		}
		d, err := dispatch.New(ctx, cfg, ns.JS, ns.Log)
		if err != nil {
			return err
		}
		ns.Ready(d.Ready)
		return d.Run(ctx)
	})
}
