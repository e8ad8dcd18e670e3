package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/tools/internal/devstack"
)

// failoverWorkflow is the failover run's workflow: 40 agent steps with a
// 50 ms timer after each, so that an execution writes an event every few
// milliseconds for a few seconds.
const failoverWorkflow = "bench-failover"

// failoverLoad is the throughput load the failover run keeps beside its
// executions (-failover-load): what a dispatcher's death costs the
// executions that go on, the survivors' among them, whose dispatchers
// take the dead one's partitions and read the events stream's tail for
// the local steps it may have left (rescue.go).
type failoverLoad struct {
	tracker              *tracker // of the throughput run's workflow
	executions, inflight int
}

// failoverLoadLead is how long the load runs before the cut: a rescue
// reads the last 20 s, and finds this much of the load's events there.
const failoverLoadLead = 10 * time.Second

// runFailover measures how long executions pause when a dispatcher dies:
// two more dispatchers join the stack's, each on its own connection; once
// the three share the partitions, n executions start, and one of the two
// is cut off (its connection closed: it can neither renew its leases nor
// acknowledge what it holds, as after a SIGKILL). The figure is the
// longest pause between two consecutive events of any execution that was
// running at that moment.
func runFailover(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, info devstack.Info, n int, load failoverLoad) error {
	def := workflow.Definition{Name: failoverWorkflow}
	for i := range 40 {
		def.Steps = append(def.Steps,
			workflow.Step{ID: fmt.Sprintf("n%d", i), Kind: workflow.KindNoop},
			workflow.Step{ID: fmt.Sprintf("w%d", i), Kind: workflow.KindSleep, Duration: "50ms"})
	}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return err
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketDispatchers)
	if err != nil {
		return err
	}
	members := []string{"bench-victim", "bench-survivor"}
	var victim *bus.Conn
	for _, m := range members {
		c, err := info.Dial(ctx, auth.RoleDispatcher, m)
		if err != nil {
			return err
		}
		defer c.NC.Close()
		d, err := dispatch.New(ctx, dispatch.Config{Member: m, BindOnly: info.AuthDir != "", Source: "jetflow/" + m}, c.JS, zerolog.Nop())
		if err != nil {
			return err
		}
		dctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(dctx) }()
		defer func() {
			stop()
			// The victim's Run fails once its connection is cut.
			if err := <-done; err != nil && m != "bench-victim" {
				fmt.Fprintf(os.Stderr, "jetflow-bench: dispatcher %s stopped with an error: %v\n", m, err)
			}
		}()
		if m == "bench-victim" {
			victim = c
		}
	}
	held := func() map[string]int {
		out := map[string]int{}
		for p := range partition.DefaultCount {
			if e, err := kv.Get(ctx, partition.LeaseKey(p)); err == nil {
				out[string(e.Value())]++
			}
		}
		return out
	}
	if err := waitUntil(ctx, 30*time.Second, func() bool { h := held(); return len(h) == 3 && h["bench-victim"] > 0 }); err != nil {
		return fmt.Errorf("three dispatchers sharing the partitions: %w (%v)", err, held())
	}
	before := held()

	tr := newTracker(conn.NC, failoverWorkflow)
	defer tr.close()
	prefix := batchPrefix("failover")
	type result struct {
		lat []time.Duration
		err error
	}
	var loaded chan result
	if load.executions > 0 {
		loaded = make(chan result, 1)
		go func() {
			lat, err := load.tracker.runBatch(ctx, conn, batchPrefix("failover-load"), load.executions, load.inflight)
			loaded <- result{lat, err}
		}()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-loaded:
			if r.err != nil {
				return fmt.Errorf("failover run's load: %w", r.err)
			}
			return fmt.Errorf("failover run's load: its %d executions ended in less than %s, before the cut: give more", load.executions, failoverLoadLead)
		case <-time.After(failoverLoadLead - time.Second):
		}
	}
	finished := make(chan result, 1)
	go func() {
		lat, err := tr.runBatch(ctx, conn, prefix, n, n)
		finished <- result{lat, err}
	}()
	time.Sleep(time.Second) // every execution under way
	cut := time.Now()
	victim.NC.Close()
	if err := waitUntil(ctx, 30*time.Second, func() bool { return held()["bench-victim"] == 0 && len(held()) == 2 }); err != nil {
		return fmt.Errorf("the survivors taking the partitions: %w (%v)", err, held())
	}
	takeover := time.Since(cut)
	r := <-finished
	if r.err != nil {
		return r.err
	}
	var loadLat []time.Duration
	if loaded != nil {
		lr := <-loaded
		if lr.err != nil {
			return fmt.Errorf("failover run's load: %w", lr.err)
		}
		loadLat = lr.lat
	}
	var worst time.Duration
	running := 0
	for i := range n {
		evs, err := history.Read(ctx, conn.JS, bus.ExecutionSubject(failoverWorkflow, fmt.Sprintf("%s-%d", prefix, i)), 0)
		if err != nil {
			return err
		}
		if len(evs) == 0 || !evs[0].Time.Before(cut) || !evs[len(evs)-1].Time.After(cut) {
			continue
		}
		running++
		for j := 1; j < len(evs); j++ {
			worst = max(worst, evs[j].Time.Sub(evs[j-1].Time))
		}
	}
	fmt.Fprintf(out, "\nfailover run: %d executions of 40 noop steps and 40 50ms timers; 3 dispatchers %v; one cut off (as by SIGKILL) 1s in\n", n, before)
	fmt.Fprintf(out, "  partitions taken over   %s after the cut\n", takeover.Round(time.Millisecond))
	fmt.Fprintf(out, "  longest pause           %s between two events of one of the %d executions running at the cut\n", worst.Round(time.Millisecond), running)
	if loaded != nil {
		fmt.Fprintf(out, "  load                    %d executions of the throughput run's workflow, %d in flight, from %s before the cut:\n",
			load.executions, load.inflight, failoverLoadLead)
		printLatency(out, "  start-to-finish", loadLat)
	}
	return nil
}

// waitUntil polls cond every 20 ms until it holds or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
