package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/natstest"
)

// Names of what fuzzServer puts in place, so that requests about them get
// past the lookups to the decoding that follows.
const (
	fuzzWorkflow  = "fz"
	fuzzExecution = "fz-1"    // claimed, with a history that ended
	fuzzRunning   = "fz-2"    // claimed, started, not ended
	fuzzLock      = "fz-lock" // held by fuzzRunning
)

// fuzzServer is the api's real handler over an embedded JetStream (one
// per fuzzing process), without a dispatcher: a command is published and
// answered 202 after StartWait (1 ms here). Authentication is off, so
// that every request reaches its route's decoding.
func fuzzServer(f *testing.F) http.Handler {
	f.Helper()
	_, js := natstest.Connect(f, natstest.RunJetStream(f))
	srv, err := New(context.Background(), Config{StartWait: time.Millisecond, MaxBody: 4 << 10, Auth: AuthConfig{Disabled: true}},
		js.Conn(), js, zerolog.Nop())
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/workflows", strings.NewReader(fuzzDefinition)))
	if rec.Code != http.StatusCreated {
		f.Fatalf("register the fuzz workflow: %d %s", rec.Code, rec.Body)
	}
	ctx := context.Background()
	ids, err := claim.Open(ctx, js)
	if err != nil {
		f.Fatal(err)
	}
	start := &events.ExecutionStarted{Workflow: fuzzWorkflow, Version: 1, Token: "t",
		Steps: []events.StepRef{{ID: "wait", Kind: "wait"}}, Input: json.RawMessage(`{"who":"fuzz"}`)}
	for id, ps := range map[string][]events.Payload{
		fuzzExecution: {start, &events.ExecutionSucceeded{}},
		fuzzRunning:   {start},
	} {
		if _, err := ids.Claim(ctx, id, claim.Record{CommandKey: "fuzz#" + id, Workflow: fuzzWorkflow, ClaimedAt: time.Now()}); err != nil {
			f.Fatal(err)
		}
		var last uint64
		for _, p := range ps {
			if last, err = history.Append(ctx, js, bus.ExecutionSubject(fuzzWorkflow, id), last,
				events.New("fuzz", id, fuzzWorkflow, time.Now(), p)); err != nil {
				f.Fatal(err)
			}
		}
	}
	// The list's visibility index, live: a list by time or attribute is
	// answered 503 until it is.
	feed, err := openFeed(ctx, Config{}, DefaultNamespace, js, srv.def.defs, zerolog.Nop())
	if err != nil {
		f.Fatal(err)
	}
	srv.feeds[DefaultNamespace] = feed
	feedCtx, stopFeed := context.WithCancel(ctx)
	fed := make(chan error, 1)
	go func() { fed <- feed.Run(feedCtx) }()
	f.Cleanup(func() {
		stopFeed()
		if err := <-fed; err != nil {
			f.Errorf("the visibility feed stopped with an error: %v", err)
		}
		feed.Store().Close()
	})
	natstest.Eventually(f, 30*time.Second, feed.Live, "the visibility index is live")
	locks, err := lock.Open(ctx, js, nil)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := locks.Enqueue(ctx, fuzzLock, 1, lock.Entry{ExecutionID: fuzzRunning, Workflow: fuzzWorkflow, Request: 1}); err != nil {
		f.Fatal(err)
	}
	return h
}

const fuzzDefinition = `name: fz
input:
  type: object
  properties: {who: {type: string, writeOnly: true}}
steps:
  - {id: wait, kind: wait, signal: go}
`

