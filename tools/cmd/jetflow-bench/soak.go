package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/soak"
)

// soakJanitor is the stack's janitor interval during a soak run: short,
// so that retention deletes finished executions as the run goes and the
// store stays bounded, as in production.
const soakJanitor = 10 * time.Second

// soakConfig configures the soak run: a steady mixed load at a fixed
// arrival rate, with a row of figures every Every.
type soakConfig struct {
	// Duration is how long executions are started. Required.
	Duration time.Duration
	// Rate is how many executions are started per second, whether or not
	// the earlier ones have finished (an open loop). Flag default 10.
	Rate float64
	// Every is the interval between rows. Default 1m, or Duration/10
	// (whole seconds, at least 1s) when Duration is under 10m.
	Every time.Duration
	// Sample is the interval between measurements of memory, goroutines
	// and open files (each after a forced GC); Every must be a multiple
	// of it. Default: Every up to 10s, else the longest whole second up
	// to 10s that divides it.
	Sample time.Duration
	// Sleep is how long the sleep kind sleeps. Flag default 3s.
	Sleep time.Duration
	// Retention is the rule of every soak workflow. Flag default "10":
	// the ten most recent finished executions of each kind are kept.
	Retention string
	// Drain is how long, after the load, the run waits for the executions
	// still running to finish. Flag default 2m.
	Drain time.Duration
	// Heap (MiB), Goroutines and FDs are the leak rules. Flag defaults:
	// a slope above 1 MiB/min, 2/min and 1/min, and a growth over the
	// judged half above 16 MiB (two of nats-server's largest block
	// buffers, by which the heap after a GC moves), 20 and 5.
	Heap, Goroutines, FDs soak.Rule
	// CacheSize is the dispatcher's cache of execution states during the
	// soak. Flag default 1000 (the service's default is 10000): a bounded
	// cache that fills for longer than the warm-up would look like a
	// leak, and at 10 executions/s 1000 fill in 100s.
	CacheSize int
	// HeapProfiles, when set, is where heap profiles are written: at the
	// end of the warm-up (HeapProfiles+"-warm.pprof") and at the end of
	// the load (HeapProfiles+"-end.pprof"), to see what grew with
	// go tool pprof -diff_base.
	HeapProfiles string
	// WarnOnly reports a leak as a warning instead of an error.
	WarnOnly bool
}

// defaultSoakConfig is the soak's configuration with the flags' defaults.
func defaultSoakConfig() soakConfig {
	return soakConfig{Rate: 10, Sleep: 3 * time.Second, Retention: "10", Drain: 2 * time.Minute, CacheSize: 1000,
		Heap: soak.Rule{MinSlope: 1, MinGrowth: 16}, Goroutines: soak.Rule{MinSlope: 2, MinGrowth: 20}, FDs: soak.Rule{MinSlope: 1, MinGrowth: 5}}
}

// withDefaults computes Every and Sample when they are 0.
func (c soakConfig) withDefaults() soakConfig {
	if c.Every == 0 {
		c.Every = time.Minute
		if c.Duration < 10*time.Minute {
			c.Every = max(time.Second, (c.Duration / 10).Truncate(time.Second))
		}
	}
	if c.Sample == 0 {
		// At most 10s, and Every a multiple of it.
		c.Sample = c.Every
		for s := 10 * time.Second; s >= time.Second && c.Every > 10*time.Second; s -= time.Second {
			if c.Every%s == 0 {
				c.Sample = s
				break
			}
		}
	}
	return c
}

// validate says what is wrong with the configuration, with the flags'
// names, once the defaults are applied.
func (c soakConfig) validate() error {
	switch {
	case c.Duration <= 0:
		return errors.New("-soak must be a positive duration")
	case !(c.Rate > 0) || c.Rate > 1000:
		return fmt.Errorf("-soak-rate must be above 0 and at most 1000 executions/s, not %v", c.Rate)
	case c.Sample < 100*time.Millisecond:
		return fmt.Errorf("-soak-sample must be at least 100ms, not %s", c.Sample)
	case c.Every < c.Sample || c.Every%c.Sample != 0:
		return fmt.Errorf("-soak-every (%s) must be a multiple of -soak-sample (%s)", c.Every, c.Sample)
	case c.Every > c.Duration:
		return fmt.Errorf("-soak-every (%s) must be at most -soak (%s)", c.Every, c.Duration)
	case c.Sleep < time.Second || c.Sleep > time.Minute:
		return fmt.Errorf("-soak-sleep must be between 1s and 1m, not %s", c.Sleep)
	case c.CacheSize < 1 || c.CacheSize > 1_000_000:
		return fmt.Errorf("-soak-cache must be between 1 and 1000000, not %d", c.CacheSize)
	case c.Drain < time.Second:
		return fmt.Errorf("-soak-drain must be at least 1s, not %s", c.Drain)
	}
	if _, err := retention.Parse(c.Retention); err != nil {
		return fmt.Errorf("-soak-retention: %w", err)
	}
	for _, r := range []struct {
		flag string
		rule soak.Rule
	}{{"-soak-heap-slope and -soak-heap-growth", c.Heap}, {"-soak-goroutine-slope", c.Goroutines}, {"-soak-fd-slope", c.FDs}} {
		if err := r.rule.Validate(); err != nil {
			return fmt.Errorf("%s: %w", r.flag, err)
		}
	}
	return nil
}

