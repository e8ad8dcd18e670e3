package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/services/api/access"
)

// The OpenAPI document (openapi.json, served at GET /v1/openapi.json) is
// the api's contract. These tests hold the server to it and it to the
// server: the same routes, query parameters and scopes as the route
// table; every documented route answers; every answer of the server to
// real requests is one the document describes (its status, and its body
// against its schema). openapi_client_test.go holds pkg/client to it.

// loadOpenAPI parses and validates the served document with kin-openapi,
// as an OpenAPI 3.1 document: its schemas with the JSON Schema 2020-12
// validator.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openAPI)
	require.NoError(t, err, "openapi.json does not load")
	require.True(t, doc.IsOpenAPI31OrLater(), "openapi.json is OpenAPI %s, not 3.1", doc.OpenAPI)
	require.NoError(t, doc.Validate(loader.Context, openapi3.EnableMultiError(), openapi3.EnableSchemaFormatValidation()),
		"openapi.json is no valid OpenAPI 3.1 document")
	return doc
}

// openAPIRouter finds a request's operation in the document.
func openAPIRouter(t *testing.T, doc *openapi3.T) routers.Router {
	t.Helper()
	r, err := legacy.NewRouter(doc)
	require.NoError(t, err)
	return r
}

// documentedOperations are the document's operations, by route pattern
// ("METHOD /path", as the route table has them).
func documentedOperations(doc *openapi3.T) map[string]*openapi3.Operation {
	out := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			out[method+" "+path] = op
		}
	}
	return out
}

// TestOpenAPIDocumentIsValid: the document loads and validates as
// OpenAPI 3.1, every operation's security names the bearer scheme with
// one scope, and every operation has an id of its own.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	require.Contains(t, doc.Components.SecuritySchemes, "bearer")
	require.Equal(t, "bearer", doc.Components.SecuritySchemes["bearer"].Value.Scheme)
	ids := map[string]string{}
	for pattern, op := range documentedOperations(doc) {
		require.NotEmpty(t, op.OperationID, "%s has no operationId", pattern)
		require.NotContains(t, ids, op.OperationID, "%s and %s have the same operationId", pattern, ids[op.OperationID])
		ids[op.OperationID] = pattern
		require.NotNil(t, op.Security, "%s says nothing of its security", pattern)
		for _, req := range *op.Security {
			for scheme, scopes := range req {
				require.Contains(t, doc.Components.SecuritySchemes, scheme, "%s names the security scheme %s", pattern, scheme)
				if op.Extensions["x-jetflow-scope"] == string(access.ScopeAny) {
					require.Empty(t, scopes, "%s takes any valid token: its requirement names no scope", pattern)
					continue
				}
				require.Len(t, scopes, 1, "%s needs one scope", pattern)
			}
		}
		require.NotNil(t, op.Responses.Status(http.StatusBadRequest), "%s: every route answers 400 to a query parameter it does not take", pattern)
	}
}

// TestOpenAPIDocumentsEveryRoute: every route the server registers is an
// operation of the document, with the same method and path, and every
// operation of the document is a route the server registers.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	documented := documentedOperations(loadOpenAPI(t))
	served := map[string]bool{}
	for _, rt := range (&Server{}).routes() {
		served[rt.pattern] = true
		if _, ok := documented[rt.pattern]; !ok {
			t.Errorf("the server registers %s, which openapi.json does not document", rt.pattern)
		}
	}
	for pattern := range documented {
		if !served[pattern] {
			t.Errorf("openapi.json documents %s, which the server does not register", pattern)
		}
	}
}

