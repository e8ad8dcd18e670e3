package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

// start applies a start command: it checks it as the api does
// (startcheck.Check), claims the execution id forever (a KV create, so two
// commands can never both own it), appends ExecutionStarted with the
// pinned definition, and schedules the first step. A re-delivered or
// re-published command finds its own claim and only makes sure the
// execution progresses.
func (d *Dispatcher) start(ctx context.Context, ev events.Event, cmd *events.StartExecution) error {
	key, id := startcheck.Identify(ev)
	// Resolve the definition and build the first event before claiming the
	// id, so that a command that cannot start leaves the id free.
	var def *startcheck.Definition
	rec, err := d.defs.Get(ctx, cmd.Workflow, cmd.Version)
	switch {
	case err == nil:
		def = &startcheck.Definition{Name: rec.Name, Version: rec.Version, Spec: rec.Definition}
	case !errors.Is(err, catalog.ErrNotFound):
		return err
	}
	st, err := startcheck.Check(ev, def, startcheck.Options{MaxPayload: d.js.Conn().MaxPayload(), Now: d.cfg.Now()})
	if p := (*startcheck.Problem)(nil); errors.As(err, &p) {
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: p.Code, Field: p.Field, Reason: p.Message})
	}
	if err != nil {
		return permanentError{err}
	}
	started := st.Started
	started.Token, started.APIURL = newToken(), d.cfg.APIURL
	c, err := d.ids.Claim(ctx, id, claim.Record{CommandKey: key, Digest: st.Digest, Workflow: cmd.Workflow, ClaimedAt: d.cfg.Now()})
	if conflict := (*claim.ConflictError)(nil); errors.As(err, &conflict) {
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: events.CodeConflict, Field: "execution_id", Reason: conflict.Reason})
	}
	if err != nil {
		return err
	}
	if c.Expired() { // this command ran, and its execution has since expired: never run it again
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: events.CodeConflict, Field: "execution_id", Reason: fmt.Sprintf(
			"execution %q expired under its retention rule at %s and its history was deleted; execution ids are unique forever: start a new execution with a new id",
			id, c.ExpiredAt.UTC().Format(time.RFC3339))})
	}
	return d.withExecution(ctx, cmd.Workflow, id, func(x *execState) error {
		if x.state.Status == projections.StatusNone {
			x.def = rec.Definition
			if err := d.append(ctx, x, started); err != nil {
				return err
			}

			zerolog.Ctx(ctx).Info().Str("workflow", rec.Name).Int("version", rec.Version).Msg("execution started")
		}
		return d.advance(ctx, x)
	})
}

// reject publishes why a command changes nothing and terminates it.
func (d *Dispatcher) reject(ctx context.Context, cmd events.Event, execID, code, reason string) error {
	return d.publishRejection(ctx, cmd, execID, code, reason, "", 0)
}

// publishRejection publishes the rejection of cmd, which arrived on
// subject at stream sequence seq (if known), and returns the
// rejectedError that terminates the message.
func (d *Dispatcher) publishRejection(ctx context.Context, cmd events.Event, execID, code, reason, subject string, seq uint64) error {
	return d.publishRejected(ctx, cmd, &events.CommandRejected{ExecutionID: execID, Code: code, Reason: reason, Subject: subject, StreamSeq: seq})
}

// publishRejected publishes rej, the rejection of cmd (its command key
// and type filled in here), and returns the rejectedError that
// terminates the message.
func (d *Dispatcher) publishRejected(ctx context.Context, cmd events.Event, rej *events.CommandRejected) error {
	key := events.CommandKey(cmd.Source, cmd.ID)
	rej.CommandKey, rej.CommandType = key, cmd.Type
	msg, err := events.Encode(events.RejectionSubject(key), events.New(d.cfg.Source, rej.ExecutionID, "", d.cfg.Now(), rej))
	if err != nil {
		return err
	}
	if _, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID("rej-"+events.RejectionSubject(key))); err != nil {
		return fmt.Errorf("publish rejection: %w", err)
	}
	zerolog.Ctx(ctx).Warn().Str("code", rej.Code).Str("field", rej.Field).Str("reason", rej.Reason).Str("command", key).Msg("command rejected")
	return rejectedError{reason: rej.Reason}
}

