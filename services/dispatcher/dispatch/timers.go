package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// timerID is the id of an execution's timer for a purpose, step and
// attempt. It is deterministic, so arming the same timer again (after a
// crash) replaces the same JetStream schedule instead of adding one.
func timerID(execID, purpose, stepID string, attempt int) string {
	h := sha256.Sum256([]byte(execID + "\x00" + purpose + "\x00" + stepID + "\x00" + strconv.Itoa(attempt)))
	return "t" + hex.EncodeToString(h[:12])
}

// armTimer makes a durable timer: a JetStream message schedule in the
// timers stream (JF_TIMERS) that publishes a FireTimer command for the
// execution at due, then records TimerArmed. The schedule is published first: if the
// dispatcher dies in between, the orphan fires for a timer the history does
// not know (and is ignored) and the re-handled decision re-arms the same
// timer id, replacing it. A timer already armed keeps its due time.
//
// It returns the due time in force (the first one, for a re-armed timer),
// which the caller records with the step.
func (d *Dispatcher) armTimer(ctx context.Context, x *execState, purpose, stepID string, attempt int, due time.Time) (time.Time, error) {
	id := timerID(x.id, purpose, stepID, attempt)
	if t, ok := x.state.Timers[id]; ok {
		if t.Fired {
			return t.Due, nil
		}
		due = t.Due
	}
	if err := d.publishSchedule(ctx, x.id, x.workflow, id, due); err != nil {
		return due, err
	}
	if _, ok := x.state.Timers[id]; ok {
		return due, nil
	}
	return due, d.append(ctx, x, &events.TimerArmed{TimerID: id, Purpose: purpose, StepID: stepID, Attempt: attempt, Due: due.UTC()})
}

func (d *Dispatcher) publishSchedule(ctx context.Context, execID, wf, id string, due time.Time) error {
	ev := events.New(d.cfg.Source, execID, wf, d.cfg.Now(), &events.FireTimer{ExecutionID: execID, Workflow: wf, TimerID: id})
	ev.ID = "fire-" + id
	msg, err := bus.Encode(bus.ScheduleSubject(id), ev)
	if err != nil {
		return permanentError{err}
	}
	// Set with nanoseconds: the client helper truncates to the second and
	// would fire early.
	msg.Header.Set("Nats-Schedule", "@at "+due.UTC().Format(time.RFC3339Nano))
	msg.Header.Set("Nats-Schedule-Target", bus.PartitionTimerSubject(d.partitionOf(execID), execID))
	if _, err := d.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("schedule timer %s: %w", id, err)
	}
	return nil
}

// fireTimer applies a timer coming due.
func (d *Dispatcher) fireTimer(ctx context.Context, ev events.Event, p *events.FireTimer) error {
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		log := zerolog.Ctx(ctx).With().Str("timer_id", p.TimerID).Logger()
		t, ok := x.state.Timers[p.TimerID]
		switch {
		case !ok && d.cfg.Now().Sub(ev.Time) < 10*time.Second:
			// Armed by another dispatcher a moment ago? Look again shortly.
			return fmt.Errorf("timer %s not recorded yet", p.TimerID)
		case !ok:
			log.Info().Msg("ignore a timer the history does not know")
			return nil
		case x.state.Status.Terminal():
			return nil
		case t.Fired:
			// Recorded already: by a dispatcher that stopped before it
			// acted on it (this command is the redelivery), or by this
			// one for a duplicate. Deciding again repairs the first and
			// changes nothing in the second.
			return d.advance(ctx, x)
		}
		// What a fired timer means (a sleep ends, a wait or an attempt
		// times out, a retry is due, the workflow times out) is decided
		// from the recorded TimerFired, so it is right after any crash.
		if err := d.append(ctx, x, &events.TimerFired{TimerID: p.TimerID}); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}

// rearmOverdue re-publishes the schedules of armed timers that should have
// fired long ago (their schedule was lost): they fire at once.
func (d *Dispatcher) rearmOverdue(ctx context.Context, x *execState) error {
	for id, t := range x.state.Timers {
		if !t.Fired && d.cfg.Now().Sub(t.Due) > 30*time.Second {
			zerolog.Ctx(ctx).Warn().Str("timer_id", id).Time("due", t.Due).Msg("re-arm overdue timer")
			if err := d.publishSchedule(ctx, x.id, x.workflow, id, t.Due); err != nil {
				return err
			}
		}
	}
	return nil
}

// signal records a signal for an execution; a wait step takes it now or
// when it is reached.
func (d *Dispatcher) signal(ctx context.Context, ev events.Event, p *events.SignalExecution) error {
	reject := func(code, format string, args ...any) error {
		return d.reject(ctx, ev, p.ExecutionID, code, fmt.Sprintf(format, args...))
	}
	if !events.ValidSignalName(p.Name) {
		return reject(events.CodeInvalid, "signal name %q: %s", p.Name, events.SignalNameRule)
	}
	wf, err := d.commandTarget(ctx, ev, p.ExecutionID)
	if err != nil {
		return err
	}
	sigID := events.SignalID(events.CommandKey(ev.Source, ev.ID))
	return d.withExecution(ctx, wf, p.ExecutionID, func(x *execState) error {
		switch {
		case x.state.Status == projections.StatusNone:
			return d.notStarted(ctx, ev, p.ExecutionID)
		case !x.state.ExpiredAt.IsZero():
			return d.rejectExpired(ctx, ev, x.state.ID, x.state.ExpiredAt)
		case x.state.Status.Terminal():
			return reject(events.CodeConflict, "execution %q has already %s", p.ExecutionID, x.state.Status)
		}
		for _, s := range x.state.Signals {
			if s.ID == sigID {
				return d.advance(ctx, x) // the same signal again
			}
		}
		if err := d.append(ctx, x, &events.SignalReceived{SignalID: sigID, Name: p.Name, Data: p.Data, Sender: ev.Source, Actor: p.Actor}); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}