// fuzzRequests are real requests: those of the tests and of docs/api.md.
var fuzzRequests = []struct {
	method, target, header, body string
}{
	{"GET", "/healthz", "", ""},
	{"GET", "/readyz", "", ""},
	{"POST", "/v1/workflows", "", "name: hello\ndescription: hi\nsteps:\n  - id: greet\n    kind: log\n    message: hello\n  - {id: done, kind: noop}\n"},
	{"POST", "/v1/workflows", "Content-Type: application/json", `{"name":"j","version":2,"steps":[{"id":"a","kind":"noop"}]}`},
	{"GET", "/v1/workflows", "", ""},
	{"GET", "/v1/workflows/fz", "", ""},
	{"GET", "/v1/workflows/fz/versions/1", "", ""},
	{"POST", "/v1/executions", "Content-Type: application/json", `{"workflow":"fz","input":{"who":"a"}}`},
	{"POST", "/v1/executions", "Content-Type: application/json\nIdempotency-Key: order-77", `{"workflow":"fz"}`},
	{"POST", "/v1/executions", "Content-Type: application/json", `{"workflow":"fz","version":1,"id":"x-7","wait_after_fail":true,"dry_run":true}`},
	{"POST", "/v1/executions", "Content-Type: application/json", `{"workflow":"typed","input":{"count":0}}`},
	{"POST", "/v1/executions", "Content-Type: application/json", `{"workflow":"fz","id":"a b"}`},
	{"POST", "/v1/executions", "Content-Type: application/json", `{"workflow":"fz","id":"fz-1"}`},
	{"POST", "/v1/executions", "Ce-Specversion: 1.0\nCe-Type: io.jetflow.execution.start\nCe-Source: tour/curl\nCe-Id: order-2001\nContent-Type: application/json",
		`{"workflow":"fz","input":{"who":"http binary"}}`},
	{"POST", "/v1/executions", "Ce-Specversion: 1.0\nCe-Type: io.jetflow.execution.start\nCe-Source: urn:test\nCe-Id: ce-1\nCe-Time: 2026-01-02T03:04:05Z\nContent-Type: application/json",
		`{"workflow":"fz","execution_id":"x-taken","version":1}`},
	{"POST", "/v1/executions", "Content-Type: application/cloudevents+json",
		`{"specversion":"1.0","type":"io.jetflow.execution.start","source":"tour/curl","id":"order-2002","datacontenttype":"application/json","data":{"workflow":"fz","input":{"who":"structured"}}}`},
	{"POST", "/v1/executions", "Content-Type: application/cloudevents+json", `{"specversion":"0.3","type":"x","source":"s","id":"1"}`},
	{"GET", "/v1/executions", "", ""},
	{"GET", "/v1/executions?workflow=fz&status=succeeded&limit=2", "", ""},
	{"GET", "/v1/executions?damaged=true&after=fz-1", "", ""},
	{"GET", "/v1/executions?limit=0&status=nope&workflow=a.b", "", ""},
	{"GET", "/v1/executions?sort=started_desc&started_after=2026-01-02T03:04:05Z&attr=customer:acme&attr=tier:gold", "", ""},
	{"GET", "/v1/executions?sort=ended_asc&ended_before=2026-01-02T03:04:05Z&after=ZW5kZWRfYXNjLzEveA", "", ""},
	{"GET", "/v1/executions?sort=sideways&attr=:x&started_before=yesterday", "", ""},
	{"GET", "/v1/executions/fz-1", "", ""},
	{"GET", "/v1/executions/fz-1?at_seq=1", "", ""},
	{"GET", "/v1/executions/fz-2/steps?offset=0&limit=2", "", ""},
	{"GET", "/v1/executions/fz-1/events?from_seq=1", "", ""},
	{"GET", "/v1/executions/fz-1/events", "Accept: text/event-stream\nLast-Event-ID: 1", ""},
	{"POST", "/v1/executions/fz-2/signals/go", "Content-Type: application/json\nIdempotency-Key: sig-1", `{"by":"alice","note":"go ahead"}`},
	{"POST", "/v1/executions/fz-2/signals/go", "", ""},
	{"POST", "/v1/executions/fz-2/actions", "Content-Type: application/json", `{"action":"cancel","reason":"wrong image tag","requested_by":"alice"}`},
	{"POST", "/v1/executions/fz-1/actions", "Content-Type: application/json", `{"action":"replay","from":"blk/deploy","force":true}`},
	{"POST", "/v1/executions/fz-1/actions", "Content-Type: application/json", `{"action":"repair","ignore_seq":3}`},
	{"POST", "/v1/executions/fz-2/actions", "Content-Type: application/json\nIdempotency-Key: act-1", `{"action":"resume"}`},
	{"GET", "/v1/locks", "", ""},
	{"GET", "/v1/locks/fz-lock", "", ""},
	{"DELETE", "/v1/locks/fz-lock", "", `{"reason":"l1 hangs","requested_by":"alice","execution_id":"fz-2"}`},
	{"GET", "/v1/settings", "", ""},
	{"POST", "/v1/admin/projections/rebuild?from_seq=0", "", ""},
	{"GET", "/v1/admin/projections/parked", "", ""},
	{"POST", "/v1/admin/keys", "", `{"name":"ci-bot","scopes":["read","start"],"namespaces":["default"],"expires_in":"90d"}`},
	{"GET", "/v1/admin/keys", "", ""},
	{"DELETE", "/v1/admin/keys/0123456789abcdef", "", ""},
	{"GET", "/v1/executions", "Jetflow-Namespace: other", ""},
	{"PUT", "/v1/executions", "", ""},
}

