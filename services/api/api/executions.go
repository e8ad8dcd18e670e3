package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/services/api/visibility"
)

func isCloudEvent(r *http.Request) bool {
	return r.Header.Get("Ce-Specversion") != "" || strings.HasPrefix(r.Header.Get("Content-Type"), "application/cloudevents")
}

// startExecution accepts a JSON start request or a CloudEvent (HTTP
// binding, binary or structured mode) of type io.jetflow.execution.start.
func (s *Server) startExecution(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
	var cmd events.Event
	if isCloudEvent(r) {
		var restoreType string // see events.StructuredJSONData
		if v := r.Header.Get("Ce-Specversion"); v != "" && v != "1.0" {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "specversion",
				Message: fmt.Sprintf("ce-specversion is %q; jetflow speaks CloudEvents 1.0", v)})
			return
		}
		if _, bare := r.Header["Ce-"]; bare {
			// sdk-go reads the attribute's name after the prefix, and
			// panics on a header that has none.
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "Ce-",
				Message: "a header named Ce- names no attribute: CloudEvent attributes are headers ce-<name> (ce-id, ce-source, ...)"})
			return
		}
		if header, attr := badAttributeHeader(r.Header); header != "" {
			// sdk-go says "bad key", naming none.
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: header,
				Message: fmt.Sprintf("header %s names the attribute %q: CloudEvents attribute names are lower-case letters and digits (ce-source, ce-myext)", header, attr)})
			return
		}
		switch ct := r.Header.Get("Content-Type"); format.Lookup(ct) {
		case nil:
			if r.Header.Get("Ce-Specversion") == "" {
				writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "Content-Type",
					Message: fmt.Sprintf("Content-Type %q is no CloudEvents format jetflow reads: send a structured event as application/cloudevents+json, "+
						"or the data in binary mode with the headers ce-specversion, ce-id, ce-source and ce-type", ct)})
				return
			}
		case format.JSONBatch:
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "Content-Type",
				Message: "a batch of CloudEvents starts nothing: send one start per request, as application/cloudevents+json"})
			return
		case format.JSON:
			body, err := io.ReadAll(r.Body)
			if tooLarge(w, err, s.cfg.MaxBody) {
				return
			}
			if attr, msg := structuredProblem(body); attr != "" {
				writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: attr, Message: msg})
				return
			}
			body, restoreType = events.StructuredJSONData(body)
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		ce, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if tooLarge(w, err, s.cfg.MaxBody) {
			return
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: sdkErrorField(err, r.Header), Message: events.ExplainSDKError(err)})
			return
		}
		if restoreType != "" {
			ce.SetDataContentType(restoreType)
		}
		cmd, err = events.FromCloudEvent(*ce)
		switch {
		case errors.Is(err, events.ErrUnknownType) || (err == nil && cmd.Type != events.TypeStartExecution):
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "type",
				Message: fmt.Sprintf("type is %q; a start must be %s", ce.Type(), events.TypeStartExecution)})
			return
		case err != nil:
			var fe *events.FieldError
			_ = errors.As(err, &fe) // FromCloudEvent's errors name what is wrong
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: fe.FieldName(),
				Message: strings.TrimPrefix(err.Error(), events.ErrMalformed.Error()+": ")})
			return
		}
	} else {
		body, err := io.ReadAll(r.Body)
		if tooLarge(w, err, s.cfg.MaxBody) {
			return
		}
		var req apiv1.StartRequest
		if err == nil {
			err = events.DecodeStrictJSON(body, &req)
		}
		if err != nil {
			field, msg := events.ExplainJSON(err)
			if field == "" {
				msg = "the body " + msg
			}
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid_json", Field: field, Message: msg})
			return
		}
		cmd = events.New(s.cfg.Source, req.ID, req.Workflow, time.Now(), &events.StartExecution{
			Workflow: req.Workflow, Version: req.Version, Input: req.Input, ExecutionID: req.ID, WaitAfterFail: req.WaitAfterFail, DryRun: req.DryRun})
		// With an Idempotency-Key, a retried request is the same command:
		// it gets the execution it started (200) instead of a new one.
		if k := r.Header.Get("Idempotency-Key"); k != "" {
			if len(k) > 200 {
				writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "Idempotency-Key", Message: "must be at most 200 characters"})
				return
			}
			cmd.ID = "idem-" + k // without an id, the execution's is derived from it
		} else if req.ID == "" {
			cmd.Data.(*events.StartExecution).ExecutionID = uuid.Must(uuid.NewV7()).String()
		}
	}
	start := cmd.Data.(*events.StartExecution)
	if start.Actor != nil {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "actor",
			Message: "data: actor is set by the api, from the request's credentials; leave it out"})
		return
	}
	if start.Chain != "" || start.Run != 0 || start.ContinuedFrom != "" {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "continued_from",
			Message: "data: chain, run and continued_from are set by the dispatcher, for the run a continue-as-new step starts; leave them out"})
		return
	}
	if start.Parent != nil {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_cloudevent", Field: "parent",
			Message: "data: parent is set by the dispatcher, for the child execution a workflow step with child: true starts; leave it out"})
		return
	}
	start.Actor = actorOf(r)
	_, start.ExecutionID = startcheck.Identify(cmd) // the command names it, for the dispatcher and the answer
	def, err := s.at(r).defs.StartDefinition(r.Context(), start.Workflow, start.Version)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		s.internal(w, r, err)
		return
	}
	st, err := startcheck.Check(cmd, def, startcheck.Options{MaxPayload: s.at(r).nc.MaxPayload(), Now: time.Now()})
	if p := (*startcheck.Problem)(nil); errors.As(err, &p) {
		writeStartProblem(w, r, p)
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if s.answerExistingClaim(w, r, st.ExecutionID, st.CommandKey, st.Digest) {
		return
	}
	s.publishStart(w, r, cmd, start, st.CommandKey, st.Digest)
}