// soakKind is one kind of execution in the soak's mix: its workflow
// (YAML, with the retention rule and the sleep to fill in) and its share.
type soakKind struct {
	name   string
	yaml   string
	weight int
}

// soakKinds is the mix: short executions run by the dispatcher and an
// agent, exec steps (a process each), durable sleeps, waits satisfied by
// a signal, locks with some contention (two lock names), and a small
// foreach.
var soakKinds = []soakKind{
	{"noop", `
steps:
  - {id: set, kind: let, vars: {n: "${input.n}"}}
  - {id: op, kind: noop}
`, 3},
	{"exec", `
steps:
  - {id: run, kind: exec, command: echo, args: ["soak ${input.n}"], output: "${trim(result.stdout)}"}
`, 2},
	{"sleep", `
steps:
  - {id: nap, kind: sleep, duration: "{{sleep}}"}
  - {id: op, kind: noop}
`, 1},
	{"wait", `
steps:
  - {id: gate, kind: wait, signal: go, timeout: 5m}
  - {id: after, kind: let, vars: {got: "${steps.gate.output.name}"}}
`, 1},
	{"lock", `
steps:
  - id: critical
    kind: workflow
    lock: soak-${input.slot}
    steps:
      - {id: op, kind: noop}
`, 2},
	{"foreach", `
steps:
  - id: each
    kind: foreach
    items: ${0..4}
    concurrency: 2
    steps:
      - {id: op, kind: noop}
`, 1},
}

// soakSleep is the index of the sleep kind, and soakWait that of the
// kind whose executions get a signal.
const (
	soakSleep = 2
	soakWait  = 3
)

// soakWorkflow is the workflow name of a kind.
func soakWorkflow(k soakKind) string { return "soak-" + k.name }

// soakMix spreads the kinds by weight over one cycle of starts, so that
// every window of the run sees the same mix.
func soakMix() []int {
	total := 0
	for _, k := range soakKinds {
		total += k.weight
	}
	// Smooth weighted round robin (as nginx's upstreams): deterministic,
	// and each kind's starts evenly spaced.
	mix := make([]int, 0, total)
	current := make([]int, len(soakKinds))
	for range total {
		best := 0
		for i, k := range soakKinds {
			current[i] += k.weight
			if current[i] > current[best] {
				best = i
			}
		}
		current[best] -= total
		mix = append(mix, best)
	}
	return mix
}

// soakRun is one running execution of the soak.
type soakRun struct {
	kind     int
	due      time.Time // when the open loop meant to start it
	signaled bool
}

// soakCounts is what the tracker saw in one interval (or in all).
type soakCounts struct {
	started, finished, failed int
}

// soakTracker follows the soak's executions with an ordered consumer on
// their history subjects (reading only ce-type; only what the stream
// stored counts, not an append it refused): it counts starts, ends and
// failures per interval, keeps the latency of each execution that
// finished, by kind, and signals the executions of the wait kind when
// they wait.
type soakTracker struct {
	cc     jetstream.ConsumeContext
	signal func(id string)

	mu        sync.Mutex
	running   map[string]*soakRun
	interval  soakCounts
	total     soakCounts
	lat       [][]time.Duration // of the interval, by kind
	failedIDs []string          // the first few, with how they ended
	drained   chan struct{}     // closed, once armed, when nothing runs
}

