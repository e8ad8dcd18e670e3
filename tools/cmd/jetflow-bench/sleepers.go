package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/soak"
)

// sleepersWorkflow is the workflow of the sleepers run: one sleep step,
// long enough that no execution wakes during the run.
const (
	sleepersWorkflow = "bench-sleepers"
	sleepersSleep    = "1h"
)

// sleepersSettle is how long the sleepers run waits by default, once
// every execution is recorded sleeping, before it measures: the projector
// writes its read models and the dispatcher its caches after the events.
// (nats-server keeps more for a while: a stream's block cache for 10 s
// after its last use, the commands stream's message ids for its 10 min
// dedupe window; -sleepers-settle 11m measures without them.) 30 s is
// past the block caches: 3 s after a burst, what they held weighed as
// much as the sleepers.
const sleepersSettle = 30 * time.Second

// sleepersStall is how long the sleepers run waits for one more
// execution to be recorded sleeping before it gives up: a large run on a
// busy machine takes many minutes, but never stops moving.
const sleepersStall = 2 * time.Minute

// footprint is the process's memory and goroutines at one moment, taken
// after the Go runtime has returned what it could to the OS.
type footprint struct {
	rss        int64  // VmRSS in bytes, -1 when unknown
	rssFile    int64  // of rss, the file-backed pages (RssFile: the binary's code, files mapped), -1 when unknown
	heap       uint64 // heap spans in use (live objects and the free room among them)
	live       uint64 // live heap objects
	goroutines int
	// server is the NATS server process's part of the figures above
	// (-nats-process), nil when the server runs in this process.
	server *footprint
}

func takeFootprint() footprint {
	// Two GCs, and the freed pages returned: RSS is then what is live. A
	// sync.Pool keeps what was put in it through one GC (nats-server's
	// pools of message-block buffers: over 100 MiB after 100,000 starts),
	// and frees it at the next, which an idle process runs within two
	// minutes anyway (the runtime's forced GC).
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := footprint{rss: -1, rssFile: -1, heap: ms.HeapInuse, live: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		if rss, ok := soak.ParseVmRSS(string(b)); ok {
			f.rss = rss
		}
		if file, ok := soak.ParseStatusKB(string(b), "RssFile"); ok {
			f.rssFile = file
		}
	}
	if serverProcess != nil { // -nats-process: both processes
		c, ok := childFootprint()
		f = f.plus(c, ok)
		if ok {
			f.server = &c
		}
	}
	return f
}

// plus is f with the footprint of another process, c (known: ok), added:
// a figure either does not know is not known.
func (f footprint) plus(c footprint, ok bool) footprint {
	add := func(a, b int64) int64 {
		if !ok || a < 0 || b < 0 {
			return -1
		}
		return a + b
	}
	f.rss, f.rssFile = add(f.rss, c.rss), add(f.rssFile, c.rssFile)
	f.heap, f.live, f.goroutines = f.heap+c.heap, f.live+c.live, f.goroutines+c.goroutines
	return f
}

// perExecution is the growth from before to after divided by n, and
// whether it is known: not when either is unknown (-1) or n is not
// positive.
func perExecution(before, after int64, n int) (float64, bool) {
	if before < 0 || after < 0 || n <= 0 {
		return 0, false
	}
	return float64(after-before) / float64(n), true
}

// sleepTracker counts the executions of the sleepers run recorded
// sleeping (their step.waiting event, which records the timer's arming:
// docs/adr/0018).
type sleepTracker struct {
	sub    *nats.Subscription
	prefix string
	want   int64
	asleep atomic.Int64
	ended  atomic.Int64
	all    chan struct{}
	once   sync.Once
}