// TestOpenAPIParamsAndScopesAreTheRouteTables: each operation's query
// parameters are the route table's params (which the server holds it to:
// any other is a 400), its path parameters those of its pattern, and the
// scope it says it needs (x-jetflow-scope, its security requirement,
// its description) the route table's scope.
func TestOpenAPIParamsAndScopesAreTheRouteTables(t *testing.T) {
	t.Parallel()
	documented := documentedOperations(loadOpenAPI(t))
	for _, rt := range (&Server{}).routes() {
		op, ok := documented[rt.pattern]
		if !ok {
			continue // TestOpenAPIDocumentsEveryRoute says so
		}
		var query, path []string
		namespaced := false
		for _, p := range op.Parameters {
			switch p.Value.In {
			case openapi3.ParameterInQuery:
				query = append(query, p.Value.Name)
			case openapi3.ParameterInPath:
				path = append(path, p.Value.Name)
			case openapi3.ParameterInHeader:
				namespaced = namespaced || p.Value.Name == NamespaceHeader
			}
		}
		require.ElementsMatch(t, rt.params, query, "the query parameters of %s in openapi.json are not the route table's", rt.pattern)
		var inPattern []string
		for _, m := range pathParamRe.FindAllStringSubmatch(rt.pattern, -1) {
			inPattern = append(inPattern, m[1])
		}
		require.ElementsMatch(t, inPattern, path, "the path parameters of %s in openapi.json", rt.pattern)

		scope := cmp.Or(string(rt.scope), "none")
		require.Equal(t, scope, op.Extensions["x-jetflow-scope"], "the x-jetflow-scope of %s in openapi.json is not the route table's", rt.pattern)
		require.NotNil(t, op.Security, "%s says nothing of its security", rt.pattern)
		switch rt.scope {
		case "":
			require.Empty(t, *op.Security, "%s is public: its security requirement is empty", rt.pattern)
			require.Contains(t, op.Description, "Public", rt.pattern)
			require.Nil(t, op.Responses.Status(http.StatusUnauthorized), "%s is public: it never answers 401", rt.pattern)
		case access.ScopeAny:
			require.Equal(t, openapi3.SecurityRequirements{{"bearer": {}}}, *op.Security, "the security of %s in openapi.json", rt.pattern)
			require.Contains(t, op.Description, "any scope", rt.pattern)
			require.NotNil(t, op.Responses.Status(http.StatusUnauthorized), "%s needs a token: it answers 401 without", rt.pattern)
			require.Nil(t, op.Responses.Status(http.StatusForbidden), "%s takes any valid token: it never answers 403", rt.pattern)
		default:
			require.Equal(t, openapi3.SecurityRequirements{{"bearer": {scope}}}, *op.Security, "the security of %s in openapi.json", rt.pattern)
			require.Contains(t, op.Description, "scope `"+scope+"`", rt.pattern)
			require.NotNil(t, op.Responses.Status(http.StatusUnauthorized), "%s needs a token: it answers 401 without", rt.pattern)
			require.NotNil(t, op.Responses.Status(http.StatusForbidden), "%s needs a scope: it answers 403 without", rt.pattern)
		}
		require.Equal(t, rt.scope != "" && !rt.global, namespaced, "%s takes the %s header if and only if it is about a namespace", rt.pattern, NamespaceHeader)
	}
}

// validator checks the api's answers against the document.
type validator struct {
	doc    *openapi3.T
	router routers.Router
}

var registerStreamDecoder sync.Once

func newValidator(t *testing.T) validator {
	t.Helper()
	registerStreamDecoder.Do(func() {
		// A server-sent event stream is text; the document says so.
		openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
	})
	doc := loadOpenAPI(t)
	return validator{doc: doc, router: openAPIRouter(t, doc)}
}

// check returns why the answer a to req is not one the document
// describes; nil if it is.
func (v validator) check(ctx context.Context, req *http.Request, a reply) error {
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		return err
	}
	return openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 a.status,
		Header:                 a.header,
		Body:                   io.NopCloser(bytes.NewReader(a.body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	})
}

// reply is an answer of the api, read.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// send sends a request to the api at base, with the headers of header
// ("Name: value" lines), and returns the request and the answer.
func send(t *testing.T, base, method, target, header, body string) (*http.Request, reply) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+target, strings.NewReader(body))
	require.NoError(t, err)
	for line := range strings.SplitSeq(header, "\n") {
		if name, value, ok := strings.Cut(line, ":"); ok {
			req.Header.Add(name, strings.TrimSpace(value))
		}
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return req, reply{status: resp.StatusCode, header: resp.Header, body: data}
}