func newSoakTracker(ctx context.Context, js jetstream.JetStream, signal func(id string)) (*soakTracker, error) {
	t := &soakTracker{signal: signal, running: map[string]*soakRun{}, lat: make([][]time.Duration, len(soakKinds))}
	var subjects []string
	for _, k := range soakKinds {
		subjects = append(subjects, bus.WorkflowSubjects(soakWorkflow(k)))
	}
	cons, err := js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow the soak's histories: %w", err)
	}
	t.cc, err = cons.Consume(func(m jetstream.Msg) { t.onEvent(m.Subject(), m.Headers()) })
	if err != nil {
		return nil, fmt.Errorf("follow the soak's histories: %w", err)
	}
	return t, nil
}

func (t *soakTracker) close() { t.cc.Stop() }

func (t *soakTracker) onEvent(subject string, header nats.Header) {
	typ := events.Type(header.Get("ce-type"))
	if !typ.IsTerminal() && typ != events.TypeStepWaiting {
		return
	}
	now := time.Now()
	id := subject[strings.LastIndexByte(subject, '.')+1:]
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.running[id]
	if r == nil {
		return
	}
	if typ == events.TypeStepWaiting {
		if r.kind == soakWait && !r.signaled {
			r.signaled = true
			go t.signal(id)
		}
		return
	}
	delete(t.running, id)
	t.interval.finished++
	t.total.finished++
	t.lat[r.kind] = append(t.lat[r.kind], now.Sub(r.due))
	if typ != events.TypeExecutionSucceeded {
		t.interval.failed++
		t.total.failed++
		if len(t.failedIDs) < 5 {
			t.failedIDs = append(t.failedIDs, id+" ("+string(typ)+")")
		}
	}
	if t.drained != nil && len(t.running) == 0 {
		close(t.drained)
		t.drained = nil
	}
}

// starting records an execution about to be started.
func (t *soakTracker) starting(id string, kind int, due time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running[id] = &soakRun{kind: kind, due: due}
	t.interval.started++
	t.total.started++
}

// notStarted takes back an execution whose start could not be published.
func (t *soakTracker) notStarted(id string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.running[id]; !ok {
		return
	}
	delete(t.running, id)
	t.interval.failed++
	t.total.failed++
	if len(t.failedIDs) < 5 {
		t.failedIDs = append(t.failedIDs, id+" (start not published: "+err.Error()+")")
	}
}

// failSignal counts a wait execution that could not be signaled: it
// would wait until its step times out.
func (t *soakTracker) failSignal(id string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.failedIDs) < 5 {
		t.failedIDs = append(t.failedIDs, id+" (signal not published: "+err.Error()+")")
	}
}

// take returns the interval's counts and latencies by kind and starts a
// new interval.
func (t *soakTracker) take() (soakCounts, [][]time.Duration, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, lat := t.interval, t.lat
	t.interval, t.lat = soakCounts{}, make([][]time.Duration, len(soakKinds))
	return c, lat, len(t.running)
}

// drain returns a channel closed once no execution runs.
func (t *soakTracker) drain() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := make(chan struct{})
	if len(t.running) == 0 {
		close(ch)
	} else {
		t.drained = ch
	}
	return ch
}

// soakResult is what a soak run counted and concluded.
type soakResult struct {
	soakCounts
	// unfinished is how many executions had not finished after the drain.
	unfinished int
	// rows is how many rows were printed.
	rows int
	// heap, goroutines and fds are the verdicts (fds TooShort when
	// open files cannot be counted).
	heap, goroutines, fds soak.Trend
}

// soakRow is one interval's latencies by kind, kept for the table at the end.
type soakRow struct {
	at    time.Duration
	kinds []soak.Latency
}

