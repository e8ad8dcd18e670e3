package api

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/lock"
)

// lockInfo shows the lock name as the bucket records it: its holders,
// each since when, and its waiters in the order they asked.
func lockInfo(name string, r lock.Record) apiv1.Lock {
	return apiv1.Lock{Name: name, Limit: max(r.Limit, 1), Holders: lockEntries(r.Holders), Waiters: lockEntries(r.Waiters)}
}

// lockEntries shows the entries of a lock ([] for none).
func lockEntries(es []lock.Entry) []apiv1.LockEntry {
	out := make([]apiv1.LockEntry, len(es))
	for i, e := range es {
		out[i] = lockEntry(e)
	}
	return out
}

// lockEntry shows a holder or waiter of a lock.
func lockEntry(e lock.Entry) apiv1.LockEntry {
	return apiv1.LockEntry{ExecutionID: e.ExecutionID, Workflow: e.Workflow, Path: e.Path, Request: e.Request, Since: e.Since}
}

// listLocks answers GET /v1/locks: every lock held or waited for.
func (s *Server) listLocks(w http.ResponseWriter, r *http.Request) {
	tb, err := lock.Open(r.Context(), s.at(r).js, nil)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	all, err := tb.List(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := make([]apiv1.Lock, 0, len(all))
	for name, rec := range all {
		out = append(out, lockInfo(name, rec))
	}
	slices.SortFunc(out, func(a, b apiv1.Lock) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, apiv1.LockList{Locks: out})
}

// lockOf reads the lock named in the path, answering 400 or 404 itself.
func (s *Server) lockOf(w http.ResponseWriter, r *http.Request) (*lock.Table, string, lock.Record, bool) {
	name := r.PathValue("name")
	if !events.ValidLockName(name) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "name", Message: fmt.Sprintf("lock %q: %s", name, events.LockNameRule)})
		return nil, "", lock.Record{}, false
	}
	tb, err := lock.Open(r.Context(), s.at(r).js, nil)
	if err != nil {
		s.internal(w, r, err)
		return nil, "", lock.Record{}, false
	}
	rec, _, found, err := tb.Get(r.Context(), name)
	if err != nil {
		s.internal(w, r, err)
		return nil, "", lock.Record{}, false
	}
	if !found {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "name", Message: fmt.Sprintf("lock %q is not held or waited for", name)})
		return nil, "", lock.Record{}, false
	}
	return tb, name, rec, true
}

// getLock answers GET /v1/locks/{name}.
func (s *Server) getLock(w http.ResponseWriter, r *http.Request) {
	if _, name, rec, ok := s.lockOf(w, r); ok {
		writeJSON(w, http.StatusOK, lockInfo(name, rec))
	}
}

// clearLock answers DELETE /v1/locks/{name}: the dispatcher removes the
// lock's holders (or one of them) with compare-and-set and records
// lock.cleared, with who asked and why, in each holder's history; the
// first waiters become holders. 200 once every holder's history records
// it, 202 if the dispatcher has not answered in time. Waiters are left
// waiting.
func (s *Server) clearLock(w http.ResponseWriter, r *http.Request) {
	_, name, rec, ok := s.lockOf(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if tooLarge(w, err, s.cfg.MaxBody) {
		return
	}
	var req apiv1.ClearLockRequest
	if err == nil && len(bytes.TrimSpace(body)) > 0 {
		err = events.DecodeStrictJSON(body, &req)
	}
	if err != nil {
		field, msg := events.ExplainJSON(err)
		if field == "" {
			msg = `the body, if any, must be JSON like {"reason":"...","execution_id":"..."}: ` + msg
		}
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_json", Field: field, Message: msg})
		return
	}
	switch {
	case len(req.Reason) > events.MaxActionReason:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "reason",
			Message: fmt.Sprintf("reason is %d bytes; at most %d are kept", len(req.Reason), events.MaxActionReason)})
		return
	case len(req.RequestedBy) > events.MaxRequestedBy:
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "requested_by",
			Message: fmt.Sprintf("requested_by is %d bytes; at most %d are kept", len(req.RequestedBy), events.MaxRequestedBy)})
		return
	case req.ExecutionID != "" && !events.ValidExecutionID(req.ExecutionID):
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "execution_id",
			Message: fmt.Sprintf("execution_id %q is not valid: %s", req.ExecutionID, events.ExecutionIDRule)})
		return
	}
	var entries []events.LockEntry
	for _, h := range rec.Holders {
		if req.ExecutionID == "" || h.ExecutionID == req.ExecutionID {
			entries = append(entries, events.LockEntry{ExecutionID: h.ExecutionID, Workflow: h.Workflow, Path: h.Path, Request: h.Request})
		}
	}
	if len(entries) == 0 {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "execution_id",
			Message: fmt.Sprintf("execution %q does not hold lock %s", req.ExecutionID, name)})
		return
	}
	cmd := events.New(s.cfg.Source, "", "", time.Now(), &events.ClearLock{Lock: name, Entries: entries, Reason: req.Reason, RequestedBy: req.RequestedBy,
		Actor: actorOf(r)})
	cmd.ID = uuid.NewString()
	key := events.CommandKey(cmd.Source, cmd.ID)

	ch := make(chan *nats.Msg, 64)
	subjects := []string{bus.RejectionSubject(key)}
	for _, e := range entries {
		subjects = append(subjects, bus.ExecutionSubject(e.Workflow, e.ExecutionID))
	}
	for _, subject := range subjects {
		sub, err := subscribeInto(s.at(r).nc, subject, ch)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		defer sub.Unsubscribe()
	}
	msg, err := bus.Encode(bus.SubjectAPIClearLock, cmd)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if _, err := s.publishCommand(r, msg, events.CommandMsgID(key)); err != nil {
		s.internal(w, r, fmt.Errorf("publish %s: %w", cmd.Type, err))
		return
	}
	resp := apiv1.ClearedLock{Lock: name, Cleared: entries, Command: key}
	left := len(entries)
	answered := s.await(r, ch, func(ev events.Event) bool {
		if rej, ok := ev.Data.(*events.CommandRejected); ok {
			writeRejection(w, rej)
			return true
		}
		if c, ok := ev.Data.(*events.LockCleared); ok && c.Command == key {
			if left--; left == 0 {
				resp.Recorded = true
				writeJSON(w, http.StatusOK, resp)
				return true
			}
		}
		return false
	})
	if !answered {
		writeJSON(w, http.StatusAccepted, resp)
	}
}
