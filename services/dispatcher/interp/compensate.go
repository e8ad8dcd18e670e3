package interp

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Compensation (the saga pattern, TaskFlow's revert). A step's
// compensate steps undo what it did once it succeeded. They run when the
// workflow compensates on failure or on cancel (compensate_on), or when
// an operator asks (the compensate action): the steps that succeeded and
// have compensate steps are recorded, in reverse order of completion,
// with io.jetflow.compensation.started, and their compensate steps then
// run one step's after the other's, as ordinary steps (durable, retried
// by their own policy, at the paths <step>/compensate/<id>), until
// io.jetflow.compensation.finished, or .failed when one of them fails
// (the later ones do not run). Then the execution ends: failed (with the
// failure compensated), cancelled, or, for an operator's, as it was.

// Action kinds of compensation (numbered apart from decide's).
const (
	actCompensate         actionKind = 200 + iota // record compensation.started
	actCompensated                                // record compensation.finished
	actCompensationFailed                         // record compensation.failed
)

// compensateSeg is the path segment of the compensate steps of round
// (the execution's compensations counted from 1).
func compensateSeg(round int) string {
	if round <= 1 {
		return "compensate"
	}
	return "compensate" + strconv.Itoa(round)
}

// isCompensateSeg reports whether a path segment is compensate steps'.
func isCompensateSeg(seg string) bool {
	n, ok := strings.CutPrefix(seg, "compensate")
	if !ok {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// toCompensate lists the step instances whose compensate steps a
// compensation runs, in the order it runs them: every instance that
// succeeded (an operation's success noted after the end counts, as the
// latest) and whose step has compensate steps, but compensate steps
// themselves and instances an earlier compensation undid and that did
// not run again since, the latest completed first.
func toCompensate(d workflow.Definition, s projections.Execution) []string {
	type done struct {
		path string
		at   int
	}
	var found []done
	for _, st := range s.Steps {
		at := st.Completed
		if st.Status != projections.OpSucceeded {
			if st.AfterEnd == nil || st.AfterEnd.Outcome != projections.OpSucceeded {
				continue
			}
			at = s.Events + 1 // it succeeded after the end: the latest
		}
		if inCompensation(st.ID) {
			continue
		}
		if undone, ok := s.Compensated[st.ID]; ok && undone == st.Completed {
			continue // undone already, and not run again since
		}
		if step, ok := resolveStep(d, s, st.ID); ok && len(step.Compensate) > 0 {
			found = append(found, done{st.ID, at})
		}
	}
	slices.SortStableFunc(found, func(a, b done) int { return cmp.Compare(b.at, a.at) })
	out := make([]string, len(found))
	for i, f := range found {
		out[i] = f.path
	}
	return out
}

// inCompensation reports whether path is inside compensate steps.
func inCompensation(path string) bool {
	for _, seg := range strings.Split(path, "/") {
		if isCompensateSeg(seg) {
			return true
		}
	}
	return false
}

// orCompensate returns the compensation that begins instead of end (the
// execution failing or being cancelled) when the workflow compensates
// then and some step has something to undo; else end itself.
func orCompensate(d workflow.Definition, s projections.Execution, end action) action {
	cause := events.CompensateForFailure
	if end.kind == actCancelled {
		cause = events.CompensateForCancel
	}
	if s.DryRun || s.Compensation != nil || !d.CompensatesOn(cause) {
		return end
	}
	if a, out := compensableOut(d, s); out {
		// Operations still out that may yet succeed, and would need
		// undoing: their reports first, their timeouts and sends seen to
		// as a cancel sees to them.
		return a
	}
	steps := toCompensate(d, s)
	if len(steps) == 0 {
		return end
	}
	return action{kind: actCompensate, cause: cause, err: end.err, compensate: steps}
}

// compensating decides an execution whose compensation began: the
// compensate steps of its steps run in the recorded order; then it ends
// as the compensation's cause says.
func compensating(d workflow.Definition, s projections.Execution) action {
	c := s.Compensation
	if c.Status == projections.CompensationRunning {
		e := newEngine(d, s)
		for _, path := range c.Steps {
			f, step, ok := resolveFrame(d, s, path)
			if !ok || len(step.Compensate) == 0 {
				continue // not in the definition any more: nothing to run
			}
			r := e.run(f.child(path+"/"+compensateSeg(c.Round)+"/", step.Compensate, compensatingRoot(s, path)))
			switch r.state {
			case running:
				return r.act
			case failed:
				return action{kind: actCompensationFailed, path: path, err: r.err}
			}
		}
		return action{kind: actCompensated}
	}
	// Over: the execution ends.
	msg := c.Error
	if c.Status == projections.CompensationFailed {
		msg = cmp.Or(msg, "compensation asked") + fmt.Sprintf("; then compensation: step %s could not be compensated: %s", c.StepID, c.Failure)
	}
	end := c.Prior
	switch c.Cause {
	case events.CompensateForFailure:
		end = projections.StatusFailed
	case events.CompensateForCancel:
		end = projections.StatusCancelled
	}
	switch {
	case end == projections.StatusCancelled || s.Status == projections.StatusCancelling:
		return action{kind: actCancelled}
	case end == projections.StatusSucceeded && c.Status == projections.CompensationFinished:
		return action{kind: actSucceed, output: s.Output}
	}
	return action{kind: actFail, err: cmp.Or(msg, "compensated")}
}

// compensatingRoot is the expression root compensating of the
// compensate steps of the instance at path: the instance they undo (its
// id, path, attempt and output), whatever later rounds ran.
func compensatingRoot(s projections.Execution, path string) map[string]any {
	st, _ := instanceOf(s, path)
	return map[string]any{"compensating": map[string]any{"id": localID(lastSegment(path)), "path": path,
		"attempt": float64(st.Attempt), "output": decode(st.Output)}}
}

// awaitCompensation marks the wait of a failure's compensation for the
// reports of operations still out (a cancel is refused meanwhile).
const awaitCompensation = "await-compensation"

// compensableOut looks at the operations still out whose steps have
// compensate steps (an attempt with an agent whose final report has not
// come): if there are some, out is true and a is what they need (a
// timeout, a send again: inFlight) or a wait.
func compensableOut(d workflow.Definition, s projections.Execution) (a action, out bool) {
	for _, st := range s.Steps {
		if !st.Status.InFlight() || st.AfterEnd != nil || inCompensation(st.ID) {
			continue
		}
		_, step, ok := resolveFrame(d, s, st.ID)
		if !ok || len(step.Compensate) == 0 {
			continue
		}
		if a := inFlight(s, step, st); a.kind != actWait {
			return a, true
		}
		out = true
	}
	return action{kind: actWait, cause: awaitCompensation}, out
}

// compensate decides an operator's compensate action: an execution that
// is over runs the compensate steps of its steps that succeeded, with a
// new token, then ends as it was. A compensation a force-cancel or a
// kill stopped goes on where it was.
func compensate(in Input, rec events.ActionRecord) Decision {
	s := in.State
	c := s.Compensation
	switch {
	case c != nil && (c.Status != projections.CompensationRunning || !s.Status.Terminal()):
		return reject(events.CodeConflict, "execution %q was compensated already (%s); replay it to run it again", in.ID, c.Status)
	case !s.Status.Terminal():
		return reject(events.CodeConflict, "execution %q is %s: compensate applies to an execution that is over (failed, cancelled or succeeded); cancel it first", in.ID, s.Status)
	}
	if _, out := compensableOut(in.Def, s); out {
		return reject(events.CodeConflict, "execution %q has operations still out that may need undoing: wait for their reports (the janitor fails a lost one), then compensate", in.ID)
	}
	steps := toCompensate(in.Def, s)
	if c != nil {
		steps = c.Steps // the stopped compensation, as it was
	}
	if len(steps) == 0 {
		return reject(events.CodeConflict, "execution %q has nothing to compensate: no step that succeeded has compensate steps", in.ID)
	}
	if in.Token == "" {
		return Decision{Need: NeedToken{}}
	}
	return Decision{Events: []events.Payload{&events.CompensationStarted{ActionRecord: rec, Cause: events.CompensateForOperator,
		Error: s.Error, Steps: steps, Token: in.Token}}, After: []Effect{CatchUp{}}}
}