// badAttributeHeader is the first header ce-<name> (in sorted order)
// whose name is no CloudEvents attribute name, and that name ("" if
// none): the binary mode's counterpart of structuredProblem.
func badAttributeHeader(h http.Header) (header, attr string) {
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if len(k) <= len("Ce-") || !strings.EqualFold(k[:len("Ce-")], "Ce-") {
			continue
		}
		if name := strings.ToLower(k[len("Ce-"):]); !events.IsAttributeName(name) {
			return k, name
		}
	}
	return "", ""
}

// structuredProblem names an attribute of a structured CloudEvent whose
// name is not one (lower-case letters and digits) or whose value is no
// string, number, boolean or null, and says so (sdk-go says "bad key" or
// "invalid CloudEvents value", naming neither); "" if there is none, or
// body is no JSON object (sdk-go says that well).
func structuredProblem(body []byte) (attr, msg string) {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return "", ""
	}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if name == "data" || name == "data_base64" {
			continue
		}
		switch v := bytes.TrimSpace(members[name]); {
		case !events.IsAttributeName(name):
			return name, fmt.Sprintf("attribute name %q: CloudEvents attribute names are lower-case letters and digits (source, not Source)", name)
		case len(v) > 0 && (v[0] == '{' || v[0] == '['):
			return name, fmt.Sprintf("attribute %q is a JSON object or array; CloudEvents attributes are strings, numbers or booleans (the data goes in data)", name)
		case slices.Contains(stringAttrs, name):
			if msg := stringAttrProblem(name, v); msg != "" {
				return name, msg
			}
		}
	}
	return "", ""
}

// stringAttrs are the CloudEvents attributes that are strings, which
// sdk-go parses without saying which one it could not.
var stringAttrs = []string{"specversion", "id", "type", "source", "subject", "datacontenttype", "dataschema", "time"}

// stringAttrProblem says what is wrong with the value v of the string
// attribute name ("" if nothing).
func stringAttrProblem(name string, v json.RawMessage) string {
	var str string
	if json.Unmarshal(v, &str) != nil {
		return fmt.Sprintf("%s must be a string, not %s", name, v)
	}
	switch name {
	case "source", "dataschema":
		if _, err := url.Parse(str); err != nil || (name == "source" && str == "") {
			return fmt.Sprintf("%s %q is not a URI reference (e.g. tour/curl, urn:x, https://example.com/x)", name, str)
		}
	case "time":
		if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
			return fmt.Sprintf("time %q is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z)", str)
		}
	}
	return ""
}

// writeStartProblem answers a start that startcheck.Check refused: 404
// for a workflow or version that is not registered, else 400 (code
// invalid_input, with every problem, for an input the schema refuses).
// The field and message are those the dispatcher's rejection would carry.
func writeStartProblem(w http.ResponseWriter, r *http.Request, p *startcheck.Problem) {
	status, e := http.StatusBadRequest, apiError{Code: p.Code}
	e.Field, e.Message = startField(r, p.Field, p.Message)
	switch {
	case p.Code == events.CodeNotFound:
		status = http.StatusNotFound
	case len(p.Input) > 0:
		e.Code, e.Problems = "invalid_input", rawProblems(p.Input)
	}
	writeError(w, status, e)
}

