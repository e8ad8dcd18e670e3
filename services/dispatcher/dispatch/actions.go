package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// commandTarget checks the execution a command names and returns its
// workflow. A command for an execution that does not exist, or expired and
// was deleted, is rejected.
func (d *Dispatcher) commandTarget(ctx context.Context, ev events.Event, execID string) (string, error) {
	if r := vetExecutionID(execID); r != nil {
		return "", d.reject(ctx, ev, execID, r.Code, r.Reason)
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

// action carries out an operator's action on an execution. Every action
// is recorded in the history with who asked and why; a command handled
// twice (redelivered after a crash) is recorded once.
func (d *Dispatcher) action(ctx context.Context, ev events.Event, p *events.ExecutionAction) error {
	if r := vetAction(p); r != nil {
		return d.reject(ctx, ev, p.ExecutionID, r.Code, r.Reason)
	}
	wf, err := d.commandTarget(ctx, ev, p.ExecutionID)
	if err != nil {
		return err
	}
	rec := actionRecord(ev, p)
	key := rec.Command
	if p.Action == events.ActionRepair {
		return d.repair(ctx, ev, wf, p, rec)
	}
	cmd := interp.ActionCommand{Key: key, Record: rec, From: p.From, Force: p.Force, Version: p.Version, Parent: p.Parent, SentAt: ev.Time}
	return d.withExecution(ctx, wf, p.ExecutionID, func(x *execState) error {
		before := x.state.LastSeq
		err := d.command(ctx, ev, x, func(in interp.Input) interp.Decision { return interp.Action(in, cmd) })
		if err == nil && x.state.LastSeq != before {
			zerolog.Ctx(ctx).Info().Str("action", p.Action).Str("requested_by", rec.RequestedBy).Str("reason", p.Reason).
				Str("status", string(x.state.Status)).Msg("action recorded")
		}
		return err
	})
}

// publishKill tells agents to terminate the execution's running operations.
// It is published after the execution is recorded cancelled, so a task
// that starts later is already refused by its result being ignored; agents
// also look for the notice before running a task. A lift (k.Lift) ends
// the kill of a resumed execution, so that agents run its new tasks: it
// replaces the kill notice (one per execution is kept), if there is one.
// The notice of an execution that ended with operations with the agents
// (k.Ended, io.jetflow.tasks.refuse) is kept in the same place; the one
// terminating a single attempt (k.TaskID, io.jetflow.task.terminate) in
// its own. Agents of an older version skip both (types they do not know).
func (d *Dispatcher) publishKill(ctx context.Context, x *execState, k interp.PublishKill) error {
	switch { // the local steps (local.go) run here
	case k.TaskID != "":
		d.local.kill(x.id, k.TaskID, fmt.Errorf("terminated, its step gave up on it (%s)", k.Reason))
	case !k.Lift:
		d.local.kill(x.id, "", errors.New("terminated, its execution was killed or ended"))
	}
	if k.Lift {
		// From the stream's leader: a replica may not have the latest
		// notice yet (the stream allows direct gets). None kept: lifted
		// all the same, since agents remember a notice longer than the
		// stream keeps it.
		m, err := bus.LeaderGet(ctx, d.js, bus.StreamKills, bus.MsgQuery{LastBySubject: bus.KillSubject(x.id)})
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			m = nil
		case err != nil:
			return fmt.Errorf("read kill notice of %s: %w", x.id, err)
		}
		if m != nil {
			if ev, err := bus.Decode(m.Header, m.Data); err == nil {
				if k, ok := ev.Data.(*events.KillOperations); ok && k.Lift {
					return nil
				}
			}
		}
	}
	var p events.Payload = &events.KillOperations{ExecutionID: x.id, Workflow: x.workflow, Command: k.Command, Lift: k.Lift}
	subject := bus.KillSubject(x.id)
	var opts []jetstream.PublishOpt
	switch {
	case k.TaskID != "": // its own subject: the execution's notice stays
		p = &events.TerminateTask{ExecutionID: x.id, Workflow: x.workflow, TaskID: k.TaskID, Reason: k.Reason}
		subject = bus.TaskKillSubject(x.id, k.TaskID)
		opts = append(opts, jetstream.WithMsgID("kill-"+events.TaskHash(k.TaskID)))
	case k.Ended:
		p = &events.RefuseTasks{ExecutionID: x.id, Workflow: x.workflow, Tokens: k.Tokens, Command: k.Command}
		opts = append(opts, jetstream.WithMsgID("refuse-"+events.TaskHash(x.id+"/"+x.state.Token)))
	case !k.Lift:
		opts = append(opts, jetstream.WithMsgID("kill-"+events.CommandMsgID(k.Command)))
	}
	msg, err := bus.Encode(subject, events.New(d.cfg.Source, x.id, x.workflow, d.cfg.Now(), p))
	if err != nil {
		return permanentError{err}
	}
	if k.TaskID != "" {
		// Best effort: a step's timeout must not wait for the kill
		// notices stream. Without the notice the attempt runs on to its
		// end, and its report is ignored, as before notices existed.
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := d.js.PublishMsg(pctx, msg, opts...); err != nil {
			zerolog.Ctx(ctx).Warn().Err(err).Str("task_id", k.TaskID).Msg("could not tell the agents to terminate an attempt its step gave up on; it runs on")
		}
		return nil
	}
	if _, err := d.js.PublishMsg(ctx, msg, opts...); err != nil {
		return fmt.Errorf("publish kill notice: %w", err)
	}
	return nil
}

// storedResults returns the final results in the results stream of the
// operations s has with the agents, for their current attempt and token,
// by step: results that arrived while the execution was over were not
// recorded.
func (d *Dispatcher) storedResults(ctx context.Context, x *execState) (map[string]events.Event, error) {
	if !slices.ContainsFunc(x.state.Steps, func(st projections.Step) bool { return st.Status.InFlight() }) {
		return map[string]events.Event{}, nil
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
			if st.Status.InFlight() && interp.Stale(x.state, st, ref) == "" {
				if _, seen := out[st.ID]; !seen {
					out[st.ID] = ev
				}
			}
		}
	}
	return out, nil
}

// reopened catches up with what happened while the execution was over:
// the kill is lifted, timers that came due fire now, and results that
// arrived (and were not recorded) are applied.
func (d *Dispatcher) reopened(ctx context.Context, x *execState) error {
	if _, err := d.perform(ctx, x, interp.PublishKill{Lift: true}); err != nil {
		return err
	}
	if err := d.checkChildren(ctx, x); err != nil { // ended while it was over (abandoned by its end)
		return err
	}
	return d.catchUp(ctx, x)
}

// catchUp fires the timers of x that came due and applies the results of
// its operations that arrived and were not recorded (while it was over,
// or damaged).
func (d *Dispatcher) catchUp(ctx context.Context, x *execState) error {
	if err := d.rearmDue(ctx, x, d.cfg.Now(), ""); err != nil {
		return err
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
