package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
)

// rejections collects the rejections the dispatcher publishes.
type rejections struct {
	ch chan *events.CommandRejected
}

func (s *stack) watchRejections(t *testing.T) *rejections {
	t.Helper()
	r := &rejections{ch: make(chan *events.CommandRejected, 64)}
	sub, err := s.nc.Subscribe(bus.RejectionsPrefix+".>", func(m *nats.Msg) {
		ev, err := bus.Decode(m.Header, m.Data)
		if p, ok := ev.Data.(*events.CommandRejected); err == nil && ok {
			r.ch <- p
		}
	})
	require.NoError(t, err)
	require.NoError(t, s.nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return r
}

// next returns the next rejection, failing the test if none comes.
func (r *rejections) next(t *testing.T) *events.CommandRejected {
	t.Helper()
	select {
	case p := <-r.ch:
		return p
	case <-time.After(30 * time.Second):
		t.Fatal("no rejection was published")
		return nil
	}
}

// TestEveryCommandMessageIsAnswered: whatever lands on a commands subject
// is either applied or rejected with a reason on jf.rejections.>; a
// message that names no command (no CloudEvent id) is rejected under its
// subject and stream sequence; one refused as it is decoded names the
// attribute at fault.
func TestEveryCommandMessageIsAnswered(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: hello\nsteps:\n  - id: a\n    kind: noop\n")
	rej := s.watchRejections(t)
	start := []byte(`{"workflow":"hello","execution_id":"never-1"}`)
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	for _, tt := range []struct {
		name    string
		subject string
		header  nats.Header
		data    []byte
		reason  string
		key     string // the rejection's command key; "" for subject#seq-N
		field   string // the attribute or member at fault, if named
	}{
		{name: "NoHeadersAtAll", subject: bus.SubjectStart, data: start, reason: "not a CloudEvent"},
		{name: "BinaryWithoutID", subject: bus.SubjectStart, data: start,
			header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"tour"}},
			reason: "has no id", field: "id"},
		{name: "MalformedStructuredJSON", subject: bus.SubjectStart, header: structured, data: []byte(`{"specversion":"1.0","id":`),
			reason: "not valid JSON"},
		{name: "StructuredWithoutID", subject: bus.SubjectStart, header: structured,
			data:   []byte(`{"specversion":"1.0","type":"io.jetflow.execution.start","source":"tour","data":{"workflow":"hello"}}`),
			reason: "has no id", field: "id"},
		// Refused as it is decoded, a structured event is still answered
		// under its source and id, where its sender listens.
		{name: "StructuredDataNotJSON", subject: bus.SubjectStart, header: structured,
			data: []byte(`{"specversion":"1.0","type":"io.jetflow.execution.start","source":"tour","id":"ct-1",` +
				`"datacontenttype":"text/plain","data":{"workflow":"hello"}}`),
			reason: "set datacontenttype to application/json", key: "tour#ct-1", field: "datacontenttype"},
		{name: "StructuredSpecVersion2", subject: bus.SubjectStart, header: structured,
			data:   []byte(`{"specversion":"2.0","type":"io.jetflow.execution.start","source":"tour","id":"sv-1","data":{"workflow":"hello"}}`),
			reason: "jetflow speaks CloudEvents 1.0", key: "tour#sv-1", field: "specversion"},
		{name: "StartOnTheSignalSubject", subject: bus.SubjectSignal,
			header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"tour"}, "ce-id": {"mis-1"}},
			data:   start, reason: "that subject takes " + string(events.TypeSignalExecution), key: "tour#mis-1"},
		{name: "UnknownCommandSubject", subject: bus.CommandsPrefix + ".bogus",
			header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"tour"}, "ce-id": {"bogus-1"}},
			data:   start, reason: "is not a command subject", key: "tour#bogus-1"},
		{name: "UnknownType", subject: bus.SubjectStart,
			header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {"com.example.nope"}, "ce-source": {"tour"}, "ce-id": {"nope-1"}},
			data:   start, reason: "not a jetflow command", key: "tour#nope-1"},
	} {
		// Published one at a time, so that each rejection is the next one.
		ack, err := s.js.PublishMsg(context.Background(), &nats.Msg{Subject: tt.subject, Header: tt.header, Data: tt.data})
		require.NoError(t, err, tt.name)
		p := rej.next(t)
		require.Equal(t, events.CodeInvalid, p.Code, tt.name)
		require.Contains(t, p.Reason, tt.reason, tt.name)
		require.NotContains(t, p.Reason, "\n", tt.name)
		require.Equal(t, tt.subject, p.Subject, tt.name)
		require.Equal(t, ack.Sequence, p.StreamSeq, tt.name)
		if tt.key == "" {
			tt.key = tt.subject + "#seq-" + jsonNumber(ack.Sequence)
		}
		require.Equal(t, tt.key, p.CommandKey, tt.name)
		require.Equal(t, tt.field, p.Field, tt.name)
	}
	// None of them started anything.
	_, err := s.c.Execution(context.Background(), "never-1")
	require.True(t, client.IsStatus(err, http.StatusNotFound), "%v", err)
	_, err = s.js.Stream(context.Background(), bus.StreamEvents)
	require.NoError(t, err)
	stream, err := s.js.Stream(context.Background(), bus.StreamEvents)
	require.NoError(t, err)
	_, err = stream.GetLastMsgForSubject(context.Background(), bus.ExecutionSubject("hello", "never-1"))
	require.True(t, errors.Is(err, jetstream.ErrMsgNotFound), "%v", err)
}