// catchAll reports whether an answer is the catch-all's, for a path no
// route has or a method the path does not take.
func catchAll(status int, body []byte) bool {
	var e struct {
		Error apiError `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return status == http.StatusMethodNotAllowed || e.Error.Code == "method_not_allowed" ||
		(status == http.StatusNotFound && strings.HasPrefix(e.Error.Message, "no route for "))
}

// TestEveryDocumentedRouteAnswers: a request to each operation of the
// document, its path parameters filled, reaches a route of the running
// server (anything but the catch-all's 404 or 405), without a token and
// with the admin's; each answer is one the document describes.
func TestEveryDocumentedRouteAnswers(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	v := newValidator(t)
	values := map[string]string{"version": "1"} // any other parameter: a name nothing has
	for pattern, op := range documentedOperations(v.doc) {
		method, path, _ := strings.Cut(pattern, " ")
		for _, p := range op.Parameters {
			if p.Value.In == openapi3.ParameterInPath {
				path = strings.ReplaceAll(path, "{"+p.Value.Name+"}", cmp.Or(values[p.Value.Name], "nope"))
			}
		}
		for _, token := range []string{"", b.admin} {
			header := ""
			if token != "" {
				header = "Authorization: Bearer " + token
			}
			req, a := send(t, b.url, method, path, header, "")
			if catchAll(a.status, a.body) {
				t.Errorf("%s %s, documented as %s, gets the catch-all's answer: %d %s", method, path, pattern, a.status, a.body)
				continue
			}
			if err := v.check(t.Context(), req, a); err != nil {
				t.Errorf("%s %s (token: %t): the answer %d is not what openapi.json describes: %v\n%s", method, path, token != "", a.status, err, a.body)
			}
		}
	}
}

// TestAnswersKeepToTheOpenAPIDocument: the answers of the running server
// to real requests (the fuzz corpus: those of the tests and of
// docs/api.md, good and bad), about a workflow, executions and a lock
// that exist, are the answers the document describes: their statuses,
// error codes and bodies. A request the document has no route for gets
// the catch-all's answer.
func TestAnswersKeepToTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	seedFuzzWorld(t, b)
	v := newValidator(t)
	checked := map[string]bool{}
	for _, r := range fuzzRequests {
		header := strings.TrimSpace(r.header + "\nAuthorization: Bearer " + b.admin)
		req, a := send(t, b.url, r.method, r.target, header, r.body)
		route, _, err := v.router.FindRoute(req)
		if noRoute := (*routers.RouteError)(nil); errors.As(err, &noRoute) { // no path, or not this method
			require.True(t, catchAll(a.status, a.body), "%s %s is no route of openapi.json, yet answered %d %s", r.method, r.target, a.status, a.body)
			continue
		}
		require.NoError(t, err)
		checked[route.Method+" "+route.Path] = true
		if err := v.check(t.Context(), req, a); err != nil {
			t.Errorf("%s %s: the answer %d is not what openapi.json describes: %v\n%s", r.method, r.target, a.status, err, a.body)
		}
	}
	require.Greater(t, len(checked), len((&Server{}).routes())/2, "the answers of most routes are checked")
}

// seedFuzzWorld puts in place, through the api and on NATS, what
// fuzzServer does for the fuzz corpus: the workflow fz, an execution that
// ended (fz-1), one that runs (fz-2) and a lock it holds.
func seedFuzzWorld(t *testing.T, b *authBundle) {
	t.Helper()
	a := b.call(t, http.MethodPost, "/v1/workflows", b.admin, "", fuzzDefinition)
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	ctx := t.Context()
	ids, err := claim.Open(ctx, b.js)
	require.NoError(t, err)
	start := &events.ExecutionStarted{Workflow: fuzzWorkflow, Version: 1, Token: "t",
		Steps: []events.StepRef{{ID: "wait", Kind: "wait"}}, Input: json.RawMessage(`{"who":"fuzz"}`)}
	for id, ps := range map[string][]events.Payload{
		fuzzExecution: {start, &events.ExecutionSucceeded{}},
		fuzzRunning:   {start},
	} {
		_, err := ids.Claim(ctx, id, claim.Record{CommandKey: "fuzz#" + id, Workflow: fuzzWorkflow, ClaimedAt: time.Now()})
		require.NoError(t, err)
		var last uint64
		for _, p := range ps {
			last, err = history.Append(ctx, b.js, bus.ExecutionSubject(fuzzWorkflow, id), last, events.New("fuzz", id, fuzzWorkflow, time.Now(), p))
			require.NoError(t, err)
		}
	}
	locks, err := lock.Open(ctx, b.js, nil)
	require.NoError(t, err)
	_, err = locks.Enqueue(ctx, fuzzLock, 1, lock.Entry{ExecutionID: fuzzRunning, Workflow: fuzzWorkflow, Request: 1})
	require.NoError(t, err)
}

// TestOpenAPIIsServed: GET /v1/openapi.json answers the document, without
// a token.
func TestOpenAPIIsServed(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	a := b.call(t, http.MethodGet, "/v1/openapi.json", "", "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	require.Equal(t, openAPI, a.body)
}