// startField is how the request r names field, a member of a start
// command's data, and a message that begins with it: a JSON request (not
// a CloudEvent) calls the execution id "id".
func startField(r *http.Request, field, msg string) (string, string) {
	if field != "execution_id" || isCloudEvent(r) {
		return field, msg
	}
	if rest, ok := strings.CutPrefix(msg, field+" "); ok {
		msg = "id " + rest
	}
	return "id", msg
}

// answerExistingClaim answers when the execution id is already taken: the
// same request again gets the execution (200); another one gets 409.
func (s *Server) answerExistingClaim(w http.ResponseWriter, r *http.Request, id, key, digest string) bool {
	c, err := s.at(r).ids.Get(r.Context(), id)
	if errors.Is(err, claim.ErrNotFound) {
		return false
	}
	if err != nil {
		s.internal(w, r, err)
		return true
	}
	if err := c.Check(id, key, digest); err != nil {
		writeConflict(w, r, err)
		return true
	}
	resp := apiv1.Started{ID: id, Workflow: c.Workflow, Status: "accepted", Links: links(id)}
	if x, err := s.currentExecution(r.Context(), id); err == nil {
		x = public(x)
		resp.Status, resp.Execution, resp.Version = string(x.Status), &x, x.Version
	} else if ee := (*expiredError)(nil); errors.As(err, &ee) {
		resp.Status = "expired"
	}
	writeJSON(w, http.StatusOK, resp)
	return true
}

// writeConflict answers 409 for a start whose execution id another
// request holds (err is a claim.ConflictError), naming the field as the
// dispatcher's rejection does.
func writeConflict(w http.ResponseWriter, r *http.Request, err error) {
	field, _ := startField(r, "execution_id", "")
	writeError(w, http.StatusConflict, apiError{Code: events.CodeConflict, Field: field, Message: err.Error()})
}

// public is an execution's state as the api shows it: without the
// execution tokens, which fence agents' results and are nobody else's
// business (the history keeps them, for operators).
func public(x projections.Execution) projections.Execution {
	x.Token = ""
	if slices.ContainsFunc(x.Steps, func(st projections.Step) bool { return st.Token != "" }) {
		x.Steps = slices.Clone(x.Steps)
		for i := range x.Steps {
			x.Steps[i].Token = ""
		}
	}
	return x
}

// answerRejection answers with the stored rejection of a command, if any.
func (s *Server) answerRejection(w http.ResponseWriter, r *http.Request, key string) bool {
	// From the stream's leader: a replica may not have the rejection yet
	// (the stream allows direct gets).
	m, err := bus.LeaderGet(r.Context(), s.at(r).js, bus.StreamRejections, bus.MsgQuery{LastBySubject: bus.RejectionSubject(key)})
	if err != nil {
		return false
	}
	ev, err := bus.Decode(m.Header, m.Data)
	rej, ok := ev.Data.(*events.CommandRejected)
	if err != nil || !ok {
		return false
	}
	writeRejection(w, requestRejection(r, rej))
	return true
}

// writeRejection answers with a dispatcher's rejection: its code, the
// field it names and its reason.
func writeRejection(w http.ResponseWriter, p *events.CommandRejected) {
	status := map[string]int{events.CodeConflict: http.StatusConflict, events.CodeNotFound: http.StatusNotFound,
		events.CodeExpired: http.StatusGone, events.CodeDamaged: http.StatusConflict, events.CodeForbidden: http.StatusForbidden}[p.Code]
	writeError(w, cmpStatus(status), apiError{Code: p.Code, Field: p.Field, Message: oneLine(p.Reason)})
}

// requestRejection is p as the request r names its members (see
// startField).
func requestRejection(r *http.Request, p *events.CommandRejected) *events.CommandRejected {
	q := *p
	q.Field, q.Reason = startField(r, p.Field, p.Reason)
	return &q
}

func links(id string) map[string]string {
	return map[string]string{"self": "/v1/executions/" + id, "events": "/v1/executions/" + id + "/events"}
}

