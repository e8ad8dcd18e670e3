package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// The fairness run's workflows: a fan-out of noop operations, 50 at a
// time, and a small execution of three noop steps.
const (
	fanoutWorkflow = "bench-fanout"
	smallWorkflow  = "bench-small"
)

// fairnessSamples is how many small executions measure the idle latency.
const fairnessSamples = 100

// runFairness measures what one huge execution costs the small ones: the
// start-to-finish latency of 3-step executions run one after another,
// first on an idle system, then while a foreach of n noop operations (50
// in flight) runs. The goal: the p99 while the fan-out runs stays within
// 100 ms of the idle p99. With sleep > 0 the fan-out's operations are
// exec steps that sleep that long: slow operations, which hold agents.
func runFairness(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int, sleep time.Duration) error {
	op := "{id: op, kind: noop}"
	if sleep > 0 {
		op = fmt.Sprintf(`{id: op, kind: exec, command: sleep, args: ["%g"]}`, sleep.Seconds())
	}
	fanout, err := foreachOf(fanoutWorkflow, n, op)
	if err != nil {
		return err
	}
	small := workflow.Definition{Name: smallWorkflow}
	for i := range 3 {
		small.Steps = append(small.Steps, workflow.Step{ID: fmt.Sprintf("s%d", i+1), Kind: workflow.KindNoop})
	}
	for _, d := range []workflow.Definition{fanout, small} {
		if _, _, err := store.Apply(ctx, d); err != nil {
			return err
		}
	}
	st := newTracker(conn.NC, smallWorkflow)
	defer st.close()
	if _, err := st.runBatch(ctx, conn, batchPrefix("small-warm"), 20, 1); err != nil {
		return err
	}
	idle, err := st.runBatch(ctx, conn, batchPrefix("small-idle"), fairnessSamples, 1)
	if err != nil {
		return err
	}

	ft := newTracker(conn.NC, fanoutWorkflow)
	defer ft.close()
	id := batchPrefix("fanout")
	done := ft.wait(id)
	ev := events.New("jetflow-bench", "", fanoutWorkflow, time.Now(), &events.StartExecution{Workflow: fanoutWorkflow, ExecutionID: id})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	if err != nil {
		return err
	}
	began := time.Now()
	if _, err := conn.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish start: %w", err)
	}
	// Small executions one after another for as long as the fan-out runs
	// (the first second left out: the fan-out is still starting).
	var busy []time.Duration
	var fanoutTook time.Duration
	prefix := batchPrefix("small-busy")
	for i := 0; ; i++ {
		select {
		case typ := <-done:
			if typ != string(events.TypeExecutionSucceeded) {
				return fmt.Errorf("fan-out execution %s ended with %s", id, typ)
			}
			fanoutTook = time.Since(began)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if fanoutTook > 0 {
			break
		}
		lat, err := st.runBatch(ctx, conn, fmt.Sprintf("%s-%d", prefix, i), 1, 1)
		if err != nil {
			return err
		}
		if time.Since(began) > time.Second {
			busy = append(busy, lat...)
		}
	}
	what := "noop operations"
	if sleep > 0 {
		what = fmt.Sprintf("exec operations sleeping %s", sleep)
	}
	fmt.Fprintf(out, "\nfairness run: 3-step executions one after another, idle and while a foreach of %d %s (50 in flight) runs\n", n, what)
	fmt.Fprintf(out, "  fan-out          %s (%.0f operations/s)\n", fanoutTook.Round(time.Millisecond), float64(n)/fanoutTook.Seconds())
	printLatency(out, "idle", idle)
	if len(busy) == 0 {
		fmt.Fprintf(out, "  during fan-out   no sample: the fan-out ended within a second; give -fairness more items\n")
		return nil
	}
	printLatency(out, "during fan-out", busy)
	above := quantile(busy, 0.99) - quantile(idle, 0.99)
	verdict := "goal met: under 100ms"
	if above >= 100*time.Millisecond {
		verdict = "goal not met: 100ms"
	}
	fmt.Fprintf(out, "  p99 above idle   %s over %d executions (%s)\n", above.Round(time.Millisecond), len(busy), verdict)
	return nil
}

// quantile returns the q-quantile of lat (sorting it).
func quantile(lat []time.Duration, q float64) time.Duration {
	slices.Sort(lat)
	return lat[min(len(lat)-1, int(q*float64(len(lat))))]
}

// wait returns a channel that gets the terminal event type of execution id.
func (t *tracker) wait(id string) <-chan string {
	ch := make(chan string, 1)
	t.mu.Lock()
	t.waiters[id] = ch
	t.mu.Unlock()
	return ch
}
