package dispatch

import (
	"encoding/json"
	"fmt"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// action is what the dispatcher must do next for an execution.
type action struct {
	kind    actionKind
	step    workflow.Step
	attempt int
	err     string
	// input is the rendered operation (actSchedule), the recorded one
	// (actSend, actResend).
	input json.RawMessage
	// vars are the rendered variables of a let step.
	vars map[string]json.RawMessage
	// output is a return step's or the workflow's rendered output.
	output json.RawMessage
	// signal is the signal a wait step takes.
	signal *projections.Signal
	// delay is a retry's backoff; until a sleep's end.
	delay time.Duration
	until time.Time
}

type actionKind int

const (
	actWait       actionKind = iota // nothing to do until a result, timer or signal arrives
	actSkip                         // the condition is false: append StepSkipped
	actSchedule                     // append StepScheduled with the rendered input
	actSend                         // append StepSending, publish the task, append StepSent
	actResend                       // the task may not have been stored: publish it again, append StepSent
	actStepFail                     // the step cannot run (bad expression...): record it failed
	actLet                          // set variables, the step succeeds
	actReturn                       // the step succeeds and the execution ends with its output
	actSleep                        // arm a timer, the step waits
	actWaitSignal                   // wait for a signal (arming the timeout, if any)
	actTakeSignal                   // a kept signal fits: the wait step succeeds with it
	actComplete                     // the dispatcher's own step is done: it succeeds
	actReschedule                   // a failed attempt is retried after a backoff
	actSucceed                      // append ExecutionSucceeded (with the rendered output)
	actFail                         // append ExecutionFailed
)

// decide returns the next action for state s of definition d. It is pure:
// the same state always gives the same action, which makes re-handling a
// redelivered message (after a crash) safe. Expressions are evaluated over
// recorded state only.
func decide(d workflow.Definition, s projections.Execution) action {
	if s.Status != projections.StatusStarted {
		return action{kind: actWait}
	}
	if timerFired(s, events.TimerWorkflowTimeout, "", 0) {
		return action{kind: actFail, err: "the workflow timed out after " + d.Timeout}
	}
	env := envOf(s)
	for _, st := range s.Steps {
		step, ok := d.Step(st.ID)
		if !ok {
			return action{kind: actFail, err: "step " + st.ID + " is not in the pinned definition"}
		}
		switch st.Status {
		case projections.OpSucceeded:
			if step.Kind == workflow.KindReturn { // the execution ends here
				return action{kind: actSucceed, output: st.Output}
			}
			continue
		case projections.OpSkipped:
			continue
		case projections.OpFailed:
			if r := d.RetryOf(step); r != nil && st.Attempt < r.Limit && r.Retries(st.Error) {
				return action{kind: actReschedule, step: step, attempt: st.Attempt, delay: r.Delay(st.Attempt)}
			}
			return action{kind: actFail, step: step, err: "step " + st.ID + " failed: " + st.Error}
		case projections.OpRescheduled:
			if timerFired(s, events.TimerRetry, st.ID, st.Attempt) {
				return schedule(d, step, st.Attempt+1, env)
			}
			return action{kind: actWait}
		case projections.OpNone:
			if step.Condition != "" {
				run, err := expression.Condition(step.Condition, env)
				if err != nil {
					return action{kind: actStepFail, step: step, attempt: st.Attempt + 1, err: "condition: " + err.Error()}
				}
				if !run {
					return action{kind: actSkip, step: step}
				}
			}
			return schedule(d, step, st.Attempt+1, env)
		case projections.OpPending:
			if !workflow.IsOperation(step.Kind) {
				return internal(step, st, s, env)
			}
			return action{kind: actSend, step: step, attempt: st.Attempt, input: st.Input}
		case projections.OpSending:
			if timerFired(s, events.TimerStepTimeout, st.ID, st.Attempt) {
				return action{kind: actStepFail, step: step, attempt: st.Attempt,
					err: fmt.Sprintf("attempt %d timed out after %s", st.Attempt, step.Timeout)}
			}
			return action{kind: actResend, step: step, attempt: st.Attempt, input: st.Input}
		case projections.OpWaiting:
			return waiting(step, st, s, env)
		default: // sent or started: the agent has it; wait for its result, or its timeout
			if timerFired(s, events.TimerStepTimeout, st.ID, st.Attempt) {
				return action{kind: actStepFail, step: step, attempt: st.Attempt,
					err: fmt.Sprintf("attempt %d timed out after %s", st.Attempt, step.Timeout)}
			}
			return action{kind: actWait}
		}
	}
	out, err := render(d.Output, env)
	if err != nil {
		return action{kind: actFail, err: "workflow output: " + err.Error()}
	}
	return action{kind: actSucceed, output: out}
}

// waiting decides a sleep or wait step that waits: a sleep ends when its
// timer has fired; a wait takes a fitting signal, or fails when its
// timeout has fired. Deciding from recorded timers (rather than when the
// timer command arrives) keeps this right after any crash.
func waiting(step workflow.Step, st projections.Step, s projections.Execution, env map[string]any) action {
	switch step.Kind {
	case workflow.KindSleep:
		if timerFired(s, events.TimerSleep, st.ID, st.Attempt) {
			return action{kind: actComplete, step: step, attempt: st.Attempt}
		}
	case workflow.KindWait:
		if sig := takeable(step, s, env); sig != nil {
			return action{kind: actTakeSignal, step: step, attempt: st.Attempt, signal: sig}
		}
		if timerFired(s, events.TimerWaitTimeout, st.ID, st.Attempt) {
			return action{kind: actStepFail, step: step, attempt: st.Attempt,
				err: fmt.Sprintf("timed out after %s waiting for signal %v", step.Timeout, step.WaitSignals())}
		}
	}
	return action{kind: actWait}
}

// schedule prepares an attempt: operations get their input rendered now
// (and recorded, so a resend uses exactly it); the dispatcher's own steps
// are scheduled bare and run when pending.
func schedule(d workflow.Definition, step workflow.Step, attempt int, env map[string]any) action {
	if !workflow.IsOperation(step.Kind) {
		return action{kind: actSchedule, step: step, attempt: attempt}
	}
	spec, err := renderStep(step, env)
	if err != nil {
		return action{kind: actStepFail, step: step, attempt: attempt, err: err.Error()}
	}
	return action{kind: actSchedule, step: step, attempt: attempt, input: spec}
}

// internal decides a pending step that the dispatcher runs itself.
func internal(step workflow.Step, st projections.Step, s projections.Execution, env map[string]any) action {
	fail := func(err error) action {
		return action{kind: actStepFail, step: step, attempt: st.Attempt, err: err.Error()}
	}
	switch step.Kind {
	case workflow.KindLet:
		vars := make(map[string]json.RawMessage, len(step.Vars))
		for k, v := range step.Vars {
			b, err := render(v, env)
			if err != nil {
				return fail(fmt.Errorf("vars.%s: %w", k, err))
			}
			vars[k] = b
		}
		return action{kind: actLet, step: step, attempt: st.Attempt, vars: vars}
	case workflow.KindFail:
		msg, err := expression.RenderString(step.Message, env)
		if err != nil {
			return fail(fmt.Errorf("message: %w", err))
		}
		if msg == "" {
			msg = "failed by step " + step.ID
		}
		return action{kind: actStepFail, step: step, attempt: st.Attempt, err: msg}
	case workflow.KindReturn:
		out, err := render(step.Output, env)
		if err != nil {
			return fail(fmt.Errorf("output: %w", err))
		}
		return action{kind: actReturn, step: step, attempt: st.Attempt, output: out}
	case workflow.KindSleep:
		if timerFired(s, events.TimerSleep, st.ID, st.Attempt) { // armed and fired before the step recorded its wait
			return action{kind: actComplete, step: step, attempt: st.Attempt}
		}
		if step.Duration != "" {
			txt, err := expression.RenderString(step.Duration, env)
			if err != nil {
				return fail(fmt.Errorf("duration: %w", err))
			}
			dur, err := time.ParseDuration(txt)
			if err != nil || dur < 0 {
				return fail(fmt.Errorf("duration %q is not a duration (e.g. 30s)", txt))
			}
			return action{kind: actSleep, step: step, attempt: st.Attempt, delay: dur}
		}
		txt, err := expression.RenderString(step.Until, env)
		if err != nil {
			return fail(fmt.Errorf("until: %w", err))
		}
		until, err := time.Parse(time.RFC3339Nano, txt)
		if err != nil {
			return fail(fmt.Errorf("until %q is not an RFC 3339 time", txt))
		}
		return action{kind: actSleep, step: step, attempt: st.Attempt, until: until}
	case workflow.KindWait:
		if sig := takeable(step, s, env); sig != nil {
			return action{kind: actTakeSignal, step: step, attempt: st.Attempt, signal: sig}
		}
		return action{kind: actWaitSignal, step: step, attempt: st.Attempt}
	}
	return fail(fmt.Errorf("the dispatcher cannot run a %s step", step.Kind))
}

// takeable returns the first kept signal a wait step accepts: one of its
// names, and its match condition (if any) true. A signal that arrived
// before the step was reached is kept for it.
func takeable(step workflow.Step, s projections.Execution, env map[string]any) *projections.Signal {
	names := step.WaitSignals()
	for i := range s.Signals {
		sig := s.Signals[i]
		if sig.TakenBy != "" || !contains(names, sig.Name) {
			continue
		}
		if step.Match != "" {
			ok, err := expression.Condition(step.Match, with(env, "signal", map[string]any{"name": sig.Name, "data": decode(sig.Data)}))
			if err != nil || !ok {
				continue
			}
		}
		return &sig
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// renderStep evaluates an operation step's templates into the spec the
// agent receives: text fields as text, body and input as any JSON value.
// The dispatcher's own fields (condition, output, retry, timeout) stay out.
func renderStep(step workflow.Step, env map[string]any) (json.RawMessage, error) {
	var firstErr error
	str := func(field, v string) string {
		if firstErr != nil || !expression.IsTemplate(v) {
			return v
		}
		out, err := expression.RenderString(v, env)
		if err != nil {
			firstErr = fmt.Errorf("%s: %w", field, err)
		}
		return out
	}
	out := workflow.Step{ID: step.ID, Kind: step.Kind, Queue: step.Queue, Operation: step.Operation, Level: step.Level,
		Message: str("message", step.Message), Command: str("command", step.Command), Dir: str("dir", step.Dir),
		Method: str("method", step.Method), URL: str("url", step.URL)}
	for i, a := range step.Args {
		out.Args = append(out.Args, str(fmt.Sprintf("args[%d]", i), a))
	}
	if step.Env != nil {
		out.Env = make(map[string]string, len(step.Env))
		for k, v := range step.Env {
			out.Env[k] = str("env."+k, v)
		}
	}
	if step.Headers != nil {
		out.Headers = make(map[string]string, len(step.Headers))
		for k, v := range step.Headers {
			out.Headers[k] = str("headers."+k, v)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	var err error
	if out.Body, err = expression.Render(step.Body, env); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	if out.Input, err = expression.Render(step.Input, env); err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	return json.Marshal(out)
}

// render evaluates a template value to JSON (nil for no value).
func render(v any, env map[string]any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	out, err := expression.Render(v, env)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func timerFired(s projections.Execution, purpose, stepID string, attempt int) bool {
	t, ok := s.Timers[timerID(s.ID, purpose, stepID, attempt)]
	return ok && t.Fired
}
