package interp

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// action is what the dispatcher must do next for an execution.
type action struct {
	kind actionKind
	step workflow.Step
	// path is the step instance's path (its id at the top level).
	path    string
	attempt int
	err     string
	// input is the rendered operation (actSchedule), the recorded one
	// (actSend, actResend).
	input json.RawMessage
	// vars are the rendered variables of a let step.
	vars map[string]json.RawMessage
	// output is a return step's or the workflow's rendered output.
	output json.RawMessage
	// continued is the successor of an execution a continue-as-new step
	// ended (actSucceed).
	continued string
	// cause and compensate: an actCompensate's (why, and the steps whose
	// compensate steps run, in order).
	cause      string
	compensate []string
	// signal is the signal a wait step takes.
	signal *projections.Signal
	// final marks a step failure that retrying cannot change.
	final bool
	// terminate: the failing attempt may be with the agents (its timeout
	// fired), which are told to terminate it.
	terminate bool
	// jitter randomises delay by up to this fraction.
	jitter float64
	// purpose is the timer an actArmTimer arms.
	purpose string
	// delay is a retry's backoff; until a sleep's end.
	delay time.Duration
	until time.Time
	// replay is the replay an actReplay records.
	replay *replayRequest
	// lock is what an actLock or actUnlock is about (locks.go).
	lock lockAct
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
	actArmTimer                     // a timeout that is due to exist is not recorded: arm it
	actReschedule                   // a failed attempt is retried after a backoff
	actSucceed                      // append ExecutionSucceeded (with the rendered output)
	actFail                         // append ExecutionFailed
	actCancelled                    // a cancelling execution has nothing running: append ExecutionCancelled
	actReplay                       // a retry step (or automatic recovery) replays the execution
	actClearLock                    // a clear-lock step: hand its recorded clear to the dispatchers, the step succeeds
	actContinue                     // a continue-as-new step: start the successor, the step succeeds (and the execution ends)
	actStartChild                   // a child step: publish its child's recorded start, record it started
)

// workflowOnError starts the paths of the workflow's own on-error steps.
const workflowOnError = "on-error/"

// decide returns the next action for state s of definition d. It is pure:
// the same state always gives the same action, which makes re-handling a
// redelivered message (after a crash) safe. Expressions are evaluated over
// recorded state only.
func decide(d workflow.Definition, s projections.Execution) action {
	return decideIn(d, s, nil)
}

// decideIn is decide with the view kept from the execution's earlier
// decisions (nil: none), which makes it cost what changed since.
func decideIn(d workflow.Definition, s projections.Execution, v *view) action {
	if s.Compensation != nil && s.Status.Active() {
		return compensating(d, s)
	}
	switch s.Status {
	case projections.StatusStarted:
	case projections.StatusCancelling:
		return cancelling(d, s)
	default:
		return action{kind: actWait}
	}
	e := pooledEngine(d, s)
	defer releaseEngine(e)
	var r result
	if timerFired(s, events.TimerWorkflowTimeout, "", s.Resumes) && !continuing(s) {
		// Its steps go no further (a late result is recorded, nothing
		// follows it); its on-error steps run, as for any other failure.
		r = result{state: failed, err: "the workflow timed out after " + d.Timeout}
	} else {
		if a, ok := armWorkflowTimeout(d, s); ok {
			return a
		}
		if v = v.sync(s); v != nil {
			e.v, e.rounds = v, v.rounds
		}
		r = e.run(frame{steps: d.Steps, retry: d.Retry})
	}
	if r.state == failed && len(d.OnError) > 0 {
		// The workflow's on-error steps run before it fails: for cleanup,
		// or to rescue it with a return.
		h := e.run(frame{prefix: workflowOnError, steps: d.OnError, roots: map[string]any{"error": map[string]any{"message": r.err}}, handler: true, retry: d.Retry})
		switch {
		case h.state == running:
			return h.act
		case h.state == failed:
			return orCompensate(d, s, action{kind: actFail, err: r.err + "; then on-error: " + h.err})
		case h.returned:
			return action{kind: actSucceed, output: h.output, continued: h.continued}
		}
	}
	switch {
	case r.state == running:
		return r.act
	case r.state == failed:
		return orCompensate(d, s, action{kind: actFail, step: r.act.step, path: r.act.path, err: r.err})
	case r.returned:
		return action{kind: actSucceed, output: r.output, continued: r.continued}
	}
	if d.Output == nil { // nothing to render: no environment built (an end's look ahead made it for nothing)
		return action{kind: actSucceed}
	}
	out, err := render(d.Output, e.env(frame{}))
	if err != nil {
		return action{kind: actFail, err: "workflow output: " + err.Error()}
	}
	return action{kind: actSucceed, output: out}
}

// frame is a list of steps being run: the workflow's, or a container's
// (one per foreach item, parallel branch, switch case or workflow block).
type frame struct {
	// prefix is prepended to the steps' ids to make their paths.
	prefix string
	steps  []workflow.Step
	// roots are extra expression roots (item and index in a foreach body,
	// input in a workflow called by name), inherited by nested frames.
	roots map[string]any
	// handler marks on-error steps: their goto and retry steps end them
	// and act on the failed step's list.
	handler bool
	// retry is the default retry policy of the frame's operations (the
	// workflow's, or a called workflow's).
	retry *workflow.Retry
	// call: the frame is (inside) a workflow called by name.
	call bool
}