// runSoak applies the soak workflows, starts executions at cfg.Rate for
// cfg.Duration, prints a row every cfg.Every, waits for the executions
// still running, then prints the latency by kind and the leak verdict.
// It returns an error when an execution failed or did not finish, or
// when a resource grows (unless cfg.WarnOnly), with the result.
func runSoak(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, cfg soakConfig) (soakResult, error) {
	var res soakResult
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, err
	}
	for _, k := range soakKinds {
		src := fmt.Sprintf("name: %s\nretention: %q\n", soakWorkflow(k), cfg.Retention) +
			strings.ReplaceAll(k.yaml, "{{sleep}}", cfg.Sleep.String())
		def, err := workflow.Parse([]byte(src))
		if err != nil {
			return res, fmt.Errorf("soak workflow %s: %w", k.name, err)
		}
		if _, _, err := store.Apply(ctx, def); err != nil {
			return res, fmt.Errorf("apply soak workflow %s: %w", k.name, err)
		}
	}
	evStream, err := conn.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return res, fmt.Errorf("soak: events stream: %w", err)
	}
	var tr *soakTracker
	tr, err = newSoakTracker(ctx, conn.JS, func(id string) {
		ev := events.New("jetflow-bench", "", "", time.Now(), &events.SignalExecution{ExecutionID: id, Name: "go"})
		msg, err := bus.Encode(bus.SubjectSignal, ev)
		if err == nil {
			_, err = conn.JS.PublishMsg(ctx, msg)
		}
		if err != nil && ctx.Err() == nil {
			tr.failSignal(id, err)
		}
	})
	if err != nil {
		return res, err
	}
	defer tr.close()

	mix := soakMix()
	var shares []string
	for _, k := range soakKinds {
		shares = append(shares, fmt.Sprintf("%s %d%%", k.name, 100*k.weight/len(mix)))
	}
	fmt.Fprintf(out, "\nsoak run: %s at %g executions/s (%s), retention %q on every soak workflow, janitor every %s,\n",
		cfg.Duration, cfg.Rate, strings.Join(shares, ", "), cfg.Retention, soakJanitor)
	fmt.Fprintf(out, "  the dispatcher's cache %d execution states\n", cfg.CacheSize)
	fmt.Fprintf(out, "  a row every %s; latency: from the intended start to the terminal event, of the executions that finished in the row\n", cfg.Every)
	fmt.Fprintf(out, "  (all kinds, less the %s of the sleep kind; by kind at the end);\n", cfg.Sleep)
	fmt.Fprintf(out, "  heap: live after a forced GC; memory, goroutines and open files sampled every %s for the verdict\n\n", cfg.Sample)
	fmt.Fprintf(out, "  CPU: cores used over the row by the whole process (nats-server and the four services); store: what JetStream keeps on disk\n\n")
	fmt.Fprintf(out, "%8s %7s %8s %6s %7s %8s %8s %8s %8s %8s %8s %10s %5s %11s %10s %5s %9s\n",
		"elapsed", "started", "finished", "failed", "running", "p50", "p90", "p99", "max",
		"heap MiB", "RSS MiB", "goroutines", "fds", "events msgs", "events MiB", "CPU", "store MiB")
	lastCPU, lastAt := cpuTime(), time.Duration(0)

	began := time.Now()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan struct{})
	runID := began.UnixNano()
	go func() {
		defer close(loadDone)
		period := time.Duration(float64(time.Second) / cfg.Rate)
		timer := time.NewTimer(0)
		defer timer.Stop()
		<-timer.C
		for i := 0; ; i++ {
			due := began.Add(time.Duration(i) * period)
			if due.Sub(began) >= cfg.Duration {
				return
			}
			if d := time.Until(due); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-loadCtx.Done():
					return
				}
			}
			kind := mix[i%len(mix)]
			k := soakKinds[kind]
			id := fmt.Sprintf("soak-%d-%d", runID, i)
			input, _ := json.Marshal(map[string]any{"n": i, "slot": i % 2})
			ev := events.New("jetflow-bench", "", soakWorkflow(k), time.Now(),
				&events.StartExecution{Workflow: soakWorkflow(k), ExecutionID: id, Input: input})
			msg, err := bus.Encode(bus.SubjectStart, ev)
			if err != nil {
				tr.notStarted(id, err)
				continue
			}
			tr.starting(id, kind, due)
			if _, err := conn.JS.PublishMsg(loadCtx, msg); err != nil {
				tr.notStarted(id, err)
				if loadCtx.Err() != nil {
					return
				}
			}
		}
	}()

	var heap, gor, fds []soak.Sample
	var rows []soakRow
	perRow := int(cfg.Every / cfg.Sample)
	samples := int(cfg.Duration / cfg.Sample)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for k := 1; k <= samples; k++ {
		timer.Reset(time.Until(began.Add(time.Duration(k) * cfg.Sample)))
		select {
		case <-timer.C:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		at := time.Duration(k) * cfg.Sample
		m := measure()
		heap = append(heap, soak.Sample{At: at, Value: float64(m.heap) / (1 << 20)})
		gor = append(gor, soak.Sample{At: at, Value: float64(m.goroutines)})
		if m.fds >= 0 {
			fds = append(fds, soak.Sample{At: at, Value: float64(m.fds)})
		}
		if cfg.HeapProfiles != "" && (k == samples/2 || k == samples) {
			name := cfg.HeapProfiles + "-warm.pprof"
			if k == samples {
				name = cfg.HeapProfiles + "-end.pprof"
			}
			if err := writeHeapProfile(name); err != nil {
				return res, err
			}
		}
		if k%perRow != 0 && k != samples {
			continue
		}
		c, lat, running := tr.take()
		var all []time.Duration
		row := soakRow{at: at}
		for kind, l := range lat {
			row.kinds = append(row.kinds, soak.Summarize(l))
			for _, d := range l {
				if kind == soakSleep {
					d -= cfg.Sleep // what the sleep took beyond its time
				}
				all = append(all, d)
			}
		}
		rows = append(rows, row)
		l := soak.Summarize(all)
		msgs, mib := "-", "-"
		if info, err := evStream.Info(ctx); err == nil {
			msgs, mib = fmt.Sprint(info.State.Msgs), fmt.Sprintf("%.1f", float64(info.State.Bytes)/(1<<20))
		}
		cpu, stored := "-", "-"
		if now := cpuTime(); now >= 0 && lastCPU >= 0 {
			cpu = fmt.Sprintf("%.2f", (now-lastCPU).Seconds()/(at-lastAt).Seconds())
			lastCPU, lastAt = now, at
		}
		if ai, err := conn.JS.AccountInfo(ctx); err == nil {
			stored = fmt.Sprintf("%.1f", float64(ai.Store)/(1<<20))
		}
		fmt.Fprintf(out, "%8s %7d %8d %6d %7d %8s %8s %8s %8s %8.1f %8s %10d %5s %11s %10s %5s %9s\n",
			at.Round(time.Second), c.started, c.finished, c.failed, running,
			ms(l.N, l.P50), ms(l.N, l.P90), ms(l.N, l.P99), ms(l.N, l.Max),
			float64(m.heap)/(1<<20), orDash(m.rss, func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/(1<<20)) }),
			m.goroutines, orDash(m.fds, func(v int64) string { return fmt.Sprint(v) }), msgs, mib, cpu, stored)
		res.rows++
	}
	// An open loop starts every execution it meant to, even when it fell
	// behind: those it starts now count after the rows.
	select {
	case <-loadDone:
	case <-ctx.Done():
		return res, ctx.Err()
	}

	// The executions still running finish (a sleep, a lock queue); the
	// rows are over, so this does not count in the verdict.
	drainBegan := time.Now()
	var drainedIn string
	select {
	case <-tr.drain():
		drainedIn = fmt.Sprintf("in %s", time.Since(drainBegan).Round(time.Millisecond))
	case <-time.After(cfg.Drain):
		drainedIn = fmt.Sprintf("not within %s", cfg.Drain)
	case <-ctx.Done():
		return res, ctx.Err()
	}
	c, lat, running := tr.take()
	tr.mu.Lock()
	res.soakCounts, res.unfinished = tr.total, running
	failedIDs := append([]string(nil), tr.failedIDs...)
	for id, r := range tr.running {
		if len(failedIDs) >= 10 {
			break
		}
		failedIDs = append(failedIDs, fmt.Sprintf("%s (%s, not finished)", id, soakKinds[r.kind].name))
	}
	tr.mu.Unlock()

	fmt.Fprintf(out, "\nafter the load: the executions still running finished %s: %d (%d failed); %d did not finish\n",
		drainedIn, c.finished, c.failed, running)
	if c.started > 0 {
		fmt.Fprintf(out, "  (%d of them started after the last row: the load fell behind its rate)\n", c.started)
	}
	var tail []time.Duration
	for _, l := range lat {
		tail = append(tail, l...)
	}
	if len(tail) > 0 {
		l := soak.Summarize(tail)
		fmt.Fprintf(out, "  their latency    p50 %s  p99 %s  max %s\n", ms(l.N, l.P50), ms(l.N, l.P99), ms(l.N, l.Max))
	}

	printKinds(out, rows)

	res.heap = cfg.Heap.Judge(heap, cfg.Duration)
	res.goroutines = cfg.Goroutines.Judge(gor, cfg.Duration)
	res.fds = cfg.FDs.Judge(fds, cfg.Duration)
	fmt.Fprintf(out, "\nleak verdict (second half of the run; Theil-Sen slope, Mann-Kendall z):\n")
	fmt.Fprintf(out, "  heap        %s\n", res.heap.Format("MiB"))
	fmt.Fprintf(out, "  goroutines  %s\n", res.goroutines.Format("goroutines"))
	if len(fds) > 0 {
		fmt.Fprintf(out, "  open files  %s\n", res.fds.Format("fds"))
	} else {
		fmt.Fprintf(out, "  open files  not counted on this system\n")
	}
	fmt.Fprintf(out, "executions: %d started, %d finished, %d failed, %d did not finish\n",
		res.started, res.finished, res.failed, res.unfinished)

	var errs []error
	if res.failed > 0 || res.unfinished > 0 || len(failedIDs) > 0 {
		errs = append(errs, fmt.Errorf("soak run: %d executions failed and %d did not finish (%s)",
			res.failed, res.unfinished, strings.Join(failedIDs, "; ")))
	}
	var leaks []string
	for _, l := range []struct {
		name string
		t    soak.Trend
		unit string
	}{{"heap", res.heap, "MiB"}, {"goroutines", res.goroutines, "goroutines"}, {"open files", res.fds, "fds"}} {
		if l.t.Verdict == soak.Growing {
			leaks = append(leaks, l.name+" "+l.t.Format(l.unit))
		}
	}
	if len(leaks) > 0 {
		if cfg.WarnOnly {
			fmt.Fprintf(out, "warning: a leak? %s\n", strings.Join(leaks, "; "))
		} else {
			errs = append(errs, fmt.Errorf("soak run: a leak: %s (-soak-warn-leak to only warn)", strings.Join(leaks, "; ")))
		}
	}
	return res, errors.Join(errs...)
}

