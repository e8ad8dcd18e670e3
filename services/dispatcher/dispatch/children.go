package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
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
		end, ok, err := d.childEnd(ctx, x.id, st)
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

// childEnd reads how the child execution of step st of execution parent
// ended, from its history; ok is false while it has not ended (or has
// not started). An execution that holds the child's id but was not
// started by this step (a client took the id first) ends the step too.
func (d *Dispatcher) childEnd(ctx context.Context, parent string, st projections.Step) (interp.ChildEnd, bool, error) {
	id := st.Child
	evs, err := d.hist.Read(ctx, bus.ExecutionSubject(st.ChildWorkflow, id), 0)
	if err != nil {
		return interp.ChildEnd{}, false, fmt.Errorf("read the history of child execution %s: %w", id, err)
	}
	if len(evs) == 0 {
		// Not started yet; or expired and deleted before its parent read
		// its end (a retention shorter than the parent's wait to hear);
		// or its start refused, its id claimed by another command.
		c, err := d.ids.Get(ctx, id)
		switch {
		case errors.Is(err, claim.ErrNotFound):
			return interp.ChildEnd{}, false, nil
		case err != nil:
			return interp.ChildEnd{}, false, fmt.Errorf("look up the claim of child execution %s: %w", id, err)
		case c.Expired():
			return interp.ChildEnd{ID: id, Status: projections.StatusFailed, Expired: true}, true, nil
		}
		if start, ok := interp.ChildStart(st); ok && c.Digest != "" && c.Digest != start.Digest() {
			return interp.ChildEnd{ID: id, Status: projections.StatusFailed,
				Foreign: fmt.Sprintf("its id was claimed by another start (%s, workflow %s) before it", c.CommandKey, c.Workflow)}, true, nil
		}
		return interp.ChildEnd{}, false, nil
	}
	s, err := projections.Fold(evs)
	if err != nil { // damaged: its end is the one a repair leads to
		zerolog.Ctx(ctx).Warn().Err(err).Str("child", id).Msg("the history of a child execution does not fold; its parent waits")
		return interp.ChildEnd{}, false, nil
	}
	if p := s.Parent; p == nil || p.ExecutionID != parent || p.StepID != st.ID || p.Attempt != st.Attempt {
		return interp.ChildEnd{ID: id, Status: projections.StatusFailed,
			Foreign: fmt.Sprintf("execution %s (workflow %s) holds its id, and was started by %s, not by this step", id, s.Workflow, cmp.Or(s.StartedBy, "another start"))}, true, nil
	}
	if !s.Status.Terminal() {
		return interp.ChildEnd{}, false, nil
	}
	return interp.ChildEnd{ID: id, Status: s.Status, Output: s.Output, Error: s.Error}, true, nil
}