func (f frame) child(prefix string, steps []workflow.Step, roots map[string]any) frame {
	merged := make(map[string]any, len(f.roots)+len(roots))
	for k, v := range f.roots {
		merged[k] = v
	}
	for k, v := range roots {
		merged[k] = v
	}
	return frame{prefix: prefix, steps: steps, roots: merged, retry: f.retry, call: f.call}
}

type outcome int

const (
	running outcome = iota // act says what to do (or actWait)
	done                   // every step is done; output is the last one's
	failed                 // err says why
)

type result struct {
	state    outcome
	act      action
	err      string
	output   json.RawMessage
	returned bool // a return step ended the execution
	// continued: a continue-as-new step ended it, for this successor.
	continued string
	// jump is the target of a goto in on-error steps: the list of the
	// failed step goes on from there.
	jump string
	// retry is set when on-error steps decided to run the failed step again.
	retry *workflow.Retry
}

// engine holds what one decision needs: the definition, the state, and the
// step instances indexed by path and by the frame they belong to.
type engine struct {
	rounds bool // some step ran again after a goto
	// noReplay: this engine only looks (at errors, at what is being
	// handled), it does not plan the replays retry steps ask for.
	noReplay bool
	d        workflow.Definition
	s        projections.Execution
	// byPath and byParent index e.s.Steps (by path, and by frame in
	// order): positions, not copies of the steps (a step is over 400
	// bytes, and they were copied at every decision that looked).
	byPath   map[string]int
	byParent map[string][]int
	global   map[string]any
	base     map[string]any // global without steps
	// v is the view kept between decisions (nil: none, the maps above
	// are built for this decision).
	v *view
}

func newEngine(d workflow.Definition, s projections.Execution) *engine {
	return &engine{d: d, s: s}
}

// engines keeps decideIn's engines between decisions: an engine holds
// the definition and the state by value (over a kilobyte), and every
// decision made one: 7.5% of the bytes a local step allocated.
var engines = sync.Pool{New: func() any { return new(engine) }}

// pooledEngine is newEngine from the pool; releaseEngine gives it back
// once nothing the decision returns refers to it (actions and results
// are values; the maps an engine builds are handed out, never reused).
func pooledEngine(d workflow.Definition, s projections.Execution) *engine {
	e := engines.Get().(*engine)
	*e = engine{d: d, s: s}
	return e
}

func releaseEngine(e *engine) {
	*e = engine{} // what it refers to is not kept alive by the pool
	engines.Put(e)
}

// lookingEngine is an engine that only looks (see engine.noReplay).
func lookingEngine(d workflow.Definition, s projections.Execution) *engine {
	return &engine{d: d, s: s, noReplay: true}
}

// instance returns the step instance at path, if the history has it. Small
// executions are scanned (cheaper than building a map on every decision);
// larger ones get an index on first use.
func (e *engine) instance(path string) (projections.Step, bool) {
	if e.v != nil {
		if i, ok := e.v.pos[path]; ok {
			return e.s.Steps[i], true
		}
		return projections.Step{}, false
	}
	if len(e.s.Steps) <= 32 {
		for i := len(e.s.Steps) - 1; i >= 0; i-- { // the last of a path, as the index and the fold find it
			if e.s.Steps[i].ID == path {
				return e.s.Steps[i], true
			}
		}
		return projections.Step{}, false
	}
	e.index()
	if i, ok := e.byPath[path]; ok {
		return e.s.Steps[i], true
	}
	return projections.Step{}, false
}

// children returns the positions in e.s.Steps of the instances directly
// in the frame with this prefix: the index's or the view's own slice,
// to be read only.
func (e *engine) children(prefix string) []int {
	if e.v != nil {
		return e.v.children[prefix]
	}
	e.index()
	return e.byParent[prefix]
}

// started reports whether the frame with this prefix has instances.
func (e *engine) started(prefix string) bool {
	if e.v != nil {
		return len(e.v.children[prefix]) > 0
	}
	return len(e.children(prefix)) > 0
}

// index builds the maps by path and by frame, once (a view has them).
func (e *engine) index() {
	if e.byPath != nil || e.v != nil {
		return
	}
	e.byPath = make(map[string]int, len(e.s.Steps))
	e.byParent = map[string][]int{}
	for k, st := range e.s.Steps {
		e.byPath[st.ID] = k
		parent := ""
		if i := strings.LastIndexByte(st.ID, '/'); i >= 0 {
			parent = st.ID[:i+1]
		}
		e.byParent[parent] = append(e.byParent[parent], k)
		if strings.Contains(st.ID, "~") {
			e.rounds = true
		}
	}
}

// lazyEnv is the expression environment of a frame, built on first use:
// most decisions evaluate no expression at all.
type lazyEnv struct {
	e *engine
	f frame
	m map[string]any
}

func (l *lazyEnv) get() map[string]any {
	if l.m == nil {
		l.m = l.e.env(l.f)
	}
	return l.m
}

func (e *engine) globalEnv() map[string]any {
	if e.global == nil {
		e.global = envOf(e.s)
	}
	return e.global
}

// baseEnv is globalEnv without steps (which a frame's env replaces):
// building every instance's view costs what the execution has done.
func (e *engine) baseEnv() map[string]any {
	if e.base == nil {
		e.base = baseEnvOf(e.s)
	}
	return e.base
}

// env is what expressions in frame f see: steps.<id> are the steps of f
// and of the frames around it (the nearest wins), plus f's extra roots.
func (e *engine) env(f frame) map[string]any {
	e.index()
	if f.prefix == "" && len(f.roots) == 0 && !e.rounds {
		return e.globalEnv()
	}
	steps := make(map[string]any)
	e.frameSteps(steps, "") // top-level steps; a later round's instance wins
	for i := 0; i < len(f.prefix); i++ {
		if f.prefix[i] == '/' {
			e.frameSteps(steps, f.prefix[:i+1])
		}
	}
	env := with(e.baseEnv(), "steps", steps)
	for k, v := range f.roots {
		env[k] = v
	}
	return env
}