// publishStart publishes the command and waits for the dispatcher's
// verdict: ExecutionStarted (201), a rejection (4xx) or nothing yet (202).
func (s *Server) publishStart(w http.ResponseWriter, r *http.Request, cmd events.Event, start *events.StartExecution, key, digest string) {
	end := s.traceStart(r, &cmd, start)
	defer end()
	ch := make(chan *nats.Msg, 16)
	subStarted, err := subscribeInto(s.at(r).nc, bus.ExecutionSubject(start.Workflow, start.ExecutionID), ch)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer subStarted.Unsubscribe()
	subRejected, err := subscribeInto(s.at(r).nc, bus.RejectionSubject(key), ch)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer subRejected.Unsubscribe()

	msg, err := bus.Encode(bus.SubjectAPIStart, cmd)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Message: err.Error()})
		return
	}
	// The message id covers the data too: the same key with other data is
	// another request, which the dispatcher refuses instead of the stream
	// dropping it as a duplicate of the first.
	ack, err := s.publishCommand(r, msg, events.CommandMsgID(key+"#"+digest))
	if err != nil {
		s.internal(w, r, fmt.Errorf("publish start command: %w", err))
		return
	}
	if ack.Duplicate { // the same command was published before: answer with what became of it
		if s.answerExistingClaim(w, r, start.ExecutionID, key, digest) || s.answerRejection(w, r, key) {
			return
		}
	}
	answered := s.await(r, ch, func(ev events.Event) bool {
		switch p := ev.Data.(type) {
		case *events.ExecutionStarted:
			// The start may be another request's, which won the id's claim.
			if err := claim.Started(p).Check(start.ExecutionID, key, digest); err != nil {
				writeConflict(w, r, err)
				return true
			}
			writeJSON(w, http.StatusCreated, apiv1.Started{ID: start.ExecutionID, Workflow: start.Workflow, Version: p.Version,
				Status: string(projections.StatusStarted), Created: true, Links: links(start.ExecutionID)})
			return true
		case *events.CommandRejected:
			writeRejection(w, requestRejection(r, p))
			return true
		}
		return false
	})
	if !answered {
		writeJSON(w, http.StatusAccepted, apiv1.Started{ID: start.ExecutionID, Workflow: start.Workflow, Version: start.Version,
			Status: "accepted", Links: links(start.ExecutionID)})
	}
}

// await reads the events and rejections a command's subscriptions deliver
// until answer (which writes the response) returns true, the request ends
// (true: nothing more to write) or StartWait passes (false: the caller
// answers 202). The api stopping (Server.stopping) is not the request's
// end: the command is stored and a dispatcher handles it, which the
// caller's 202 says (false); an empty answer would tell a client that
// nothing was done.
//
// An event seen on a history subject counts only once the events stream
// holds it: the subscriptions are plain NATS ones, which also see an
// append that the stream refused (it lost the expected-sequence check to
// another writer) and may see one before the stream has stored it.
func (s *Server) await(r *http.Request, ch <-chan *nats.Msg, answer func(events.Event) bool) bool {
	deadline := time.Now().Add(s.cfg.StartWait)
	timeout := time.NewTimer(s.cfg.StartWait)
	defer timeout.Stop()
	for {
		select {
		case m := <-ch:
			ev, err := bus.Decode(m.Header, m.Data)
			if err != nil {
				continue
			}
			if strings.HasPrefix(m.Subject, bus.EventsPrefix+".") && !s.inHistory(r.Context(), m.Subject, ev, deadline) {
				continue
			}
			if answer(ev) {
				return true
			}
		case <-timeout.C:
			return false
		case <-s.stopping:
			return false
		case <-r.Context().Done():
			return !stoppedUnder(r)
		}
	}
}

// publishCommand publishes the command a request sends, with message id
// id. Neither the request's end nor the api stopping cuts the publish
// short (it waits as long as the api's JetStream requests do,
// bus.ServiceRequestTimeout): once the api has taken a request, its
// command is either stored or not, and the answer says which (a publish
// cut short could be stored all the same, behind an error that tells the
// client to send it again).
func (s *Server) publishCommand(r *http.Request, msg *nats.Msg, id string) (*jetstream.PubAck, error) {
	return s.at(r).js.PublishMsg(context.WithoutCancel(r.Context()), msg, jetstream.WithMsgID(id))
}

