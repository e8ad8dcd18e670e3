package dispatch

import (
	"bytes"
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
// steps it was running (release, cutShort) before it deletes the lease;
// one that dies cannot, and a local step's report lives in its
// dispatcher's memory only, where an agent's would be delivered again.
// So a dispatcher that takes partitions whose last holder may have died
// (their leases expired, mayHaveDied), not those of a new deployment or
// given back, reads the tail of the events stream, the last
// rescueWindow, and nudges (a
// reconcile in the inbox, taken by itself) every execution of those
// partitions that dispatched a local step there and did not end there:
// a step whose attempt did not end runs again, and the decision a
// recorded success left untaken is taken. A nudge of an execution that
// goes on, or waits, changes nothing. A step dispatched before the
// window has been quiet long enough for the janitor
// (janitor.LocalIdleAfter).

// rescueWindow is how far back, beyond a lease's time to live, a
// dispatcher that takes partitions looks for local steps dispatched: the
// janitor's LocalIdleAfter and a margin for clocks.
const rescueWindow = 20 * time.Second

// rescueTypes are the types of the events a rescue reads (those that
// may carry a step's dispatch, and the ends of executions): the others
// are not decoded.
var rescueTypes = map[string]bool{}

func init() {
	for _, t := range []events.Type{events.TypeStepDispatched, events.TypeStepSending, events.TypeStepSucceeded, events.TypeExecutionStarted,
		events.TypeExecutionSucceeded, events.TypeExecutionFailed, events.TypeExecutionCancelled} {
		rescueTypes[string(t)] = true
	}
}

// rescueShare is the part of its time a rescue's read of the stream
// spends reading (history.ScanIf.Share).
const rescueShare = 0.5

// localQueueJSON is how the payload of an event that dispatches a local
// step names its queue (the JSON of events.StepDispatched,
// events.StepSending, and the Then of events.StepSucceeded and
// events.ExecutionStarted).
var localQueueJSON = []byte(`"queue":"` + workflow.LocalQueue + `"`)

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

// rescueLocal nudges the executions of partitions parts that dispatched
// a local step in the stream's last rescueWindow and did not end there,
// and returns how many.
func (d *Dispatcher) rescueLocal(ctx context.Context, parts map[int]bool) (int, error) {
	since := d.cfg.Now().Add(-rescueWindow - d.cfg.LeaseTTL)
	first, err := firstSince(ctx, d.js, since)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil // nothing appended since
	}
	if err != nil {
		return 0, err
	}
	execs, err := d.localDispatches(ctx, parts, first)
	if err != nil {
		return 0, fmt.Errorf("read %s from %s: %w", bus.StreamEvents, since.Format(time.RFC3339), err)
	}
	n := 0
	for exec, x := range execs {
		if ctx.Err() != nil {
			return n, nil // stopping: the next holder looks again
		}
		if _, held := d.holds(exec); x.ended || !held || d.local.runs(exec) {
			continue // ended, another's now, or running here (this dispatcher took it and goes on)
		}
		d.nudge(exec, x.workflow)
		n++
	}
	return n, nil
}

// dispatched is what a rescue's read found of an execution that
// dispatched a local step: its workflow, and whether it ended since.
type dispatched struct {
	workflow string
	ended    bool
}

// localDispatches reads the events stream from sequence first, and
// returns the executions of partitions parts that dispatched a local
// step there, by subject. The read is long after a death under load (all
// partitions' events of the window: some 200,000 at 10,000 a second),
// and the executions this dispatcher goes on with must not wait for it:
// it reads on a connection of its own, where its batches do not queue in
// front of the acknowledgements of the appends, closed once read, and at
// most rescueShare of its time.
func (d *Dispatcher) localDispatches(ctx context.Context, parts map[int]bool, first uint64) (map[string]*dispatched, error) {
	js := d.js
	if nc, own, err := bus.Beside(ctx, d.js.Conn(), "rescue"); err == nil {
		defer nc.Close()
		js = own
	} else if ctx.Err() == nil {
		d.log.Warn().Err(err).Msg("look for local steps left by a dispatcher that died: no connection of its own, read on the dispatcher's (its executions wait behind the read)")
	}
	execs := map[string]*dispatched{}
	opt := history.ScanIf{Share: rescueShare, Keep: func(subject string, h nats.Header, data []byte) bool {
		// Decoded only when of those partitions and rescueReads: the
		// stream's tail holds every partition's events.
		return parts[d.partitionOf(subject[strings.LastIndexByte(subject, '.')+1:])] && rescueReads(h.Get("ce-type"), data)
	}}
	err := history.ScanReportsIf(ctx, js, bus.StreamEvents, bus.EventsPrefix+".>", first, opt, func(ev events.Event) error {
		x := execs[ev.Subject]
		switch {
		case x == nil && dispatchesLocal(ev):
			execs[ev.Subject] = &dispatched{workflow: ev.Workflow}
		case x != nil && ev.Type.IsTerminal():
			x.ended = true
		}
		return nil
	})
	return execs, err
}

// rescueReads reports whether a rescue decodes an event of type t whose
// data is data: one of rescueTypes that ends an execution, or names the
// local queue (as every event that dispatches a local step does:
// dispatchesLocal); most events of the stream's tail name none. One it
// passes over wrongly is no loss, only later: the janitor finds its
// execution quiet (janitor.LocalIdleAfter).
func rescueReads(t string, data []byte) bool {
	return rescueTypes[t] && (events.Type(t).IsTerminal() || bytes.Contains(data, localQueueJSON))
}

// dispatchesLocal reports whether ev records a local step's dispatch, by
// itself or with the event before it (then).
func dispatchesLocal(ev events.Event) bool {
	switch p := ev.Data.(type) {
	case *events.StepDispatched:
		return p.Queue == workflow.LocalQueue
	case *events.StepSending:
		return p.Queue == workflow.LocalQueue
	case *events.StepSucceeded:
		return p.Then != nil && p.Then.Queue == workflow.LocalQueue
	case *events.ExecutionStarted:
		return p.Then != nil && p.Then.Queue == workflow.LocalQueue
	}
	return false
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