// result applies an agent's report about a task.
func (d *Dispatcher) result(ctx context.Context, ref events.TaskRef, ev events.Event) error {
	return d.withExecution(ctx, ref.Workflow, ref.ExecutionID, func(x *execState) error {
		if x.state.Status == projections.StatusNone {
			return permanentError{fmt.Errorf("result for unknown execution %s", ref.ExecutionID)}
		}
		if x.state.StepIndex(ref.StepID) < 0 {
			// A nested step is created by its first event: a cached state
			// that is behind the history does not know it yet.
			if err := d.checkFresh(ctx, x); err != nil {
				return err
			}
			return permanentError{fmt.Errorf("result for unknown step %q", ref.StepID)}
		}
		if err := d.applyResult(ctx, x, ref, ev); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}

// taskToken is the execution token an attempt's task carries: the one
// current when it was sent (a plain resume waits for the results of tasks
// sent before it, with the old token).
func taskToken(s projections.Execution, st projections.Step) string {
	if st.Token != "" {
		return st.Token
	}
	return s.Token
}

// applyResult records an agent's report about a task, if it is about the
// step's current attempt and new; a stale or repeated report changes nothing.
func (d *Dispatcher) applyResult(ctx context.Context, x *execState, ref events.TaskRef, ev events.Event) error {
	log := zerolog.Ctx(ctx).With().Str("step_id", ref.StepID).Int("attempt", ref.Attempt).Logger()
	i := x.state.StepIndex(ref.StepID)
	if i < 0 {
		return nil
	}
	st := x.state.Steps[i]
	if x.state.Status.Terminal() {
		log.Info().Str("status", string(x.state.Status)).Msg("ignore result for an ended execution")
		return nil
	}
	var stale string
	switch {
	case ref.Attempt != st.Attempt:
		stale = fmt.Sprintf("attempt %d is not the step's current attempt %d", ref.Attempt, st.Attempt)
	case ref.Token != taskToken(x.state, st):
		stale = "stale execution token: the task was not sent with it"
	case st.Queue != "" && ref.Queue != st.Queue:
		// Agents may report for their own queues only: a report from
		// another queue's agent never counts, whatever token it carries.
		stale = fmt.Sprintf("the report came from queue %q; the step's task went to queue %q", ref.Queue, st.Queue)
	}
	if stale != "" {
		// Stale as the history stands, not as a cached state that is
		// behind it says (that one is reloaded and decides again).
		if err := d.ensureCurrent(ctx, x); err != nil {
			return err
		}
		log.Info().Str("step_status", string(st.Status)).Str("reason", stale).Msg("ignore result of a stale attempt")
		if slices.Contains(x.state.Ignored, ev.ID) {
			return nil // recorded already (this report delivered again)
		}
		return d.append(ctx, x, &events.ResultIgnored{ResultID: ev.ID, ResultType: ev.Type, TaskID: ref.TaskID,
			StepID: ref.StepID, Attempt: ref.Attempt, Agent: ref.Agent, Reason: stale})
	}
	var p events.Payload
	switch r := ev.Data.(type) {
	case *events.OperationStarted:
		// Record the first start, and every later delivery that runs
		// the operation again (its agent died or timed out).
		if st.Status == projections.OpSending || st.Status == projections.OpSent ||
			(st.Status == projections.OpStarted && r.Delivery > st.Delivery) {
			p = &events.StepStarted{StepID: st.ID, Attempt: st.Attempt, Agent: r.Agent, Delivery: r.Delivery}
		}
	case *events.OperationSucceeded:
		if st.Status.InFlight() {
			p = d.succeeded(x, st, r)
		}
	case *events.OperationFailed:
		if st.Status.InFlight() {
			p = &events.StepFailed{StepID: st.ID, Attempt: st.Attempt, Error: r.Error, Output: r.Output, Agent: r.Agent, Lost: r.Lost, Final: r.Final}
		}
	}
	if p == nil {
		log.Debug().Str("step_status", string(st.Status)).Msg("ignore duplicate result")
		return nil
	}
	return d.append(ctx, x, p)
}

// succeeded records an operation's result, mapped through the step's
// output expression (whose root "result" is the operation's output).
func (d *Dispatcher) succeeded(x *execState, st projections.Step, r *events.OperationSucceeded) events.Payload {
	f, step, _ := resolveFrame(x.def, x.state, st.ID)
	out := r.Output
	if step.Output != nil {
		mapped, err := render(step.Output, with(newEngine(x.def, x.state).env(f), "result", decode(r.Output)))
		if err != nil {
			return &events.StepFailed{StepID: st.ID, Attempt: st.Attempt, Error: "output: " + err.Error(), Output: r.Output, Agent: r.Agent}
		}
		out = mapped
	}
	return &events.StepSucceeded{StepID: st.ID, Attempt: st.Attempt, Output: out, Agent: r.Agent, Duration: r.Duration}
}

// advance appends events, publishes tasks and arms timers until the
// execution has to wait for something outside.
func (d *Dispatcher) advance(ctx context.Context, x *execState) error {
	// Each action appends at least one event; the bound grows with the
	// instances (loops and foreach items add them) and only stops a bug.
	if err := d.syncLocks(ctx, x); err != nil {
		return err
	}
	for i := 0; i < 16*len(x.state.Steps)+64; i++ {
		v := x.view
		if len(x.state.Steps) <= smallExecution {
			v = nil // a small execution is cheaper to walk than to keep a view of
		}
		a := decideLockedIn(x.def, x.state, v)
		if verifyView {
			if b := decideLocked(x.def, x.state); !reflect.DeepEqual(a, b) {
				panic(fmt.Sprintf("execution %s: with its view the decision is %+v, without it %+v", x.id, a, b))
			}
		}
		if a.kind == actWait {
			return nil
		}
		if err := d.act(ctx, x, a); err != nil {
			return err
		}
	}
	return permanentError{fmt.Errorf("execution %s did not settle", x.id)}
}

// act carries out one decision.
func (d *Dispatcher) act(ctx context.Context, x *execState, a action) error {
	if a.kind == actLock || a.kind == actUnlock {
		return d.actOnLock(ctx, x, a)
	}
	log := zerolog.Ctx(ctx)
	id := a.path
	if id == "" {
		id = a.step.ID
	}
	a.path = id
	nestedKind := "" // nested steps and later rounds are created by their first event
	if strings.ContainsAny(id, "/~") {
		nestedKind = a.step.Kind
	}
	if reason := dryRunSkip(x.state, a); reason != "" { // nothing runs, sleeps or waits
		return d.append(ctx, x, &events.StepSkipped{StepID: id, DryRun: true, Reason: reason})
	}
	switch a.kind {
	case actSkip:
		return d.append(ctx, x, &events.StepSkipped{StepID: id, Kind: nestedKind, Reason: "condition is false"})
	case actSchedule:
		if a.step.Kind == workflow.KindWorkflow && a.step.Workflow != "" {
			return d.scheduleCalled(ctx, x, a, nestedKind)
		}
		return d.append(ctx, x, &events.StepScheduled{StepID: id, Kind: nestedKind, Attempt: a.attempt, Input: a.input})
	case actSend:
		taskID := events.TaskID(x.id, id, a.attempt)
		if err := d.append(ctx, x, &events.StepSending{StepID: id, Attempt: a.attempt, TaskID: taskID, Queue: a.step.QueueName()}); err != nil {
			return err
		}
		return d.send(ctx, x, a)
	case actResend:
		return d.send(ctx, x, a)
	case actStepFail: // one event, also for a step that could not be scheduled
		return d.append(ctx, x, &events.StepFailed{StepID: id, Kind: nestedKind, Attempt: a.attempt, Error: a.err, Final: a.final})
	case actLet: // the variables and the step's success are one event
		return d.append(ctx, x, &events.StepSucceeded{StepID: id, Attempt: a.attempt, Vars: a.vars})
	case actArmTimer:
		_, err := d.armTimer(ctx, x, a.purpose, a.path, a.attempt, a.until)
		return err
	case actReturn:
		// The step succeeds; decide then ends what the return ends (the
		// execution, or a called workflow).
		return d.append(ctx, x, &events.StepSucceeded{StepID: id, Attempt: a.attempt, Output: a.output})
	case actSleep:
		until := a.until
		if until.IsZero() {
			until = d.cfg.Now().Add(a.delay)
		}
		until, err := d.armTimer(ctx, x, events.TimerSleep, id, a.attempt, until)
		if err != nil {
			return err
		}
		return d.append(ctx, x, &events.StepWaiting{StepID: id, Attempt: a.attempt, Until: until.UTC()})
	case actWaitSignal:
		var until time.Time
		if a.step.Timeout != "" {
			dur, err := time.ParseDuration(a.step.Timeout)
			if err != nil {
				return d.act(ctx, x, action{kind: actStepFail, step: a.step, attempt: a.attempt, err: "timeout: " + err.Error()})
			}
			if until, err = d.armTimer(ctx, x, events.TimerWaitTimeout, id, a.attempt, d.cfg.Now().Add(dur)); err != nil {
				return err
			}
		}
		return d.append(ctx, x, &events.StepWaiting{StepID: id, Attempt: a.attempt, Until: until.UTC(), Signals: a.step.WaitSignals()})
	case actComplete:
		return d.append(ctx, x, &events.StepSucceeded{StepID: id, Attempt: a.attempt, Output: a.output})
	case actTakeSignal:
		out := signalOutput(a.signal)
		if a.step.Output != nil {
			f, _, _ := resolveFrame(x.def, x.state, id)
			mapped, err := render(a.step.Output, with(newEngine(x.def, x.state).env(f), "result", decode(out)))
			if err != nil {
				return d.act(ctx, x, action{kind: actStepFail, step: a.step, path: id, attempt: a.attempt, err: "output: " + err.Error(), final: true})
			}
			out = mapped
		}
		return d.append(ctx, x, &events.StepSucceeded{StepID: id, Attempt: a.attempt, SignalID: a.signal.ID, Output: out})
	case actReschedule:
		jitter := 1.0
		if a.jitter > 0 {
			jitter = 1 - a.jitter + 2*a.jitter*mrand.Float64() // recorded in the event, so replay is exact
		}
		due, err := d.armTimer(ctx, x, events.TimerRetry, id, a.attempt, d.cfg.Now().Add(time.Duration(float64(a.delay)*jitter)))
		if err != nil {
			return err
		}
		log.Info().Str("step_id", id).Int("attempt", a.attempt).Time("due", due).Msg("retry scheduled")
		return d.append(ctx, x, &events.StepRescheduled{StepID: id, Attempt: a.attempt, NextAttempt: a.attempt + 1,
			Due: due.UTC(), TimerID: timerID(x.id, events.TimerRetry, id, a.attempt)})
	case actSucceed:
		return d.finish(ctx, x, &events.ExecutionSucceeded{Output: a.output})
	case actFail:
		if x.state.WaitAfterFail { // an operator fixes the cause and resumes it
			return d.finish(ctx, x, &events.ExecutionSuspended{Error: a.err, StepID: id})
		}
		return d.finish(ctx, x, &events.ExecutionFailed{Error: a.err, StepID: id})
	case actCancelled:
		return d.finish(ctx, x, cancelled(x.state))
	case actReplay:
		rec := events.ActionRecord{Action: events.ActionReplay, RequestedBy: "retry step " + a.replay.cause}
		if a.replay.automatic {
			rec.RequestedBy, rec.Reason = "jetflow (replayable: automatically)", "step "+id+" was interrupted: "+stepError(x.state, id)
		}
		if err := d.replay(ctx, x, rec, *a.replay); err != nil {
			return err
		}
		return d.reopened(ctx, x)
	}
	return permanentError{fmt.Errorf("unknown action %d", a.kind)}
}

// dryRunSkip says why a dry run skips what a would do ("" if it does it):
// an operation that would be sent (its input is recorded with its
// schedule), a sleep, a wait for a signal.
func dryRunSkip(s projections.Execution, a action) string {
	if !s.DryRun {
		return ""
	}
	switch a.kind {
	case actSend:
		return fmt.Sprintf("dry run: would run %s with the input recorded", a.step.OperationKind())
	case actSleep:
		return "dry run: would sleep"
	case actWaitSignal:
		return "dry run: would wait for a signal"
	}
	return ""
}

// scheduleCalled schedules a workflow step that calls another workflow by
// name: it pins the called workflow's definition (and checks the input
// against its schema) by recording them with the schedule.
func (d *Dispatcher) scheduleCalled(ctx context.Context, x *execState, a action, kind string) error {
	fail := func(msg string) error { // recorded before it was scheduled: a resume starts it over
		return d.act(ctx, x, action{kind: actStepFail, step: a.step, path: a.path, attempt: a.attempt, err: msg, final: true})
	}
	if strings.Count(a.path, "/") > 4*workflow.MaxDepth {
		return fail("workflows call each other too deep (a workflow calling itself?)")
	}
	rec, err := d.defs.Get(ctx, a.step.Workflow, a.step.Version)
	if errors.Is(err, catalog.ErrNotFound) {
		return fail(fmt.Sprintf("workflow %q version %d is not registered", a.step.Workflow, a.step.Version))
	}
	if err != nil {
		return err
	}
	var rendered struct {
		Input json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(a.input, &rendered)
	if problems := rec.Definition.CheckInput(rendered.Input); len(problems) > 0 {
		return fail(fmt.Sprintf("input of workflow %s: %s %s", rec.Name, problems[0].Field, problems[0].Message))
	}
	input, err := json.Marshal(map[string]any{"workflow": rec.Name, "version": rec.Version,
		"definition": rec.Definition, "input": orEmpty(rendered.Input)})
	if err != nil {
		return permanentError{err}
	}
	return d.append(ctx, x, &events.StepScheduled{StepID: a.path, Kind: kind, Attempt: a.attempt, Input: input})
}

// finish ends the execution.
func (d *Dispatcher) finish(ctx context.Context, x *execState, p events.Payload) error {
	if err := d.append(ctx, x, p); err != nil {
		return err
	}
	switch e := p.(type) {
	case *events.ExecutionSucceeded:
		zerolog.Ctx(ctx).Info().Msg("execution succeeded")
	case *events.ExecutionFailed:
		zerolog.Ctx(ctx).Info().Str("error", e.Error).Msg("execution failed")
	case *events.ExecutionCancelled:
		zerolog.Ctx(ctx).Info().Msg("execution cancelled")
	case *events.ExecutionSuspended:
		zerolog.Ctx(ctx).Info().Str("error", e.Error).Msg("execution suspended: it waits to be resumed")
	}
	return nil
}

func signalOutput(s *projections.Signal) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"name": s.Name, "data": decode(s.Data), "signal_id": s.ID})
	return b
}