func jsonNumber(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestSameKeyOtherDataIsAConflict: a start with the source and id (or the
// Idempotency-Key) of an earlier one is the same request only with the
// same data: then it gets that execution (200); with other data it is a
// 409 over HTTP and a conflict rejection over NATS, and the execution is
// untouched.
func TestSameKeyOtherDataIsAConflict(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: hello\nsteps:\n  - id: a\n    kind: noop\n")
	url := s.info.APIURL + "/v1/executions"
	ce := func(input string) map[string]string {
		return map[string]string{"ce-specversion": "1.0", "ce-type": string(events.TypeStartExecution), "ce-source": "tour/curl", "ce-id": "order-1"}
	}
	status, e := postJSON(t, url, `{"workflow":"hello","input":{"who":"a"}}`, ce(""))
	require.Equal(t, http.StatusCreated, status, e.Message)
	status, e = postJSON(t, url, `{"workflow":"hello","input":{"who":"a"}}`, ce(""))
	require.Equal(t, http.StatusOK, status, e.Message)
	// Member order and spacing do not make another request.
	status, e = postJSON(t, url, `{ "input": {"who": "a"}, "workflow": "hello" }`, ce(""))
	require.Equal(t, http.StatusOK, status, e.Message)
	status, e = postJSON(t, url, `{"workflow":"hello","input":{"who":"b"}}`, ce(""))
	require.Equal(t, http.StatusConflict, status, e.Message)
	require.Contains(t, e.Message, "same key")
	require.Equal(t, "execution_id", e.Field, "a CloudEvent's data names the execution id so")

	// The same with an Idempotency-Key on a plain JSON start.
	key := map[string]string{"Idempotency-Key": "idem-1"}
	status, e = postJSON(t, url, `{"workflow":"hello","input":{"n":1}}`, key)
	require.Equal(t, http.StatusCreated, status, e.Message)
	status, e = postJSON(t, url, `{"workflow":"hello","input":{"n":1}}`, key)
	require.Equal(t, http.StatusOK, status, e.Message)
	status, e = postJSON(t, url, `{"workflow":"hello","input":{"n":2}}`, key)
	require.Equal(t, http.StatusConflict, status, e.Message)

	// Over NATS: the second event is rejected with code conflict.
	rej := s.watchRejections(t)
	pub := func(input string) {
		msg := &nats.Msg{Subject: bus.SubjectStart, Data: []byte(`{"workflow":"hello","input":` + input + `}`),
			Header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"tour/nats"}, "ce-id": {"order-9"}}}
		_, err := s.js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	pub(`{"who":"first"}`)
	id := events.DerivedExecutionID(events.CommandKey("tour/nats", "order-9"))
	x := s.waitDone(t, id, 20*time.Second)
	pub(`{"who":"second"}`)
	p := rej.next(t)
	require.Equal(t, events.CodeConflict, p.Code)
	require.Contains(t, p.Reason, "same key")
	require.Equal(t, id, p.ExecutionID)
	after, err := s.c.Execution(ctx, id)
	require.NoError(t, err)
	require.JSONEq(t, `{"who":"first"}`, string(after.Input))
	// Nothing appended: by the history itself, which the rejection must
	// not touch (a read model could once be older than the end waitDone
	// saw from the fold; GET now folds a model behind the history).
	evs, err := s.c.Events(ctx, id, 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	require.Equal(t, x.LastSeq, evs[len(evs)-1].Seq)
}

// TestPublicAnswersHoldNoToken: execution tokens fence agents' results;
// no api answer shows them (the history keeps them for operators).
func TestPublicAnswersHoldNoToken(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: hello\nsteps:\n  - id: a\n    kind: noop\n")
	body := `{"workflow":"hello","id":"tok-1"}`
	key := map[string]string{"Idempotency-Key": "tok-1"}
	status, e := postJSON(t, s.info.APIURL+"/v1/executions", body, key)
	require.Equal(t, http.StatusCreated, status, e.Message)
	s.waitDone(t, "tok-1", 20*time.Second)
	var token string
	for _, ev := range s.history(t, "tok-1") {
		if p, ok := ev.Data.(*events.ExecutionStarted); ok {
			token = p.Token
		}
	}
	require.NotEmpty(t, token)
	for _, req := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/executions", body}, // the repeated request answers with the execution
		{http.MethodGet, "/v1/executions/tok-1", ""},
		{http.MethodGet, "/v1/executions/tok-1?at_seq=1000000", ""},
		{http.MethodGet, "/v1/executions", ""},
	} {
		r, err := http.NewRequest(req.method, s.info.APIURL+req.path, strings.NewReader(req.body))
		require.NoError(t, err)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "tok-1")
		resp, err := apiHTTP.Do(r)
		require.NoError(t, err)
		var raw json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
		resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, "%s %s: %s", req.method, req.path, raw)
		require.NotContains(t, string(raw), token, "%s %s", req.method, req.path)
		require.NotContains(t, string(raw), `"token"`, "%s %s", req.method, req.path)
	}
}

