package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// lockWorkflow is the workflow of the lock run: one let step (run by the
// dispatcher itself, so the run measures the lock and not an agent)
// inside a lock that every execution contends for.
const lockWorkflow = "bench-locks"

// lockTracker records, per execution of the lock run, when its history
// says it acquired the lock, and whether it ended well.
type lockTracker struct {
	sub      *nats.Subscription
	mu       sync.Mutex
	acquired map[string]time.Time
	want     int
	done     int
	failed   []string
	finished chan struct{}
}

func newLockTracker(nc *nats.Conn, want int) (*lockTracker, error) {
	t := &lockTracker{acquired: map[string]time.Time{}, want: want, finished: make(chan struct{})}
	sub, err := nc.Subscribe(bus.WorkflowSubjects(lockWorkflow), func(m *nats.Msg) {
		typ := events.Type(m.Header.Get("ce-type"))
		at, err := time.Parse(time.RFC3339Nano, m.Header.Get("ce-time"))
		if err != nil {
			return
		}
		id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		t.mu.Lock()
		defer t.mu.Unlock()
		switch typ {
		case events.TypeLockAcquired:
			t.acquired[id] = at
		case events.TypeExecutionFailed, events.TypeExecutionCancelled:
			t.failed = append(t.failed, id)
			fallthrough
		case events.TypeExecutionSucceeded:
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

// runLocks starts n executions at once that all contend for one lock (a
// mutex, or a semaphore of limit) and reports lock acquire/release pairs
// per second and how long a handover from one holder to the next took.
func runLocks(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n, limit int) error {
	def := workflow.Definition{Name: lockWorkflow, Lock: "bench-lock", Semaphore: limit, Steps: []workflow.Step{
		{ID: "inside", Kind: workflow.KindLet, Vars: map[string]any{"held": true}},
	}}
	if limit <= 1 {
		def.Semaphore = 0
	}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return err
	}
	tr, err := newLockTracker(conn.NC, n)
	if err != nil {
		return err
	}
	defer func() { _ = tr.sub.Unsubscribe() }()
	began := time.Now()
	prefix := fmt.Sprintf("lock-%d-", began.UnixNano())
	for i := range n {
		ev := events.New("jetflow-bench", "", lockWorkflow, time.Now(),
			&events.StartExecution{Workflow: lockWorkflow, ExecutionID: fmt.Sprintf("%s%d", prefix, i)})
		msg, err := bus.Encode(bus.SubjectStart, ev)
		if err != nil {
			return err
		}
		if _, err := conn.JS.PublishMsg(ctx, msg); err != nil {
			return fmt.Errorf("publish start: %w", err)
		}
	}
	select {
	case <-tr.finished:
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("lock run: %d of %d executions ended within 5m", tr.done, n)
	case <-ctx.Done():
		return ctx.Err()
	}
	wall := time.Since(began)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.failed) > 0 {
		return fmt.Errorf("lock run: %d executions did not succeed, e.g. %s", len(tr.failed), tr.failed[0])
	}
	// The gap between consecutive acquisitions (history event times): for a
	// mutex, one holder's whole turn plus the handover to the next.
	var acq []time.Time
	for _, at := range tr.acquired {
		acq = append(acq, at)
	}
	slices.SortFunc(acq, time.Time.Compare)
	var gaps []time.Duration
	for i := 1; i < len(acq); i++ {
		gaps = append(gaps, acq[i].Sub(acq[i-1]))
	}
	kind := "a mutex"
	if limit > 1 {
		kind = fmt.Sprintf("a semaphore of %d", limit)
	}
	fmt.Fprintf(out, "\nlock run: %d executions started at once, contending for %s (one let step inside)\n", n, kind)
	fmt.Fprintf(out, "  wall time        %s\n", wall.Round(time.Millisecond))
	fmt.Fprintf(out, "  acquire/release  %.0f pairs/s\n", float64(len(tr.acquired))/wall.Seconds())
	if len(acq) > 1 {
		busy := acq[len(acq)-1].Sub(acq[0])
		fmt.Fprintf(out, "  under contention %.0f acquisitions/s (first to last acquisition, %s)\n",
			float64(len(acq)-1)/busy.Seconds(), busy.Round(time.Millisecond))
	}
	if len(gaps) > 0 {
		printLatency(out, "between acquires", gaps)
	}
	return nil
}