// printKinds prints the latency of each kind, p50/p99 in ms, a row per
// interval.
func printKinds(out io.Writer, rows []soakRow) {
	fmt.Fprintf(out, "\nlatency by kind, p50/p99 in ms (intended start to terminal event):\n%8s", "elapsed")
	for _, k := range soakKinds {
		fmt.Fprintf(out, " %13s", k.name)
	}
	fmt.Fprintln(out)
	for _, r := range rows {
		fmt.Fprintf(out, "%8s", r.at.Round(time.Second))
		for _, l := range r.kinds {
			cell := "-"
			if l.N > 0 {
				cell = fmt.Sprintf("%d/%d", l.P50.Milliseconds(), l.P99.Milliseconds())
			}
			fmt.Fprintf(out, " %13s", cell)
		}
		fmt.Fprintln(out)
	}
}

// measurement is one sample of the process's resources.
type measurement struct {
	heap       uint64 // live heap bytes after a forced GC
	rss        int64  // resident set size, -1 when unknown
	goroutines int
	fds        int64 // open file descriptors, -1 when unknown
}

// measure forces a GC and reads the process's resources. RSS and open
// files come from /proc (Linux); elsewhere they are -1.
func measure() measurement {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := measurement{heap: ms.HeapAlloc, rss: -1, goroutines: runtime.NumGoroutine(), fds: -1}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		if rss, ok := soak.ParseVmRSS(string(b)); ok {
			m.rss = rss
		}
	}
	if d, err := os.ReadDir("/proc/self/fd"); err == nil {
		m.fds = int64(len(d)) - 1 // the directory being read
	}
	return m
}