// inHistory reports whether ev, seen on the history subject, is stored
// there: the subject's first message after ev's previous event is ev (by
// its Nats-Msg-Id, the event's id). While the stream has nothing there
// yet, it looks again until deadline.
func (s *Server) inHistory(ctx context.Context, subject string, ev events.Event, deadline time.Time) bool {
	for {
		// From the leader: a replica may not have stored it yet.
		m, err := bus.LeaderGet(ctx, s.ns(ctx).js, bus.StreamEvents, bus.MsgQuery{Seq: ev.PrevSeq + 1, NextBySubject: subject})
		if err == nil {
			return m.Header.Get(jetstream.MsgIDHeader) == ev.ID // another event took its place: refused
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil { // not the request's end
			s.log.Warn().Err(err).Str("subject", subject).Msg("look up an event in the history")
		}
		if !time.Now().Before(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-s.stopping: // await answers 202 at once
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// querySeq reads a stream sequence from the query (0 when absent); on a
// bad value it answers 400 and returns false.
func querySeq(w http.ResponseWriter, r *http.Request, name string) (uint64, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: name, Message: name + " must be a non-negative integer"})
		return 0, false
	}
	return n, true
}

// tooLarge answers 413 if err comes from a body over the limit.
func tooLarge(w http.ResponseWriter, err error, limit int64) bool {
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) {
		return false
	}
	writeError(w, http.StatusRequestEntityTooLarge, apiError{Code: "too_large", Message: fmt.Sprintf("request body exceeds %d bytes", limit)})
	return true
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func cmpStatus(s int) int {
	if s == 0 {
		return http.StatusBadRequest
	}
	return s
}

// loadModel returns execution id's read model (stored), or the fold of
// its history while it has none yet (not stored): jetstream.ErrKeyNotFound
// for an id no execution has, an *expiredError for one deleted under its
// retention rule.
func (s *Server) loadModel(ctx context.Context, id string) (x projections.Execution, stored bool, err error) {
	if !events.ValidExecutionID(id) {
		return x, false, jetstream.ErrKeyNotFound
	}
	e, err := s.ns(ctx).execs.Get(ctx, id)
	if err == nil {
		err = json.Unmarshal(e.Value(), &x)
		return x, true, err
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return x, false, err
	}
	c, err := s.ns(ctx).ids.Get(ctx, id)
	if errors.Is(err, claim.ErrNotFound) {
		return x, false, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return x, false, err
	}
	if err := expired(id, c); err != nil {
		return x, false, err
	}
	x, err = s.foldExecution(ctx, id, c.Workflow)
	return x, false, err
}

// currentExecution is loadModel's answer, not behind the history: a read
// model the history has events past (under load the projector writes a
// model up to a -projector-coalesce after its events, and the api folded
// the history while the execution had no model yet) is replaced by the
// fold of the history, so that a GET does not answer a state older than
// one it answered before. It costs a look for the history's next event
// after the model's (one request, which finds none when the model is
// current), and the fold when there is one. A large execution's model
// (one that leaves anything out, Truncated, or of more than
// maxCurrentFold events) is answered as it is: its history is large to
// fold at each GET while it runs (a page open on it asks every few
// hundred milliseconds). So is a model whose check or fold fails (the
// events stream between leaders): it is logged, and the GET still
// answers.
func (s *Server) currentExecution(ctx context.Context, id string) (projections.Execution, error) {
	x, stored, err := s.loadModel(ctx, id)
	if err != nil || !stored || x.Truncated != nil || x.Events > maxCurrentFold || x.Workflow == "" {
		return x, err
	}
	subject := bus.ExecutionSubject(x.Workflow, id)
	// From the leader: a replica may not have stored the latest yet.
	_, err = bus.LeaderGet(ctx, s.ns(ctx).js, bus.StreamEvents, bus.MsgQuery{Seq: x.LastSeq + 1, NextBySubject: subject})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return x, nil // current
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Str("execution_id", id).Msg("read model answered as it is: its history's tail could not be read")
		}
		return x, nil
	}
	folded, err := s.foldExecution(ctx, id, x.Workflow)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Str("execution_id", id).Msg("read model answered as it is, behind its history: the history could not be folded")
		}
		return x, nil
	}
	return folded, nil
}

// maxCurrentFold bounds the history currentExecution folds at a GET: a
// thousand events fold in a few milliseconds.
const maxCurrentFold = 1000

func (s *Server) getExecution(w http.ResponseWriter, r *http.Request) {
	id, ok := executionID(w, r)
	if !ok {
		return
	}
	atSeq, ok := querySeq(w, r, "at_seq")
	if !ok {
		return
	}
	if atSeq > 0 {
		s.executionAt(w, r, id, atSeq)
		return
	}
	x, err := s.currentExecution(r.Context(), id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: fmt.Sprintf("execution %q does not exist", id)})
		return
	}
	if ee := (*expiredError)(nil); errors.As(err, &ee) {
		writeExpired(w, ee)
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, public(x))
}

