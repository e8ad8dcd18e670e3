package interp

import (
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// cancelled is the event that ends a cancelling execution.
func cancelled(s projections.Execution) *events.ExecutionCancelled {
	rec := events.ActionRecord{Action: events.ActionCancel}
	if c := s.Cancellation; c != nil {
		rec.Reason, rec.RequestedBy, rec.Actor = c.Reason, c.RequestedBy, c.Actor
	}
	return &events.ExecutionCancelled{ActionRecord: rec}
}

// resetFor lists the step instances a resume runs again: failures that
// their on-error steps did not recover (and are not handling), attempts
// waiting for a retry, operations whose failure arrived while the
// execution was over (failed), and with force the operations that were
// with the agents (or being sent). The on-error instances of an attempt
// that runs again are left as they are: a new attempt's failure gets
// new ones. Of two instances at one path (a move made before
// 2026-12-05 could leave them), only the later counts, as for every
// other reader.
func resetFor(d workflow.Definition, s projections.Execution, force bool, failedBefore map[string]bool) []string {
	var out []string
	reset := map[string]bool{}
	e := lookingEngine(d, s)
	last := make(map[string]int, len(s.Steps))
	for i, st := range s.Steps {
		last[st.ID] = i
	}
	for i, st := range s.Steps {
		if last[st.ID] != i || staleHandler(s, st.ID, reset) || !current(s, st.ID) {
			continue
		}
		switch {
		case st.Status == projections.OpRescheduled, force && st.Status.InFlight(), failedBefore[st.ID] && st.Status.InFlight():
		case st.Status == projections.OpFailed && st.Stopped: // the end stopped its child: a new child, not its on-error steps
		case st.Status == projections.OpFailed:
			if f, step, ok := resolveFrame(d, s, st.ID); ok && len(step.OnError) > 0 && e.handle(f, step, st).state != failed {
				continue // recovered by its on-error steps, or being handled by them
			}
		default:
			continue
		}
		out = append(out, st.ID)
		reset[st.ID] = true
	}
	return out
}

// staleHandler reports whether path is inside the on-error steps of an
// attempt that is not its step's current one (or that the resume runs
// again, under a new attempt).
func staleHandler(s projections.Execution, path string, reset map[string]bool) bool {
	segs := strings.Split(path, "/")
	for i := 1; i < len(segs)-1; i++ {
		if !strings.HasPrefix(segs[i], "on-error") || !isHandlerSeg(segs[i]) {
			continue
		}
		owner := strings.Join(segs[:i], "/")
		n, _ := strconv.Atoi(strings.TrimPrefix(segs[i], "on-error"))
		st, ok := instanceOf(s, owner)
		if !ok || st.Attempt != n || (reset[owner] && (!workflow.IsContainer(st.Kind) || st.ChildStep())) { // run again under a new attempt
			return true
		}
	}
	return false
}

// failedMeanwhile lists the operations whose stored result is a failure.
//
// A failure noted after the end (events.ResultAfterEnd) counts too, once
// the results stream no longer keeps its report (it keeps them for a
// while). A success noted there whose report it no longer keeps is not
// run again by a plain resume (its output is gone; force-resume runs it).
func failedMeanwhile(s projections.Execution, stored map[string]events.Event) map[string]bool {
	out := map[string]bool{}
	for id, ev := range stored {
		if ev.Type == events.TypeOperationFailed {
			out[id] = true
		}
	}
	for _, st := range s.Steps {
		if st.AfterEnd != nil && st.AfterEnd.Outcome == projections.OpFailed && st.Status.InFlight() {
			out[st.ID] = true
		}
	}
	return out
}

// stepError is the recorded error of a step instance.
func stepError(s projections.Execution, id string) string {
	st, _ := instanceOf(s, id)
	return st.Error
}
