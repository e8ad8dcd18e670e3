// Command jetflow-bench measures jetflow end to end: many executions of a
// workflow of N noop steps through all four services on an embedded
// JetStream (file store), started by publishing start CloudEvents. It
// prints executions/s, steps/s and start-to-finish latency percentiles,
// then a sequential single-execution latency run and one of 1-step
// executions, and optionally (-timers)
// a durable-timer run: many executions sleeping until the same instant,
// reporting how late their timers fired, (-locks) a lock run: many
// executions contending for one lock, reporting acquire/release pairs per
// second and handover latency, and (-retention) a retention run: many
// finished executions, some of which their retention rule no longer keeps,
// reporting how long the janitor's sweeps take to delete them, and
// (-sleepers) a memory run: many executions asleep, reporting what each
// costs the process. It ends with a table of the figures next to the
// speed goals (figures.go). -fsync runs the server with an fsync on
// every write. Alone,
// (-soak) a soak run: a steady mixed load at a fixed arrival rate for a
// given time, a row every interval with latency percentiles, memory,
// goroutines, open files and the events stream's size, and a verdict on
// leaks (see soak.go and package soak). Alone, (-visibility) the api's
// visibility index filled with many executions, and the latency of its
// lists (visibility.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/nats-io/nats-server/v2/server"
	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/api/projector"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/tools/internal/devstack"
)

type config struct {
	executions, concurrency, steps, single       int
	single1, sleepers                            int
	sleepersSettle                               time.Duration
	fsync, groupCommit                           bool
	agentConcurrency, dispatcherWorkers          int
	syncInterval                                 time.Duration
	coalesce, gather                             time.Duration
	timers, failover, foreach, fairness          int
	loop, loopRounds                             int
	fsyncProbe, loopSleep, subjectsProbeCold     time.Duration
	failoverLoad                                 int
	fairnessSleep                                time.Duration
	bulkAfter                                    int
	timerLead                                    time.Duration
	locks, lockLimit                             int
	retention, retentionKeep                     int
	backup                                       bool
	dataDir, cpuProfile, memProfile, figuresFile string
	burstProfile, traceFile                      string
	burstProfileFor                              time.Duration
	insecure, byConnection, metrics              bool
	natsProcess                                  bool
	local                                        bool
	tracing                                      bool
	soak                                         soakConfig
	visibility, subjectsProbe                    int
	visibilityCache                              int
	visibilityPostgres                           string
}

