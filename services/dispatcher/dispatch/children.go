package dispatch

import (
	"context"
	"fmt"
	"strconv"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// Child executions (see services/dispatcher/interp/child.go): a child's
// end reaches its parent as a reconcile in the parent's inbox, and the
// parent reads the child's end from the child's own history, the one
// record of it (the reconcile says only where to look).

// notifyParent asks the parent of x, a child execution that just ended,
// to look at its children. A crash before it (or a publish that fails)
// loses nothing: the parent, waiting, is reconciled by the janitor's
// idle sweep, and a resume or replay of the parent looks too.
func (d *Dispatcher) notifyParent(ctx context.Context, x *execState) {
	p := x.state.Parent
	id := "childend-" + x.id + "-" + strconv.FormatUint(x.state.LastSeq, 10)
	rec := &events.ReconcileExecution{ExecutionID: p.ExecutionID, Workflow: p.Workflow,
		Reason: fmt.Sprintf("child execution %s %s", x.id, x.state.Status)}
	if err := d.publishOwn(ctx, id, p.ExecutionID, p.Workflow, rec); err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Str("parent", p.ExecutionID).
			Msg("tell the parent execution that its child ended; its idle sweep will find out")
	}
}

// checkChildren records the end of each child of x that its steps wait
// for and that has ended.
func (d *Dispatcher) checkChildren(ctx context.Context, x *execState) error {
	if !x.state.Status.Active() {
		return nil
	}
	for _, st := range interp.WaitingChildren(x.state) {
		end, ok, err := d.childEnd(ctx, st.ChildWorkflow, st.Child)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if _, err := d.decide(ctx, x, func(in interp.Input) interp.Decision { return interp.ChildEnded(in, st.ID, end) }); err != nil {
			return err
		}
	}
	return nil
}

// childEnd reads how the child execution id (of workflow wf) ended, from
// its history; ok is false while it has not ended (or has not started).
func (d *Dispatcher) childEnd(ctx context.Context, wf, id string) (interp.ChildEnd, bool, error) {
	evs, err := d.hist.Read(ctx, bus.ExecutionSubject(wf, id), 0)
	if err != nil {
		return interp.ChildEnd{}, false, fmt.Errorf("read the history of child execution %s: %w", id, err)
	}
	if len(evs) == 0 {
		// Not started yet, or expired and deleted before its parent read
		// its end (a retention shorter than the parent's wait to hear).
		c, err := d.ids.Get(ctx, id)
		if err != nil || !c.Expired() {
			return interp.ChildEnd{}, false, nil
		}
		return interp.ChildEnd{ID: id, Status: projections.StatusFailed, Expired: true}, true, nil
	}
	s, err := projections.Fold(evs)
	if err != nil { // damaged: its end is the one a repair leads to
		zerolog.Ctx(ctx).Warn().Err(err).Str("child", id).Msg("the history of a child execution does not fold; its parent waits")
		return interp.ChildEnd{}, false, nil
	}
	if !s.Status.Terminal() {
		return interp.ChildEnd{}, false, nil
	}
	return interp.ChildEnd{ID: id, Status: s.Status, Output: s.Output, Error: s.Error}, true, nil
}