// frameSteps sets steps[id] to the view of the latest instance of each
// step of the frame with this prefix (a later round's wins).
func (e *engine) frameSteps(steps map[string]any, prefix string) {
	if e.v != nil {
		for id, k := range e.v.latest[prefix] {
			steps[id] = stepView(e.s.Steps[k])
		}
		return
	}
	for _, k := range e.children(prefix) {
		st := e.s.Steps[k]
		steps[localID(st.ID[len(prefix):])] = stepView(st)
	}
}

// run runs a frame's steps in order. A goto that ran starts a new round
// of the frame at its target: the steps of round r > 0 are new instances,
// whose paths end in ~r, so nothing recorded is ever rewritten.
func (e *engine) run(f frame) result {
	env := &lazyEnv{e: e, f: f}
	var last json.RawMessage
	round := 0
	// With a view, the leading steps that ended for good, and the rounds
	// a goto ended, are not walked again. Not in a handler (its steps run
	// again for another failure).
	var m *listMemo
	first := 0
	if e.v != nil && !f.handler {
		m = e.v.list(f.prefix)
		round, first, last = m.round, m.done, m.last
	}
	for i := first; i < len(f.steps); i++ {
		step := f.steps[i]
		path := f.prefix + step.ID
		if round > 0 {
			path += "~" + strconv.Itoa(round)
		}
		st, ok := e.instance(path)
		if !ok {
			st = projections.Step{ID: path, Kind: step.Kind}
			if len(e.s.RetiredSteps) > 0 { // back after a move to another version retired it
				st.Attempt = e.s.RetiredAttempts(path)
				st.RetryBase = st.Attempt
			}
		}
		if f.handler && st.Status == projections.OpSucceeded && (step.Kind == workflow.KindGoto || step.Kind == workflow.KindRetry) {
			if step.Kind == workflow.KindRetry && step.Next != "" { // go on from next, like a goto
				return result{state: done, jump: step.Next}
			}
			if step.Kind == workflow.KindRetry {
				return result{state: done, retry: step.Retry}
			}
			return result{state: done, jump: step.Target}
		}
		var target string // where this list goes on, after a goto
		var r result
		if step.Kind == workflow.KindGoto && st.Status == projections.OpSucceeded {
			target = step.Target
		} else {
			r = e.step(f, step, st, env)
			if r.state == done {
				target = r.jump // a goto in the step's on-error steps
			}
		}
		if target != "" {
			if target == workflow.GotoEnd {
				return result{state: done, output: last}
			}
			if round++; round > workflow.MaxRounds {
				return result{state: failed, act: action{step: step, path: path},
					err: fmt.Sprintf("goto %s ran more than %d times; a longer loop continues as new", target, workflow.MaxRounds)}
			}
			at := i
			i = slices.IndexFunc(f.steps, func(s workflow.Step) bool { return s.ID == target }) - 1
			if i < -1 {
				return result{state: failed, act: action{step: step, path: path}, err: "goto target " + target + " is not in this list"}
			}
			if m != nil && m.round == round-1 && m.done == at && step.Kind == workflow.KindGoto && st.Status == projections.OpSucceeded {
				// The round ended for good in this goto: the next decision
				// goes on from the next round's target (m.last is last: the
				// memo has passed every step walked).
				m.round, m.done = round, i+1
			}
			env = &lazyEnv{e: e, f: f} // the new round's steps are not done yet
			continue
		}
		if r.state != done || r.returned {
			return r
		}
		if len(r.output) > 0 {
			last = r.output
		}
		if m != nil && m.round == round && m.done == i && (st.Status == projections.OpSucceeded || st.Status == projections.OpSkipped) {
			m.done, m.last = i+1, last
		}
	}
	return result{state: done, output: last}
}

// handle runs the on-error steps of a step that failed (after its retry
// policy). If they complete, the step is recovered; a retry step among
// them reschedules it; a goto among them moves within the step's list; a
// failure among them fails the step.
func (e *engine) handle(f frame, step workflow.Step, st projections.Step) result {
	prefix := fmt.Sprintf("%s/on-error%d/", st.ID, st.Attempt)
	errRoot := map[string]any{"message": st.Error, "step": localID(lastSegment(st.ID)), "attempt": float64(tries(st))}
	hf := f.child(prefix, step.OnError, map[string]any{"error": errRoot})
	hf.handler = true
	r := e.run(hf)
	if r.state != done || r.returned {
		if r.state == failed {
			r.err = "step " + st.ID + " failed: " + st.Error + "; then on-error: " + r.err
		}
		return r
	}
	if r.retry != nil && e.s.DryRun { // a dry run arms no timer: the retry is where it ends
		return result{state: failed, act: action{step: step, path: st.ID},
			err: "step " + st.ID + " failed: " + st.Error + "; then on-error: a dry run does not retry"}
	}
	if r.retry != nil {
		return result{state: running, act: action{kind: actReschedule, step: step, path: st.ID, attempt: st.Attempt,
			delay: r.retry.Delay(tries(st)), jitter: r.retry.Jitter}}
	}
	if r.jump != "" {
		return result{state: done, jump: r.jump}
	}
	return result{state: done, output: r.output}
}

