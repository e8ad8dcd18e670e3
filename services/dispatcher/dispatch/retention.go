package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

// withRetention adds to a step's first schedule the retention its
// retention: field sets, so that the change is part of the history. A hash
// key that cannot be rendered fails the step, as any other expression of
// the step would. Other events are returned as they are.
func (d *Dispatcher) withRetention(x *execState, p events.Payload) events.Payload {
	e, ok := p.(*events.StepScheduled)
	if !ok || e.Retention != nil {
		return p
	}
	if !x.mayRetain() {
		return p // no step has a retention: field (resolving the frame costs what the execution did)
	}
	if i := x.state.StepIndex(e.StepID); i >= 0 && x.state.Steps[i].Status != projections.OpNone {
		return p // a retry or a later attempt: the step was entered already
	}
	f, step, ok := resolveFrame(x.def, x.state, e.StepID)
	if !ok || step.Retention == "" {
		return p
	}
	prev := retention.Default
	if x.state.Retention != "" {
		if r, err := retention.ParseRule(x.state.Retention); err == nil {
			prev = r
		}
	}
	r, err := step.Retention.Resolve(prev, x.state.RetentionKey, func() map[string]any { return newEngine(x.def, x.state).env(f) })
	if err != nil {
		return &events.StepFailed{StepID: e.StepID, Kind: e.Kind, Attempt: e.Attempt, Error: err.Error(), Final: true}
	}
	next := *e
	next.Retention = r
	return &next
}

// mayRetain reports whether any step of the execution's definition may
// set a retention (it has a retention: field, or calls another workflow,
// whose recorded definition may). It is worked out once per state kept.
func (x *execState) mayRetain() bool {
	if len(x.def.Steps) == 0 {
		return true // no definition yet: do not remember
	}
	if x.retains == 0 {
		x.retains = -1
		if stepsMayRetain(x.def.Steps) || stepsMayRetain(x.def.OnError) {
			x.retains = 1
		}
	}
	return x.retains > 0
}

func stepsMayRetain(steps []workflow.Step) bool {
	for _, st := range steps {
		if st.Retention != "" || st.Workflow != "" || stepsMayRetain(st.Steps) || stepsMayRetain(st.OnError) || stepsMayRetain(st.Default) {
			return true
		}
		for _, b := range st.Branches {
			if stepsMayRetain(b.Steps) {
				return true
			}
		}
		for _, c := range st.Cases {
			if stepsMayRetain(c.Steps) {
				return true
			}
		}
	}
	return false
}

// expire records that a finished execution expired under its retention
// rule, as the janitor asks (docs/retention.md). It does so only if the
// history still ends where the janitor saw it: an execution resumed or
// replayed since is kept, and the janitor decides again on its new state.
// Once execution.expired is recorded nothing can follow it (the fold
// refuses any event after it), so an operator's resume arriving now is
// refused rather than lost with the history the janitor then deletes.
func (d *Dispatcher) expire(ctx context.Context, ev events.Event, p *events.ExpireExecution) error {
	log := zerolog.Ctx(ctx).With().Uint64("janitor_seq", p.LastSeq).Str("rule", p.Rule).Logger()
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		s := x.state
		switch {
		case !s.ExpiredAt.IsZero():
			return nil // recorded already (this command again)
		case s.Status == projections.StatusNone:
			log.Info().Msg("expire: no history, nothing to record")
			return nil
		case s.LastSeq != p.LastSeq || !s.Status.Terminal():
			log.Info().Uint64("history_seq", s.LastSeq).Str("status", string(s.Status)).
				Msg("expire: the execution changed since the janitor looked, kept")
			return nil
		}
		if _, open := openLock(s); open {
			// Its end was recorded but a crash came before its locks were
			// given up: give them up now; the janitor decides again.
			log.Info().Msg("expire: locks still to release first, kept")
			return d.releaseEnded(ctx, x)
		}
		if err := d.append(ctx, x, &events.ExecutionExpired{Rule: p.Rule, Group: p.Group, RequestedBy: ev.Source}); err != nil {
			return err
		}
		log.Info().Str("status", string(s.Status)).Msg("execution expired under its retention rule")
		return nil
	})
}

// rejectExpired refuses a command for an execution that expired at at:
// its history is deleted, or about to be, and nothing may be added to it.
func (d *Dispatcher) rejectExpired(ctx context.Context, cmd events.Event, id string, at time.Time) error {
	return d.reject(ctx, cmd, id, events.CodeExpired, fmt.Sprintf(
		"execution %q expired under its retention rule at %s; its history is deleted (or about to be)",
		id, at.UTC().Format(time.RFC3339)))
}
