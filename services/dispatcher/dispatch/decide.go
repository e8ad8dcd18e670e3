package dispatch

import (
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// action is what the dispatcher must do next for an execution.
type action struct {
	kind actionKind
	step workflow.Step
	// attempt of the step the action is about.
	attempt int
	err     string
}

type actionKind int

const (
	actWait     actionKind = iota // nothing to do until a result or command arrives
	actSchedule                   // append StepScheduled (pending)
	actSend                       // append StepSending, publish the task, append StepSent
	actResend                     // the task may not have been stored: publish it again, append StepSent
	actSucceed                    // append ExecutionSucceeded
	actFail                       // append ExecutionFailed
)

// decide returns the next action for state s of definition d. It is pure:
// the same state always gives the same action, which makes re-handling a
// redelivered message (after a crash) safe.
func decide(d workflow.Definition, s projections.Execution) action {
	if s.Status != projections.StatusStarted {
		return action{kind: actWait}
	}
	for _, st := range s.Steps {
		step, ok := d.Step(st.ID)
		if !ok {
			return action{kind: actFail, err: "step " + st.ID + " is not in the pinned definition"}
		}
		switch st.Status {
		case projections.OpSucceeded:
			continue
		case projections.OpFailed:
			return action{kind: actFail, step: step, err: "step " + st.ID + " failed: " + st.Error}
		case projections.OpNone:
			return action{kind: actSchedule, step: step, attempt: st.Attempt + 1}
		case projections.OpPending:
			return action{kind: actSend, step: step, attempt: st.Attempt}
		case projections.OpSending:
			return action{kind: actResend, step: step, attempt: st.Attempt}
		default: // sent or started: the agent has it; wait for its result
			return action{kind: actWait}
		}
	}
	return action{kind: actSucceed}
}