func main() {
	if spec := os.Getenv(natsChildEnv); spec != "" { // -nats-process's server
		if err := runNATSChild(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "jetflow-bench (NATS server process):", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "jetflow-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c := config{soak: defaultSoakConfig()}
	fs := flag.NewFlagSet("jetflow-bench", flag.ContinueOnError)
	fs.IntVar(&c.executions, "executions", 2000, "executions in the throughput run (0 skips it and the warm-up)")
	fs.IntVar(&c.concurrency, "concurrency", 200, "executions in flight at once in the throughput run")
	fs.IntVar(&c.steps, "steps", 10, "noop steps per execution")
	fs.BoolVar(&c.local, "local", false, "make the throughput, single-execution and 1-step runs' noop steps local (local: true): run by the dispatcher, not sent to an agent (docs/adr/0014)")
	fs.IntVar(&c.single, "single", 100, "executions in the sequential single-execution latency run")
	fs.IntVar(&c.single1, "single1", 100, "executions of one noop step in the sequential 1-step latency run (0 skips it)")
	fs.IntVar(&c.sleepers, "sleepers", 0, "executions in the sleepers run: all asleep for an hour, reporting the process's memory and goroutines per sleeping execution (0 skips it)")
	fs.IntVar(&c.visibilityCache, "visibility-cache-bytes", 0, "the page cache of the SQLite visibility index's writer, in bytes, of the api's and of the -visibility run's (0: the default, 64 MiB; the sleepers run counts it in the process's memory)")
	fs.DurationVar(&c.sleepersSettle, "sleepers-settle", sleepersSettle, "how long the sleepers run waits, once all are asleep, before it measures (11m: past the commands stream's dedupe window)")
	fs.BoolVar(&c.fsync, "fsync", false, "run the embedded server with an fsync of every JetStream write before its ack (sync_interval: always)")
	fs.IntVar(&c.dispatcherWorkers, "dispatcher-workers", 0, "the dispatcher's -workers (0: its default, 32, or 256 with -group-commit)")
	fs.BoolVar(&c.groupCommit, "group-commit", false, "the dispatcher gathers its history appends and task publishes into atomic batches (its -group-commit, docs/adr/0020; meant for -fsync)")
	fs.IntVar(&c.agentConcurrency, "agent-concurrency", 0, "tasks the agent runs at once per queue (jetflow-agent's -concurrency; 0: its default, 16)")
	fs.DurationVar(&c.gather, "projector-gather", projector.DefaultGather, "when not under load, how long the api's projector waits after an event for the next ones (jetflow-api's -projector-gather): 0 (each event as it comes) to 1s")
	fs.DurationVar(&c.coalesce, "projector-coalesce", projector.DefaultCoalesce, "how long, under load, the api's projector gathers events before it writes the read models (jetflow-api's -projector-coalesce): 0 (write at every batch) to 10s")
	fs.DurationVar(&c.syncInterval, "sync-interval", 0, "how often the embedded server fsyncs its file store, without -fsync (sync_interval; default nats-server's, 2m)")
	fs.IntVar(&c.timers, "timers", 0, "executions in the durable-timer run, all sleeping until the same instant (0 skips it)")
	fs.DurationVar(&c.timerLead, "timer-lead", 0, "how far ahead of the first start the timer run's common due time is (default max(5s, 3ms × timers): 30s for 10,000)")
	fs.IntVar(&c.foreach, "foreach", 0, "items of the foreach run: one execution of a foreach of let steps (0 skips it)")
	fs.IntVar(&c.loop, "loop", 0, "executions of the loop run, all at once: goto loops of -loop-rounds rounds, reporting how a round's time grows with the history (0 skips it)")
	fs.IntVar(&c.loopRounds, "loop-rounds", workflow.MaxRounds, fmt.Sprintf("rounds of each loop run's execution (1 to %d, the language's limit)", workflow.MaxRounds))
	fs.DurationVar(&c.loopSleep, "loop-sleep", 0, "make each round of the loop run begin with a sleep of this long (a durable timer) instead of a local noop (0: the noop)")
	fs.IntVar(&c.fairness, "fairness", 0, "operations of the fairness run's fan-out: the latency of small executions idle and while one foreach of that many noop operations runs (0 skips it)")
	fs.IntVar(&c.bulkAfter, "bulk-after", 0, "the dispatcher's -bulk-after (0: its default; -1: every task on the normal lane, as before the agents' bulk lanes)")
	fs.DurationVar(&c.fairnessSleep, "fairness-sleep", 0, "make the fairness run's fan-out operations exec steps that sleep this long (0: noop), as slow operations hold agents")
	fs.IntVar(&c.failover, "failover", 0, "executions in the failover run: three dispatchers, one cut off while they run (0 skips it)")
	fs.IntVar(&c.failoverLoad, "failover-load", 0, "executions of the throughput run's workflow kept -concurrency in flight from 10s before the failover run's cut, reporting their start-to-finish (0: none)")
	fs.IntVar(&c.locks, "locks", 0, "executions in the lock run, all contending for one lock (0 skips it)")
	fs.IntVar(&c.lockLimit, "lock-semaphore", 1, "holders the lock run's lock allows at once (1: a mutex)")
	fs.IntVar(&c.retention, "retention", 0, "finished executions in the retention run, swept by the janitor (0 skips it)")
	fs.IntVar(&c.retentionKeep, "retention-keep", -1, "executions the retention run's rule keeps (default 3/5 of -retention: 2/5 are deleted)")
	fs.DurationVar(&c.soak.Duration, "soak", 0, "run the soak alone for this long: a steady mixed load, a row of figures every -soak-every, and a leak verdict (0 skips it)")
	fs.Float64Var(&c.soak.Rate, "soak-rate", c.soak.Rate, "executions the soak starts per second, finished or not (an open loop)")
	fs.DurationVar(&c.soak.Every, "soak-every", 0, "the soak's interval between rows (default 1m, or -soak/10 under 10m)")
	fs.DurationVar(&c.soak.Sample, "soak-sample", 0, "the soak's interval between samples of memory, goroutines and files (default: -soak-every up to 10s, else the longest whole second up to 10s that divides it)")
	fs.DurationVar(&c.soak.Sleep, "soak-sleep", c.soak.Sleep, "how long the soak's sleep executions sleep")
	fs.StringVar(&c.soak.Retention, "soak-retention", c.soak.Retention, "the retention rule of every soak workflow")
	fs.DurationVar(&c.soak.Drain, "soak-drain", c.soak.Drain, "how long the soak waits, after the load, for the executions still running")
	fs.Float64Var(&c.soak.Heap.MinSlope, "soak-heap-slope", c.soak.Heap.MinSlope, "the soak's heap growth (MiB/min, after warm-up) above which a real trend is a leak")
	fs.Float64Var(&c.soak.Heap.MinGrowth, "soak-heap-growth", c.soak.Heap.MinGrowth, "the soak's heap growth over the judged half (MiB) above which a real trend is a leak: the heap after a GC moves by nats-server's block buffers (up to 8 MiB each)")
	fs.Float64Var(&c.soak.Goroutines.MinSlope, "soak-goroutine-slope", c.soak.Goroutines.MinSlope, "the soak's goroutine growth (per minute, after warm-up) above which a real trend is a leak")
	fs.Float64Var(&c.soak.FDs.MinSlope, "soak-fd-slope", c.soak.FDs.MinSlope, "the soak's open-file growth (per minute, after warm-up) above which a real trend is a leak")
	fs.IntVar(&c.soak.CacheSize, "soak-cache", c.soak.CacheSize, "the dispatcher's cache of execution states during the soak (the service's default is 10000; a cache still filling after the warm-up looks like a leak)")
	fs.StringVar(&c.soak.HeapProfiles, "soak-heap-profiles", "", "write heap profiles at the end of the soak's warm-up and of its load to this prefix + -warm.pprof and -end.pprof (compare them with go tool pprof -diff_base)")
	fs.BoolVar(&c.soak.WarnOnly, "soak-warn-leak", false, "report a leak found by the soak as a warning, not an error")
	fs.BoolVar(&c.backup, "backup", false, "after the other runs, time a backup of everything they left (jetflow admin backup) and its restore into a new server")
	fs.StringVar(&c.dataDir, "data", "", "data directory (default: a new temp dir, removed afterwards)")
	fs.BoolVar(&c.natsProcess, "nats-process", false, "run nats-server in a process of its own, as production does, instead of in this one: each process's garbage collector then paces and marks its own heap; RSS and CPU count both processes")
	fs.BoolVar(&c.insecure, "insecure", false, "run NATS without authentication (to measure what authentication costs)")
	fs.BoolVar(&c.metrics, "metrics", false, "count and serve every service's Prometheus metrics, as jetflow dev does (to measure what counting costs)")
	fs.BoolVar(&c.tracing, "tracing", false, "record every execution's trace and export it over OTLP/HTTP to a receiver in the process, as jetflow dev does with OTEL_EXPORTER_OTLP_ENDPOINT (to measure what tracing costs)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured runs to this file")
	fs.StringVar(&c.traceFile, "trace", "", "write Go's execution trace of the measured runs to this file (go tool trace: goroutines started, scheduling delays, blocking; not -tracing, the executions' OpenTelemetry traces)")
	fs.StringVar(&c.burstProfile, "timers-cpuprofile", "", "write a CPU profile of the timer run's burst to this file: from 20 ms before the timers are due, for -timers-cpuprofile-for (this process's: with -nats-process the server's is not in it)")
	fs.DurationVar(&c.burstProfileFor, "timers-cpuprofile-for", time.Second, "how long -timers-cpuprofile profiles the burst")
	fs.StringVar(&c.memProfile, "memprofile", "", "write a heap profile at the end to this file (with -nats-process, the server process's to this file + .nats)")
	fs.StringVar(&c.figuresFile, "figures", "", "write the goals' figures this run measured to this file, as JSON (what jetflow-benchcompare reads)")
	fs.BoolVar(&c.byConnection, "by-connection", false, "after the throughput run, print the messages per step each NATS connection sent and received (where a step's messages go)")
	fs.StringVar(&c.visibilityPostgres, "visibility-postgres", "", "with -visibility: the index in the PostgreSQL database at this URL (schema "+benchSchema+", kept: a second run skips the fill) instead of SQLite in -data")
	fs.DurationVar(&c.fsyncProbe, "fsync-probe", 0, "run alone: how many messages a second a file store that fsyncs every write takes, published and acknowledged, in 1, 2, 4 and 8 work-queue streams, then history appends one by one and gathered into atomic batches, each for this long (0 skips it)")
	fs.IntVar(&c.subjectsProbe, "subjects-probe", 0, "run alone: the memory an embedded nats-server keeps per subject holding a message (an execution id's claim, a history, a read model's key each hold one), from this many keys put in a bucket, at least 10000, in a temporary directory of its own (0 skips it)")
	fs.DurationVar(&c.subjectsProbeCold, "subjects-probe-cold", DefaultSubjectsProbeCold, "how long the subjects probe waits before its last measure, for the server's block caches and subject indexes to go cold")
	fs.IntVar(&c.visibility, "visibility", 0, "run alone: fill the api's visibility index with this many executions (in -data, kept: a second run with the same -data skips the fill) and measure its lists (0 skips it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.subjectsProbeCold < 0 {
		return fmt.Errorf("-subjects-probe-cold %s: give how long to wait, e.g. 2m15s (0 measures at once)", c.subjectsProbeCold)
	}
	if c.subjectsProbe != 0 && c.subjectsProbe < minSubjectsProbe {
		return fmt.Errorf("-subjects-probe %d: give how many keys to put, at least %d (the server's fixed cost outweighs fewer), e.g. 400000", c.subjectsProbe, minSubjectsProbe)
	}
	if c.subjectsProbe > 0 { // no stack: a server of its own (subjectsprobe.go)
		return runSubjectsProbe(ctx, out, c.subjectsProbe, c.subjectsProbeCold)
	}
	if c.fsyncProbe < 0 {
		return fmt.Errorf("-fsync-probe %s: give how long each run lasts, e.g. 5s", c.fsyncProbe)
	}
	if c.fsyncProbe > 0 { // no stack: servers of its own (fsyncprobe.go)
		return runFsyncProbe(ctx, out, c.fsyncProbe, c.concurrency)
	}
	if c.visibility > 0 { // no stack: the index is filled and read directly (visibility.go)
		dir := c.dataDir
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "jetflow-bench-visibility-"); err != nil {
				return err
			}
			defer os.RemoveAll(dir)
		}
		return runVisibility(ctx, out, c.visibility, dir, c.visibilityPostgres, 200, c.visibilityCache)
	}
	if c.executions < 0 || c.concurrency < 1 || c.steps < 1 || c.single < 0 || c.timers < 0 || c.timerLead < 0 || c.failover < 0 || c.foreach < 0 || c.fairness < 0 || c.fairnessSleep < 0 {
		return fmt.Errorf("-concurrency and -steps must be positive, -executions, -single, -timers and -timer-lead non-negative")
	}
	if c.loop < 0 || (c.loop > 0 && (c.loopRounds < 1 || c.loopRounds > workflow.MaxRounds)) {
		return fmt.Errorf("-loop %d -loop-rounds %d: give a non-negative number of executions and 1 to %d rounds", c.loop, c.loopRounds, workflow.MaxRounds)
	}
	if c.loopSleep < 0 || (c.loopSleep > 0 && c.loopSleep < time.Millisecond) {
		return fmt.Errorf("-loop-sleep %s: give 0 (a local noop) or at least 1ms", c.loopSleep)
	}
	if c.failoverLoad < 0 || (c.failoverLoad > 0 && c.failover == 0) {
		return fmt.Errorf("-failover-load %d: give a positive number of executions, with -failover (the run it loads)", c.failoverLoad)
	}
	if c.burstProfile != "" && (c.timers == 0 || c.cpuProfile != "" || c.burstProfileFor <= 0) {
		return fmt.Errorf("-timers-cpuprofile profiles the timer run's burst: give -timers, a positive -timers-cpuprofile-for, and no -cpuprofile (one CPU profile at a time)")
	}
	if c.single1 < 0 || c.sleepers < 0 || c.syncInterval < 0 || c.sleepersSettle < 0 {
		return fmt.Errorf("-single1, -sleepers, -sleepers-settle and -sync-interval must be non-negative")
	}
	if r := api.Ranges.ProjectorGather; !r.Contains(c.gather) {
		return fmt.Errorf("-projector-gather %s: out of range, use 0 (each event as it comes) to %s", svc.ShortDuration(c.gather), svc.ShortDuration(r.Max))
	}
	if r := api.Ranges.ProjectorCoalesce; !r.Contains(c.coalesce) {
		return fmt.Errorf("-projector-coalesce %s: out of range, use 0 (write at every batch) to %s", svc.ShortDuration(c.coalesce), svc.ShortDuration(r.Max))
	}
	if c.agentConcurrency < 0 || c.agentConcurrency > 1024 {
		return fmt.Errorf("-agent-concurrency %d: give the tasks the agent runs at once per queue, 1 to 1024, or 0 for its default", c.agentConcurrency)
	}
	if r := dispatch.Ranges.Workers; c.dispatcherWorkers != 0 && (c.dispatcherWorkers < r.Min || c.dispatcherWorkers > r.Max) {
		return fmt.Errorf("-dispatcher-workers %d: out of range, use %d to %d, or 0 for the dispatcher's default", c.dispatcherWorkers, r.Min, r.Max)
	}
	if c.fsync && c.syncInterval > 0 {
		return fmt.Errorf("-fsync and -sync-interval exclude each other: with -fsync every write is fsynced")
	}
	if c.locks < 0 || c.lockLimit < 1 || c.lockLimit > events.MaxSemaphore {
		return fmt.Errorf("-locks must be non-negative and -lock-semaphore between 1 and %d", events.MaxSemaphore)
	}
	if c.retentionKeep < 0 {
		c.retentionKeep = c.retention * 3 / 5
	}
	if c.retention < 0 || c.retentionKeep > c.retention {
		return fmt.Errorf("-retention must be non-negative and -retention-keep at most -retention")
	}
	if c.soak.Duration != 0 {
		if err := soakAlone(fs, &c); err != nil {
			return err
		}
	}
	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "jetflow-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		c.dataDir = dir
	}
	var natsURL, credsDir string
	if c.natsProcess {
		child, err := startNATSChild(ctx, natsChildConfig{DataDir: c.dataDir, SyncAlways: c.fsync, SyncInterval: c.syncInterval, Insecure: c.insecure})
		if err != nil {
			return err
		}
		defer child.stop() // after the stack's own stop, deferred below
		serverProcess, natsURL, credsDir = child, child.hello.URL, child.hello.AuthDir
		defer func() { serverProcess = nil }()
	}
	scfg := devstack.Config{DataDir: c.dataDir, NATSAddr: "127.0.0.1:0", NATSURL: natsURL, CredsDir: credsDir, HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(os.Stderr).Level(zerolog.WarnLevel), Insecure: c.insecure, BulkAfter: c.bulkAfter,
		SyncAlways: c.fsync, SyncInterval: c.syncInterval, GroupCommit: c.groupCommit, Workers: c.dispatcherWorkers, Concurrency: c.agentConcurrency, VisibilityCache: c.visibilityCache, ProjectorCoalesce: svc.NeverIfZero(c.coalesce), ProjectorGather: svc.NeverIfZero(c.gather)}
	if c.metrics {
		scfg.MetricsAddr = "127.0.0.1:0"
	}
	if c.tracing {
		sink, err := startTraceSink(ctx)
		if err != nil {
			return fmt.Errorf("-tracing: %w", err)
		}
		defer sink.report(out)
		scfg.Tracer = sink.tp
	}
	if c.retention > 0 {
		// Every report stored (none handed straight to the dispatcher,
		// docs/adr/0009), so that the sweeps purge results too.
		scfg.JanitorInterval, scfg.JanitorCatchUpEvery, scfg.NoDirectReports = quietJanitor, -1, true
	}
	if c.soak.Duration > 0 {
		scfg.JanitorInterval, scfg.CacheSize = soakJanitor, c.soak.CacheSize
	}
	info, stopStack, err := startStack(ctx, scfg)
	if err != nil {
		return err
	}
	defer stopStack()

	conn, err := info.Dial(ctx, auth.RoleAdmin, "jetflow-bench")
	if err != nil {
		return err
	}
	defer conn.NC.Close()
	store, err := catalog.Open(ctx, conn.JS)
	if err != nil {
		return err
	}
	def := workflow.Definition{Name: "bench"}
	for i := range c.steps {
		def.Steps = append(def.Steps, workflow.Step{ID: fmt.Sprintf("s%d", i+1), Kind: workflow.KindNoop, Local: c.local})
	}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return err
	}
	security := "NATS authentication on (each service its own identity)"
	if c.insecure {
		security = "NATS authentication off (-insecure)"
	}
	syncMode := "fsync every 2m (nats-server's default)"
	switch {
	case c.fsync:
		syncMode = "fsync on every write (-fsync)"
	case c.syncInterval > 0:
		syncMode = fmt.Sprintf("fsync every %s (-sync-interval)", c.syncInterval)
	}
	if c.groupCommit {
		syncMode += ", history appends and tasks in atomic batches (-group-commit)"
	}
	if w := (dispatch.Config{Workers: c.dispatcherWorkers, GroupCommit: c.groupCommit}).WorkersOrDefault(); w != dispatch.DefaultWorkers {
		syncMode += fmt.Sprintf(", %d dispatcher workers", w)
	}
	switch c.coalesce {
	case projector.DefaultCoalesce:
	case 0:
		syncMode += ", read models written at every batch (-projector-coalesce 0)"
	default:
		syncMode += fmt.Sprintf(", read models gathered for %s under load (-projector-coalesce)", svc.ShortDuration(c.coalesce))
	}
	switch c.gather {
	case projector.DefaultGather:
	case 0:
		syncMode += ", each event projected as it comes when idle (-projector-gather 0)"
	default:
		syncMode += fmt.Sprintf(", events gathered for %s when idle (-projector-gather)", svc.ShortDuration(c.gather))
	}
	if c.metrics {
		security += ", metrics counted (-metrics)"
	}
	if c.tracing {
		security += ", traces recorded and exported (-tracing)"
	}
	where := "embedded JetStream"
	if c.natsProcess {
		where = "JetStream in a process of its own (-nats-process)"
	}
	fmt.Fprintf(out, "jetflow-bench: all four services, %s (file store, %s), %s, GOMAXPROCS=%d\n", where, syncMode, security, runtime.GOMAXPROCS(0))
	fig := figures{fsync: c.fsync, natsProcess: c.natsProcess}

	tr := newTracker(conn.NC, "bench")
	defer tr.close()
	// Warm up (consumers, caches, JIT of the file store).
	if c.executions > 0 {
		if _, err := tr.runBatch(ctx, conn, batchPrefix("warm"), 50, 50); err != nil {
			return err
		}
	}
	for _, r := range []struct {
		path  string
		start func(io.Writer) error
		stop  func()
	}{{c.cpuProfile, pprof.StartCPUProfile, pprof.StopCPUProfile}, {c.traceFile, trace.Start, trace.Stop}} {
		if r.path == "" {
			continue
		}
		f, err := os.Create(r.path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := r.start(f); err != nil {
			return err
		}
		defer r.stop()
	}
	if c.executions > 0 {
		// The warm-up's events are projected before the run begins.
		behind := projectorLag(ctx, info, conn)
		waitProjected(ctx, behind, 2*time.Minute)
		began, cpuBefore := time.Now(), cpuTime()
		goBefore := goroutinesCreated()
		msgsBefore := serverMsgs(info.Server)
		connsBefore := connMsgs(info.Server)
		lat, err := tr.runBatch(ctx, conn, batchPrefix("tput"), c.executions, c.concurrency)
		if err != nil {
			return err
		}
		wall, cpu := time.Since(began), cpuTime()
		// The read models are part of a step's cost: the projector may
		// still be behind when the last execution ends, and what it does
		// then is counted too.
		projected := waitProjected(ctx, behind, 2*time.Minute)
		cpuAll := cpuTime()
		started := goroutinesCreated() - goBefore
		var wallAll time.Duration
		msgs := serverMsgs(info.Server).minus(msgsBefore)
		if cpuBefore >= 0 && cpu >= 0 && cpuAll >= 0 {
			cpu -= cpuBefore
			cpuAll -= cpuBefore
		} else {
			cpu, cpuAll = -1, -1
		}
		steps := c.executions * c.steps
		caughtUp := !projected.IsZero()
		if caughtUp {
			wallAll = projected.Sub(began)
		} else { // not known: the figures to the last end, not the time spent waiting
			wallAll, cpuAll = wall, cpu
		}
		fig.stepsPerSec = float64(steps) / wallAll.Seconds()
		fig.spread = spread(lat)
		fig.cpuPerStep = perUnit(cpuAll, steps)
		counted := "with the read models caught up"
		if !caughtUp {
			counted = "to the last end only"
		}
		fmt.Fprintf(out, "\nthroughput run: %d executions of %d noop steps%s, %d in flight\n", c.executions, c.steps, localNote(c.local), c.concurrency)
		fmt.Fprintf(out, "  wall time        %s to the last end", wall.Round(time.Millisecond))
		if caughtUp {
			fmt.Fprintf(out, ", %s to the read models caught up\n", wallAll.Round(time.Millisecond))
		} else {
			fmt.Fprintf(out, " (the read models' catching up not seen: the figures below stop at the last end)\n")
		}
		fmt.Fprintf(out, "  executions/s     %.0f %s\n", float64(c.executions)/wallAll.Seconds(), counted)
		fmt.Fprintf(out, "  steps/s          %.0f %s (%.0f to the last end)\n",
			fig.stepsPerSec, counted, float64(steps)/wall.Seconds())
		printLatency(out, "start-to-finish", lat)
		fmt.Fprintf(out, "  p99 / p50        %.2f\n", fig.spread)
		if cpuAll >= 0 {
			fmt.Fprintf(out, "  CPU              %s user+system in %s, %s per step (%.2f of %d cores); %s per step to the last end\n",
				cpuAll.Round(time.Millisecond), processesNote(c.natsProcess), millis(fig.cpuPerStep), cpuAll.Seconds()/wallAll.Seconds(), runtime.NumCPU(),
				millis(perUnit(cpu, steps)))
		}
		if msgs.known {
			fmt.Fprintf(out, "  NATS messages    %.1f in and %.1f out of the server per step (%d, %d)\n",
				float64(msgs.in)/float64(steps), float64(msgs.out)/float64(steps), msgs.in, msgs.out)
		}
		fmt.Fprintf(out, "  goroutines       %.2f started per step in %s (%d; the benchmark's own: one per execution)\n",
			float64(started)/float64(steps), thisProcessNote(c.natsProcess), started)
		if c.byConnection {
			printConnMsgs(out, connsBefore, connMsgs(info.Server), steps)
		}
	}
	if c.single > 0 {
		lat, err := tr.runBatch(ctx, conn, batchPrefix("single"), c.single, 1)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\nsingle-execution run: %d executions of %d noop steps%s one after another\n", c.single, c.steps, localNote(c.local))
		printLatency(out, "start-to-finish", lat)
		perStep := make([]time.Duration, len(lat))
		for i, l := range lat {
			perStep[i] = l / time.Duration(c.steps)
		}
		printLatency(out, "per step", perStep)
		fig.perStep = percentile(perStep, 0.50)
	}
	if c.single1 > 0 {
		p50, err := runSingle1(ctx, out, conn, store, c.single1, c.local)
		if err != nil {
			return err
		}
		fig.oneStep = p50
	}
	if c.timers > 0 {
		p99, armedLate, err := runTimers(ctx, out, conn, store, c.timers, c.timerLead, c.burstProfile, c.burstProfileFor)
		if err != nil {
			return err
		}
		fig.timers, fig.timerLate, fig.timersArmedLate = c.timers, p99, armedLate
	}
	if c.foreach > 0 {
		if err := runForeach(ctx, out, conn, store, c.foreach); err != nil {
			return err
		}
	}
	if c.loop > 0 {
		if err := runLoop(ctx, out, conn, store, projectorLag(ctx, info, conn), c.loop, c.loopRounds, c.loopSleep); err != nil {
			return err
		}
	}
	if c.fairness > 0 {
		if err := runFairness(ctx, out, conn, store, c.fairness, c.fairnessSleep); err != nil {
			return err
		}
	}
	if c.failover > 0 {
		load := failoverLoad{tracker: tr, executions: c.failoverLoad, inflight: c.concurrency}
		if err := runFailover(ctx, out, conn, store, info, c.failover, load); err != nil {
			return err
		}
	}
	if c.locks > 0 {
		if err := runLocks(ctx, out, conn, store, c.locks, c.lockLimit); err != nil {
			return err
		}
	}
	if c.retention > 0 {
		if err := runRetention(ctx, out, conn, store, info, c.retention, c.retentionKeep, c.concurrency); err != nil {
			return err
		}
	}
	if c.soak.Duration > 0 {
		if _, err := runSoak(ctx, out, conn, store, c.soak); err != nil {
			return err
		}
	}
	if c.sleepers > 0 {
		res, err := runSleepers(ctx, out, conn, store, c.sleepers, c.sleepersSettle)
		if err != nil {
			return err
		}
		if res.rssKnown {
			fig.sleepers, fig.sleeperBytes = c.sleepers, res.rssPer
		}
	}
	if c.backup {
		if err := runBackup(ctx, out, conn.NC, info, c.dataDir); err != nil {
			return err
		}
	}
	if c.memProfile != "" {
		f, err := os.Create(c.memProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			return err
		}
		if serverProcess != nil {
			path := c.memProfile + ".nats"
			if err := serverProcess.heapProfile(path); err != nil {
				return err
			}
			fmt.Fprintf(out, "\nthe NATS server process's heap profile: %s\n", path)
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	memoryOf := "process memory"
	if c.natsProcess {
		memoryOf = "this process's memory (not the NATS server process's)"
	}
	fmt.Fprintf(out, "\n%s: heap in use %.1f MiB, total from OS %.1f MiB\n", memoryOf,
		float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20))
	if c.soak.Duration == 0 {
		printGoals(out, fig)
	}
	if c.figuresFile != "" {
		b, err := json.MarshalIndent(fig.export(), "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.figuresFile, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("-figures: %w", err)
		}
	}
	return nil
}

// localNote says, after "noop steps", that they are local (-local).
func localNote(local bool) string {
	if local {
		return " (local: run by the dispatcher)"
	}
	return ""
}

// single1Workflow is the 1-step run's workflow: one noop step.
const single1Workflow = "bench1"

// runSingle1 runs n executions of one noop step one after another (after
// a few left out, to warm the workflow up) and returns their
// start-to-finish p50.
func runSingle1(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int, local bool) (time.Duration, error) {
	def := workflow.Definition{Name: single1Workflow, Steps: []workflow.Step{{ID: "s1", Kind: workflow.KindNoop, Local: local}}}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return 0, err
	}
	tr := newTracker(conn.NC, single1Workflow)
	defer tr.close()
	if _, err := tr.runBatch(ctx, conn, batchPrefix("warm1"), 5, 1); err != nil {
		return 0, err
	}
	lat, err := tr.runBatch(ctx, conn, batchPrefix("single1"), n, 1)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "\n1-step run: %d executions of one noop step%s one after another\n", n, localNote(local))
	printLatency(out, "start-to-finish", lat)
	return percentile(lat, 0.50), nil
}

