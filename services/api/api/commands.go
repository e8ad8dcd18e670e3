package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// executionCommand is a command about one existing execution (a signal,
// an operator's action) sent on behalf of an HTTP request.
type executionCommand struct {
	execID  string
	subject string
	data    events.Payload
	// recorded reports whether a history event is this command's record;
	// key is the command key.
	recorded func(ev events.Event, key string) bool
	// resp builds the answer's body for command key; "recorded" is added.
	resp func(key string) map[string]any
}

// sendExecutionCommand publishes c and answers with what became of it:
// 200 once the history records it, 202 if the dispatcher has not answered
// in time, or the reason it was refused. An Idempotency-Key header makes a
// retried request the same command.
func (s *Server) sendExecutionCommand(w http.ResponseWriter, r *http.Request, c executionCommand) {
	id := c.execID
	e, err := s.ids.Get(r.Context(), id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || !events.ValidExecutionID(id) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: fmt.Sprintf("execution %q does not exist", id)})
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	var claim struct {
		Workflow string `json:"workflow"`
	}
	if err := json.Unmarshal(e.Value(), &claim); err != nil {
		s.internal(w, r, fmt.Errorf("decode claim of %s: %w", id, err))
		return
	}
	if x, err := s.loadExecution(r.Context(), id); err == nil && x.Status.Terminal() {
		writeError(w, http.StatusConflict, apiError{Code: "conflict", Message: fmt.Sprintf("execution %q has already %s", id, x.Status)})
		return
	}

	cmdID := uuid.NewString()
	if k := r.Header.Get("Idempotency-Key"); len(k) > 200 {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "Idempotency-Key", Message: "must be at most 200 characters"})
		return
	} else if k != "" {
		cmdID = "idem-" + k
	}
	cmd := events.New(s.cfg.Source, id, claim.Workflow, time.Now(), c.data)
	cmd.ID = cmdID
	key := events.CommandKey(cmd.Source, cmd.ID)
	resp := c.resp(key)

	ch := make(chan *nats.Msg, 64)
	for _, subject := range []string{events.ExecutionSubject(claim.Workflow, id), events.RejectionSubject(key)} {
		sub, err := s.nc.ChanSubscribe(subject, ch)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		defer sub.Unsubscribe()
	}
	msg, err := events.Encode(c.subject, cmd)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	ack, err := s.js.PublishMsg(r.Context(), msg, jetstream.WithMsgID(events.CommandMsgID(key)))
	if err != nil {
		s.internal(w, r, fmt.Errorf("publish %s: %w", cmd.Type, err))
		return
	}
	if ack.Duplicate { // the same request again: answer with what became of it
		if s.commandRecorded(r, id, func(ev events.Event) bool { return c.recorded(ev, key) }) {
			resp["recorded"] = true
			writeJSON(w, http.StatusOK, resp)
			return
		}
		if s.answerRejection(w, r, key) {
			return
		}
	}
	answered := s.await(r, ch, func(ev events.Event) bool {
		if rej, ok := ev.Data.(*events.CommandRejected); ok {
			writeRejection(w, rej)
			return true
		}
		if c.recorded(ev, key) {
			resp["recorded"] = true
			writeJSON(w, http.StatusOK, resp)
			return true
		}
		return false
	})
	if !answered {
		resp["recorded"] = false
		writeJSON(w, http.StatusAccepted, resp)
	}
}

// commandRecorded reports whether the execution's history holds an event
// for which match is true.
func (s *Server) commandRecorded(r *http.Request, id string, match func(events.Event) bool) bool {
	evs, err := history.Read(r.Context(), s.js, events.ExecutionFilter(id), 0)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		if match(ev) {
			return true
		}
	}
	return false
}
