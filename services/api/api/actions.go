package api

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"jetflow.dev/pkg/events"
)

// actionRequest is the body of POST /v1/executions/{id}/actions.
type actionRequest struct {
	Action string `json:"action"`
	// Reason is kept in the history with the action.
	Reason string `json:"reason,omitempty"`
	// RequestedBy names who asks (a person, a tool); the api's source if empty.
	RequestedBy string `json:"requested_by,omitempty"`
}

// maxReason bounds the reason an operator gives, so that it fits in an event.
const maxReason = 4096

// executionAction carries out an operator's action (cancel, force-cancel, kill)
// on an execution. The answer is 200 once the history records it, 202 if
// the dispatcher has not answered in time, or the reason it was refused.
func (s *Server) executionAction(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if tooLarge(w, err, s.cfg.MaxBody) {
		return
	}
	var req actionRequest
	if err == nil {
		err = events.DecodeStrictJSON(body, &req)
	}
	if err != nil {
		field, msg := events.ExplainJSON(err)
		if field == "" {
			msg = `the body must be JSON like {"action":"cancel","reason":"..."}: ` + msg
		}
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_json", Field: field, Message: msg})
		return
	}
	switch {
	case req.Action == "":
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "action",
			Message: "action is required; use one of: " + strings.Join(events.Actions, ", ")})
		return
	case !slices.Contains(events.Actions, req.Action):
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "action",
			Message: fmt.Sprintf("action %q is not known; use one of: %s", req.Action, strings.Join(events.Actions, ", "))})
		return
	case len(req.Reason) > maxReason:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "reason",
			Message: fmt.Sprintf("reason is %d bytes; at most %d are kept", len(req.Reason), maxReason)})
		return
	}
	s.sendExecutionCommand(w, r, executionCommand{
		execID: id, subject: events.SubjectAction,
		data: &events.ExecutionAction{ExecutionID: id, Action: req.Action, Reason: req.Reason, RequestedBy: req.RequestedBy},
		recorded: func(ev events.Event, key string) bool {
			var rec events.ActionRecord
			switch p := ev.Data.(type) {
			case *events.ExecutionCancelling:
				rec = p.ActionRecord
			case *events.ExecutionCancelled:
				rec = p.ActionRecord
			}
			return rec.Command == key
		},
		resp: func(key string) map[string]any {
			return map[string]any{"execution_id": id, "action": req.Action, "command": key}
		},
	})
}