// step decides one step of a frame.
func (e *engine) step(f frame, step workflow.Step, st projections.Step, env *lazyEnv) result {
	act := func(a action) result { a.path = st.ID; return result{state: running, act: a} }
	wait := result{state: running, act: action{kind: actWait}}
	switch st.Status {
	case projections.OpSucceeded:
		if step.Kind == workflow.KindContinue { // the execution ends: its successor goes on
			var out struct {
				ContinuedAs string `json:"continued_as"`
			}
			_ = json.Unmarshal(st.Output, &out)
			return result{state: done, output: st.Output, returned: true, continued: out.ContinuedAs}
		}
		return result{state: done, output: st.Output, returned: step.Kind == workflow.KindReturn}
	case projections.OpSkipped:
		return result{state: done}
	case projections.OpFailed:
		if a, ok := e.autoReplay(step, st); ok {
			return act(a)
		}
		if r := retryOf(step, f); r != nil && !e.s.DryRun && !st.Final && tries(st) < r.Limit && r.Retries(st.Error) {
			return act(action{kind: actReschedule, step: step, attempt: st.Attempt, delay: r.Delay(tries(st)), jitter: r.Jitter})
		}
		if len(step.OnError) > 0 {
			return e.handle(f, step, st)
		}
		return result{state: failed, act: action{step: step, path: st.ID}, err: "step " + st.ID + " failed: " + st.Error}
	case projections.OpRescheduled:
		if timerFired(e.s, events.TimerRetry, st.ID, st.Attempt) {
			return act(e.schedule(step, st.Attempt+1, env))
		}
		return wait
	case projections.OpNone:
		if step.Condition != "" {
			run, err := expression.Condition(step.Condition, env.get())
			if err != nil {
				return act(action{kind: actStepFail, step: step, attempt: st.Attempt + 1, err: "condition: " + err.Error(), final: true})
			}
			if !run {
				return act(action{kind: actSkip, step: step})
			}
		}
		if step.Kind == workflow.KindRetry && step.Retry != nil && len(step.Retry.On) > 0 {
			// A retry step retries only the errors its policy names; for
			// another, it is skipped and the on-error steps after it go on.
			errRoot, _ := env.get()["error"].(map[string]any)
			if msg, _ := errRoot["message"].(string); !step.Retry.Retries(msg) {
				return act(action{kind: actSkip, step: step, err: fmt.Sprintf("the error is not one it retries (on: %s)", strings.Join(step.Retry.On, ", "))})
			}
		}
		return act(e.schedule(step, st.Attempt+1, env))
	case projections.OpPending:
		switch {
		case step.Kind == workflow.KindRetry && step.Replay:
			return act(e.retryReplay(step, st))
		case workflow.IsContainer(step.Kind):
			return e.container(f, step, st, env)
		case step.Kind == workflow.KindContinue && f.call:
			return act(action{kind: actStepFail, step: step, attempt: st.Attempt, final: true,
				err: "continue-as-new ends a whole execution: it cannot run in a workflow called by another"})
		case step.Kind == workflow.KindContinue && e.s.Parent != nil:
			return act(action{kind: actStepFail, step: step, attempt: st.Attempt, final: true,
				err: fmt.Sprintf("continue-as-new cannot end a child execution: its parent %s waits for this one's result", e.s.Parent.ExecutionID)})
		case !workflow.IsOperation(step.Kind):
			return act(internal(step, st, e.s, env))
		}
		return act(action{kind: actSend, step: step, attempt: st.Attempt, input: st.Input})
	case projections.OpWaiting:
		if step.Kind == workflow.KindRetry { // a replay's backoff
			return act(e.retryReplay(step, st))
		}
		return act(waiting(step, st, e.s, env))
	default: // sending, sent or started: the agents have it
		if a := inFlight(e.s, step, st); a.kind != actWait {
			return act(a)
		}
		return wait
	}
}

// inFlight decides an attempt that is with the agents, or may be (sending):
// a task that may not be stored is published again; an attempt past its
// timeout fails; a timeout due to exist but not recorded is armed.
// Otherwise the result is awaited.
func inFlight(s projections.Execution, step workflow.Step, st projections.Step) action {
	if timerFired(s, events.TimerStepTimeout, st.ID, st.Attempt) {
		msg := fmt.Sprintf("attempt %d timed out after %s", st.Attempt, step.Timeout)
		if st.Status != projections.OpStarted && st.Queue != workflow.LocalQueue { // as the history records it: the same after a crash
			msg += fmt.Sprintf(" before an agent of queue %s started it", cmp.Or(st.Queue, workflow.DefaultQueue))
		}
		return action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, err: msg, terminate: true}
	}
	if st.Status == projections.OpSending {
		return action{kind: actResend, step: step, path: st.ID, attempt: st.Attempt, input: st.Input}
	}
	if dur, err := optionalDuration(step.Timeout); err == nil && !timerArmed(s, events.TimerStepTimeout, st.ID, st.Attempt) {
		// Counted from when the task was sent.
		return action{kind: actArmTimer, step: step, path: st.ID, attempt: st.Attempt, purpose: events.TimerStepTimeout,
			until: sentAt(st).Add(dur)}
	}
	return action{kind: actWait}
}

// errNoDuration is optionalDuration's answer to a field left empty.
var errNoDuration = errors.New("no duration")

// optionalDuration parses a duration field that may be left empty (a
// timeout: none), as time.ParseDuration, whose error for an empty field
// costs allocations every decision of every execution without one.
func optionalDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errNoDuration
	}
	return time.ParseDuration(s)
}

