package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
)

// executionCommand is a command about one existing execution (a signal,
// an operator's action) sent on behalf of an HTTP request.
type executionCommand struct {
	execID  string
	subject string
	data    events.Payload
	// record reports whether a history event records the command with key
	// key, and, if that command was not this one (a reused Idempotency-Key),
	// why they conflict.
	record func(ev events.Event, key string) (found bool, conflict string)
	// resp builds the answer's body for command key: whether the history
	// records the command yet.
	resp func(key string, recorded bool) any
	// refused says why the command cannot apply to an execution in this
	// status ("" if it can), so that the answer is at once a 409.
	refused func(projections.Status) string
	// repair: the command is for a damaged execution (the repair action);
	// any other is refused at once for one.
	repair bool
	// workflow is the execution's, from its claim (set by
	// sendExecutionCommand): its history is on that workflow's subject.
	workflow string
}

// sendExecutionCommand publishes c and answers with what became of it:
// 200 once the history records it, 202 if the dispatcher has not answered
// in time, or the reason it was refused. An Idempotency-Key header makes a
// retried request the same command.
func (s *Server) sendExecutionCommand(w http.ResponseWriter, r *http.Request, c executionCommand) {
	id := c.execID
	cl, ok := s.claimOf(w, r, id)
	if !ok {
		return
	}
	c.workflow = cl.Workflow
	cmdID := uuid.NewString()
	idemKey := r.Header.Get("Idempotency-Key")
	if len(idemKey) > 200 {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "Idempotency-Key", Message: "must be at most 200 characters"})
		return
	} else if idemKey != "" {
		cmdID = "idem-" + idemKey
	}
	events.SetCommandActor(c.data, actorOf(r)) // who asked, as authenticated: never from the body
	cmd := events.New(s.cfg.Source, id, cl.Workflow, time.Now(), c.data)
	cmd.ID = cmdID
	key := events.CommandKey(cmd.Source, cmd.ID)
	// A retried request is answered like the first, however late, even if
	// that first one ended the execution.
	if idemKey != "" && (s.answerRecorded(w, r, c, key) || s.answerRejection(w, r, key)) {
		return
	}
	// An execution whose start is accepted but not recorded yet (pending:
	// its history is empty, as while the events stream elects a leader) is
	// not refused here: the dispatcher handles the command once the start
	// is, and decides then. Refused as the history stands (currentExecution),
	// not as a lagging read model says: right after a cancel ended, a
	// model still cancelling refused a resume a GET had shown possible.
	if x, err := s.currentExecution(r.Context(), id); err == nil && x.Status != projections.StatusNone && x.Status != projections.StatusPending {
		// Damaged (not merely of a type a newer dispatcher knows: that
		// waits) as the history stands, not as a read model that lags a
		// repair says.
		if d := x.Damaged; d != nil && !d.Unknown && !c.repair {
			if d = s.damageNow(r.Context(), cl.Workflow, id); d != nil {
				writeError(w, http.StatusConflict, apiError{Code: events.CodeDamaged, Message: events.DamagedMessage(id, d.Seq, oneLine(d.Reason))})
				return
			}
		}
		if why := c.refused(x.Status); why != "" {
			writeError(w, http.StatusConflict, apiError{Code: "conflict", Message: fmt.Sprintf("execution %q %s", id, why)})
			return
		}
	}

	ch := make(chan *nats.Msg, 64)
	for _, subject := range []string{bus.ExecutionSubject(cl.Workflow, id), bus.RejectionSubject(key)} {
		sub, err := subscribeInto(s.at(r).nc, subject, ch)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		defer sub.Unsubscribe()
	}
	msg, err := bus.Encode(c.subject, cmd)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	ack, err := s.publishCommand(r, msg, events.CommandMsgID(key))
	if err != nil {
		s.internal(w, r, fmt.Errorf("publish %s: %w", cmd.Type, err))
		return
	}
	if ack.Duplicate && (s.answerRecorded(w, r, c, key) || s.answerRejection(w, r, key)) {
		return // the same request at the same moment: answer with what became of it
	}
	answered := s.await(r, ch, func(ev events.Event) bool {
		if rej, ok := ev.Data.(*events.CommandRejected); ok {
			writeRejection(w, rej)
			return true
		}
		if found, _ := c.record(ev, key); found {
			writeJSON(w, http.StatusOK, c.resp(key, true))
			return true
		}
		return false
	})
	if !answered {
		writeJSON(w, http.StatusAccepted, c.resp(key, false))
	}
}

// answerRecorded answers if the execution's history records the command
// with key: 200 if it is this command, 409 if the key was used for another.
func (s *Server) answerRecorded(w http.ResponseWriter, r *http.Request, c executionCommand, key string) bool {
	evs, err := history.Read(r.Context(), s.at(r).js, bus.ExecutionSubject(c.workflow, c.execID), 0)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		found, conflict := c.record(ev, key)
		switch {
		case !found:
			continue
		case conflict != "":
			writeError(w, http.StatusConflict, apiError{Code: "conflict", Field: "Idempotency-Key", Message: conflict})
		default:
			writeJSON(w, http.StatusOK, c.resp(key, true))
		}
		return true
	}
	return false
}

// damageNow is the damage of execution id as its history stands (nil if
// it has none, or cannot be read now: the dispatcher decides then).
func (s *Server) damageNow(ctx context.Context, workflow, id string) *projections.Damage {
	evs, err := history.Read(ctx, s.ns(ctx).js, bus.ExecutionSubject(workflow, id), 0)
	if err != nil {
		return nil
	}
	return projections.FoldQuarantined(id, evs).Damaged
}

// subscribeInto subscribes to subject and hands ch the messages it has
// room for, dropping the others. A request waits on a history's subject
// for the one or two events that answer it; a busy execution (a loop of
// local steps) may append many more meanwhile, and a channel
// subscription (nats.Conn.ChanSubscribe) that overflows makes the client
// drop them as a slow consumer's, an error logged for what is no fault.
func subscribeInto(nc *nats.Conn, subject string, ch chan<- *nats.Msg) (*nats.Subscription, error) {
	return nc.Subscribe(subject, func(m *nats.Msg) {
		select {
		case ch <- m:
		default:
		}
	})
}