// FuzzRequest sends any request to the api's real handler: method, target
// (path and query), headers ("Name: value" lines) and body. Whatever it
// is, the api does not panic, never answers 5xx (nothing here is the
// server's fault: NATS is up), and every 4xx is a JSON error with a code
// and a message; a 400 names the field at fault (or, for a body that is
// not JSON at all, says so).
func FuzzRequest(f *testing.F) {
	h := fuzzServer(f)
	for _, r := range fuzzRequests {
		f.Add(r.method, r.target, r.header, []byte(r.body))
	}
	f.Fuzz(func(t *testing.T, method, target, header string, body []byte) {
		req, err := http.NewRequest(method, "http://api.test"+target, bytes.NewReader(body))
		if err != nil || req.URL.Host != "api.test" {
			return // not a request a client could send
		}
		for _, line := range strings.Split(header, "\n") {
			name, value, ok := strings.Cut(line, ":")
			if !ok || !validHeaderName(name) {
				continue
			}
			req.Header.Add(name, strings.TrimSpace(value))
		}
		// Nothing takes long, but a server-sent events stream of a running
		// execution, which lasts until its client goes: this one goes
		// 100 ms after the stream has begun (on a busy machine, beginning
		// may take longer than that).
		const wait = 5 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		rec := &streamRecorder{ResponseRecorder: httptest.NewRecorder(), begun: make(chan struct{})}
		go func() {
			select {
			case <-rec.begun:
				time.Sleep(100 * time.Millisecond)
				cancel()
			case <-ctx.Done():
			}
		}()
		h.ServeHTTP(rec, req.WithContext(ctx))
		if ctx.Err() != nil && rec.Header().Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s %s took %s", method, target, wait)
		}
		checkAnswer(t, req, rec.ResponseRecorder)
	})
}

// streamRecorder is a ResponseRecorder that tells when a server-sent
// events stream has begun (its first flush).
type streamRecorder struct {
	*httptest.ResponseRecorder
	begun chan struct{}
	once  sync.Once
}

func (r *streamRecorder) Flush() {
	r.ResponseRecorder.Flush()
	if r.Header().Get("Content-Type") == "text/event-stream" {
		r.once.Do(func() { close(r.begun) })
	}
}

// validHeaderName reports whether name is a header name (a token), as the
// HTTP server would accept it.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

// checkAnswer holds the api's answer to req to its contract.
func checkAnswer(t *testing.T, req *http.Request, rec *httptest.ResponseRecorder) {
	t.Helper()
	what := req.Method + " " + req.URL.String()
	switch {
	case rec.Code >= 500:
		t.Fatalf("%s: %d %s", what, rec.Code, rec.Body)
	case rec.Code < 400:
		return
	}
	var body apiv1.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error == nil {
		t.Fatalf("%s: %d, and the body is no JSON error (%v): %s", what, rec.Code, err, rec.Body)
	}
	e := body.Error
	if e.Code == "" || e.Message == "" {
		t.Fatalf("%s: %d without a code or message: %s", what, rec.Code, rec.Body)
	}
	// A member whose name is "" is named so: only the message shows it.
	if rec.Code == http.StatusBadRequest && e.Field == "" && !wholeBodyAtFault(e) && !strings.Contains(e.Message, `unknown member ""`) {
		t.Fatalf("%s: 400 naming no field: %s", what, rec.Body)
	}
}

// wholeBodyAtFault reports whether e, naming no field, is about the body
// as a whole: it is not JSON at all (a request or a structured
// CloudEvent), or a definition whose problems are
// placed by their lines (one about the whole definition, such as an empty
// one, is placed nowhere).
func wholeBodyAtFault(e *apiv1.Error) bool {
	switch e.Code {
	case "invalid_json":
		return true
	case "invalid_cloudevent":
		return strings.HasPrefix(e.Message, "the structured CloudEvent is not valid JSON")
	case "invalid_definition":
		var problems []struct {
			Field string `json:"field"`
			Line  int    `json:"line"`
		}
		if json.Unmarshal(e.Problems, &problems) != nil || len(problems) == 0 {
			return false
		}
		for _, p := range problems {
			if p.Field == "" && p.Line == 0 && len(problems) > 1 {
				return false // one of several problems that says not where
			}
		}
		return true
	}
	return false
}

// TestBadAttributeHeader: a binary-mode header ce-<name> whose name is no
// CloudEvents attribute name is named, with the name it gives (sdk-go
// says "bad key", naming none; FuzzRequest found it).
func TestBadAttributeHeader(t *testing.T) {
	h := http.Header{}
	h.Set("Ce-Source", "tour/curl")
	h.Set("Ce-Myext", "x")
	header, attr := badAttributeHeader(h)
	require.Empty(t, header)
	require.Empty(t, attr)

	h.Set("Ce-Sotion.staow.execuurce", "tour/curl")
	h.Set("Ce-My_ext", "x")
	header, attr = badAttributeHeader(h)
	require.Equal(t, "Ce-My_ext", header, "the first in sorted order")
	require.Equal(t, "my_ext", attr)
	h.Del("Ce-My_ext")
	header, attr = badAttributeHeader(h)
	require.Equal(t, "Ce-Sotion.staow.execuurce", header)
	require.Equal(t, "sotion.staow.execuurce", attr)
}
