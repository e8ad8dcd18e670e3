package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// commandTarget checks the execution a command names and returns its
// workflow. A command for an execution that does not exist, or expired and
// was deleted, is rejected.
func (d *Dispatcher) commandTarget(ctx context.Context, ev events.Event, execID string) (string, error) {
	if !events.ValidExecutionID(execID) {
		return "", d.reject(ctx, ev, execID, events.CodeInvalid, fmt.Sprintf("execution_id %q is not valid: %s", execID, events.ExecutionIDRule))
	}
	c, err := d.ids.Get(ctx, execID)
	if errors.Is(err, claim.ErrNotFound) {
		return "", d.reject(ctx, ev, execID, events.CodeNotFound, fmt.Sprintf("execution %q does not exist", execID))
	}
	if err != nil {
		return "", err
	}
	if c.Expired() {
		return "", d.rejectExpired(ctx, ev, execID, c.ExpiredAt)
	}
	return c.Workflow, nil
}

// notStarted handles a command for an execution whose history is still
// empty: its start may be on its way (retry for a while), else reject.
func (d *Dispatcher) notStarted(ctx context.Context, ev events.Event, execID string) error {
	if d.cfg.Now().Sub(ev.Time) < 30*time.Second {
		return fmt.Errorf("execution %s is not started yet", execID)
	}
	return d.reject(ctx, ev, execID, events.CodeNotFound, fmt.Sprintf("execution %q never started", execID))
}