// armWorkflowTimeout returns the arming of the workflow's timeout if it is
// due to exist and is not recorded. It counts from the start, or from the
// last resume (each resume gives the workflow its time again; the timer's
// attempt is the resume count).
func armWorkflowTimeout(d workflow.Definition, s projections.Execution) (action, bool) {
	dur, err := optionalDuration(d.Timeout)
	if err != nil || s.DryRun || timerArmed(s, events.TimerWorkflowTimeout, "", s.Resumes) {
		return action{}, false
	}
	from := s.StartedAt
	if s.Resumes > 0 {
		from = s.ResumedAt
	}
	from = lockedFrom(s, from) // with a lock: from its acquisition
	return action{kind: actArmTimer, purpose: events.TimerWorkflowTimeout, attempt: s.Resumes, until: from.Add(dur)}, true
}

// tries is the attempt's number within the step's retry policy: attempts
// before a resume do not count.
func tries(st projections.Step) int { return st.Attempt - st.RetryBase }

// cancelling decides a cancelling execution: nothing new starts (no
// schedule, retry, on-error handler or wait), but the attempts with the
// agents are seen through as usual (a half-sent task is sent, timeouts are
// armed and honoured) and their results recorded. It ends cancelled once
// none is left, or when the workflow times out.
func cancelling(d workflow.Definition, s projections.Execution) action {
	if timerFired(s, events.TimerWorkflowTimeout, "", s.Resumes) {
		return orCompensate(d, s, action{kind: actCancelled})
	}
	if a, ok := armWorkflowTimeout(d, s); ok {
		return a
	}
	running := false
	for _, st := range s.Steps {
		if !st.Status.InFlight() {
			continue
		}
		_, step, ok := resolveFrame(d, s, st.ID)
		if !ok {
			continue // not in the pinned definition: nothing to wait for
		}
		if a := inFlight(s, step, st); a.kind != actWait {
			return a
		}
		running = true
	}
	if running {
		return action{kind: actWait}
	}
	return orCompensate(d, s, action{kind: actCancelled})
}

// schedule prepares an attempt: operations get their input rendered now
// (and recorded, so a resend uses exactly it); containers record what they
// decide at start (foreach items, switch case, called workflow's input);
// the dispatcher's own steps are scheduled bare and run when pending.
func (e *engine) schedule(step workflow.Step, attempt int, env *lazyEnv) action {
	fail := func(err error) action { // an expression that cannot be evaluated: retrying cannot help
		return action{kind: actStepFail, step: step, attempt: attempt, err: err.Error(), final: true}
	}
	var input json.RawMessage
	var err error
	switch {
	case workflow.IsOperation(step.Kind):
		if input, err = renderStep(step, env); err != nil {
			return fail(err)
		}
	case step.Kind == workflow.KindForeach:
		items, err := expression.Render(step.Items, env.get())
		if err != nil {
			return fail(fmt.Errorf("items: %w", err))
		}
		list, ok := items.([]any)
		if !ok {
			return fail(fmt.Errorf("items gives %s, not a list", describeJSON(items)))
		}
		input, _ = json.Marshal(map[string]any{"items": list})
	case step.Kind == workflow.KindSwitch:
		chosen := -1
		for i, c := range step.Cases {
			ok, err := expression.Condition(c.When, env.get())
			if err != nil {
				return fail(fmt.Errorf("cases[%d].when: %w", i, err))
			}
			if ok {
				chosen = i
				break
			}
		}
		input, _ = json.Marshal(map[string]any{"case": chosen})
	case step.Kind == workflow.KindClearLock:
		name, err := renderLockName(step.Lock, env.get())
		if err != nil {
			return fail(fmt.Errorf("lock: %w", err))
		}
		reason, err := expression.RenderString(step.Reason, env.get())
		if err != nil {
			return fail(fmt.Errorf("reason: %w", err))
		}
		if len(reason) > events.MaxActionReason {
			return fail(fmt.Errorf("reason is %d bytes; at most %d are kept", len(reason), events.MaxActionReason))
		}
		// The dispatcher adds the holders it clears (see act).
		input, _ = json.Marshal(clearInput{Lock: name, Reason: reason})
	case step.Kind == workflow.KindWorkflow && step.Workflow != "":
		in, err := render(step.Input, env.get())
		if err != nil {
			return fail(fmt.Errorf("input: %w", err))
		}
		// The dispatcher adds the called workflow's definition (see act).
		input, _ = json.Marshal(map[string]any{"input": orEmpty(in)})
	}
	return action{kind: actSchedule, step: step, attempt: attempt, input: input}
}

