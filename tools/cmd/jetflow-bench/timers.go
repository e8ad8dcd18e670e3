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

// timerRecord is what the timer run saw of one execution: CloudEvent
// times of its TimerArmed and ExecutionSucceeded events, and of the
// event that recorded its timer's firing: its TimerFired, or the end
// carrying the sleep's success that records it (docs/adr/0017).
type timerRecord struct {
	armed, fired, succeeded time.Time
}

// timerTracker follows the executions of the timer run with a core NATS
// subscription on their history subjects, reading the ce-type and
// ce-time headers (and of an end whether it records the firing).
type timerTracker struct {
	sub      *nats.Subscription
	mu       sync.Mutex
	recs     map[string]*timerRecord
	want     int
	done     int
	failed   []string
	finished chan struct{} // closed when every execution has ended
}

func newTimerTracker(nc *nats.Conn, want int) (*timerTracker, error) {
	t := &timerTracker{recs: make(map[string]*timerRecord, want), want: want, finished: make(chan struct{})}
	sub, err := nc.Subscribe(bus.WorkflowSubjects(timerWorkflow), func(m *nats.Msg) {
		typ, ok := trackedType(m.Header)
		if !ok {
			return
		}
		at, err := time.Parse(time.RFC3339Nano, m.Header.Get("ce-time"))
		if err != nil {
			return
		}
		id := executionOf(m.Subject)
		t.mu.Lock()
		defer t.mu.Unlock()
		r := t.recs[id]
		if r == nil {
			r = &timerRecord{}
			t.recs[id] = r
		}
		if r.fired.IsZero() && recordsFiring(m.Header) {
			r.fired = at
		}
		switch typ {
		case events.TypeTimerArmed:
			r.armed = at
		case events.TypeExecutionSucceeded, events.TypeExecutionFailed:
			if typ == events.TypeExecutionSucceeded {
				r.succeeded = at
			} else {
				t.failed = append(t.failed, id)
			}
			if t.done++; t.done == t.want {
				close(t.finished)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	t.sub = sub
	return t, nil
}

func (t *timerTracker) close() { _ = t.sub.Unsubscribe() }

// executionOf is the execution of a history subject (its last token).
func executionOf(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }

// endRecordsFiring says whether an io.jetflow.execution.succeeded with
// these headers carries the sleep's success that records its timer's
// firing: such an end, and only such an end, is written with schema
// version 4 (events.SchemaOf). Read from the header, not the data: the
// tracker takes its share of the burst's cores.
func endRecordsFiring(h nats.Header) bool { return h.Get("ce-"+events.ExtSchema) == "4" }

// trackedType is what the timer run's tracker makes of an event, from its
// header: an arming (a timer.armed, or a step.waiting recording one),
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
// (of the firings' storing, read back: storedFirings) and how many timers
// were armed after T (which makes it the benchmark's). With profile, it
// writes a CPU profile of the burst there, for profileFor.
func runTimers(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int, lead time.Duration, profile string, profileFor time.Duration) (p99 time.Duration, armedLate int, err error) {
	def := workflow.Definition{Name: timerWorkflow, Steps: []workflow.Step{
		{ID: "nap", Kind: workflow.KindSleep, Until: "${input.due}"},
	}}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return 0, 0, err
	}
	tr, err := newTimerTracker(conn.NC, n)
	if err != nil {
		return 0, 0, err
	}
	defer tr.close()
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

	deadline := time.NewTimer(time.Until(due) + 3*time.Minute)
	defer deadline.Stop()
	var timedOut bool
	select {
	case <-tr.finished:
	case <-deadline.C:
		timedOut = true
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	tr.mu.Lock()
	var armed, fired, early, within100, within1s, succeeded int
	var lastArmed, firstFire, lastFire time.Time
	var fireLate, succLate []time.Duration
	for id, r := range tr.recs {
		if !strings.HasPrefix(id, prefix) {
			continue
		}
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
	}

	done, failed := tr.done, slices.Clone(tr.failed)
	tr.mu.Unlock()

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
	// The burst's profile is written before the read back, which is not
	// the burst's.
	if err := prof.finish(timedOut); err != nil {
		return 0, 0, err
	}
	if prof != nil && !timedOut {
		fmt.Fprintf(out, "  CPU profile      %s: this process, from %s before T for %s\n", profile, burstProfileLead, profileFor)
	}
	// The goals' figure is when the firings were stored, once every one
	// is read back; else when they were decided.
	var storedLate []time.Duration
	serr := errors.New("not read: the run timed out")
	if !timedOut {
		var stored map[string]time.Time
		stored, serr = storedFirings(ctx, conn.JS, prefix, began, fired)
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		for _, at := range stored {
			storedLate = append(storedLate, at.Sub(due))
		}
	}
	if serr != nil {
		fmt.Fprintf(out, "  fire stored      not read (the figure is the lateness above): %v\n", serr)
	} else {
		printLatency(out, "fire stored", storedLate)
	}
	p99 = timerFigure(fireLate, storedLate, serr)
	if len(succLate) > 0 {
		printLatency(out, "succeeded", succLate)
	}
	if fired > 1 && lastFire.After(firstFire) {
		fmt.Fprintf(out, "  timers fired/s   %.0f (%d between %s and %s after T)\n", float64(fired)/lastFire.Sub(firstFire).Seconds(),
			fired, firstFire.Sub(due).Round(time.Millisecond), lastFire.Sub(due).Round(time.Millisecond))
	}
	fmt.Fprintf(out, "  executions       %d succeeded, %d failed\n", succeeded, len(failed))
	switch {
	case timedOut:
		return 0, 0, fmt.Errorf("timer run: %d of %d executions ended within 3m after T", done, n)
	case len(failed) > 0:
		return 0, 0, fmt.Errorf("timer run: %d executions failed, e.g. %s", len(failed), failed[0])
	case early > 0:
		return 0, 0, fmt.Errorf("timer run: %d timers fired before they were due", early)
	}
	return p99, armedLate, nil
}

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

// storedFirings reads back, once the timer run is over, when the server
// stored each firing of the run's executions (those whose id starts with
// prefix; stored since since), by execution, until it has want of them.
// The tracker's figure is the event's ce-time: when the dispatcher
// decided the firing, which comes before the append is stored, by as many
// appends as it has in flight; and its core subscription sees a message
// as it is published, before it is stored. The stored time is when a
// reader of the history can first see it. Read after the burst, headers
// only, so as not to take the burst's cores. It fails, with what it
// found, when nothing more has come for a fetch once storedQuiet has
// passed (a firing seen published but not stored: its append failed), or
// when storedReadFor has.
func storedFirings(ctx context.Context, js jetstream.JetStream, prefix string, since time.Time, want int) (map[string]time.Time, error) {
	rctx, cancel := context.WithTimeout(ctx, storedReadFor)
	defer cancel()
	fail := func(err error) error { return fmt.Errorf("read the timer run's histories back: %w", err) }
	began := time.Now()
	cons, err := js.CreateConsumer(rctx, bus.StreamEvents, jetstream.ConsumerConfig{
		FilterSubject: bus.WorkflowSubjects(timerWorkflow),
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
		AckPolicy: jetstream.AckNonePolicy, HeadersOnly: true, InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fail(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, bus.StreamEvents, cons.CachedInfo().Name)
	}()
	out := make(map[string]time.Time, want)
	for len(out) < want {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return out, fail(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return out, fail(err)
			}
			id := executionOf(m.Subject())
			if !strings.HasPrefix(id, prefix) || !recordsFiring(m.Headers()) {
				continue
			}
			if _, dup := out[id]; !dup {
				out[id] = md.Timestamp
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return out, fail(err)
		}
		switch {
		case ctx.Err() != nil:
			return out, ctx.Err()
		case rctx.Err() != nil:
			return out, fail(fmt.Errorf("%d of %d firings found within %s", len(out), want, storedReadFor))
		case got == 0 && time.Since(began) >= storedQuiet:
			return out, fail(fmt.Errorf("%d of %d firings stored", len(out), want))
		}
	}
	return out, nil
}

// storedReadFor bounds storedFirings; storedQuiet is how long it reads
// before a fetch that brings nothing ends it: every firing it looks for
// was published before it began, and a busy server stores a burst's last
// appends a few hundred milliseconds after they come.
const (
	storedReadFor = 30 * time.Second
	storedQuiet   = 3 * time.Second
)

// timerFigure is the timer run's figure: the p99 of when the firings were
// stored, once read back (readErr nil), else of when they were decided
// (0 when none fired).
func timerFigure(decided, stored []time.Duration, readErr error) time.Duration {
	lat := decided
	if readErr == nil && len(stored) > 0 {
		lat = stored
	}
	if len(lat) == 0 {
		return 0
	}
	lat = slices.Clone(lat)
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