func newSleepTracker(nc *nats.Conn, prefix string, want int) (*sleepTracker, error) {
	t := &sleepTracker{prefix: prefix, want: int64(want), all: make(chan struct{})}
	sub, err := nc.Subscribe(bus.WorkflowSubjects(sleepersWorkflow), func(m *nats.Msg) {
		if !strings.HasPrefix(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], prefix) {
			return
		}
		switch typ := events.Type(m.Header.Get("ce-type")); {
		case typ == events.TypeStepWaiting:
			if t.asleep.Add(1) == t.want {
				t.once.Do(func() { close(t.all) })
			}
		case typ.IsTerminal():
			t.ended.Add(1)
		}
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.sub = sub
	return t, nil
}

func (t *sleepTracker) close() { _ = t.sub.Unsubscribe() }

// sleepersResult is what the sleepers run measured.
type sleepersResult struct {
	before, after footprint
	// rssPer and heapPer are bytes per sleeping execution; rssKnown
	// says whether the system reported the RSS.
	rssPer, heapPer float64
	rssKnown        bool
}

// runSleepers starts n executions that sleep for an hour, waits until
// every one is recorded sleeping, and reports what they cost the process
// in memory and goroutines. They are left asleep: the data directory is
// removed with the run (or keeps them, with -data).
func runSleepers(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int, settle time.Duration) (sleepersResult, error) {
	var res sleepersResult
	def := workflow.Definition{Name: sleepersWorkflow, Steps: []workflow.Step{
		{ID: "nap", Kind: workflow.KindSleep, Duration: sleepersSleep},
	}}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return res, err
	}
	prefix := fmt.Sprintf("sleeper-%d-", time.Now().UnixNano())
	tr, err := newSleepTracker(conn.NC, prefix, n)
	if err != nil {
		return res, err
	}
	defer tr.close()
	res.before = takeFootprint()

	began := time.Now()
	if err := publishStarts(ctx, conn, n, func(i int) *events.StartExecution {
		return &events.StartExecution{Workflow: sleepersWorkflow, ExecutionID: fmt.Sprintf("%s%d", prefix, i)}
	}); err != nil {
		return res, err
	}
	published := time.Since(began)
	fmt.Fprintf(out, "\nsleepers run: %d executions of a one-step workflow sleeping %s\n", n, sleepersSleep)

	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	last, lastAt, lastSaid := int64(-1), time.Now(), time.Now()
wait:
	for {
		select {
		case <-tr.all:
			break wait
		case now := <-progress.C:
			k := tr.asleep.Load()
			if k != last {
				last, lastAt = k, now
			} else if now.Sub(lastAt) >= sleepersStall {
				return res, fmt.Errorf("sleepers run: %d of %d executions recorded sleeping, none more for %s (%d ended)",
					k, n, sleepersStall, tr.ended.Load())
			}
			if now.Sub(lastSaid) >= 30*time.Second { // a large run takes minutes: say how far it is
				fmt.Fprintf(out, "  (%s: %d of %d recorded sleeping)\n", now.Sub(began).Round(time.Second), k, n)
				lastSaid = now
			}
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	asleep := time.Since(began)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.after = takeFootprint()
	if e := tr.ended.Load(); e > 0 {
		return res, fmt.Errorf("sleepers run: %d executions ended instead of sleeping", e)
	}
	res.rssPer, res.rssKnown = perExecution(res.before.rss, res.after.rss, n)
	res.heapPer, _ = perExecution(int64(res.before.heap), int64(res.after.heap), n)

	fmt.Fprintf(out, "  start commands   published in %s; all recorded sleeping %s after the first; measured %s later\n",
		published.Round(time.Millisecond), asleep.Round(time.Millisecond), settle)
	if serverProcess != nil {
		fmt.Fprintf(out, "  (every figure below is the sum of this process's and the NATS server process's, -nats-process)\n")
	}
	if res.rssKnown {
		fmt.Fprintf(out, "  RSS              %s before, %s after: %.2f KiB per sleeping execution\n",
			mib(res.before.rss), mib(res.after.rss), res.rssPer/1024)
	} else {
		fmt.Fprintf(out, "  RSS              unknown (no /proc/self/status)\n")
	}
	if per, ok := perExecution(res.before.rssFile, res.after.rssFile, n); ok {
		fmt.Fprintf(out, "  of which files   %s before, %s after: %.2f KiB per sleeping execution (file-backed pages: mostly the binary's code)\n",
			mib(res.before.rssFile), mib(res.after.rssFile), per/1024)
	}
	fmt.Fprintf(out, "  heap in use      %s before, %s after: %.2f KiB per sleeping execution\n",
		mib(int64(res.before.heap)), mib(int64(res.after.heap)), res.heapPer/1024)
	livePer, _ := perExecution(int64(res.before.live), int64(res.after.live), n)
	fmt.Fprintf(out, "  live heap        %s before, %s after: %.2f KiB per sleeping execution (the rest of the heap in use is room between objects)\n",
		mib(int64(res.before.live)), mib(int64(res.after.live)), livePer/1024)
	if b, a := res.before.server, res.after.server; b != nil && a != nil {
		rssPer, _ := perExecution(b.rss, a.rss, n)
		heapPer, _ := perExecution(int64(b.heap), int64(a.heap), n)
		livePer, _ := perExecution(int64(b.live), int64(a.live), n)
		fmt.Fprintf(out, "  of which NATS    RSS %s → %s, heap in use %s → %s, live heap %s → %s: %.2f, %.2f, %.2f KiB per sleeping execution\n",
			mib(b.rss), mib(a.rss), mib(int64(b.heap)), mib(int64(a.heap)), mib(int64(b.live)), mib(int64(a.live)),
			rssPer/1024, heapPer/1024, livePer/1024)
	}
	fmt.Fprintf(out, "  goroutines       %d before, %d after (%+d)\n",
		res.before.goroutines, res.after.goroutines, res.after.goroutines-res.before.goroutines)
	fmt.Fprintf(out, "  Go timers        not measurable (the Go runtime exports no count of its timers)\n")
	return res, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
