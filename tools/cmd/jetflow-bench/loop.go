package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// loopWorkflow is the loop run's workflow: a goto loop whose rounds are
// a local noop, a let counting them and the goto.
const loopWorkflow = "bench-loop"

// loopOf is a goto loop of n rounds, each a local noop (or a sleep of
// sleep), a let and the goto back: a history that grows by every round's
// step instances, as a long polling loop's does.
func loopOf(n int, sleep time.Duration) (workflow.Definition, error) {
	work := "{id: work, kind: noop, local: true}"
	if sleep > 0 {
		work = fmt.Sprintf("{id: work, kind: sleep, duration: %s}", sleep)
	}
	return workflow.Parse(fmt.Appendf(nil, `
name: %s
steps:
  - {id: init, kind: let, vars: {n: 0}}
  - %s
  - {id: count, kind: let, vars: {n: "${vars.n + 1}"}}
  - {id: again, kind: goto, target: work, condition: "${vars.n < %d}"}
`, loopWorkflow, work, n))
}

// loopWork names a round's first step, for the run's report.
func loopWork(sleep time.Duration) string {
	if sleep > 0 {
		return "a sleep of " + sleep.String()
	}
	return "a local noop"
}

// loopRounds records when each round of the loop run's executions
// counted itself (the success of its let step).
type loopRounds struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (l *loopRounds) record(m *nats.Msg) {
	if events.Type(m.Header.Get("ce-type")) != events.TypeStepSucceeded {
		return
	}
	var d struct {
		StepID string `json:"step_id"`
	}
	if json.Unmarshal(m.Data, &d) != nil || (d.StepID != "count" && !strings.HasPrefix(d.StepID, "count~")) {
		return
	}
	id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	now := time.Now()
	l.mu.Lock()
	l.at[id] = append(l.at[id], now)
	l.mu.Unlock()
}

// perRound is the mean time a round took over rounds [from, to) of the
// executions' recorded rounds (0-based, each execution's own), together.
func (l *loopRounds) perRound(from, to int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum time.Duration
	var n int
	from = max(from, 1) // a round is between two counts
	for _, at := range l.at {
		for i := from; i < to && i < len(at); i++ {
			sum += at[i].Sub(at[i-1])
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

// runLoop runs executions goto loops of rounds rounds each, all at once,
// and reports how long a round took at the start, the middle and the end
// of the loops: what a long execution's growing history costs each step.
func runLoop(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, lag func() (uint64, bool), executions, rounds int, sleep time.Duration) error {
	d, err := loopOf(rounds, sleep)
	if err != nil {
		return err
	}
	if _, _, err := store.Apply(ctx, d); err != nil {
		return err
	}
	tr := newTracker(conn.NC, loopWorkflow)
	defer tr.close()
	lr := &loopRounds{at: map[string][]time.Time{}}
	sub, err := conn.NC.Subscribe(bus.WorkflowSubjects(loopWorkflow), lr.record)
	if err != nil {
		return fmt.Errorf("subscribe to the loop run's events: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	waitProjected(ctx, lag, 2*time.Minute) // what came before is not counted
	began, cpu0 := time.Now(), cpuTime()
	prefix := batchPrefix("loop")
	lat, err := tr.runBatch(ctx, conn, prefix, executions, executions)
	if err != nil {
		return err
	}
	// The read models are part of the cost: the projector writes a
	// model of every instance so far for each batch of events.
	projected := waitProjected(ctx, lag, 2*time.Minute)
	cpu := cpuTime() - cpu0
	var longest time.Duration
	for _, l := range lat {
		longest = max(longest, l)
	}
	steps := executions * (3*rounds + 1)
	tenth := max(rounds/10, 2) // a round's time is between two rounds' counts
	fmt.Fprintf(out, "\nloop run: %d executions at once, each a goto loop of %d rounds (%s, a let, the goto: %d step instances)\n", executions, rounds, loopWork(sleep), 3*rounds+1)
	fmt.Fprintf(out, "  start-to-finish  %s (the slowest), %.0f steps/s", longest.Round(time.Millisecond), float64(steps)/longest.Seconds())
	if !projected.IsZero() {
		fmt.Fprintf(out, "; the read models caught up %s after the start", projected.Sub(began).Round(time.Millisecond))
	}
	fmt.Fprintf(out, "\n  CPU              %.3f ms per step (to the read models caught up, if seen)\n", float64(cpu.Microseconds())/1000/float64(steps))
	if rounds >= 2*tenth {
		fmt.Fprintf(out, "  a round took     %s in the first %d rounds, %s in the middle %d, %s in the last %d\n",
			lr.perRound(0, tenth).Round(time.Microsecond), tenth,
			lr.perRound(rounds/2-tenth/2, rounds/2+tenth/2).Round(time.Microsecond), tenth,
			lr.perRound(rounds-tenth, rounds).Round(time.Microsecond), tenth)
	}
	if kv, err := conn.JS.KeyValue(ctx, bus.BucketExecutions); err == nil {
		if e, err := kv.Get(ctx, prefix+"-0"); err == nil {
			var m struct {
				Truncated *projections.Truncation `json:"truncated"`
			}
			_ = json.Unmarshal(e.Value(), &m)
			note := ""
			if t := m.Truncated; t != nil {
				note = fmt.Sprintf(" (truncated: %d finished instances and %d values left out)", t.Steps, t.Values)
			}
			fmt.Fprintf(out, "  read model       %.0f KiB%s; the bucket's revision %d (every model written so far)\n", float64(len(e.Value()))/1024, note, e.Revision())
		}
	}
	return nil
}