// quietJanitor is the stack's janitor interval when the retention run
// times a janitor of its own: the stack's must not sweep (and delete)
// first (the longest interval a janitor takes, far beyond any run), nor
// read the models between sweeps (its catch-ups are turned off).
const quietJanitor = 24 * time.Hour

// startStack runs the whole system in this process until stop is called.
func startStack(ctx context.Context, cfg devstack.Config) (info devstack.Info, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan devstack.Info, 1)
	done := make(chan error, 1)
	go func() {
		done <- devstack.Run(ctx, cfg, func(i devstack.Info) { ready <- i })
	}()
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		return info, nil, err
	}
	return info, func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "jetflow-bench: the system stopped with an error: %v\n", err)
		}
	}, nil
}

func printLatency(out io.Writer, name string, lat []time.Duration) {
	if len(lat) == 0 {
		fmt.Fprintf(out, "  %-16s none\n", name)
		return
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return percentile(lat, q) }
	fmt.Fprintf(out, "  %-16s p50 %s  p90 %s  p99 %s  max %s\n", name,
		latencyRound(p(0.50)), latencyRound(p(0.90)), latencyRound(p(0.99)), latencyRound(lat[len(lat)-1]))
}

// latencyRound rounds a latency for printing as the goals table does
// (millis): to the microsecond below 1 ms, to 10 µs above.
func latencyRound(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}