// container decides a pending container from its children.
func (e *engine) container(f frame, step workflow.Step, st projections.Step, env *lazyEnv) result {
	finish := func(out json.RawMessage) result {
		return result{state: running, act: action{kind: actComplete, step: step, path: st.ID, attempt: st.Attempt, output: out}}
	}
	failWith := func(r result) result {
		return result{state: running, act: action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, err: r.err}}
	}
	prefix := instancePrefix(st.ID, st.Attempt) // a container run again (by on-error's retry) gets new instances
	block := func() result {
		if step.Workflow != "" && step.Child {
			return e.childStep(step, st)
		}
		if step.Workflow != "" {
			return e.called(f, step, st, prefix, env, finish, failWith)
		}
		r := e.run(f.child(prefix+"/", step.Steps, nil))
		switch {
		case r.state == running:
			return r
		case r.state == failed:
			return failWith(r)
		case r.returned:
			return r // a return in a block ends the execution
		}
		return e.mapOutput(step, st, r.output, env, finish)
	}
	if l, ok := e.s.LockAt(st.ID); ok && l.Status == projections.LockCleared && step.Kind == workflow.KindWorkflow && !e.s.DryRun {
		// Cleared while its steps ran: it asks again only when one of
		// them next starts, behind whoever asked meanwhile; the step
		// itself ends without it (its lock is over then).
		if r := block(); r.state == running && (!startsAnew(e.s, r.act) || cmp.Or(r.act.path, r.act.step.ID) == st.ID) {
			return r
		}
	}
	if r, ok := e.lockGate(step, st, env); !ok { // a workflow step's lock comes first
		return r
	}
	switch step.Kind {
	case workflow.KindWorkflow:
		return block()
	case workflow.KindForeach:
		// With a view, the leading items already done are not walked
		// again: their outputs are kept (items end for good).
		var m *foreachMemo
		var items, outputs []any
		if e.v != nil {
			m = e.v.memo(prefix, st.Input)
			items, outputs = m.items, m.outputs
		} else {
			var rec struct {
				Items []any `json:"items"`
			}
			_ = json.Unmarshal(st.Input, &rec)
			items, outputs = rec.Items, make([]any, len(rec.Items))
		}
		limit := max(step.Concurrency, 1)
		busy, pending := 0, false
		first := 0
		if m != nil {
			first = m.done
		}
		for i := first; i < len(items); i++ {
			item := items[i]
			p := fmt.Sprintf("%s[%d]/", prefix, i)
			started := e.started(p)
			if !started && busy >= limit {
				pending = true
				break // items start in order, at most limit at a time
			}
			r := e.run(f.child(p, step.Steps, map[string]any{"item": item, "index": float64(i)}))
			switch r.state {
			case failed:
				return failWith(result{err: fmt.Sprintf("item %d: %s", i, r.err)})
			case running:
				busy++
				pending = true
				if r.act.kind != actWait {
					return r
				}
			case done:
				if r.returned {
					return r
				}
				outputs[i] = decode(r.output)
				if m != nil && m.done == i && !pending {
					m.done++ // every item before it is done too
				}
			}
		}
		if pending {
			return result{state: running, act: action{kind: actWait}}
		}
		out, _ := json.Marshal(outputs)
		return e.mapOutput(step, st, out, env, finish)
	case workflow.KindParallel:
		outputs := map[string]any{}
		pending := false
		var act *result
		for _, b := range step.Branches {
			r := e.run(f.child(prefix+"/"+b.ID+"/", b.Steps, nil))
			switch r.state {
			case failed:
				return failWith(result{err: fmt.Sprintf("branch %s: %s", b.ID, r.err)})
			case running:
				pending = true
				if r.act.kind != actWait && act == nil {
					act = &r
				}
			case done:
				if r.returned {
					return r
				}
				if step.Mode == workflow.ModeFirst {
					out, _ := json.Marshal(map[string]any{"branch": b.ID, "output": decode(r.output)})
					return e.mapOutput(step, st, out, env, finish)
				}
				outputs[b.ID] = decode(r.output)
			}
		}
		if act != nil {
			return *act
		}
		if pending {
			return result{state: running, act: action{kind: actWait}}
		}
		out, _ := json.Marshal(outputs)
		return e.mapOutput(step, st, out, env, finish)
	case workflow.KindSwitch:
		var rec struct {
			Case int `json:"case"`
		}
		_ = json.Unmarshal(st.Input, &rec)
		steps, name := step.Default, "default"
		if rec.Case >= 0 && rec.Case < len(step.Cases) {
			steps, name = step.Cases[rec.Case].Steps, fmt.Sprintf("case%d", rec.Case)
		}
		r := e.run(f.child(prefix+"/"+name+"/", steps, nil))
		switch {
		case r.state == running:
			return r
		case r.state == failed:
			return failWith(r)
		case r.returned:
			return r
		}
		return e.mapOutput(step, st, r.output, env, finish)
	}
	return failWith(result{err: "the dispatcher cannot run a " + step.Kind + " step"})
}

// called runs another workflow's steps as a container: with its own input,
// default retry policy and on-error steps; a return in it ends it (not the
// caller) and its output expression gives the result.
func (e *engine) called(f frame, step workflow.Step, st projections.Step, prefix string, env *lazyEnv,
	finish func(json.RawMessage) result, failWith func(result) result) result {
	var called struct {
		Definition workflow.Definition `json:"definition"`
		Input      json.RawMessage     `json:"input"`
	}
	if err := json.Unmarshal(st.Input, &called); err != nil {
		return failWith(result{err: "the called workflow's recorded definition is unreadable: " + err.Error()})
	}
	def := called.Definition
	cf := f.child(prefix+"/", def.Steps, map[string]any{"input": orObject(decode(called.Input))})
	cf.retry, cf.call = def.Retry, true
	var r result
	if a, timedOut := e.callTimeout(def, step, st); timedOut {
		// As for a workflow run on its own: its steps go no further and
		// its on-error steps run.
		r = result{state: failed, err: "the workflow timed out after " + def.Timeout}
	} else if a != nil {
		return result{state: running, act: *a}
	} else {
		r = e.run(cf)
	}
	if r.state == failed && len(def.OnError) > 0 {
		hf := cf.child(prefix+"/on-error/", def.OnError, map[string]any{"error": map[string]any{"message": r.err}})
		hf.handler = true
		h := e.run(hf)
		switch {
		case h.state == running:
			return h
		case h.returned:
			return e.mapOutput(step, st, h.output, env, finish)
		case h.state == failed:
			r.err += "; then on-error: " + h.err
		}
	}
	switch {
	case r.state == running:
		return r
	case r.state == failed:
		return failWith(result{err: fmt.Sprintf("workflow %s: %s", def.Name, r.err)})
	}
	out := r.output
	if !r.returned && def.Output != nil {
		var err error
		if out, err = render(def.Output, e.env(cf)); err != nil {
			return failWith(result{err: fmt.Sprintf("workflow %s output: %s", def.Name, err)})
		}
	}
	return e.mapOutput(step, st, out, env, finish)
}

