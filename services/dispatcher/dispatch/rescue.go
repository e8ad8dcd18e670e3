package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/workflow"
)

// Local steps left by a dispatcher that died (docs/adr/0014). A dispatcher
// that stops, or gives a partition up, nudges the executions whose local
// steps it was running (cutShort); one that dies cannot, and nothing else
// would run those steps again before the janitor finds them quiet. So a
// dispatcher that takes partitions reads the tail of the events stream,
// the last rescueWindow: an execution of those partitions that
// dispatched a local step there and did not end there is nudged (a
// reconcile in its inbox, taken by this dispatcher), which runs again a
// step whose attempt did not end, and takes the decision a success left. A step dispatched before the window has been quiet long
// enough for the janitor (janitor.LocalIdleAfter). A nudge of an
// execution whose step runs, or went on, changes nothing.

// rescueWindow is how far back, beyond a lease's time to live, a
// dispatcher that takes partitions looks for local steps dispatched: the
// janitor's LocalIdleAfter and a margin for clocks.
const rescueWindow = 20 * time.Second

// rescueTypes are the types of the events a rescue reads (a step's
// dispatch, alone or carried, and the ends of attempts and of
// executions): the others are not decoded.
var rescueTypes = map[string]bool{}

func init() {
	for _, t := range []events.Type{events.TypeStepDispatched, events.TypeStepSending, events.TypeStepSucceeded, events.TypeExecutionStarted,
		events.TypeStepFailed, events.TypeStepRescheduled, events.TypeExecutionSucceeded, events.TypeExecutionFailed, events.TypeExecutionCancelled} {
		rescueTypes[string(t)] = true
	}
}

// rescueGather is how long the takes of partitions are gathered before
// one read of the stream's tail for all of them (a dispatcher starting
// takes several at once).
const rescueGather = 500 * time.Millisecond

// rescuer gathers the partitions taken, for rescueLocal.
type rescuer struct {
	taken chan int
}

func newRescuer() *rescuer { return &rescuer{taken: make(chan int, 1024)} }

// took notes that partition p was taken (dropped if too many wait: the
// janitor covers them).
func (r *rescuer) took(p int) {
	select {
	case r.taken <- p:
	default:
	}
}

// runRescues reads the stream's tail for the partitions taken, gathered,
// until ctx ends.
func (d *Dispatcher) runRescues(ctx context.Context) {
	for {
		var parts map[int]bool
		select {
		case <-ctx.Done():
			return
		case p := <-d.rescue.taken:
			parts = map[int]bool{p: true}
		}
		gather := time.NewTimer(rescueGather)
	gathering:
		for {
			select {
			case <-ctx.Done():
				gather.Stop()
				return
			case p := <-d.rescue.taken:
				parts[p] = true
			case <-gather.C:
				break gathering
			}
		}
		n, err := d.rescueLocal(ctx, parts)
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Warn().Err(err).Msg("look for local steps left by a dispatcher that died: the janitor will find their executions quiet")
		case n > 0:
			d.log.Info().Int("executions", n).Int("partitions", len(parts)).Msg("nudged executions whose local step may have been left running by a dispatcher that died")
		}
	}
}

// rescueLocal nudges the executions of partitions parts whose last event
// of the stream's last rescueWindow dispatched a local step, and returns
// how many.
func (d *Dispatcher) rescueLocal(ctx context.Context, parts map[int]bool) (int, error) {
	since := d.cfg.Now().Add(-rescueWindow - d.cfg.LeaseTTL)
	first, err := firstSince(ctx, d.js, since)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil // nothing appended since
	}
	if err != nil {
		return 0, err
	}
	// pending: per execution that dispatched a local step in the window,
	// its workflow, whether it ended there, and the local steps whose
	// attempt did not end there (by task id).
	type pending struct {
		workflow string
		ended    bool
		tasks    map[string]bool
	}
	execs := map[string]*pending{}
	// Decoded only when of those partitions and of those types: the
	// stream's tail holds every partition's events.
	keep := func(subject string, h nats.Header) bool {
		return parts[d.partitionOf(subject[strings.LastIndexByte(subject, '.')+1:])] && rescueTypes[h.Get("ce-type")]
	}
	err = history.ScanReportsIf(ctx, d.js, bus.StreamEvents, bus.EventsPrefix+".>", first, keep, func(ev events.Event) error {
		if !parts[d.partitionOf(ev.Subject)] {
			return nil
		}
		disp := localDispatch(ev)
		x := execs[ev.Subject]
		if x == nil {
			if disp == nil {
				return nil
			}
			x = &pending{workflow: ev.Workflow, tasks: map[string]bool{}}
			execs[ev.Subject] = x
		}
		if step, attempt, ok := attemptEnded(ev); ok {
			delete(x.tasks, events.TaskID(ev.Subject, step, attempt))
		}
		if ev.Type.IsTerminal() {
			x.ended = true
			clear(x.tasks)
		}
		if disp != nil { // after the end of the attempt whose success carries it
			x.tasks[disp.TaskID] = true
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("read %s from %s: %w", bus.StreamEvents, since.Format(time.RFC3339), err)
	}
	// Every execution that ran local steps there and did not end is
	// nudged, not only those with a step still pending: the report of a
	// local step is in its dispatcher's memory only, so one that died
	// after it recorded a success and before the decision that follows
	// (an execution of more than interp.SmallExecution instances records
	// the next dispatch in an event of its own) left nothing to wake the
	// execution, where an agent's report would be delivered again. A
	// nudge of an execution that goes on, or waits, changes nothing.
	n := 0
	for exec, x := range execs {
		if ctx.Err() != nil {
			return n, nil // stopping: the next holder looks again
		}
		if x.ended {
			continue
		}
		if _, held := d.holds(exec); !held {
			continue // another's now
		}
		running := false
		for task := range x.tasks {
			running = running || d.local.has(task)
		}
		if running {
			continue
		}
		d.nudge(exec, x.workflow, exec+".rescue")
		n++
	}
	return n, nil
}

// attemptEnded is the step attempt whose end ev records, if it does.
func attemptEnded(ev events.Event) (step string, attempt int, ok bool) {
	switch p := ev.Data.(type) {
	case *events.StepSucceeded:
		return p.StepID, p.Attempt, true
	case *events.StepFailed:
		return p.StepID, p.Attempt, true
	case *events.StepRescheduled:
		return p.StepID, p.Attempt, true
	}
	return "", 0, false
}

// localDispatch is the dispatch of a local step ev records, by itself or
// with the event before it (then), if any.
func localDispatch(ev events.Event) *events.StepDispatched {
	var disp *events.StepDispatched
	switch p := ev.Data.(type) {
	case *events.StepDispatched:
		disp = p
	case *events.StepSending:
		disp = &events.StepDispatched{TaskID: p.TaskID, Queue: p.Queue}
	case *events.StepSucceeded:
		disp = p.Then
	case *events.ExecutionStarted:
		disp = p.Then
	}
	if disp == nil || disp.Queue != workflow.LocalQueue {
		return nil
	}
	return disp
}

// firstSince is the stream sequence of the first event stored at or after
// t (jetstream.ErrMsgNotFound: none).
func firstSince(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	m, err := bus.LeaderGet(ctx, js, bus.StreamEvents, bus.MsgQuery{StartTime: &t, NextBySubject: bus.EventsPrefix + ".>"})
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}
