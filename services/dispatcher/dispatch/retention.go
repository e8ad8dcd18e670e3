package dispatch

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
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
		if _, open := interp.OpenLock(s); open {
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
// its history is deleted, or about to be.
func (d *Dispatcher) rejectExpired(ctx context.Context, cmd events.Event, id string, at time.Time) error {
	r := interp.Expired(id, at)
	return d.reject(ctx, cmd, id, r.Code, r.Reason)
}