// callTimeout applies a called workflow's own timeout to the step st
// that calls it: timedOut once its timer fired, else the arming of the
// timer if it is due to exist and is not recorded (nil if none). It
// counts from the call's start, from the last resume or replay (which
// gives the call its time again, as a workflow's timeout), or from the
// acquisition of the call's lock, whichever came last; a call run again
// (a retry) gets its time again. The timer's step is the call's
// instance (instancePrefix) and its attempt the resume count.
func (e *engine) callTimeout(def workflow.Definition, step workflow.Step, st projections.Step) (arm *action, timedOut bool) {
	dur, err := optionalDuration(def.Timeout)
	if err != nil || e.s.DryRun {
		return nil, false
	}
	key := instancePrefix(st.ID, st.Attempt)
	if timerFired(e.s, events.TimerCallTimeout, key, e.s.Resumes) {
		return nil, true
	}
	if timerArmed(e.s, events.TimerCallTimeout, key, e.s.Resumes) {
		return nil, false
	}
	from := st.ScheduledAt
	if e.s.Resumes > 0 && e.s.ResumedAt.After(from) {
		from = e.s.ResumedAt
	}
	if l, ok := e.s.LockAt(st.ID); ok && l.Status == projections.LockHeld && l.AcquiredAt.After(from) {
		from = l.AcquiredAt
	}
	return &action{kind: actArmTimer, step: step, path: key, attempt: e.s.Resumes, purpose: events.TimerCallTimeout,
		until: from.Add(dur)}, false
}

// callTimedOut reports whether the call whose instance (instancePrefix)
// is key has timed out in the execution's current run.
func callTimedOut(s projections.Execution, key string) bool {
	return timerFired(s, events.TimerCallTimeout, key, s.Resumes)
}

// mapOutput applies a container's output expression (root result) to what
// its children produced.
func (e *engine) mapOutput(step workflow.Step, st projections.Step, out json.RawMessage, env *lazyEnv, finish func(json.RawMessage) result) result {
	if step.Output == nil {
		return finish(out)
	}
	mapped, err := render(step.Output, with(env.get(), "result", decode(out)))
	if err != nil {
		return result{state: running, act: action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, err: "output: " + err.Error()}}
	}
	return finish(mapped)
}

func limitOf(r *workflow.Retry) int {
	if r == nil {
		return 0
	}
	return r.Limit
}

// retryOf is the retry policy of an operation step in frame f.
func retryOf(step workflow.Step, f frame) *workflow.Retry {
	if !workflow.IsOperation(step.Kind) {
		return nil
	}
	if step.Retry != nil {
		return step.Retry
	}
	return f.retry
}

// lastSegment is a path's last part: the step's own id (with its round).
func lastSegment(p string) string {
	return p[strings.LastIndexByte(p, '/')+1:]
}

// localID is a step's id within its frame: its path's last part without
// the ~round of a step run again after a goto.
func localID(p string) string {
	if i := strings.IndexAny(p, "~@["); i > 0 {
		return p[:i]
	}
	return p
}

func stepView(st projections.Step) map[string]any {
	return map[string]any{"output": decode(st.Output), "status": string(st.RecordedStatus()), "error": st.Error, "attempt": float64(st.Attempt)}
}

func orEmpty(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage(`{}`)
	}
	return b
}

func orObject(v any) any {
	if v == nil {
		return map[string]any{}
	}
	return v
}

func describeJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil || v == nil {
		return "null"
	}
	return string(b)
}