// executionSteps answers a page of the execution's step instances
// (?offset, ?limit: 100, at most 1000), from the whole state: the read
// model, or the fold of the history when the read model leaves steps out
// or is behind it (currentExecution).
func (s *Server) executionSteps(w http.ResponseWriter, r *http.Request) {
	id, ok := executionID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	for _, p := range []struct {
		name     string
		dst      *int
		min, max int
	}{{"offset", &offset, 0, math.MaxInt32}, {"limit", &limit, 1, 1000}} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < p.min || n > p.max {
				writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: p.name,
					Message: fmt.Sprintf("%s must be a whole number from %d to %d", p.name, p.min, p.max)})
				return
			}
			*p.dst = n
		}
	}
	x, err := s.currentExecution(r.Context(), id)
	if err == nil && x.Truncated != nil && x.Truncated.Steps > 0 {
		x, err = s.foldExecution(r.Context(), id, x.Workflow)
	}
	switch ee := (*expiredError)(nil); {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: fmt.Sprintf("execution %q does not exist", id)})
		return
	case errors.As(err, &ee):
		writeExpired(w, ee)
		return
	case err != nil:
		s.internal(w, r, err)
		return
	}
	x = public(x)
	page := apiv1.StepPage{ID: id, Total: len(x.Steps), Offset: offset, Steps: []projections.Step{}}
	if offset < len(x.Steps) {
		page.Steps = x.Steps[offset:min(offset+limit, len(x.Steps))]
	}
	writeJSON(w, http.StatusOK, page)
}

// foldExecution folds execution id of workflow wf from its whole history
// (one with no event yet is pending). A damaged history folds as far as it
// goes, marked, as the projector stores it.
func (s *Server) foldExecution(ctx context.Context, id, wf string) (projections.Execution, error) {
	evs, err := s.ns(ctx).hist.Read(ctx, bus.ExecutionSubject(wf, id), 0)
	if err != nil {
		return projections.Execution{}, err
	}
	if len(evs) == 0 {
		return projections.Execution{ID: id, Status: projections.StatusPending, Steps: []projections.Step{}}, nil
	}
	return redact.FromHistory(evs).Execution(projections.FoldQuarantined(id, evs)), nil
}

// executionAt answers the execution's state as it was at stream sequence
// atSeq: the fold of its events up to and including that sequence.
func (s *Server) executionAt(w http.ResponseWriter, r *http.Request, id string, atSeq uint64) {
	notFound := func(msg string) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: msg})
	}
	if !events.ValidExecutionID(id) {
		notFound(fmt.Sprintf("execution %q does not exist", id))
		return
	}
	cl, ok := s.claimOf(w, r, id)
	if !ok {
		return
	}
	evs, err := history.ReadUntil(r.Context(), s.at(r).js, bus.ExecutionSubject(cl.Workflow, id), 0, atSeq)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if len(evs) == 0 {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "at_seq",
			Message: fmt.Sprintf("execution %q had no event at or before sequence %d", id, atSeq)})
		return
	}
	x := projections.FoldQuarantined(id, evs) // damaged at or before atSeq: shown so
	writeJSON(w, http.StatusOK, public(redact.FromHistory(evs).Execution(x)))
}