// send publishes the step's task (deduplicated by task id), records it
// sent, and arms the attempt's timeout if the step has one.
func (d *Dispatcher) send(ctx context.Context, x *execState, a action) error {
	taskID := events.TaskID(x.id, a.path, a.attempt)
	spec := a.input
	if len(spec) == 0 { // scheduled before inputs were recorded
		var err error
		if spec, err = json.Marshal(a.step); err != nil {
			return permanentError{fmt.Errorf("encode step %s: %w", a.step.ID, err)}
		}
	}
	token := x.state.Token
	if i := x.state.StepIndex(a.path); i >= 0 { // recorded with step.sending
		token = taskToken(x.state, x.state.Steps[i])
	}
	task := events.New(d.cfg.Source, x.id, x.workflow, d.cfg.Now(), &events.Task{
		TaskID: taskID, ExecutionID: x.id, Workflow: x.workflow, StepID: a.path, Attempt: a.attempt,
		Token: token, Kind: a.step.OperationKind(), Queue: a.step.QueueName(), Spec: spec,
	})
	task.ID = taskID
	msg, err := events.Encode(events.TaskSubject(a.step.QueueName()), task)
	if err != nil {
		return permanentError{err}
	}
	ack, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID(taskID))
	if err != nil {
		return fmt.Errorf("publish task %s: %w", taskID, err)
	}
	// The attempt's timeout, if any, is armed by the next decision: decide
	// arms every timeout that is due to exist and is not recorded, so a
	// crash between two appends cannot lose one.
	return d.append(ctx, x, &events.StepSent{StepID: a.path, Attempt: a.attempt, TaskID: taskID, TaskSeq: ack.Sequence})
}
