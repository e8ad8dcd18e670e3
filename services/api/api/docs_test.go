package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/apiv1/apiv1test"
)

// bodies names, for each route, the apiv1 type of its JSON request body
// (nil: none, or any JSON) and the types its answers have (an error
// answer is always an apiv1.ErrorBody).
var bodies = map[string]struct {
	request any
	answers []any
}{
	"GET /healthz":                                {answers: []any{apiv1.Health{}}},
	"GET /readyz":                                 {answers: []any{apiv1.Ready{}}},
	"GET /v1/openapi.json":                        {}, // the answer is the OpenAPI document
	"GET /v1/executions/{id}/steps":               {answers: []any{apiv1.StepPage{}}},
	"GET /v1/admin/projections/parked":            {answers: []any{apiv1.ParkedList{}}},
	"POST /v1/workflows":                          {answers: []any{apiv1.Applied{}}}, // the request is YAML or JSON of a definition
	"GET /v1/workflows":                           {answers: []any{apiv1.WorkflowList{}}},
	"GET /v1/workflows/{name}":                    {answers: []any{apiv1.Workflow{}}},
	"GET /v1/workflows/{name}/versions/{version}": {answers: []any{apiv1.WorkflowVersion{}}},
	"POST /v1/executions":                         {request: apiv1.StartRequest{}, answers: []any{apiv1.Started{}}},
	"GET /v1/executions":                          {answers: []any{apiv1.ExecutionList{}}},
	"GET /v1/executions/_counts":                  {answers: []any{apiv1.ExecutionCounts{}}},
	"GET /v1/executions/{id}":                     {answers: []any{apiv1.Execution{}}},
	"GET /v1/executions/{id}/events":              {answers: []any{apiv1.EventList{}, apiv1.Event{}}},
	"POST /v1/executions/{id}/signals/{name}":     {answers: []any{apiv1.Signaled{}}}, // the request is the signal's data
	"POST /v1/executions/{id}/actions":            {request: apiv1.ActionRequest{}, answers: []any{apiv1.Acted{}}},
	"GET /v1/locks":                               {answers: []any{apiv1.LockList{}}},
	"GET /v1/locks/{name}":                        {answers: []any{apiv1.Lock{}}},
	"DELETE /v1/locks/{name}":                     {request: apiv1.ClearLockRequest{}, answers: []any{apiv1.ClearedLock{}}},
	"GET /v1/settings":                            {answers: []any{apiv1.Settings{}}},
	"POST /v1/admin/projections/rebuild":          {answers: []any{apiv1.Rebuilt{}}},
	"POST /v1/admin/keys":                         {request: apiv1.KeyRequest{}, answers: []any{apiv1.Key{}}},
	"GET /v1/admin/keys":                          {answers: []any{apiv1.KeyList{}}},
	"DELETE /v1/admin/keys/{id}":                  {answers: []any{apiv1.Key{}}},
	"GET /v1/whoami":                              {answers: []any{apiv1.Whoami{}}},
}