// waiting decides a sleep or wait step that waits: a sleep ends when its
// timer has fired; a wait takes a fitting signal, or fails when its
// timeout has fired. Deciding from recorded timers (rather than when the
// timer command arrives) keeps this right after any crash.
func waiting(step workflow.Step, st projections.Step, s projections.Execution, env *lazyEnv) action {
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

// internal decides a pending step that the dispatcher runs itself.
func internal(step workflow.Step, st projections.Step, s projections.Execution, lz *lazyEnv) action {
	env := lz.get()
	fail := func(err error) action {
		return action{kind: actStepFail, step: step, attempt: st.Attempt, err: err.Error(), final: true}
	}
	switch step.Kind {
	case workflow.KindLet:
		vars := make(map[string]json.RawMessage, len(step.Vars))
		for _, k := range slices.Sorted(maps.Keys(step.Vars)) { // the first error is the same every time
			v := step.Vars[k]
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
			if !st.SleptFrom.IsZero() { // run again resuming: it counts from its first wait
				return action{kind: actSleep, step: step, attempt: st.Attempt, until: st.SleptFrom.Add(dur)}
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
		if sig := takeable(step, s, lz); sig != nil {
			return action{kind: actTakeSignal, step: step, attempt: st.Attempt, signal: sig}
		}
		return action{kind: actWaitSignal, step: step, attempt: st.Attempt}
	case workflow.KindRetry: // within on-error: retry the failed step while attempts remain
		errRoot, _ := env["error"].(map[string]any)
		attempt, _ := errRoot["attempt"].(float64)
		if step.Retry == nil || int(attempt) >= step.Retry.Limit {
			return fail(fmt.Errorf("no retries left: the step failed %d times (limit %d)", int(attempt), limitOf(step.Retry)))
		}
		out, _ := json.Marshal(map[string]any{"retry": true, "next_attempt": int(attempt) + 1})
		return action{kind: actComplete, step: step, attempt: st.Attempt, output: out}
	case workflow.KindContinue:
		input := s.Input // the same input, unless it says otherwise
		if step.Input != nil {
			var err error
			if input, err = render(step.Input, env); err != nil {
				return fail(fmt.Errorf("input: %w", err))
			}
		}
		return action{kind: actContinue, step: step, attempt: st.Attempt, input: input}
	case workflow.KindClearLock: // its clear was recorded with its schedule
		return action{kind: actClearLock, step: step, attempt: st.Attempt, input: st.Input}
	case workflow.KindReplayable: // a replay point: nothing to do
		return action{kind: actComplete, step: step, attempt: st.Attempt}
	case workflow.KindGoto: // recorded as done; the frame then starts a new round at the target
		out, _ := json.Marshal(map[string]string{"target": step.Target})
		return action{kind: actComplete, step: step, attempt: st.Attempt, output: out}
	}
	return fail(fmt.Errorf("the dispatcher cannot run a %s step", step.Kind))
}

// takeable returns the first kept signal a wait step accepts: one of its
// names, and its match condition (if any) true. A signal that arrived
// before the step was reached is kept for it.
func takeable(step workflow.Step, s projections.Execution, env *lazyEnv) *projections.Signal {
	names := step.WaitSignals()
	for i := range s.Signals {
		sig := s.Signals[i]
		if sig.TakenBy != "" || !contains(names, sig.Name) {
			continue
		}
		if step.Match != "" {
			ok, err := expression.Condition(step.Match, with(env.get(), "signal", map[string]any{"name": sig.Name, "data": decode(sig.Data)}))
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
// Secret references (${secret.NAME}) are not evaluated: the fields keep
// them as text, and SecretRefs gives the agent, by JSON pointer, the
// template of each field that holds one, to resolve from its own secrets.
func renderStep(step workflow.Step, lz *lazyEnv) (json.RawMessage, error) {
	var firstErr error
	refs := map[string]string{}
	str := func(field, v string) string {
		if firstErr != nil || !expression.IsTemplate(v) {
			return v
		}
		out, err := expression.RenderString(v, lz.get())
		if err != nil {
			firstErr = fmt.Errorf("%s: %w", field, err)
		}
		return out
	}
	// agentStr renders a text field where secrets may be referenced; ptr
	// is its JSON pointer in the spec.
	agentStr := func(field, ptr, v string) string {
		if firstErr != nil || !expression.IsTemplate(v) {
			return v
		}
		out, tmpl, err := expression.RenderSecretString(v, lz.get())
		if err != nil {
			firstErr = fmt.Errorf("%s: %w", field, err)
		}
		if tmpl != "" {
			refs[ptr] = tmpl
		}
		return out
	}
	out := workflow.Step{ID: step.ID, Kind: step.Kind, Queue: step.Queue, Operation: step.Operation, Level: step.Level, Heartbeat: step.Heartbeat,
		Message: str("message", step.Message), Command: str("command", step.Command), Dir: agentStr("dir", "/dir", step.Dir),
		Method: str("method", step.Method), URL: agentStr("url", "/url", step.URL)}
	for i, a := range step.Args {
		out.Args = append(out.Args, agentStr(fmt.Sprintf("args[%d]", i), fmt.Sprintf("/args/%d", i), a))
	}
	if step.Env != nil {
		out.Env = make(map[string]string, len(step.Env))
		for _, k := range slices.Sorted(maps.Keys(step.Env)) { // firstErr is the same every time
			out.Env[k] = agentStr("env."+k, "/env/"+expression.PointerToken(k), step.Env[k])
		}
	}
	if step.Headers != nil {
		out.Headers = make(map[string]string, len(step.Headers))
		for _, k := range slices.Sorted(maps.Keys(step.Headers)) {
			out.Headers[k] = agentStr("headers."+k, "/headers/"+expression.PointerToken(k), step.Headers[k])
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	out.Body, out.Input = step.Body, step.Input
	for _, f := range []struct {
		name string
		v    any
		dst  *any
	}{{"body", step.Body, &out.Body}, {"input", step.Input, &out.Input}} {
		if !expression.HasTemplate(f.v) {
			continue
		}
		v, tmpls, err := expression.RenderSecrets(f.v, lz.get())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.dst = v
		for ptr, t := range tmpls {
			refs["/"+f.name+ptr] = t
		}
	}
	if len(refs) > 0 {
		out.SecretRefs = refs
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

func timerArmed(s projections.Execution, purpose, stepID string, attempt int) bool {
	if len(s.Timers) == 0 {
		return false
	}
	_, ok := s.Timers[timerID(s.ID, purpose, stepID, attempt)]
	return ok
}

// sentAt is when an attempt's task was handed to the agents: its
// step.sent (a history written before it was recorded tells less: the
// start, or else the scheduling).
func sentAt(st projections.Step) time.Time {
	if !st.SentAt.IsZero() {
		return st.SentAt
	}
	if !st.StartedAt.IsZero() {
		return st.StartedAt
	}
	return st.ScheduledAt
}

func timerFired(s projections.Execution, purpose, stepID string, attempt int) bool {
	if len(s.Timers) == 0 { // most executions: no id to hash (every decision asks)
		return false
	}
	t, ok := s.Timers[timerID(s.ID, purpose, stepID, attempt)]
	return ok && t.Fired
}
