package dispatch

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/services/dispatcher/interp"
)

// expire records that a finished execution expired under its retention
// rule, as the janitor asks (docs/retention.md). It does so only if the
// history still ends where the janitor saw it: an execution resumed or
// replayed since is kept, and the janitor decides again on its new state.
// Once execution.expired is recorded nothing can follow it (the fold
// refuses any event after it), so an operator's resume arriving now is
// refused rather than lost with the history the janitor then deletes.
func (d *Dispatcher) expire(ctx context.Context, ev events.Event, p *events.ExpireExecution) error {
	ctx = zerolog.Ctx(ctx).With().Uint64("janitor_seq", p.LastSeq).Str("rule", p.Rule).Logger().WithContext(ctx)
	cmd := interp.ExpireCommand{LastSeq: p.LastSeq, Rule: p.Rule, Group: p.Group, By: ev.Source}
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		return d.command(ctx, ev, x, func(in interp.Input) interp.Decision { return interp.Expire(in, cmd) })
	})
}

// rejectExpired refuses a command for an execution that expired at at:
// its history is deleted, or about to be.
func (d *Dispatcher) rejectExpired(ctx context.Context, cmd events.Event, id string, at time.Time) error {
	r := interp.Expired(id, at)
	return d.reject(ctx, cmd, id, r.Code, r.Reason)
}
