package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// signalExecution sends a named signal to an execution. The body, if any,
// is the signal's data (JSON). An Idempotency-Key header makes a retried
// request the same signal. The answer is 200 once the signal is recorded
// in the history, 202 if the dispatcher has not answered in time, or the
// reason it was refused.
func (s *Server) signalExecution(w http.ResponseWriter, r *http.Request) {
	id, ok := executionID(w, r)
	if !ok {
		return
	}
	name := r.PathValue("name")
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
	s.sendExecutionCommand(w, r, executionCommand{
		execID: id, subject: bus.SubjectAPISignal,
		data: &events.SignalExecution{ExecutionID: id, Name: name, Data: data},
		record: func(ev events.Event, key string) (bool, string) {
			p, ok := ev.Data.(*events.SignalReceived)
			if !ok || p.SignalID != events.SignalID(key) {
				return false, ""
			}
			if p.Name != name {
				return true, fmt.Sprintf("this Idempotency-Key already sent the signal %q; use a new key for a new signal", p.Name)
			}
			return true, ""
		},
		resp: func(key string, recorded bool) any {
			return apiv1.Signaled{ExecutionID: id, Signal: name, SignalID: events.SignalID(key), Recorded: recorded}
		},
		refused: signalRefused,
	})
}

// signalRefused says why an execution in status st takes no signal ("" if
// it takes one): once it has ended, as the dispatcher decides.
func signalRefused(st projections.Status) string {
	if st.Terminal() {
		return "has already " + string(st)
	}
	return ""
}