// decodeStrictly decodes data into a new value of v's type, refusing
// unknown members anywhere in it.
func decodeStrictly(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(reflect.New(reflect.TypeOf(v)).Interface()); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

var (
	sectionRe = regexp.MustCompile("^##+ `([A-Z]+ /[^`]*)`")
	dataRe    = regexp.MustCompile(`-d '([^']*)'`)
)

// TestDocumentedBodiesAreTheWireTypes: every JSON example of docs/api.md
// (answers, and request bodies of curl commands) decodes, without an
// unknown member, into the apiv1 type of its route, or of errors; so a
// member the docs name is one the api sends or reads.
func TestDocumentedBodiesAreTheWireTypes(t *testing.T) {
	t.Parallel()
	for _, rt := range (&Server{}).routes() {
		require.Contains(t, bodies, rt.pattern, "name the bodies of %s", rt.pattern)
	}
	require.Len(t, bodies, len((&Server{}).routes()), "bodies names a route that is not served")

	doc, err := os.ReadFile("../../../docs/api.md")
	require.NoError(t, err)
	section := "" // the route whose section this is ("" before the first)
	var fence, block []string
	exampled := map[string]bool{}
	requests := 0
	check := func(lang string, lines []string, at int) {
		text := strings.Join(lines, "\n")
		switch lang {
		case "json":
			var top map[string]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(text), &top), "docs/api.md:%d is no JSON object", at)
			if _, ok := top["error"]; ok {
				if err := decodeStrictly([]byte(text), apiv1.ErrorBody{}); err != nil {
					t.Errorf("docs/api.md:%d is no error answer: %v", at, err)
				}
				return
			}
			b, ok := bodies[section]
			require.True(t, ok, "docs/api.md:%d: an answer outside a route's section", at)
			var errs []string
			for _, v := range b.answers {
				if err := decodeStrictly([]byte(text), v); err != nil {
					errs = append(errs, fmt.Sprintf("%T: %v", v, err))
					continue
				}
				exampled[section] = true
				return
			}
			t.Errorf("docs/api.md:%d (%s) is none of the route's answers: %s", at, section, strings.Join(errs, "; "))
		case "sh":
			cmd := strings.ReplaceAll(text, "\\\n", " ")
			if strings.Contains(strings.ToLower(cmd), "ce-specversion") {
				return // a CloudEvent: its data is the command's payload (docs/events.md)
			}
			for _, m := range dataRe.FindAllStringSubmatch(cmd, -1) {
				b := bodies[section]
				if b.request == nil {
					continue
				}
				if err := decodeStrictly([]byte(m[1]), b.request); err != nil {
					t.Errorf("docs/api.md:%d is no request of %s (%T): %v", at, section, b.request, err)
				}
				requests++
			}
		}
	}
	lang, start := "", 0
	for i, line := range strings.Split(string(doc), "\n") {
		if fence != nil {
			if line == "```" {
				check(lang, block, start)
				fence, block = nil, nil
				continue
			}
			block = append(block, line)
			continue
		}
		if l, ok := strings.CutPrefix(line, "```"); ok {
			fence, lang, start = []string{line}, l, i+1
			continue
		}
		if m := sectionRe.FindStringSubmatch(line); m != nil {
			section = m[1]
		} else if strings.HasPrefix(line, "## ") {
			section = ""
		}
	}
	for _, route := range []string{"POST /v1/workflows", "GET /v1/workflows", "GET /v1/workflows/{name}", "POST /v1/executions",
		"GET /v1/executions", "GET /v1/executions/{id}", "GET /v1/executions/{id}/events", "POST /v1/executions/{id}/signals/{name}",
		"POST /v1/executions/{id}/actions", "GET /v1/locks", "DELETE /v1/locks/{name}", "GET /v1/settings",
		"POST /v1/admin/projections/rebuild", "POST /v1/admin/keys"} {
		require.True(t, exampled[route], "docs/api.md shows an answer of %s, checked here", route)
	}
	require.GreaterOrEqual(t, requests, 5, "the curl commands' bodies are checked")
}

// neverSent are members of answer types that the api never sends.
var neverSent = map[string]bool{
	"projections.Execution.token": true, // public() blanks them; they are omitted when empty
	"projections.Step.token":      true,
}

// TestDocsNameEveryMember: every member of every body of the api, and of
// the objects inside them (an execution's steps, a lock's holders), is
// named in docs/api.md, as `name` or "name", in the section of a route
// whose bodies hold that type (a lock's members in GET /v1/locks, shown
// "as above" for one lock). A member added to a wire type, or to the
// read model the api shows, needs its line in the docs.
func TestDocsNameEveryMember(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/api.md")
	require.NoError(t, err)
	sections := map[string]string{}
	section := ""
	for _, line := range strings.Split(string(doc), "\n") {
		if m := sectionRe.FindStringSubmatch(line); m != nil {
			section = m[1]
		} else if strings.HasPrefix(line, "## ") {
			section = ""
		}
		sections[section] += line + "\n"
	}
	// Each struct type reachable from a route's bodies, with the text of
	// the sections of the routes that reach it.
	text := map[reflect.Type]string{}
	var reach func(t reflect.Type, sec string)
	reach = func(t reflect.Type, sec string) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() || strings.Contains(text[t], sec) {
			return
		}
		text[t] += sec
		for f := range t.Fields() {
			reach(f.Type, sec)
		}
	}
	for route, b := range bodies {
		require.Contains(t, sections, route, "docs/api.md has a section for %s", route)
		for _, v := range append(slices.Clone(b.answers), b.request) {
			if v != nil {
				reach(reflect.TypeOf(v), sections[route])
			}
		}
	}
	reach(reflect.TypeFor[apiv1.ErrorBody](), sections[""]) // the Errors section
	checked := 0
	for typ, doc := range text {
		ms, err := apiv1test.Members(reflect.New(typ).Interface())
		require.NoError(t, err)
		for name := range ms {
			if neverSent[typ.String()+"."+name] {
				continue
			}
			checked++
			if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, `"`+name+`"`) {
				t.Errorf("docs/api.md does not name the member %q of %s where its routes are", name, typ)
			}
		}
	}
	require.Greater(t, checked, 100)
}
