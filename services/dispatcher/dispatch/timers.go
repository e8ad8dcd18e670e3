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
	return d.setSchedule(ctx, execID, wf, id, due, lastSeq, !d.cfg.NoTimerNotices && d.noticesHere(execID), true)
}

// setSchedule is publishSchedule; notices says whether a timer due past
// the horizon has its notice (docs/adr/0019) rather than its firing
// scheduled, memory whether one due within it may be kept in memory.
func (d *Dispatcher) setSchedule(ctx context.Context, execID, wf, id string, due time.Time, lastSeq uint64, notices, memory bool) error {
	// Due soon, it fires from memory (soon.go), its schedule a little
	// later as the guarantee; kept once the schedule is stored. Due
	// later, its notice comes a little before it is due, to bring it
	// here then.
	now := d.cfg.Now()
	at, cmd, cmdID := due, events.Payload(&events.FireTimer{ExecutionID: execID, Workflow: wf, TimerID: id}), "fire-"+id
	p := d.partitionOf(execID)
	target := bus.PartitionTimerSubject(p, execID)
	kept := memory && d.soon.fits(now, due)
	if kept {
		at = due.Add(scheduleGrace)
	} else if noticed, ok := d.soon.noticeAt(now, due); ok && notices {
		at, cmd, cmdID = noticed, &events.TimerNotice{ExecutionID: execID, Workflow: wf, TimerID: id, Due: due}, "notice-"+id
		target = bus.PartitionNoticeSubject(p, execID)
	}
	ev := events.New(d.cfg.Source, execID, wf, now, cmd)
	ev.ID = cmdID
	msg, err := bus.ScheduleMsg(id, ev, at, target)
	if err != nil {
		return permanentError{err}
	}
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
// timer is still armed for the due time the notice was set for and has
// not fired, its firing's schedule is set again: for a running execution
// as for a timer due soon (2 s after the due time, the guarantee), the
// timer kept in memory to fire at its due time and the execution's state
// cached until then (withExecutionAs keeps it: soonTimers.keeps); for an
// ended or a damaged one (a resume or a repair may come before the due
// time), for the due time, as it was before notices. The notice is
// acknowledged once the schedule is stored; a dispatcher that stops
// before leaves it to the next holder. A notice of an arming replaced
// since, or of a timer fired, changes nothing. No notice is set again
// from a notice: one handled more than the horizon before its due time
// (this process's clock behind the server's) sets the firing for the
// due time.
func (d *Dispatcher) noticeTimer(ctx context.Context, p *events.TimerNotice) error {
	return d.withDamagedExecution(ctx, p.Workflow, p.ExecutionID, func(x *execState) error {
		if x.torn != nil {
			return x.torn
		}
		if x.state.Damaged != nil { // its timers may not be read: the notice's own
			return d.setSchedule(ctx, x.id, x.workflow, p.TimerID, p.Due, x.state.LastSeq, false, false)
		}
		t, ok := x.state.Timers[p.TimerID]
		if !ok || t.Fired || !t.Due.Equal(p.Due) {
			zerolog.Ctx(ctx).Debug().Str("timer_id", p.TimerID).Msg("timer notice changes nothing")
			return nil
		}
		return d.setSchedule(ctx, x.id, x.workflow, p.TimerID, t.Due, x.state.LastSeq, false, !x.state.Status.Terminal())
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