// tracker notices terminal events of a workflow's executions with a core
// NATS subscription, reading only the ce-type header.
type tracker struct {
	workflow string
	sub      *nats.Subscription
	mu       sync.Mutex
	waiters  map[string]chan string
}

func newTracker(nc *nats.Conn, workflow string) *tracker {
	t := &tracker{workflow: workflow, waiters: map[string]chan string{}}
	t.sub, _ = nc.Subscribe(bus.WorkflowSubjects(workflow), func(m *nats.Msg) {
		typ := events.Type(m.Header.Get("ce-type"))
		if !typ.IsTerminal() {
			return
		}
		id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		t.mu.Lock()
		ch := t.waiters[id]
		delete(t.waiters, id)
		t.mu.Unlock()
		if ch != nil {
			ch <- string(typ)
		}
	})
	_ = t.sub.SetPendingLimits(-1, -1)
	return t
}

func (t *tracker) close() { _ = t.sub.Unsubscribe() }

// batchPrefix makes the execution ids of a batch unique to this run.
func batchPrefix(name string) string { return fmt.Sprintf("%s-%d", name, time.Now().UnixNano()) }

// runBatch starts n executions, with ids prefix-0 to prefix-(n-1), with at
// most inflight running and returns each one's start-to-finish latency.
func (t *tracker) runBatch(ctx context.Context, conn *bus.Conn, prefix string, n, inflight int) ([]time.Duration, error) {
	lat := make([]time.Duration, n)
	sem := make(chan struct{}, inflight)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-errc:
			return nil, err
		}
		id := fmt.Sprintf("%s-%d", prefix, i)
		ch := make(chan string, 1)
		t.mu.Lock()
		t.waiters[id] = ch
		t.mu.Unlock()
		ev := events.New("jetflow-bench", "", t.workflow, time.Now(), &events.StartExecution{Workflow: t.workflow, ExecutionID: id})
		msg, err := bus.Encode(bus.SubjectStart, ev)
		if err != nil {
			return nil, err
		}
		began := time.Now()
		if _, err := conn.JS.PublishMsg(ctx, msg); err != nil {
			return nil, fmt.Errorf("publish start: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			select {
			case typ := <-ch:
				lat[i] = time.Since(began)
				if typ != string(events.TypeExecutionSucceeded) {
					select {
					case errc <- fmt.Errorf("execution %s ended with %s", id, typ):
					default:
					}
				}
			case <-time.After(2 * time.Minute):
				select {
				case errc <- fmt.Errorf("execution %s did not finish within 2m", id):
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	return lat, nil
}

// msgCount is how many messages the embedded server took in and sent
// out (its varz), the benchmark's own included.
type msgCount struct {
	in, out int64
	known   bool
}

// processesNote says whose CPU the figures count.
func processesNote(natsProcess bool) string {
	if natsProcess {
		return "both processes (this one and the NATS server's, -nats-process)"
	}
	return "the whole process"
}

// thisProcessNote says which goroutines goroutinesCreated counts.
func thisProcessNote(natsProcess bool) string {
	if natsProcess {
		return "this process (the services; not the NATS server's, -nats-process)"
	}
	return "the whole process"
}

// goroutinesCreated is how many goroutines this process has started
// (runtime/metrics).
func goroutinesCreated() uint64 {
	sample := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

func serverMsgs(s *server.Server) msgCount {
	if s == nil {
		return childMsgs() // -nats-process: the server process's
	}
	v, err := s.Varz(nil)
	if err != nil {
		return msgCount{}
	}
	return msgCount{in: v.InMsgs, out: v.OutMsgs, known: true}
}

func (c msgCount) minus(before msgCount) msgCount {
	if !c.known || !before.known {
		return msgCount{}
	}
	return msgCount{in: c.in - before.in, out: c.out - before.out, known: true}
}