// scanExecutions lists read models sorted by id, filtered by workflow and
// status, paged with limit and the opaque cursor "after", reading them
// from the bucket: the list before the visibility index is live
// (listExecutions).
func (s *Server) scanExecutions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 50
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "limit", Message: "limit must be between 1 and 1000"})
			return
		}
		limit = n
	}
	wf, status, after := q.Get("workflow"), q.Get("status"), q.Get("after")
	var onlyDamaged bool
	if v := q.Get("damaged"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil || !b {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "damaged",
				Message: fmt.Sprintf("damaged=%q: use damaged=true to list the damaged executions only", v)})
			return
		}
		onlyDamaged = true
	}
	if wf != "" && !events.ValidWorkflowName(wf) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "workflow", Message: fmt.Sprintf("%q is not a valid workflow name", wf)})
		return
	}
	if status != "" && !slices.Contains(projections.ListedStatuses, projections.Status(status)) {
		names := make([]string, len(projections.ListedStatuses))
		for i, st := range projections.ListedStatuses {
			names[i] = string(st)
		}
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "status",
			Message: fmt.Sprintf("status %q is not one of %s", status, strings.Join(names, ", "))})
		return
	}
	deadline := time.Now().Add(listScanTime) // listing the keys counts too
	lister, err := s.at(r).execs.ListKeys(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	var keys []string
	for k := range lister.Keys() {
		if k > after {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	out := []apiv1.ExecutionSummary{}
	next, partial := "", false
	// Each read model examined is a request to the bucket: a filter that
	// matches few of many would make one list request read them all. The
	// work of one request is bounded; the page says where to go on.
	for i, k := range keys {
		if i == listScanMax || (i >= listScanMin && time.Now().After(deadline)) {
			next, partial = keys[i-1], true
			break
		}
		e, err := s.at(r).execs.Get(r.Context(), k)
		if err != nil {
			continue // deleted meanwhile
		}
		var x projections.Execution
		if json.Unmarshal(e.Value(), &x) != nil || (wf != "" && x.Workflow != wf) || (status != "" && string(x.Status) != status) ||
			(onlyDamaged && x.Damaged == nil) {
			continue
		}
		if len(out) == limit {
			next = out[len(out)-1].ID
			break
		}
		r := visibility.RowOf(x, nil) // counted as the index counts them
		out = append(out, apiv1.ExecutionSummary{ID: x.ID, Workflow: x.Workflow, Version: x.Version, Status: string(x.Status), Error: x.Error,
			Steps: r.Steps, Done: r.Done, StartedAt: x.StartedAt, EndedAt: x.EndedAt, Damaged: x.Damaged})
	}
	writeJSON(w, http.StatusOK, apiv1.ExecutionList{Executions: out, Next: next, Partial: partial})
}

// A list request examines at most listScanMax read models, for at most
// listScanTime; past either it answers the page so far, marked partial,
// with the cursor to go on from. It examines at least listScanMin
// whatever the time: on a loaded machine listing the keys alone could
// take the whole time, and a request that examined one read model made
// a client (which asks up to ten times to fill a page) give up with
// nothing found.
const (
	listScanMax  = 1000
	listScanMin  = 250
	listScanTime = 2 * time.Second
)

// view shows ev with the execution's writeOnly input values hidden.
func view(ev events.Event, in redact.Inputs) apiv1.Event {
	v := apiv1.Event{Seq: ev.Seq, ID: ev.ID, Type: ev.Type, Source: ev.Source, Subject: ev.Subject, Workflow: ev.Workflow, Time: ev.Time,
		Invalid: ev.Invalid}
	if ev.Invalid == "" {
		v.Data = in.EventData(ev.Type, ev.Raw)
	}
	return v
}

// inputsOf returns what to hide in the events of the history on subject, given some
// of its events (evs): their start, or else the history's first event.
func (s *Server) inputsOf(ctx context.Context, subject string, evs []events.Event) (redact.Inputs, error) {
	if len(evs) > 0 && evs[0].Type == events.TypeExecutionStarted {
		return redact.FromHistory(evs[:1]), nil
	}
	first, err := s.ns(ctx).hist.First(ctx, subject)
	if errors.Is(err, history.ErrNoEvent) {
		return redact.Inputs{}, nil
	}
	if err != nil {
		return redact.Inputs{}, err
	}
	return redact.FromHistory([]events.Event{first}), nil
}

// executionEvents returns the history from from_seq as JSON, or follows it
// live as server-sent events when the client accepts text/event-stream.
func (s *Server) executionEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := executionID(w, r)
	if !ok {
		return
	}
	from, ok := querySeq(w, r, "from_seq")
	if !ok {
		return
	}
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(last), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "Last-Event-ID",
				Message: fmt.Sprintf("Last-Event-ID %q is not an event id of this stream: ids are stream sequences (non-negative integers)", last)})
			return
		}
		from = n + 1 // the event after the last one the client has
	}
	cl, ok := s.claimOf(w, r, id)
	if !ok {
		return
	}
	subject := bus.ExecutionSubject(cl.Workflow, id) // the history of the workflow it was claimed for
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		s.followEvents(w, r, id, subject, from)
		return
	}
	evs, err := history.Read(r.Context(), s.at(r).js, subject, from)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	in, err := s.inputsOf(r.Context(), subject, evs)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := make([]apiv1.Event, len(evs))
	for i, ev := range evs {
		out[i] = view(ev, in)
	}
	writeJSON(w, http.StatusOK, apiv1.EventList{Events: out})
}

// sseKeepalive is how often an idle event stream sends a comment line.
const sseKeepalive = 15 * time.Second

// followInactive is how long the server keeps a follow's consumer once
// nothing pulls from it: the api deletes it when the follow ends
// (dropFollowed), and this reaps those of an api that stopped first. A
// follow pulls all the time (a pull lasts bus.PullExpiry).
const followInactive = 30 * time.Second

