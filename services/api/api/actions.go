package api

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/access"
)

// replayFromRe is what a replay's from may hold: resume, last, start, a
// step id or a step instance's path.
var replayFromRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_\-/~@\[\]]{0,255}$`)

// executionAction carries out an operator's action (cancel, force-cancel, kill, resume, force-resume)
// on an execution. The answer is 200 once the history records it, 202 if
// the dispatcher has not answered in time, or the reason it was refused.
func (s *Server) executionAction(w http.ResponseWriter, r *http.Request) {
	id, ok := executionID(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if tooLarge(w, err, s.cfg.MaxBody) {
		return
	}
	var req apiv1.ActionRequest
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
	case len(req.Reason) > events.MaxActionReason:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "reason",
			Message: fmt.Sprintf("reason is %d bytes; at most %d are kept", len(req.Reason), events.MaxActionReason)})
		return
	case len(req.RequestedBy) > events.MaxRequestedBy:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "requested_by",
			Message: fmt.Sprintf("requested_by is %d bytes; at most %d are kept", len(req.RequestedBy), events.MaxRequestedBy)})
		return
	case req.Action != events.ActionReplay && req.From != "":
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "from", Message: "from applies to the replay action only"})
		return
	case req.Action != events.ActionReplay && req.Force:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "force",
			Message: "force applies to the replay action only (use force-cancel or force-resume)"})
		return
	case req.Version != 0 && req.Action != events.ActionResume && req.Action != events.ActionForceResume && req.Action != events.ActionReplay:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "version",
			Message: "version applies to resume, force-resume and replay only: it moves the execution to that version of its workflow"})
		return
	case req.Action == events.ActionRepair && req.IgnoreSeq == 0:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "ignore_seq",
			Message: "repair needs ignore_seq: the stream sequence of the damaged event (GET /v1/executions/{id} shows it under damaged.seq)"})
		return
	case req.Action != events.ActionRepair && req.IgnoreSeq != 0:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "ignore_seq", Message: "ignore_seq applies to the repair action only"})
		return
	case req.Action == events.ActionRepair && !principalOf(r).Has(access.ScopeAdmin):
		writeError(w, http.StatusForbidden, apiError{Code: "forbidden", Scope: string(access.ScopeAdmin),
			Message: "repair passes over an event of the history: it needs a token with the admin scope"})
		return
	case req.From != "" && !replayFromRe.MatchString(req.From):
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "from",
			Message: fmt.Sprintf("%q is not resume, last, start or a step's id or path (e.g. deploy, blk/deploy)", req.From)})
		return
	}
	s.sendExecutionCommand(w, r, executionCommand{
		execID: id, subject: bus.SubjectAPIAction,
		data: &events.ExecutionAction{ExecutionID: id, Action: req.Action, Reason: req.Reason, RequestedBy: req.RequestedBy,
			From: req.From, Force: req.Force, Version: req.Version, IgnoreSeq: req.IgnoreSeq},
		repair: req.Action == events.ActionRepair,
		record: func(ev events.Event, key string) (bool, string) {
			var rec events.ActionRecord
			switch p := ev.Data.(type) {
			case *events.ExecutionCancelling:
				rec = p.ActionRecord
			case *events.ExecutionCancelled:
				rec = p.ActionRecord
			case *events.ExecutionResumed:
				rec = p.ActionRecord
			case *events.ExecutionReplayed:
				rec = p.ActionRecord
			case *events.ExecutionRepaired:
				rec = p.ActionRecord
			case *events.CompensationStarted:
				rec = p.ActionRecord
			}
			if rec.Command != key {
				return false, ""
			}
			if rec.Action != req.Action {
				return true, fmt.Sprintf("this Idempotency-Key already asked for %s; use a new key for a new action", rec.Action)
			}
			return true, ""
		},
		resp: func(key string, recorded bool) any {
			return apiv1.Acted{ExecutionID: id, Action: req.Action, Command: key, Recorded: recorded}
		},
		refused: func(st projections.Status) string { return st.ActionRefused(req.Action) },
	})
}