// TestQueryParametersAndNamesAreChecked: a misspelt query parameter is a
// 400 naming it, never a silently unfiltered answer; a workflow name that
// cannot be one is a 400, not a 404, and so is an execution id.
func TestQueryParametersAndNamesAreChecked(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	for _, tt := range []struct{ path, field string }{
		{"/v1/executions?wokflow=x", "wokflow"},
		{"/v1/executions?workflow=hello&limit=5&bogus=1", "bogus"},
		{"/v1/executions/x/events?fromseq=3", "fromseq"},
		{"/v1/workflows?name=x", "name"},
		{"/v1/locks?held=true", "held"},
		{"/v1/executions?=2", "query"}, // a parameter with no name
		{"/v1/workflows/a%20b", "name"},
		{"/v1/workflows/a%20b/versions/1", "name"},
		{"/v1/executions/bad%20id!", "id"},
		{"/v1/executions/bad%20id!/events", "id"},
		{"/v1/executions/bad%20id!/steps", "id"},
	} {
		resp, err := apiHTTP.Get(s.info.APIURL + tt.path)
		require.NoError(t, err)
		var body struct{ Error client.Error }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, tt.path)
		require.Equal(t, tt.field, body.Error.Field, tt.path)
		require.Contains(t, body.Error.Message, tt.field, tt.path)
	}
}
