package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/services/dispatcher/interp"
)

// publishSchedule sets the schedule of timer id of execution execID, due
// at due; lastSeq is the stream sequence of the execution's last event.
func (d *Dispatcher) publishSchedule(ctx context.Context, execID, wf, id string, due time.Time, lastSeq uint64) error {
	return d.setSchedule(ctx, execID, wf, id, due, lastSeq, !d.cfg.NoTimerNotices)
}

// setSchedule is publishSchedule; notices says whether a timer due past
// the horizon has its notice (docs/adr/0019) rather than its firing
// scheduled.
func (d *Dispatcher) setSchedule(ctx context.Context, execID, wf, id string, due time.Time, lastSeq uint64, notices bool) error {
	ev := events.New(d.cfg.Source, execID, wf, d.cfg.Now(), &events.FireTimer{ExecutionID: execID, Workflow: wf, TimerID: id})
	ev.ID = "fire-" + id
	// Due soon, it fires from memory (soon.go), its schedule a little
	// later as the guarantee; kept once the schedule is stored. Due
	// later, its notice comes a little before it is due, to bring it
	// here then.
	at, now := due, d.cfg.Now()
	kept := d.soon.fits(now, due)
	if kept {
		at = due.Add(scheduleGrace)
	} else if noticed, ok := d.soon.noticeAt(now, due); ok && notices {
		at = noticed
		ev = events.New(d.cfg.Source, execID, wf, now, &events.TimerNotice{ExecutionID: execID, Workflow: wf, TimerID: id, Due: due})
		ev.ID = "notice-" + id
	}
	msg, err := bus.Encode(bus.ScheduleSubject(id), ev)
	if err != nil {
		return permanentError{err}
	}
	// Set with nanoseconds: the client helper truncates to the second and
	// would fire early.
	msg.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	msg.Header.Set("Nats-Schedule-Target", bus.PartitionTimerSubject(d.partitionOf(execID), execID))
	if _, err := d.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("schedule timer %s: %w", id, err)
	}
	if kept {
		// Refused only if the heap filled since fits (rare): the timer
		// then fires by its schedule, scheduleGrace late.
		_ = d.soon.add(now, due, wf, execID, id, lastSeq)
	} else {
		d.soon.forget(execID, id) // an earlier arming kept here is no longer the timer's
	}
	return nil
}

// noticeTimer handles a long timer's notice (docs/adr/0019): if the
// timer is still armed for the due time the notice was set for, its
// schedule is set again as for a timer due soon, the guarantee, and it is
// kept in memory to fire at its due time, its execution's state cached
// until then (withExecutionAs keeps it: soonTimers.keeps). The notice is
// acknowledged once the schedule is stored; a dispatcher that stops
// before leaves it to the next holder. A notice of an arming replaced
// since, of a timer fired or of an ended execution changes nothing. No
// notice is set again from a notice: one handled more than the horizon
// before its due time (the clocks of this process and the server's
// apart) sets the schedule for the due time.
func (d *Dispatcher) noticeTimer(ctx context.Context, p *events.TimerNotice) error {
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		t, ok := x.state.Timers[p.TimerID]
		if !ok || t.Fired || !t.Due.Equal(p.Due) || x.state.Status.Terminal() {
			zerolog.Ctx(ctx).Debug().Str("timer_id", p.TimerID).Msg("timer notice changes nothing")
			return nil
		}
		if x.torn != nil {
			return x.torn
		}
		return d.setSchedule(ctx, x.id, x.workflow, p.TimerID, t.Due, x.state.LastSeq, false)
	})
}

// fireTimer applies a timer coming due (interp.Fired).
func (d *Dispatcher) fireTimer(ctx context.Context, ev events.Event, p *events.FireTimer) error {
	return d.withExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		ctx := zerolog.Ctx(ctx).With().Str("timer_id", p.TimerID).Logger().WithContext(ctx)
		return d.command(ctx, ev, x, func(in interp.Input) interp.Decision { return interp.Fired(in, p.TimerID, ev.Time) })
	})
}

// rearmOverdue re-publishes the schedules of armed timers that should have
// fired long ago (their schedule was lost): they fire at once.
func (d *Dispatcher) rearmOverdue(ctx context.Context, x *execState) error {
	return d.rearmDue(ctx, x, d.cfg.Now().Add(-30*time.Second), "re-arm overdue timer")
}

// rearmDue publishes again the schedules of x's timers that have not
// fired and were due by by, so that they fire at once; why, if set, is
// logged for each.
func (d *Dispatcher) rearmDue(ctx context.Context, x *execState, by time.Time, why string) error {
	for id, t := range x.state.Timers {
		if t.Fired || t.Due.After(by) {
			continue
		}
		if why != "" {
			zerolog.Ctx(ctx).Warn().Str("timer_id", id).Time("due", t.Due).Msg(why)
		}
		if _, err := d.perform(ctx, x, interp.ArmTimer{TimerID: id, Due: t.Due}); err != nil {
			return err
		}
	}
	return nil
}

// signal records a signal for an execution; a wait step takes it now or
// when it is reached (interp.Signal).
func (d *Dispatcher) signal(ctx context.Context, ev events.Event, p *events.SignalExecution) error {
	wf, err := d.commandTarget(ctx, ev, p.ExecutionID)
	if err != nil {
		return err
	}
	cmd := signalCommand(ev, p, ev.Time)
	return d.withExecution(ctx, wf, p.ExecutionID, func(x *execState) error {
		return d.command(ctx, ev, x, func(in interp.Input) interp.Decision { return interp.Signal(in, cmd) })
	})
}