// cpuTime is the CPU time (user and system) the process has used, with
// the NATS server process's (-nats-process), or -1 when the system does
// not say.
func cpuTime() time.Duration {
	self, child := selfCPU(), childCPU()
	if self < 0 || child < 0 {
		return -1
	}
	return self + child
}

// selfCPU is the CPU time (user and system) this process has used, or -1
// when the system does not say.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ms prints a latency in milliseconds, or "-" for none.
func ms(n int, d time.Duration) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func orDash(v int64, f func(int64) string) string {
	if v < 0 {
		return "-"
	}
	return f(v)
}

// soakAlone checks that no other run was asked for beside -soak, whose
// figures must be those of the soak's load only, then turns off the runs
// that are on by default, and checks the soak's settings.
func soakAlone(fs *flag.FlagSet, c *config) error {
	var others []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "executions", "concurrency", "steps", "single", "single1", "timers", "timer-lead", "foreach",
			"failover", "locks", "lock-semaphore", "retention", "retention-keep", "sleepers", "sleepers-settle",
			"nats-process": // the soak's memory figures are its own process's
			others = append(others, "-"+f.Name)
		}
	})
	if len(others) > 0 {
		return fmt.Errorf("-soak runs alone: drop %s", strings.Join(others, ", "))
	}
	c.executions, c.single, c.single1 = 0, 0, 0
	return c.soak.withDefaults().validate()
}

// writeHeapProfile writes the heap profile as of the last GC to name.
func writeHeapProfile(name string) error {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("heap profile %s: %w", name, err)
	}
	return f.Close()
}
