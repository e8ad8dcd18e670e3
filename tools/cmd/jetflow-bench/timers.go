package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// timerWorkflow is the workflow of the timer run: one sleep step that
// ends at the instant given in the input.
const timerWorkflow = "bench-timers"

// timerLead is how far ahead of now the timer run sets the common due
// time T: long enough to start every execution first, on a busy machine
// too (10,000 took 12 to 23 s to arm on a shared 2-core machine).
func timerLead(n int) time.Duration {
	return max(5*time.Second, time.Duration(n)*3*time.Second/1000)
}

// timerRecord is what the timer run read of one execution: CloudEvent
// times of its arming (a TimerArmed, or the step.waiting recording one)
// and of its end, and of the event that recorded its timer's firing (its
// TimerFired, or the end carrying the sleep's success that records it:
// docs/adr/0017), with when the server stored that event.
type timerRecord struct {
	armed, fired, firedStored, succeeded time.Time
	failed                               bool
}

// executionOf is the execution of a history subject (its last token).
func executionOf(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// endRecordsFiring says whether an io.jetflow.execution.succeeded with
// these headers carries the sleep's success that records its timer's
// firing: such an end, and only such an end, is written with schema
// version 4 (events.SchemaOf). Read from the header, not the data: the
// read back asks for headers only.
func endRecordsFiring(h nats.Header) bool { return h.Get("ce-"+events.ExtSchema) == "4" }

// trackedType is what the timer run's read back makes of an event, from
// its header: an arming (a timer.armed, or a step.waiting recording one),
// a timer.fired, an execution's end; false for any other.
func trackedType(h nats.Header) (events.Type, bool) {
	typ := events.Type(h.Get("ce-type"))
	switch typ {
	case events.TypeTimerArmed, events.TypeTimerFired, events.TypeExecutionSucceeded, events.TypeExecutionFailed:
		return typ, true
	case events.TypeStepWaiting:
		if waitRecordsArming(h) {
			return events.TypeTimerArmed, true
		}
	}
	return "", false
}

// waitRecordsArming says whether a step.waiting records its timer's
// arming (docs/adr/0018), from its header alone: it is written with
// schema 5, which no other step.waiting is.
func waitRecordsArming(h nats.Header) bool { return h.Get("ce-"+events.ExtSchema) == "5" }

// runTimers starts n executions that all sleep until the same instant T
// and reports how late their timers fired; it returns the lateness p99
// (of the firings' storing) and how many timers were armed after T (which
// makes the figure no measure of the burst). With profile, it writes a
// CPU profile of the burst there, for profileFor.
//
// Nothing of the benchmark's watches the burst: the run reads the
// executions' histories back (readTimerRun) once timerReadAfter has passed
// since T, so that the figure is the engine's, not that of an observer of
// every event sharing its cores (an earlier version followed the events
// with a core subscription as they came: docs/benchmarks.md).
func runTimers(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int, lead time.Duration, profile string, profileFor time.Duration) (p99 time.Duration, armedLate int, err error) {
	def := workflow.Definition{Name: timerWorkflow, Steps: []workflow.Step{
		{ID: "nap", Kind: workflow.KindSleep, Until: "${input.due}"},
	}}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return 0, 0, err
	}
	if lead <= 0 {
		lead = timerLead(n)
	}
	began := time.Now()
	due := began.Add(lead)
	input, err := json.Marshal(map[string]any{"due": due.UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return 0, 0, err
	}
	var prof *burstProfile // nil: none asked for
	if profile != "" {
		prof = startBurstProfile(ctx, profile, due.Add(-burstProfileLead), profileFor)
		defer func() { _ = prof.finish(true) }() // a run that failed: none, or one cut short
	}
	runID := began.UnixNano()
	prefix := fmt.Sprintf("timer-%d-", runID)

	// Publish every start command at once, from a few goroutines.
	if err := publishStarts(ctx, conn, n, func(i int) *events.StartExecution {
		return &events.StartExecution{Workflow: timerWorkflow, ExecutionID: fmt.Sprintf("%s%d", prefix, i), Input: input}
	}); err != nil {
		return 0, 0, err
	}
	published := time.Since(began)

	// The burst, unwatched; its profile is written before the read back,
	// which is not the burst's.
	select {
	case <-time.After(time.Until(due.Add(max(timerReadAfter, profileFor)))):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	if err := prof.finish(false); err != nil {
		return 0, 0, err
	}
	readAt := time.Now()
	recs, read, rerr := readTimerRun(ctx, conn.JS, prefix, began, n, due.Add(timerEndsWithin))
	readFor := time.Since(readAt)
	if ctx.Err() != nil {
		return 0, 0, ctx.Err()
	}

	var armed, fired, early, within100, within1s, succeeded int
	var lastArmed, firstFire, lastFire, lastStored time.Time
	var fireLate, storedLate, succLate []time.Duration
	var failed []string
	for id, r := range recs {
		if !r.armed.IsZero() {
			armed++
			if r.armed.After(lastArmed) {
				lastArmed = r.armed
			}
			if r.armed.After(due) {
				armedLate++
			}
		}
		if !r.fired.IsZero() {
			fired++
			late := r.fired.Sub(due)
			fireLate = append(fireLate, late)
			storedLate = append(storedLate, r.firedStored.Sub(due))
			if r.firedStored.After(lastStored) {
				lastStored = r.firedStored
			}
			switch {
			case late < 0:
				early++
			case late <= 100*time.Millisecond:
				within100++
				within1s++
			case late <= time.Second:
				within1s++
			}
			if firstFire.IsZero() || r.fired.Before(firstFire) {
				firstFire = r.fired
			}
			if r.fired.After(lastFire) {
				lastFire = r.fired
			}
		}
		if !r.succeeded.IsZero() {
			succeeded++
			succLate = append(succLate, r.succeeded.Sub(due))
		}
		if r.failed {
			failed = append(failed, id)
		}
	}

	fmt.Fprintf(out, "\ntimer run: %d executions of a one-step workflow sleeping until the same instant T = start + %s\n", n, lead)
	fmt.Fprintf(out, "  start commands   published in %s\n", published.Round(time.Millisecond))
	if !lastArmed.IsZero() {
		fmt.Fprintf(out, "  timers armed     %d, the last %s after the first start (%d after T)\n",
			armed, lastArmed.Sub(began).Round(time.Millisecond), armedLate)
	} else {
		fmt.Fprintf(out, "  timers armed     0\n")
	}
	fmt.Fprintf(out, "  timers fired     %d (%d before T)\n", fired, early)
	fmt.Fprintf(out, "  fired within     100 ms of T: %d (%.1f%%), 1 s of T: %d (%.1f%%)\n",
		within100, pct(within100, n), within1s, pct(within1s, n))
	if len(fireLate) > 0 {
		printLatency(out, "fire lateness", fireLate)
	}
	if prof != nil {
		fmt.Fprintf(out, "  CPU profile      %s: this process, from %s before T for %s\n", profile, burstProfileLead, profileFor)
	}
	// The goals' figure is when the firings were stored: when a reader of
	// the history can first see them.
	if len(storedLate) > 0 {
		printLatency(out, "fire stored", storedLate)
	}
	p99 = timerFigure(storedLate)
	if len(succLate) > 0 {
		printLatency(out, "succeeded", succLate)
	}
	if fired > 1 && lastFire.After(firstFire) {
		fmt.Fprintf(out, "  timers fired/s   %.0f (%d between %s and %s after T)\n", float64(fired)/lastFire.Sub(firstFire).Seconds(),
			fired, firstFire.Sub(due).Round(time.Millisecond), lastFire.Sub(due).Round(time.Millisecond))
	}
	fmt.Fprintf(out, "  executions       %d succeeded, %d failed\n", succeeded, len(failed))
	fmt.Fprintf(out, "  read back        %d events of the run, from %s after T, in %s (nothing watched the burst)\n",
		read, readAt.Sub(due).Round(time.Millisecond), readFor.Round(time.Millisecond))
	if lastStored.After(readAt) {
		fmt.Fprintf(out, "  (the burst outlasted the wait: its last firing was stored %s after the read began, which shared the cores with its tail)\n",
			lastStored.Sub(readAt).Round(time.Millisecond))
	}
	switch {
	case rerr != nil:
		return 0, 0, fmt.Errorf("timer run: %w", rerr)
	case len(failed) > 0:
		slices.Sort(failed)
		return 0, 0, fmt.Errorf("timer run: %d executions failed, e.g. %s", len(failed), failed[0])
	case early > 0:
		return 0, 0, fmt.Errorf("timer run: %d timers fired before they were due", early)
	}
	return p99, armedLate, nil
}

// timerReadAfter is how long after T the timer run begins to read the
// histories back: after the burst (which takes well under a second on the
// 2-core machine); a burst that lasts longer only has its tail share the
// cores with the read, which makes its figure worse, not better.
// timerEndsWithin bounds the run: every execution must have ended by then
// (after T).
const (
	timerReadAfter  = 2 * time.Second
	timerEndsWithin = 3 * time.Minute
)

func pct(k, n int) float64 {
	if n == 0 {
		return 0
	}
	return 100 * float64(k) / float64(n)
}

// publishStarts publishes the start commands start(0) ... start(n-1) to
// jf.commands.start from 32 goroutines at once, and returns the first
// error (the others stop at it).
func publishStarts(ctx context.Context, conn *bus.Conn, n int, start func(i int) *events.StartExecution) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	for range 32 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				p := start(int(i))
				msg, err := bus.Encode(bus.SubjectStart, events.New("jetflow-bench", "", p.Workflow, time.Now(), p))
				if err == nil {
					_, err = conn.JS.PublishMsg(ctx, msg)
				}
				if err != nil {
					select {
					case errc <- fmt.Errorf("publish start: %w", err):
					default:
					}
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// readTimerRun reads back the histories of the timer run's executions
// (those whose id starts with prefix; stored since since), headers only,
// until it has the ends of want of them, or until deadline; it returns
// what it read of each, and how many events it read. Where an execution's event
// records its timer's firing, the stored time is when the server stored
// it, from the message's metadata: later than its ce-time (when the
// dispatcher decided the firing), by the appends in flight ahead of it.
func readTimerRun(ctx context.Context, js jetstream.JetStream, prefix string, since time.Time, want int, deadline time.Time) (recs map[string]*timerRecord, read int, err error) {
	ended := 0
	fail := func(err error) error { return fmt.Errorf("read the timer run's histories back: %w", err) }
	recs = make(map[string]*timerRecord, want)
	cons, err := js.CreateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		FilterSubject: bus.WorkflowSubjects(timerWorkflow),
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return recs, 0, fail(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, bus.StreamEvents, cons.CachedInfo().Name)
	}()
	for ended < want {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return recs, read, fail(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			id := executionOf(m.Subject())
			typ, ok := trackedType(m.Headers())
			if !ok || !strings.HasPrefix(id, prefix) {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m.Headers().Get("ce-time"))
			if err != nil {
				return recs, read, fail(fmt.Errorf("%s: ce-time: %w", m.Subject(), err))
			}
			md, err := m.Metadata()
			if err != nil {
				return recs, read, fail(err)
			}
			r := recs[id]
			if r == nil {
				r = &timerRecord{}
				recs[id] = r
			}
			if r.fired.IsZero() && recordsFiring(m.Headers()) {
				r.fired, r.firedStored = at, md.Timestamp
			}
			first := r.succeeded.IsZero() && !r.failed // an execution ends once
			switch typ {
			case events.TypeTimerArmed:
				r.armed = at
			case events.TypeExecutionSucceeded:
				r.succeeded = at
			case events.TypeExecutionFailed:
				r.failed = true
			}
			if typ.IsTerminal() && first {
				ended++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return recs, read, fail(err)
		}
		if err := ctx.Err(); err != nil {
			return recs, read, err
		}
		// Whatever was stored in time is read, however late the read.
		if got == 0 && ended < want && time.Now().After(deadline) {
			return recs, read, fail(fmt.Errorf("%d of %d executions ended within %s after T", ended, want, timerEndsWithin))
		}
	}
	return recs, read, nil
}

// timerFigure is the timer run's figure: the p99 of when the firings were
// stored (0 when none fired).
func timerFigure(stored []time.Duration) time.Duration {
	if len(stored) == 0 {
		return 0
	}
	lat := slices.Clone(stored)
	slices.Sort(lat)
	return percentile(lat, 0.99)
}

// recordsFiring says whether an event, by its header, records a timer's
// firing: a timer.fired, or an end carrying the sleep's success that
// records it (docs/adr/0017).
func recordsFiring(h nats.Header) bool {
	switch events.Type(h.Get("ce-type")) {
	case events.TypeTimerFired:
		return true
	case events.TypeExecutionSucceeded:
		return endRecordsFiring(h)
	}
	return false
}
