package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// signalExecution sends a named signal to an execution. The body, if any,
// is the signal's data (JSON). An Idempotency-Key header makes a retried
// request the same signal. The answer is 200 once the signal is recorded
// in the history, 202 if the dispatcher has not answered in time, or the
// reason it was refused.
// signalRecorded reports whether the execution's history holds the signal.
func (s *Server) signalRecorded(r *http.Request, id, sigID string) bool {
	evs, err := history.Read(r.Context(), s.js, events.ExecutionFilter(id), 0)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		if p, ok := ev.Data.(*events.SignalReceived); ok && p.SignalID == sigID {
			return true
		}
	}
	return false
}

func (s *Server) signalExecution(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("id"), r.PathValue("name")
	if !events.ValidSignalName(name) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "name", Message: fmt.Sprintf("signal name %q: %s", name, events.SignalNameRule)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if tooLarge(w, err, s.cfg.MaxBody) {
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Message: "read body: " + err.Error()})
		return
	}
	var data json.RawMessage
	if len(bytes.TrimSpace(body)) > 0 {
		if !json.Valid(body) {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_json", Field: "data", Message: "the body (the signal's data) must be JSON"})
			return
		}
		data = body
	}
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
	_ = json.Unmarshal(e.Value(), &claim)
	x, err := s.loadExecution(r.Context(), id)
	if err == nil && x.Status.Terminal() {
		writeError(w, http.StatusConflict, apiError{Code: "conflict", Message: fmt.Sprintf("execution %q has already %s", id, x.Status)})
		return
	}

	cmdID := uuid.NewString()
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		cmdID = "idem-" + k
	}
	cmd := events.New(s.cfg.Source, id, claim.Workflow, time.Now(), &events.SignalExecution{ExecutionID: id, Name: name, Data: data})
	cmd.ID = cmdID
	key := events.CommandKey(cmd.Source, cmd.ID)

	ch := make(chan *nats.Msg, 64)
	subEvents, err := s.nc.ChanSubscribe(events.ExecutionSubject(claim.Workflow, id), ch)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer subEvents.Unsubscribe()
	subRej, err := s.nc.ChanSubscribe(events.RejectionSubject(key), ch)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer subRej.Unsubscribe()
	msg, err := events.Encode(events.SubjectSignal, cmd)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	ack, err := s.js.PublishMsg(r.Context(), msg, jetstream.WithMsgID(events.CommandMsgID(key)))
	if err != nil {
		s.internal(w, r, fmt.Errorf("publish signal: %w", err))
		return
	}
	sigID := events.SignalID(key)
	resp := map[string]any{"execution_id": id, "signal": name, "signal_id": sigID}
	if ack.Duplicate { // the same request again: answer with what became of it
		if s.signalRecorded(r, id, sigID) {
			resp["recorded"] = true
			writeJSON(w, http.StatusOK, resp)
			return
		}
		if s.answerRejection(w, r, key) {
			return
		}
	}
	answered := s.await(r, ch, func(ev events.Event) bool {
		switch p := ev.Data.(type) {
		case *events.SignalReceived:
			if p.SignalID == sigID {
				resp["recorded"] = true
				writeJSON(w, http.StatusOK, resp)
				return true
			}
		case *events.CommandRejected:
			writeRejection(w, p)
			return true
		}
		return false
	})
	if !answered {
		resp["recorded"] = false
		writeJSON(w, http.StatusAccepted, resp)
	}
}