// dropFollowed deletes the consumer of a follow that ended, in the
// background (the answer's end does not wait for it). Left to the
// server's inactivity threshold, each follow's consumer would stay for
// followInactive, and a client following many executions, or one
// following again and again, would reach the stream's limit of
// consumers, failing every follow meanwhile.
func (s *Server) dropFollowed(js jetstream.JetStream, cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteConsumer(ctx, bus.StreamEvents, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			s.log.Debug().Err(err).Str("consumer", info.Name).Msg("delete a follow's consumer (the server reaps it when inactive)")
		}
	}()
}

// followEvents streams the history from stream sequence from as
// server-sent events (id = stream sequence, event = CloudEvents type,
// data = the event as JSON). It reads the history from its start to know
// where the execution stands, and ends once it has sent everything there
// is and the execution is settled (ended, or suspended) as of its latest
// events: a cancelled execution that was resumed since is followed on. A
// request that would get nothing more from a settled execution (a
// browser's EventSource reconnecting with the last event's id) is answered
// 204 No Content, which tells EventSource not to reconnect again.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, id, subject string, from uint64) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.internal(w, r, errors.New("streaming unsupported"))
		return
	}
	js := s.at(r).js
	cons, err := js.OrderedConsumer(r.Context(), bus.StreamEvents,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, InactiveThreshold: followInactive})
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer s.dropFollowed(js, cons) // after it.Stop
	it, err := cons.Messages(bus.Messages()...)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	defer it.Stop()
	// The stream ends when the api stops (a client's EventSource then
	// reconnects, to another api or this one restarted, from the last
	// event's id).
	follow, stopFollowing := context.WithCancel(r.Context())
	defer stopFollowing()
	go func() {
		select {
		case <-s.stopping:
			stopFollowing()
		case <-follow.Done():
		}
	}()
	streaming := false
	open := func() {
		if streaming {
			return
		}
		streaming = true
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		flusher.Flush()
	}
	if cons.CachedInfo().NumPending == 0 {
		open() // no history yet: the execution is about to start
	}
	status := projections.StatusNone
	var in redact.Inputs // from the start, the first event the consumer delivers
	for {
		waitCtx, cancel := context.WithTimeout(follow, sseKeepalive)
		m, err := it.Next(jetstream.NextContext(waitCtx))
		cancel()
		if err != nil {
			if follow.Err() != nil {
				if r.Context().Err() == nil {
					// The api stops: the stream ends as an open one ends
					// (not with an error, which would stop an EventSource,
					// or pkg/client's Follow, for good), and the client
					// reconnects from the last event's id.
					open()
				}
				return
			}
			if errors.Is(err, context.DeadlineExceeded) {
				open()
				_, _ = io.WriteString(w, ": keepalive\n\n")
				flusher.Flush()
				continue
			}
			if !streaming {
				s.internal(w, r, fmt.Errorf("follow history of %s: %w", id, err))
			}
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		ev, err := bus.Decode(m.Headers(), m.Data())
		if err != nil && !errors.Is(err, events.ErrUnknownType) {
			ev = bus.InvalidEvent(m.Subject(), m.Headers(), err) // sent flagged, as GET answers it
			ev.Time = md.Timestamp
		}
		ev.Seq = md.Sequence.Stream
		if ev.Invalid == "" {
			status = projections.StatusAfter(status, ev.Type)
		}
		if start, ok := ev.Data.(*events.ExecutionStarted); ok {
			in = redact.ForStart(start)
		}
		if ev.Seq >= from {
			open()
			b, _ := rawJSON(view(ev, in))
			name := string(ev.Type)
			if ev.Invalid != "" || name == "" {
				name = "invalid" // data.invalid says why
			}
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, name, b)
			flusher.Flush()
		}
		if md.NumPending > 0 {
			continue // not caught up: later events decide where it stands
		}
		if status.Settled() {
			if !streaming {
				w.WriteHeader(http.StatusNoContent)
			}
			return
		}
		open()
	}
}

// sdkErrorField is the attribute an sdk-go decoding error is about. A URI
// attribute that does not parse (source, dataschema) is named by its
// value only ("parse \"...\": net/url: ..."): the Ce- header holding
// that value names it.
func sdkErrorField(err error, h http.Header) string {
	if field := events.SDKErrorField(err); field != "" {
		return field
	}
	var uerr *url.Error
	if !errors.As(err, &uerr) {
		return ""
	}
	for _, attr := range []string{"source", "dataschema"} {
		if v := h.Get("Ce-" + attr); v != "" && v == uerr.URL {
			return attr
		}
	}
	return ""
}
