package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
)

// clientSamples are the arguments of pkg/client's methods, by type: values
// a caller could pass (a test that calls the methods with them fails,
// naming the type, when a method takes an argument of another type).
var clientSamples = map[reflect.Type]any{
	// Every path parameter takes it: an execution id, a workflow, lock or
	// signal name, an api key's id.
	reflect.TypeFor[string]():          "0123456789abcdef",
	reflect.TypeFor[int]():             2,
	reflect.TypeFor[uint64]():          uint64(2),
	reflect.TypeFor[[]byte]():          []byte("name: hello\nsteps:\n  - {id: a, kind: noop}\n"),
	reflect.TypeFor[json.RawMessage](): json.RawMessage(`{"by": "alice"}`),
	reflect.TypeFor[client.StartRequest](): client.StartRequest{Workflow: "hello", Version: 2, Input: map[string]any{"who": "ada"},
		ID: "hello-1", WaitAfterFail: true, DryRun: true, IdempotencyKey: "order-77"},
	reflect.TypeFor[client.ListOptions](): client.ListOptions{Workflow: "hello", Status: "succeeded", After: "hello-1", Limit: 10, Damaged: true},
	reflect.TypeFor[client.ActionRequest](): client.ActionRequest{Action: "replay", Reason: "wrong tag", RequestedBy: "alice",
		From: "start", Force: true, Version: 2},
	reflect.TypeFor[client.ClearLockRequest](): client.ClearLockRequest{ExecutionID: "hello-1", Reason: "hangs", RequestedBy: "alice"},
	reflect.TypeFor[client.KeyRequest](): client.KeyRequest{Name: "ci-bot", Scopes: []string{"read", "start"}, Namespaces: []string{"default"},
		ExpiresIn: "30d"},
}

// recorded is a request as a server received it.
type recorded struct {
	method, target string
	header         http.Header
	body           []byte
}

// TestClientKeepsToTheOpenAPIDocument: every request pkg/client makes is
// an operation of the document. Each exported method of *client.Client is
// called (found by reflection: a method added later is checked without
// a list to keep) against a server that records the requests and answers
// {} (204 to an event stream). Each request must find its operation by
// method and path, send only the query parameters the operation
// documents, and pass the document's validation of a request: its path
// and query parameters, its headers and its body against the schema.
func TestClientKeepsToTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	v := newValidator(t)
	var (
		mu  sync.Mutex
		got []recorded
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, recorded{method: r.Method, target: r.URL.RequestURI(), header: r.Header.Clone(), body: body})
		mu.Unlock()
		if r.Header.Get("Accept") == "text/event-stream" {
			w.WriteHeader(http.StatusNoContent) // the execution is settled: Follow returns
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	c := client.New(srv.URL, client.WithToken("jfk_0123456789abcdef_secret"), client.WithNamespace("default"))
	c.RetryFor = -1
	t.Cleanup(func() {
		c.HTTP.CloseIdleConnections()
		srv.Close()
	})

	cv := reflect.ValueOf(c)
	require.Positive(t, cv.NumMethod())
	for i := range cv.NumMethod() {
		m := cv.Type().Method(i)
		var args []reflect.Value
		for j := 1; j < m.Type.NumIn(); j++ { // 0 is the receiver
			args = append(args, clientSample(t, m.Name, m.Type.In(j)))
		}
		mu.Lock()
		before := len(got)
		mu.Unlock()
		out := cv.Method(i).Call(args)
		if last := out[len(out)-1]; last.Type() == reflect.TypeFor[error]() {
			require.Nil(t, last.Interface(), "Client.%s", m.Name)
		}
		mu.Lock()
		sent := got[before:]
		mu.Unlock()
		require.NotEmpty(t, sent, "Client.%s sent no request", m.Name)
		for _, r := range sent {
			if err := v.checkRequest(t.Context(), r); err != nil {
				t.Errorf("Client.%s sends %s %s, not a request openapi.json describes: %v", m.Name, r.method, r.target, err)
			}
		}
	}
}

// clientSample is the argument of type typ of pkg/client's method.
func clientSample(t *testing.T, method string, typ reflect.Type) reflect.Value {
	t.Helper()
	if typ.Kind() == reflect.Func { // a callback: it returns zero values (a nil error)
		return reflect.MakeFunc(typ, func([]reflect.Value) []reflect.Value {
			var out []reflect.Value
			for k := range typ.NumOut() {
				out = append(out, reflect.Zero(typ.Out(k)))
			}
			return out
		})
	}
	if typ == reflect.TypeFor[context.Context]() {
		return reflect.ValueOf(t.Context())
	}
	v, ok := clientSamples[typ]
	require.True(t, ok, "Client.%s takes a %s: give a sample of it in clientSamples", method, typ)
	return reflect.ValueOf(v)
}

// checkRequest returns why r is no request the document describes; nil
// if it is one.
func (v validator) checkRequest(ctx context.Context, r recorded) error {
	req, err := http.NewRequestWithContext(ctx, r.method, "http://api.test"+r.target, bytes.NewReader(r.body))
	if err != nil {
		return err
	}
	req.Header = r.header
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		return err
	}
	documented := map[string]bool{}
	for _, p := range route.Operation.Parameters {
		if p.Value.In == openapi3.ParameterInQuery {
			documented[p.Value.Name] = true
		}
	}
	for name := range req.URL.Query() {
		if !documented[name] {
			return &openapi3filter.RequestError{Reason: "the query parameter " + name + " is not documented"}
		}
	}
	return openapi3filter.ValidateRequest(ctx, &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}})
}