// action carries out an operator's action on an execution. Every action
// is recorded in the history with who asked and why; a command handled
// twice (redelivered after a crash) is recorded once.
func (d *Dispatcher) action(ctx context.Context, ev events.Event, p *events.ExecutionAction) error {
	if p.Action != events.ActionReplay && (p.From != "" || p.Force) {
		return d.reject(ctx, ev, p.ExecutionID, events.CodeInvalid,
			fmt.Sprintf("from and force apply to the replay action only, not to %s (use force-cancel or force-resume)", p.Action))
	}
	if (p.Action == events.ActionRepair) != (p.IgnoreSeq > 0) {
		if p.Action == events.ActionRepair {
			return d.reject(ctx, ev, p.ExecutionID, events.CodeInvalid,
				"repair needs ignore_seq: the stream sequence of the damaged event (jetflow show names it)")
		}
		return d.reject(ctx, ev, p.ExecutionID, events.CodeInvalid, fmt.Sprintf("ignore_seq applies to the repair action only, not to %s", p.Action))
	}
	if p.Action == events.ActionRepair && (p.Actor == nil || p.Actor.Method == events.ActorNATS) {
		return d.reject(ctx, ev, p.ExecutionID, events.CodeForbidden,
			"repair is an admin's action: ask the api for it with a token that has the admin scope (jetflow repair, or POST /v1/executions/{id}/actions)")
	}
	if !events.ValidAction(p.Action) {
		return d.reject(ctx, ev, p.ExecutionID, events.CodeInvalid,
			fmt.Sprintf("action %q is not known; use one of: %s", p.Action, strings.Join(events.Actions, ", ")))
	}
	if len(p.Reason) > events.MaxActionReason || len(p.RequestedBy) > events.MaxRequestedBy {
		return d.reject(ctx, ev, p.ExecutionID, events.CodeInvalid, fmt.Sprintf(
			"reason is %d bytes and requested_by %d; at most %d and %d are kept", len(p.Reason), len(p.RequestedBy), events.MaxActionReason, events.MaxRequestedBy))
	}
	wf, err := d.commandTarget(ctx, ev, p.ExecutionID)
	if err != nil {
		return err
	}
	key := events.CommandKey(ev.Source, ev.ID)
	rec := events.ActionRecord{Action: p.Action, Reason: p.Reason, RequestedBy: p.RequestedBy, Actor: p.Actor, Command: key}
	if rec.RequestedBy == "" {
		rec.RequestedBy = ev.Source
	}
	if p.Action == events.ActionRepair {
		return d.repair(ctx, ev, wf, p, rec)
	}
	return d.withExecution(ctx, wf, p.ExecutionID, func(x *execState) error {
		s := x.state
		if !s.ExpiredAt.IsZero() {
			if _, seen := s.CommandAction(key); seen {
				return nil // carried out before the execution ended and expired
			}
			return d.rejectExpired(ctx, ev, s.ID, s.ExpiredAt)
		}
		if action, seen := s.CommandAction(key); seen {
			if action != p.Action {
				return d.reject(ctx, ev, p.ExecutionID, events.CodeConflict,
					fmt.Sprintf("command %s was already recorded as a %s; give a new command a new CloudEvent id", key, action))
			}
			// This command again: what follows its record may not have
			// been done.
			switch p.Action {
			case events.ActionKill:
				return d.publishKill(ctx, x, key)
			case events.ActionResume, events.ActionForceResume, events.ActionReplay:
				return d.afterResume(ctx, x)
			}
			return d.advance(ctx, x)
		}
		if s.Status == projections.StatusNone {
			return d.notStarted(ctx, ev, p.ExecutionID)
		}
		if why := s.Status.ActionRefused(p.Action); why != "" {
			return d.reject(ctx, ev, p.ExecutionID, events.CodeConflict, fmt.Sprintf("execution %q %s", p.ExecutionID, why))
		}
		log := zerolog.Ctx(ctx).Info().Str("action", p.Action).Str("requested_by", rec.RequestedBy).Str("reason", p.Reason)
		if p.Action == events.ActionCancel && s.Status == projections.StatusSuspended &&
			!slices.ContainsFunc(s.Steps, func(st projections.Step) bool { return st.Status.InFlight() }) {
			log.Msg("suspended execution cancelled")
			return d.append(ctx, x, &events.ExecutionCancelled{ActionRecord: rec}) // nothing runs to wait for
		}
		switch p.Action {
		case events.ActionReplay:
			from := cmp.Or(p.From, events.ReplayResume)
			if x.def.ReplayPolicy().Disabled {
				return d.reject(ctx, ev, p.ExecutionID, events.CodeConflict,
					fmt.Sprintf("workflow %s says replayable: disabled; it cannot be replayed (resume it instead)", x.def.Name))
			}
			stored, err := d.storedResults(ctx, x)
			if err != nil {
				return err
			}
			settled := map[string]bool{}
			for id := range stored {
				settled[id] = true
			}
			plan, err := planReplay(x.def, s, replayAsk{from: from, force: p.Force, settled: settled})
			var refused *replayRefused
			if errors.As(err, &refused) {
				return d.reject(ctx, ev, p.ExecutionID, events.CodeConflict,
					fmt.Sprintf("execution %q cannot be replayed from %s: %s", p.ExecutionID, from, refused.msg))
			}
			if err != nil {
				return err
			}
			if err := d.replay(ctx, x, rec, replayRequest{plan: plan, from: from, force: p.Force}); err != nil {
				return err
			}
			return d.afterResume(ctx, x)
		case events.ActionForceCancel:
			log.Msg("execution force-cancelled")
			return d.append(ctx, x, &events.ExecutionCancelled{ActionRecord: rec})
		case events.ActionKill:
			log.Msg("execution killed")
			if err := d.append(ctx, x, &events.ExecutionCancelled{ActionRecord: rec}); err != nil {
				return err
			}
			return d.publishKill(ctx, x, key)
		case events.ActionResume, events.ActionForceResume:
			stored, err := d.storedResults(ctx, x)
			if err != nil {
				return err
			}
			reset := resetFor(x.def, s, p.Action == events.ActionForceResume, failedMeanwhile(s, stored))
			log.Strs("reset", reset).Msg("execution resumed")
			if err := d.append(ctx, x, &events.ExecutionResumed{ActionRecord: rec, Token: newToken(), Reset: reset}); err != nil {
				return err
			}
			return d.afterResume(ctx, x)
		}
		log.Msg("execution cancelling")
		if err := d.append(ctx, x, &events.ExecutionCancelling{ActionRecord: rec}); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}

// cancelled is the event that ends a cancelling execution.
func cancelled(s projections.Execution) *events.ExecutionCancelled {
	rec := events.ActionRecord{Action: events.ActionCancel}
	if c := s.Cancellation; c != nil {
		rec.Reason, rec.RequestedBy, rec.Actor = c.Reason, c.RequestedBy, c.Actor
	}
	return &events.ExecutionCancelled{ActionRecord: rec}
}

// publishKill tells agents to terminate the execution's running operations.
// It is published after the execution is recorded cancelled, so a task
// that starts later is already refused by its result being ignored; agents
// also look for the notice before running a task.
func (d *Dispatcher) publishKill(ctx context.Context, x *execState, command string) error {
	ev := events.New(d.cfg.Source, x.id, x.workflow, d.cfg.Now(), &events.KillOperations{ExecutionID: x.id, Workflow: x.workflow, Command: command})
	msg, err := bus.Encode(bus.KillSubject(x.id), ev)
	if err != nil {
		return permanentError{err}
	}
	if _, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID("kill-"+events.CommandMsgID(command))); err != nil {
		return fmt.Errorf("publish kill notice: %w", err)
	}
	return nil
}

// resetFor lists the step instances a resume runs again: failures that
// their on-error steps did not recover (and are not handling), attempts
// waiting for a retry, operations whose failure arrived while the
// execution was over (failed), and with force the operations that were
// with the agents (or being sent). The on-error instances of an attempt
// that runs again are left as they are: a new attempt's failure gets
// new ones.
func resetFor(d workflow.Definition, s projections.Execution, force bool, failedBefore map[string]bool) []string {
	var out []string
	reset := map[string]bool{}
	e := lookingEngine(d, s)
	for _, st := range s.Steps {
		if staleHandler(s, st.ID, reset) || !current(s, st.ID) {
			continue
		}
		switch {
		case st.Status == projections.OpRescheduled, force && st.Status.InFlight(), failedBefore[st.ID] && st.Status.InFlight():
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
		if !ok || st.Attempt != n || (reset[owner] && !workflow.IsContainer(st.Kind)) {
			return true
		}
	}
	return false
}

// storedResults returns the final results in the results stream of the
// operations s has with the agents, for their current attempt and token,
// by step: results that arrived while the execution was over were not
// recorded.
func (d *Dispatcher) storedResults(ctx context.Context, x *execState) (map[string]events.Event, error) {
	if !slices.ContainsFunc(x.state.Steps, func(st projections.Step) bool { return st.Status.InFlight() }) {
		return nil, nil
	}
	var evs []events.Event
	// Reports stored before partitions too (in flight across the upgrade).
	for _, filter := range []string{bus.ExecutionResultsBefore(x.id), bus.ExecutionResults(x.id)} {
		some, err := history.ReadStream(ctx, d.js, bus.StreamResults, filter, 0, 0)
		if err != nil {
			return nil, fmt.Errorf("read stored results: %w", err)
		}
		evs = append(evs, some...)
	}
	out := map[string]events.Event{}
	for _, ev := range evs {
		ref, ok := events.ResultRef(ev.Data)
		if !ok || ev.Type == events.TypeOperationStarted {
			continue
		}
		if i := x.state.StepIndex(ref.StepID); i >= 0 {
			st := x.state.Steps[i]
			if st.Status.InFlight() && ref.Attempt == st.Attempt && ref.Token == taskToken(x.state, st) {
				if _, seen := out[st.ID]; !seen {
					out[st.ID] = ev
				}
			}
		}
	}
	return out, nil
}

// failedMeanwhile lists the operations whose stored result is a failure.
func failedMeanwhile(s projections.Execution, stored map[string]events.Event) map[string]bool {
	out := map[string]bool{}
	for id, ev := range stored {
		if ev.Type == events.TypeOperationFailed {
			out[id] = true
		}
	}
	return out
}

// afterResume finishes a resume (again, if its command is redelivered):
// timers that came due while the execution was over fire now, and results
// of its running operations that arrived meanwhile (and were not recorded)
// are applied, before the execution advances.
func (d *Dispatcher) afterResume(ctx context.Context, x *execState) error {
	if !x.state.Status.Active() {
		return nil // ended again since
	}
	if err := d.reopened(ctx, x); err != nil {
		return err
	}
	return d.advance(ctx, x)
}

// reopened catches up with what happened while the execution was over:
// the kill is lifted, timers that came due fire now, and results that
// arrived (and were not recorded) are applied.
func (d *Dispatcher) reopened(ctx context.Context, x *execState) error {
	if err := d.liftKill(ctx, x); err != nil {
		return err
	}
	return d.catchUp(ctx, x)
}

// catchUp fires the timers of x that came due and applies the results of
// its operations that arrived and were not recorded (while it was over,
// or damaged).
func (d *Dispatcher) catchUp(ctx context.Context, x *execState) error {
	for id, t := range x.state.Timers {
		if !t.Fired && !t.Due.After(d.cfg.Now()) {
			if err := d.publishSchedule(ctx, x.id, x.workflow, id, t.Due); err != nil {
				return err
			}
		}
	}
	stored, err := d.storedResults(ctx, x)
	if err != nil {
		return err
	}
	for _, ev := range stored {
		ref, _ := events.ResultRef(ev.Data)
		if err := d.applyResult(ctx, x, ref, ev); err != nil {
			return err
		}
	}
	return nil
}

// stepError is the recorded error of a step instance.
func stepError(s projections.Execution, id string) string {
	st, _ := instanceOf(s, id)
	return st.Error
}

// liftKill ends the kill of a resumed execution, so that agents run its
// new tasks: the lift replaces the kill notice (one per execution is kept).
func (d *Dispatcher) liftKill(ctx context.Context, x *execState) error {
	stream, err := d.js.Stream(ctx, bus.StreamKills)
	if err != nil {
		return fmt.Errorf("read kill notices: %w", err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, bus.KillSubject(x.id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read kill notice of %s: %w", x.id, err)
	}
	if ev, err := bus.Decode(m.Header, m.Data); err == nil {
		if k, ok := ev.Data.(*events.KillOperations); ok && k.Lift {
			return nil
		}
	}
	lift := events.New(d.cfg.Source, x.id, x.workflow, d.cfg.Now(), &events.KillOperations{ExecutionID: x.id, Workflow: x.workflow, Lift: true})
	msg, err := bus.Encode(bus.KillSubject(x.id), lift)
	if err != nil {
		return permanentError{err}
	}
	if _, err := d.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish kill lift: %w", err)
	}
	return nil
}
