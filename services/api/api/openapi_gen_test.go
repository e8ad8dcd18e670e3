package api

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/access"
)

// The OpenAPI document (openapi.json) is generated here, from what the
// api is made of, so that it cannot drift from it: the route table
// (methods, paths, query parameters, scopes), the Go types its bodies
// are encoded from (package apiv1 and the read model of package
// projections, with their doc comments as descriptions), and, for what
// Go cannot say (what a route does, which errors it answers and when),
// the prose of apiOperations below. TestOpenAPIDocumentIsGenerated fails
// when openapi.json is not what this makes; -update rewrites it:
//
//	go test jetflow.dev/services/api/api -run TestOpenAPIDocumentIsGenerated -update

var updateOpenAPI = flag.Bool("update", false, "rewrite openapi.json from the route table, the wire types and apiOperations")

// TestOpenAPIDocumentIsGenerated: the served document is the generated
// one, byte for byte.
func TestOpenAPIDocumentIsGenerated(t *testing.T) {
	t.Parallel()
	want, err := generateOpenAPI()
	require.NoError(t, err)
	if *updateOpenAPI {
		require.NoError(t, os.WriteFile("openapi.json", want, 0o644))
		return
	}
	if !bytes.Equal(want, openAPI) {
		t.Fatalf("openapi.json is out of date (%s): run go test jetflow.dev/services/api/api -run TestOpenAPIDocumentIsGenerated -update",
			firstDifference(openAPI, want))
	}
}

// firstDifference shows the first line where got and want differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d is %q, the generator makes %q", i+1, strings.TrimSpace(gl), strings.TrimSpace(wl))
		}
	}
	return "same lines"
}

// jsonObject is a JSON object of the document.
type jsonObject = map[string]any

// apiOperation is what the document says of a route beyond the route
// table and the Go types of its bodies.
type apiOperation struct {
	id, tag, summary, description string
	// params describes each path and query parameter of the route, by
	// name: the generator fails on one that is missing or left over.
	params map[string]apiParam
	// headers are the request headers it reads, besides Authorization
	// and Jetflow-Namespace (which follow from its scope).
	headers []apiHeader
	request *apiBody
	answers []apiAnswer
	// failures are its own error answers; those of every route of its
	// kind (query parameters, authentication, namespace, NATS) are added
	// by commonFailures.
	failures []apiFailure
	// nats: it reads or writes NATS, so it may answer 503 unavailable or
	// 500 internal when NATS fails.
	nats bool
}

type apiParam struct {
	description string
	schema      jsonObject
}

type apiHeader struct {
	name, description string
	schema            jsonObject
}

type apiBody struct {
	description string
	required    bool
	// content maps each media type to its schema: a Go value (its type's
	// schema) or a jsonObject.
	content map[string]any
}

type apiAnswer struct {
	status      int
	description string
	// content maps each media type to its schema, as apiBody's; none for
	// an answer without a body.
	content map[string]any
}

// apiFailure is an error answer: its status, its code, and when.
type apiFailure struct {
	status int
	code   string
	when   string
}

// Schemas of parameters and headers.
var (
	stringSchema = jsonObject{"type": "string"}
	seqSchema    = jsonObject{"type": "integer", "minimum": 0, "default": 0}
)

func jsonOf(v any) map[string]any { return map[string]any{"application/json": v} }

// failures is a shorthand for error answers of one status.
func failures(status int, codeWhen ...string) []apiFailure {
	var out []apiFailure
	for i := 0; i+1 < len(codeWhen); i += 2 {
		out = append(out, apiFailure{status: status, code: codeWhen[i], when: codeWhen[i+1]})
	}
	return out
}

// Parameters, headers and error answers that several routes share.
var (
	executionIDParam = apiParam{description: "The execution's id: " + events.ExecutionIDRule + ".", schema: stringSchema}
	workflowParam    = apiParam{description: "The workflow's name: " + events.WorkflowNameRule + ".", schema: stringSchema}
	lockParam        = apiParam{description: "The lock's name: " + events.LockNameRule + ".", schema: stringSchema}

	idempotencyKey = apiHeader{name: "Idempotency-Key", schema: jsonObject{"type": "string", "maxLength": 200},
		description: "Makes the request one command: sent again (its answer was lost, or it was answered 503), it is recorded once " +
			"and answered like the first, however late. Without it every request is a new command."}

	executionGone = slices.Concat(
		failures(http.StatusNotFound, "not_found", "no execution has this id (field `id`)"),
		failures(http.StatusGone, "expired", "the execution ran and expired under its retention rule: its history is deleted, its id stays taken"))
	// commandRefused are the answers to a command about an execution
	// (a signal, an action) that the api or the dispatcher refuses.
	commandRefused = slices.Concat(
		failures(http.StatusBadRequest, "invalid", "an `Idempotency-Key` over 200 characters, or the dispatcher refused the command as invalid"),
		executionGone,
		failures(http.StatusConflict,
			"conflict", "the command does not apply in the execution's status (the message says why), or the `Idempotency-Key` was used for another command (field `Idempotency-Key`)",
			"damaged", "the execution is damaged: its history holds an event that does not fold, and it waits for an admin's repair (the message names the sequence)"),
		failures(http.StatusRequestEntityTooLarge, "too_large", "a body over the api's `-max-body` (1 MiB by default)"))
	invalidJSONBody = failures(http.StatusBadRequest, "invalid_json", "the body is not the JSON object described, has an unknown member, or a member of the wrong type (`field` names it)")
)

// commandAnswers are the successful answers to a command about an
// execution (a signal, an action) whose answer body is of body's type.
func commandAnswers(body any, what string) []apiAnswer {
	return []apiAnswer{
		{status: http.StatusOK, description: "The " + what + " is recorded in the execution's history (`recorded: true`); also the answer to the same request again (same `Idempotency-Key`).", content: jsonOf(body)},
		{status: http.StatusAccepted, description: "The command is stored, but the dispatcher had not recorded it within `--start-wait` (5 s): it will be (`recorded: false`). Read the execution, or send the request again with the same `Idempotency-Key`.", content: jsonOf(body)},
	}
}

// apiOperations are the routes as the document describes them, by
// pattern.
var apiOperations = map[string]apiOperation{
	"GET /healthz": {id: "getHealth", tag: "service", summary: "Liveness",
		description: "`200` while the api serves HTTP, whatever its connection to NATS (`nats` says it: `RECONNECTING` while NATS is away). " +
			"Restarting the api cures nothing on the NATS side, so this probe does not fail then; `GET /readyz` does.",
		answers: []apiAnswer{{status: http.StatusOK, description: "The api serves HTTP.", content: jsonOf(apiv1.Health{})}}},
	"GET /readyz": {id: "getReadiness", tag: "service", summary: "Readiness",
		description: "`200` while the api is connected to NATS, every stream and bucket it uses exists, and in every namespace it serves its projector " +
			"is bound and, once since the api started, the read models were at most `-ready-max-lag` (1 minute) behind the events with its visibility index live " +
			"(later, a backlog or an index fed again is reported, not waited for). The answer is public: it names no namespace. " +
			"`parked` counts the executions whose read model " +
			"the projector has set aside: that does not make the api unready (`GET /v1/admin/projections/parked` lists them).",
		answers: []apiAnswer{{status: http.StatusOK, description: "The api is connected and serves.", content: jsonOf(apiv1.Ready{})}},
		failures: failures(http.StatusServiceUnavailable, "unavailable",
			"not connected to NATS, or a stream or bucket the api uses is missing (the message names them; `jetflow bootstrap` creates them again), "+
				"or in a namespace the projector is not bound, or, until caught up once, the read models are too far behind or the visibility index is being fed (the message says which)")},
	"GET /v1/openapi.json": {id: "getOpenAPI", tag: "service", summary: "This OpenAPI document",
		description: "The contract of the HTTP api: every route with its parameters, bodies, answers and errors, and the scope it needs (`x-jetflow-scope`). " +
			"It is public, like `/healthz`: it holds nothing of any namespace.",
		answers: []apiAnswer{{status: http.StatusOK, description: "An OpenAPI 3.1 document.",
			content: jsonOf(jsonObject{"type": "object", "required": []string{"openapi", "info", "paths"}})}}},

	"POST /v1/workflows": {id: "applyWorkflow", tag: "workflows", summary: "Register a workflow definition",
		description: "A definition without `version` is stored as the next version when it differs from the latest one (`201`), else nothing is stored (`200`). " +
			"A definition with `version: N` is stored under N if N is free (N becomes the latest version if it is above it), is `200` if N holds the same definition, " +
			"and is refused if N holds another one: a stored version never changes.",
		request: &apiBody{required: true, description: fmt.Sprintf("The definition, in YAML or JSON (docs/workflow-language.md), at most %d bytes. The `Content-Type` is not checked.", workflow.MaxSize),
			content: map[string]any{
				"application/yaml": jsonObject{"type": "object", "description": "The definition as YAML."},
				"application/json": jsonObject{"type": "object", "description": "The definition as JSON."},
			}},
		answers: []apiAnswer{
			{status: http.StatusCreated, description: "A new version was stored.", content: jsonOf(apiv1.Applied{})},
			{status: http.StatusOK, description: "The definition equals the latest version (or the version it names): nothing was stored.", content: jsonOf(apiv1.Applied{})},
		},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid_definition", "the definition does not validate: `problems` lists every problem (`field`, `line`, `column`, `message`), `field` names the first"),
			failures(http.StatusConflict, "conflict", "the definition names a `version` that holds another definition, or names none and the workflow holds the highest version number, 9007199254740991, past which the registry cannot number (field `version`); nothing changes"),
			failures(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("a definition over %d bytes", workflow.MaxSize))),
		nats: true},
	"GET /v1/workflows": {id: "listWorkflows", tag: "workflows", summary: "List workflows",
		description: "Every registered workflow's latest version, sorted by name.",
		answers:     []apiAnswer{{status: http.StatusOK, description: "The workflows.", content: jsonOf(apiv1.WorkflowList{})}},
		nats:        true},
	"GET /v1/workflows/{name}": {id: "getWorkflow", tag: "workflows", summary: "Get a workflow",
		description: "The latest version's record and every version number.",
		params:      map[string]apiParam{"name": workflowParam},
		answers:     []apiAnswer{{status: http.StatusOK, description: "The workflow.", content: jsonOf(apiv1.Workflow{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "`name` cannot be a workflow name (field `name`)"),
			failures(http.StatusNotFound, "not_found", "the workflow is not registered (field `name`)")),
		nats: true},
	"GET /v1/workflows/{name}/versions/{version}": {id: "getWorkflowVersion", tag: "workflows", summary: "Get one version of a workflow",
		description: "The version's record, with its definition as JSON.",
		params: map[string]apiParam{"name": workflowParam,
			"version": {description: "The version number.", schema: jsonObject{"type": "integer", "minimum": 1}}},
		answers: []apiAnswer{{status: http.StatusOK, description: "The version.", content: jsonOf(apiv1.WorkflowVersion{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "`name` cannot be a workflow name, or `version` is not a positive integer (the field names which)"),
			failures(http.StatusNotFound, "not_found", "the workflow or the version does not exist (field `version`)")),
		nats: true},

	"POST /v1/executions": {id: "startExecution", tag: "executions", summary: "Start an execution",
		description: "The request is a JSON start request, or a CloudEvent of type `" + string(events.TypeStartExecution) + "`: in the HTTP binding's binary mode " +
			"(the `ce-specversion`, `ce-id`, `ce-source` and `ce-type` headers, and the event's data as the body) or structured mode " +
			"(`Content-Type: application/cloudevents+json`, the whole event as the body). The api runs the start check the dispatcher runs " +
			"(workflow and version, input schema, retention hash, size), so that a start is refused here with the field and message the dispatcher would give, " +
			"then publishes the command and waits up to `--start-wait` (5 s) for the dispatcher's verdict. " +
			"The same key (an `Idempotency-Key`, or a CloudEvent's `source` and `id`) with the same data is the same request: it gets `200` and the execution; with other data it is a `409`.",
		headers: []apiHeader{idempotencyKey,
			{name: "ce-specversion", description: "A CloudEvent in binary mode: `1.0`.", schema: jsonObject{"type": "string", "enum": []string{"1.0"}}},
			{name: "ce-id", description: "A CloudEvent in binary mode: its id. With `ce-source`, the request's key (without an `execution_id`, the execution id is derived from them).", schema: stringSchema},
			{name: "ce-source", description: "A CloudEvent in binary mode: its source (a URI reference).", schema: stringSchema},
			{name: "ce-type", description: "A CloudEvent in binary mode: `" + string(events.TypeStartExecution) + "`.", schema: jsonObject{"type": "string", "enum": []string{string(events.TypeStartExecution)}}},
		},
		request: &apiBody{required: true, description: "A start request; or, with the `ce-` headers, a CloudEvent's data; or a structured CloudEvent.",
			content: map[string]any{
				"application/json": jsonObject{"anyOf": []any{schemaRef("StartRequest"), schemaRef("StartData")},
					"description": "A start request (`StartRequest`), or the data of a CloudEvent in binary mode (`StartData`)."},
				"application/cloudevents+json": schemaRef("StartCloudEvent"),
			}},
		answers: []apiAnswer{
			{status: http.StatusCreated, description: "This request started the execution (`status: started`, `created: true`).", content: jsonOf(apiv1.Started{})},
			{status: http.StatusOK, description: "The same request (same key, same data) was accepted before: nothing new was started; `status` is the execution's, and `execution` its state.", content: jsonOf(apiv1.Started{})},
			{status: http.StatusAccepted, description: "The command is stored but no dispatcher answered within `--start-wait`: the execution starts when one handles it (`status: accepted`).", content: jsonOf(apiv1.Started{})},
		},
		failures: slices.Concat(
			invalidJSONBody,
			failures(http.StatusBadRequest,
				"invalid_cloudevent", "a CloudEvent that cannot be decoded, lacks a required attribute, is not of type `"+string(events.TypeStartExecution)+"`, or whose data names a member the api or the dispatcher sets (`actor`, `chain`, `run`, `continued_from`, `parent`); `field` names the attribute or member",
				"invalid", "a value out of its domain: the execution id, the version, an input that is not an object, an `Idempotency-Key` over 200 characters, an input whose retention hash renders no key, a first history event too large for a NATS message (`field` names it)",
				"invalid_input", "the input does not match the workflow's input schema: `field` names the first field at fault, `problems` lists them all"),
			failures(http.StatusNotFound, "not_found", "no such workflow or version (field `workflow`)"),
			failures(http.StatusConflict, "conflict", "the execution id belongs to another command (ids are unique forever), or the key was used for a start with other data (field `id`; `execution_id` for a CloudEvent)"),
			failures(http.StatusRequestEntityTooLarge, "too_large", "a body over the api's `-max-body` (1 MiB by default)")),
		nats: true},
	"GET /v1/executions": {id: "listExecutions", tag: "executions", summary: "List executions",
		description: "A page of executions from the api's visibility index: filtered by workflow, status, damage, start and end time ranges " +
			"and search attributes, sorted by id (the default) or by start or end time, paged with the opaque cursor `next`. " +
			"The filters that are not part of the range the list scans (see docs/api.md) are checked row by row, a bounded number per request: " +
			"such a list may answer a page that is not full (`partial: true`), with a `next` to go on from. Following `next` until it is absent sees every match. " +
			"Until the index is live (just after the api started without `-visibility-dir`, or after a rebuild), a list in id order without " +
			"time ranges or `attr` is read from the read models, and any other is answered `503`.",
		params: map[string]apiParam{
			"workflow": {description: "Only this workflow's executions.", schema: stringSchema},
			"status":   {description: "Only executions in this status.", schema: jsonObject{"type": "string", "enum": listedStatuses()}},
			"damaged":  {description: "`true`: only damaged executions.", schema: jsonObject{"type": "boolean", "enum": []bool{true}}},
			"limit":    {description: "The page size.", schema: jsonObject{"type": "integer", "minimum": 1, "maximum": 1000, "default": 50}},
			"after":    {description: "The cursor: the previous page's `next`, with the same `sort` (in id order, an id: the page starts after it).", schema: stringSchema},
			"sort": {description: "The order: `id` (the default), `started_desc`, `started_asc`, `ended_desc` or `ended_asc` (ended executions only); " +
				"without it, a start range sorts by `started_desc` and an end range by `ended_desc`. Ties are ordered by id.",
				schema: jsonObject{"type": "string", "enum": []string{"id", "started_desc", "started_asc", "ended_desc", "ended_asc"}}},
			"started_after":  {description: "Only executions started at or after this time (RFC 3339).", schema: jsonObject{"type": "string", "format": "date-time"}},
			"started_before": {description: "Only executions started before this time (RFC 3339).", schema: jsonObject{"type": "string", "format": "date-time"}},
			"ended_after":    {description: "Only executions ended at or after this time (RFC 3339).", schema: jsonObject{"type": "string", "format": "date-time"}},
			"ended_before":   {description: "Only executions ended before this time (RFC 3339).", schema: jsonObject{"type": "string", "format": "date-time"}},
			"attr": {description: "`name:value`, repeatable (at most 8): only executions whose search attribute `name` (named by their workflow's " +
				"`search_attributes`) has this value now.", schema: jsonObject{"type": "array", "maxItems": 8,
				"items": jsonObject{"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}:"}}},
		},
		answers: []apiAnswer{{status: http.StatusOK, description: "A page of executions.", content: jsonOf(apiv1.ExecutionList{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "a bad `limit`, `status`, `damaged`, `workflow`, `sort`, time, `attr`, or an `after` that is not a cursor of a list in this `sort` (the field names it)"),
			failures(http.StatusServiceUnavailable, "unavailable", "the visibility index is not live yet and the list is one the read models cannot answer (another order than id, a time range or `attr`), or its store cannot be read now (a PostgreSQL server away): retry after `Retry-After`")),
		nats: true},
	"GET /v1/executions/_counts": {id: "countExecutions", tag: "executions", summary: "Count executions by status",
		description: "How many executions are in each status, of all the executions of the namespace or of one workflow's: " +
			"every execution the visibility index holds, not a page. The index keeps these counts with its rows, so the answer " +
			"costs a few reads whatever the number of executions. Like a list, it waits (2 s at most) for the index to hold what " +
			"the read models held when it was asked. No execution id starts with `_`, so this route is no execution's.",
		params: map[string]apiParam{"workflow": {description: "Only this workflow's executions.", schema: stringSchema}},
		answers: []apiAnswer{{status: http.StatusOK, description: "The counts by status (a status without executions is absent) and their total.",
			content: jsonOf(apiv1.ExecutionCounts{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "`workflow` cannot be a workflow name (field `workflow`)"),
			failures(http.StatusServiceUnavailable, "unavailable", "the visibility index is not live yet (just after the api started without a stored index, or after a rebuild), or its store cannot be read now (a PostgreSQL server away): retry after `Retry-After`")),
		nats: true},
	"GET /v1/executions/{id}": {id: "getExecution", tag: "executions", summary: "Get an execution's state",
		description: "The execution's read model, or the fold of its history while the projector has not caught up with a new execution. " +
			"A read model stays small: large values are replaced by `{\"omitted\": true, \"bytes\": N}` and finished step instances may be left out " +
			"(`truncated` says how many); `GET /v1/executions/{id}/steps` pages every instance. Input members the input schema marks `writeOnly` show as `\"[redacted]\"`. " +
			"With `at_seq`, the state as it was at that stream sequence.",
		params: map[string]apiParam{"id": executionIDParam,
			"at_seq": {description: "The state as it was at this stream sequence: the fold of the events up to it (0: now).", schema: seqSchema}},
		answers: []apiAnswer{{status: http.StatusOK, description: "The execution's state.", content: jsonOf(apiv1.Execution{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "the id cannot be an execution id (field `id`), or `at_seq` is not a non-negative integer"),
			executionGone,
			failures(http.StatusNotFound, "not_found", "the execution had no event at or before `at_seq` (field `at_seq`)")),
		nats: true},
	"GET /v1/executions/{id}/events": {id: "getExecutionEvents", tag: "executions", summary: "An execution's history, or its live events",
		description: "The history from `from_seq`, as JSON; or, with `Accept: text/event-stream`, the history followed live as server-sent events " +
			"(`id`: the stream sequence, `event`: the event's type, `data`: the event as JSON, as in the JSON answer), which end once the execution is settled " +
			"(ended, or suspended) as of its latest events. A reconnecting client sends `Last-Event-ID`.",
		params: map[string]apiParam{"id": executionIDParam,
			"from_seq": {description: "The first stream sequence to show (0: the whole history).", schema: seqSchema}},
		headers: []apiHeader{{name: "Last-Event-ID", description: "The stream sequence of the last event the client has: it gets the events after it (overrides `from_seq`).",
			schema: jsonObject{"type": "string", "pattern": "^[0-9]+$"}}},
		answers: []apiAnswer{
			{status: http.StatusOK, description: "The history (JSON), or the live stream (`text/event-stream`, when the request accepts it).",
				content: map[string]any{"application/json": apiv1.EventList{},
					"text/event-stream": jsonObject{"type": "string", "description": "Server-sent events, one per history event: `id`, `event` and `data` (an `Event` as JSON); a comment line every 15 s while nothing happens."}}},
			{status: http.StatusNoContent, description: "The execution is settled and nothing is left after `Last-Event-ID` (or `from_seq`): an `EventSource` reconnecting after the end stops here."},
		},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "the id cannot be an execution id (field `id`), `from_seq` is not a non-negative integer, or `Last-Event-ID` is not a stream sequence"),
			executionGone),
		nats: true},
	"GET /v1/executions/{id}/steps": {id: "getExecutionSteps", tag: "executions", summary: "A page of an execution's step instances",
		description: "The step instances in the order they were first recorded, from `offset`: all of them, also of an execution whose read model leaves finished ones out.",
		params: map[string]apiParam{"id": executionIDParam,
			"offset": {description: "The first instance to show, counting from 0.", schema: jsonObject{"type": "integer", "minimum": 0, "maximum": math.MaxInt32, "default": 0}},
			"limit":  {description: "The page size.", schema: jsonObject{"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}}},
		answers: []apiAnswer{{status: http.StatusOK, description: "A page of step instances.", content: jsonOf(apiv1.StepPage{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "the id cannot be an execution id (field `id`), or a bad `offset` or `limit`"),
			executionGone),
		nats: true},
	"POST /v1/executions/{id}/signals/{name}": {id: "signalExecution", tag: "executions", summary: "Send a signal to an execution",
		description: "A `wait` step takes the signal now or when it is reached. The api publishes the command and waits up to `--start-wait` for the history to record it.",
		params: map[string]apiParam{"id": executionIDParam,
			"name": {description: "The signal's name: " + events.SignalNameRule + ".", schema: stringSchema}},
		headers: []apiHeader{idempotencyKey},
		request: &apiBody{description: "The signal's data: any JSON value. An empty body means no data; the `Content-Type` is not checked.",
			content: jsonOf(jsonObject{})},
		answers: commandAnswers(apiv1.Signaled{}, "signal"),
		failures: slices.Concat(
			failures(http.StatusBadRequest,
				"invalid", "the id cannot be an execution id (field `id`), or the signal name is not one (field `name`)",
				"invalid_json", "the body is not JSON (field `data`)"),
			commandRefused),
		nats: true},
	"POST /v1/executions/{id}/actions": {id: "actOnExecution", tag: "executions", summary: "An operator's action on an execution",
		description: "`cancel` (stop at the next step boundary), `force-cancel` (cancelled now), `kill` (cancelled now, and the agents terminate its running operations), " +
			"`resume` or `force-resume` (run a started, failed, suspended or cancelled execution on), `replay` (go on from a replay point), `compensate` " +
			"(run the compensate steps of an execution that is over), `repair` (an admin's: have a damaged execution's folds pass over the event at `ignore_seq`). " +
			"The api publishes the command and waits up to `--start-wait` for the history to record it. `repair` needs the `admin` scope too.",
		params:  map[string]apiParam{"id": executionIDParam},
		headers: []apiHeader{idempotencyKey},
		request: &apiBody{required: true, content: jsonOf(apiv1.ActionRequest{})},
		answers: commandAnswers(apiv1.Acted{}, "action"),
		failures: slices.Concat(
			invalidJSONBody,
			failures(http.StatusBadRequest, "invalid", "the id cannot be an execution id (field `id`); a missing or unknown `action`; `reason` or `requested_by` too long; "+
				"`from` or `force` with another action than `replay`; `version` with another than `resume`, `force-resume` or `replay`; `ignore_seq` missing for a `repair` or given with another action"),
			failures(http.StatusForbidden, "forbidden", "a `repair` without the `admin` scope (`scope` names it)"),
			commandRefused),
		nats: true},

	"GET /v1/locks": {id: "listLocks", tag: "locks", summary: "List locks",
		description: "Every workflow lock held or waited for, by name.",
		answers:     []apiAnswer{{status: http.StatusOK, description: "The locks.", content: jsonOf(apiv1.LockList{})}},
		nats:        true},
	"GET /v1/locks/{name}": {id: "getLock", tag: "locks", summary: "Get a lock",
		description: "One lock: its holders, and its waiters in the order they acquire.",
		params:      map[string]apiParam{"name": lockParam},
		answers:     []apiAnswer{{status: http.StatusOK, description: "The lock.", content: jsonOf(apiv1.Lock{})}},
		failures: slices.Concat(
			failures(http.StatusBadRequest, "invalid", "the name cannot be a lock's (field `name`)"),
			failures(http.StatusNotFound, "not_found", "nobody holds or waits for the lock (field `name`)")),
		nats: true},
	"DELETE /v1/locks/{name}": {id: "clearLock", tag: "locks", summary: "Force-clear a lock's holders",
		description: "Clears the lock's holders, or only `execution_id`'s: the first waiters acquire it. The dispatcher records `" + string(events.TypeLockCleared) + "` " +
			"in each cleared holder's history; the api waits up to `--start-wait` for every one.",
		params:  map[string]apiParam{"name": lockParam},
		request: &apiBody{description: "Whose hold to clear, and why; optional.", content: jsonOf(apiv1.ClearLockRequest{})},
		answers: []apiAnswer{
			{status: http.StatusOK, description: "Every cleared holder's history records it (`recorded: true`).", content: jsonOf(apiv1.ClearedLock{})},
			{status: http.StatusAccepted, description: "The command is stored, not recorded within `--start-wait` (`recorded: false`).", content: jsonOf(apiv1.ClearedLock{})},
		},
		failures: slices.Concat(
			invalidJSONBody,
			failures(http.StatusBadRequest, "invalid", "the name cannot be a lock's (field `name`), `execution_id` cannot be an execution id, `reason` or `requested_by` is too long, or the dispatcher refused the command as invalid"),
			failures(http.StatusNotFound, "not_found", "nobody holds or waits for the lock (field `name`), or `execution_id` does not hold it (field `execution_id`)"),
			failures(http.StatusConflict, "damaged", "a holder's execution is damaged: its history cannot record the clearing until an admin repairs it"),
			failures(http.StatusRequestEntityTooLarge, "too_large", "a body over the api's `-max-body` (1 MiB by default)")),
		nats: true},

	"GET /v1/settings": {id: "getSettings", tag: "settings", summary: "System-wide settings",
		description: "Values a service recorded for the others to show; one not recorded yet is left out.",
		answers:     []apiAnswer{{status: http.StatusOK, description: "The settings.", content: jsonOf(apiv1.Settings{})}},
		nats:        true},

	"POST /v1/admin/projections/rebuild": {id: "rebuildProjections", tag: "admin", summary: "Rebuild the read models",
		description: "Re-projects the execution read models from the events stream, from `from_seq`. It runs no step, and can run while the live projector works: " +
			"a read model is only replaced by a newer one.",
		params:   map[string]apiParam{"from_seq": {description: "The stream sequence to start from (0: everything).", schema: seqSchema}},
		answers:  []apiAnswer{{status: http.StatusOK, description: "What the rebuild did.", content: jsonOf(apiv1.Rebuilt{})}},
		failures: failures(http.StatusBadRequest, "invalid", "`from_seq` is not a non-negative integer"),
		nats:     true},
	"GET /v1/admin/projections/parked": {id: "listParkedProjections", tag: "admin", summary: "List the parked read models",
		description: "The executions whose read model the projector could not write and has set aside: each is projected again on its own, with a growing delay.",
		answers:     []apiAnswer{{status: http.StatusOK, description: "The parked executions.", content: jsonOf(apiv1.ParkedList{})}}},
	"POST /v1/admin/keys": {id: "createKey", tag: "keys", summary: "Create an api key",
		description: "The answer holds the key's token, and nothing else ever will: the api keeps its SHA-256. A key never grants more than its creator holds.",
		request:     &apiBody{required: true, content: jsonOf(apiv1.KeyRequest{})},
		answers:     []apiAnswer{{status: http.StatusCreated, description: "The key, with its `token`.", content: jsonOf(apiv1.Key{})}},
		failures: slices.Concat(
			invalidJSONBody,
			failures(http.StatusBadRequest, "invalid", "a bad `name`, `scopes`, `namespaces` or `expires_in` (the field names it)"),
			failures(http.StatusForbidden, "forbidden", "the key would grant more than its creator holds"),
			failures(http.StatusRequestEntityTooLarge, "too_large", "a body over the api's `-max-body` (1 MiB by default)")),
		nats: true},
	"GET /v1/admin/keys": {id: "listKeys", tag: "keys", summary: "List api keys",
		description: "Every key the caller could have made, oldest first, without tokens or hashes.",
		answers:     []apiAnswer{{status: http.StatusOK, description: "The keys.", content: jsonOf(apiv1.KeyList{})}},
		nats:        true},
	"GET /v1/whoami": {id: "whoami", tag: "keys", summary: "Who the token is",
		description: "The caller as the api authenticated its token: its subject, how it authenticated, its key's id, the scopes it holds and the namespaces " +
			"it may use. Nothing secret is in it. Any valid token may ask, whatever its scopes: a UI offers only the actions the token can take from it " +
			"(the routes still check every request).",
		answers: []apiAnswer{{status: http.StatusOK, description: "The caller.", content: jsonOf(apiv1.Whoami{})}}},
	"DELETE /v1/admin/keys/{id}": {id: "revokeKey", tag: "keys", summary: "Revoke an api key",
		description: "The key stops working at once on this api, and within the key cache time (5 s) on the others. Revoking a revoked key changes nothing.",
		params:      map[string]apiParam{"id": {description: "The key's id.", schema: jsonObject{"type": "string", "pattern": keyIDRe.String()}}},
		answers:     []apiAnswer{{status: http.StatusOK, description: "The key, revoked.", content: jsonOf(apiv1.Key{})}},
		failures:    failures(http.StatusNotFound, "not_found", "no key has this id, or the caller could not have made it (field `id`)"),
		nats:        true},
}

// apiTags are the groups of operations, in order.
var apiTags = []jsonObject{
	{"name": "service", "description": "The api itself: probes and this document."},
	{"name": "workflows", "description": "Workflow definitions and their versions."},
	{"name": "executions", "description": "Starting executions, reading their state and history, signals and operators' actions."},
	{"name": "locks", "description": "Workflow locks and semaphores."},
	{"name": "settings", "description": "System-wide values."},
	{"name": "admin", "description": "The read models."},
	{"name": "keys", "description": "Api keys, and who a token is."},
}

func listedStatuses() []string {
	out := make([]string, len(projections.ListedStatuses))
	for i, s := range projections.ListedStatuses {
		out[i] = string(s)
	}
	return out
}

func schemaRef(name string) jsonObject { return jsonObject{"$ref": "#/components/schemas/" + name} }

// commonFailures are the error answers every route of rt's kind gives,
// besides its own.
func commonFailures(rt route, op apiOperation) []apiFailure {
	unknown := "a query parameter the route does not take (`field` names it)"
	if len(rt.params) == 0 {
		unknown = "any query parameter: the route takes none (`field` names it)"
	}
	out := failures(http.StatusBadRequest, "invalid", unknown)
	if rt.scope != "" {
		out = slices.Concat(out,
			failures(http.StatusUnauthorized, "unauthenticated", "no token, or one that is unknown, malformed, expired, revoked, or a JWT that does not verify"),
			failures(http.StatusServiceUnavailable, "unavailable", "the token could not be checked now (the keys bucket or the OIDC issuer cannot be reached)"))
		if rt.scope != access.ScopeAny { // any valid token passes: never 403
			forbidden := fmt.Sprintf("the token lacks the scope `%s` (`scope` names it)", rt.scope)
			if !rt.global && rt.hidden == nil {
				forbidden += ", or the request's namespace is not granted to it (`namespace` names it)"
			}
			out = slices.Concat(out, failures(http.StatusForbidden, "forbidden", forbidden))
		}
		if !rt.global {
			notServed := "the namespace is not one this api serves (field `Jetflow-Namespace`)"
			if rt.hidden != nil {
				notServed += "; a namespace not granted to the token is answered as for a thing that does not exist, so that nothing of another tenant is confirmed"
			}
			out = slices.Concat(out,
				failures(http.StatusBadRequest, "invalid", "a `Jetflow-Namespace` that cannot be a namespace (field `Jetflow-Namespace`)"),
				failures(http.StatusNotFound, "not_found", notServed))
		}
	}
	if op.nats {
		out = slices.Concat(out,
			failures(http.StatusServiceUnavailable, "unavailable", "NATS or JetStream is away, slow or between leaders: send the same request again after `Retry-After` (a command with the same `Idempotency-Key`)"),
			failures(http.StatusInternalServerError, "internal", "any other NATS or JetStream failure: not retryable as such; the api logs it"))
	}
	return out
}

// generateOpenAPI makes the document, indented as the api indents JSON.
func generateOpenAPI() ([]byte, error) {
	docs, err := readGoDocs()
	if err != nil {
		return nil, err
	}
	sb := &schemaBuilder{docs: docs, components: jsonObject{}, names: map[reflect.Type]string{}, strict: map[reflect.Type]bool{}}
	for _, v := range []any{apiv1.StartRequest{}, apiv1.ActionRequest{}, apiv1.ClearLockRequest{}, apiv1.KeyRequest{}, events.StartExecution{}} {
		sb.strict[reflect.TypeOf(v)] = true // decoded strictly: an unknown member is an error
	}
	// The components apiOperations refers to by name.
	sb.ref(reflect.TypeFor[apiv1.ErrorBody]())
	sb.ref(reflect.TypeFor[apiv1.StartRequest]())
	sb.ref(reflect.TypeFor[events.StartExecution]())
	sb.components["StartCloudEvent"] = jsonObject{
		"type":        "object",
		"description": "A start as a structured CloudEvent (CloudEvents 1.0, JSON format).",
		"required":    []string{"specversion", "id", "source", "type", "data"},
		"properties": jsonObject{
			"specversion":     jsonObject{"type": "string", "enum": []string{"1.0"}},
			"id":              jsonObject{"type": "string", "minLength": 1, "description": "With `source`, the request's key: without an `execution_id`, the execution id is derived from them."},
			"source":          jsonObject{"type": "string", "format": "uri-reference", "minLength": 1},
			"type":            jsonObject{"type": "string", "enum": []string{string(events.TypeStartExecution)}},
			"datacontenttype": jsonObject{"type": "string"},
			"subject":         stringSchema,
			"time":            jsonObject{"type": "string", "format": "date-time"},
			"data":            schemaRef("StartData"),
		},
	}

	paths := jsonObject{}
	for _, rt := range (&Server{}).routes() {
		op, ok := apiOperations[rt.pattern]
		if !ok {
			return nil, fmt.Errorf("openapi: describe %s in apiOperations", rt.pattern)
		}
		method, path, _ := strings.Cut(rt.pattern, " ")
		o, err := sb.operation(rt, op, path)
		if err != nil {
			return nil, fmt.Errorf("openapi: %s: %w", rt.pattern, err)
		}
		item, _ := paths[path].(jsonObject)
		if item == nil {
			item = jsonObject{}
			paths[path] = item
		}
		item[strings.ToLower(method)] = o
	}
	if len(apiOperations) != len((&Server{}).routes()) {
		return nil, errors.New("openapi: apiOperations describes a route the server does not have")
	}
	if sb.err != nil {
		return nil, sb.err
	}
	doc := jsonObject{
		"openapi": "3.1.0",
		"info": jsonObject{
			"title":   "jetflow HTTP api",
			"version": "v1",
			"description": "jetflow's HTTP api: workflow registration, starting executions (JSON or CloudEvents over HTTP), signals, operators' actions, " +
				"and queries from the read models, with live progress as server-sent events (docs/api.md).\n\n" +
				"Every answer is JSON but the event stream. Every 4xx and 5xx answer is an `ErrorBody`: a stable `code` for programs, a `message` for people, " +
				"and the `field` at fault when there is one. A path no route has is a `404 not_found`; a known path with another method a " +
				"`405 method_not_allowed` whose `Allow` header lists the methods it takes. Every route takes only the query parameters it lists: " +
				"any other is a `400 invalid` naming it.\n\n" +
				"A route's `x-jetflow-scope` is the scope its token needs (`none`: public; `any`: any valid token); `admin` holds every scope. " +
				"A request is about the namespace its `Jetflow-Namespace` header names (`default` without one).\n\n" +
				"Retry a `503` (and a proxy's `502` or `504`) after `Retry-After` seconds, with the same `Idempotency-Key` for a command; every `4xx` says what to change.",
		},
		"tags":  apiTags,
		"paths": paths,
		"components": jsonObject{
			"schemas": sb.components,
			"securitySchemes": jsonObject{"bearer": jsonObject{
				"type": "http", "scheme": "bearer",
				"description": "An api key (`jfk_<id>_<secret>`, `POST /v1/admin/keys`), a bootstrap admin token (a line of the api's `-admin-token-file`), " +
					"or an OIDC token (a JWT from the issuer given with `-oidc-issuer`). The scopes are " + scopeList() + "; `admin` holds every other. " +
					"An operation's security requirement names the scope it needs (none for one that takes any valid token).",
			}},
			"parameters": jsonObject{"namespace": jsonObject{
				"name": NamespaceHeader, "in": "header", "schema": jsonObject{"type": "string", "default": DefaultNamespace},
				"description": "The namespace the request is about; `" + DefaultNamespace + "` when absent. The token must be granted it.",
			}},
		},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("openapi: encode: %w", err)
	}
	return buf.Bytes(), nil
}

func scopeList() string {
	var names []string
	for _, s := range access.Scopes {
		names = append(names, "`"+string(s)+"`")
	}
	return strings.Join(names, ", ")
}

// pathParamRe finds the parameters of a route's path.
var pathParamRe = regexp.MustCompile(`\{([^}]+)\}`)

// operation makes the Operation Object of route rt.
func (sb *schemaBuilder) operation(rt route, op apiOperation, path string) (jsonObject, error) {
	scope := string(rt.scope)
	description := op.description + "\n\n"
	security := []any{}
	switch rt.scope {
	case "":
		scope = "none"
		description += "Public: no token is needed."
	case access.ScopeAny:
		// A bearer token with no particular scope: an empty list.
		description += "Needs a token, of any scope (`any`)."
		security = []any{jsonObject{"bearer": []string{}}}
	default:
		description += fmt.Sprintf("Needs a token with the scope `%s`.", scope)
		security = []any{jsonObject{"bearer": []string{scope}}}
	}
	o := jsonObject{
		"operationId": op.id, "tags": []string{op.tag}, "summary": op.summary, "description": description,
		"security": security, "x-jetflow-scope": scope,
	}

	var params []any
	described := map[string]bool{}
	param := func(name, in string) error {
		p, ok := op.params[name]
		if !ok {
			return fmt.Errorf("describe the %s parameter %q", in, name)
		}
		described[name] = true
		params = append(params, jsonObject{"name": name, "in": in, "required": in == "path", "description": p.description, "schema": p.schema})
		return nil
	}
	for _, m := range pathParamRe.FindAllStringSubmatch(path, -1) {
		if err := param(m[1], "path"); err != nil {
			return nil, err
		}
	}
	for _, name := range rt.params {
		if err := param(name, "query"); err != nil {
			return nil, err
		}
	}
	for name := range op.params {
		if !described[name] {
			return nil, fmt.Errorf("the parameter %q is neither in the path nor in the route's params", name)
		}
	}
	if rt.scope != "" && !rt.global {
		params = append(params, jsonObject{"$ref": "#/components/parameters/namespace"})
	}
	for _, h := range op.headers {
		params = append(params, jsonObject{"name": h.name, "in": "header", "description": h.description, "schema": h.schema})
	}
	if len(params) > 0 {
		o["parameters"] = params
	}

	if b := op.request; b != nil {
		body := jsonObject{"required": b.required, "content": sb.content(b.content)}
		if b.description != "" {
			body["description"] = b.description
		}
		o["requestBody"] = body
	}

	responses := jsonObject{}
	for _, a := range op.answers {
		r := jsonObject{"description": a.description}
		if len(a.content) > 0 {
			r["content"] = sb.content(a.content)
		}
		responses[strconv.Itoa(a.status)] = r
	}
	// Error answers, by status: each lists its codes and when.
	byStatus := map[int][]apiFailure{}
	for _, f := range slices.Concat(commonFailures(rt, op), op.failures) {
		byStatus[f.status] = append(byStatus[f.status], f)
	}
	for status, fs := range byStatus {
		var codes, lines []string
		whens := map[string][]string{}
		for _, f := range fs {
			if !slices.Contains(codes, f.code) {
				codes = append(codes, f.code)
			}
			whens[f.code] = append(whens[f.code], f.when)
		}
		for _, code := range codes {
			lines = append(lines, fmt.Sprintf("- `%s`: %s.", code, strings.Join(whens[code], "; ")))
		}
		// The answer is an ErrorBody whose code is one of these.
		r := jsonObject{
			"description": strings.Join(lines, "\n"),
			"content": sb.content(jsonOf(jsonObject{"allOf": []any{schemaRef("ErrorBody"),
				jsonObject{"properties": jsonObject{"error": jsonObject{"properties": jsonObject{"code": jsonObject{"enum": codes}}}}}}})),
		}
		switch status {
		case http.StatusUnauthorized:
			r["headers"] = jsonObject{"WWW-Authenticate": jsonObject{"schema": stringSchema,
				"description": "`Bearer realm=\"jetflow\"`, with `error=\"invalid_token\"` when a token was sent."}}
		case http.StatusServiceUnavailable:
			r["headers"] = jsonObject{"Retry-After": jsonObject{"schema": stringSchema,
				"description": "The seconds to wait before sending the same request again."}}
		}
		responses[strconv.Itoa(status)] = r
	}
	o["responses"] = responses
	return o, nil
}

// content makes a Content Object: a Go value's schema is its type's.
func (sb *schemaBuilder) content(c map[string]any) jsonObject {
	out := jsonObject{}
	for media, v := range c {
		s, ok := v.(jsonObject)
		if !ok {
			s = sb.schema(reflect.TypeOf(v))
		}
		out[media] = jsonObject{"schema": s}
	}
	return out
}

// schemaBuilder makes the schemas of Go types, as encoding/json encodes
// them: a struct is a component of its own, referred to.
type schemaBuilder struct {
	docs       goDocs
	components jsonObject
	names      map[reflect.Type]string
	// strict are the request types decoded strictly: their schemas allow
	// no other member.
	strict map[reflect.Type]bool
	err    error
}

// componentNames name the struct types whose name another type of the
// wire has too, and the types whose name says little on the wire.
var componentNames = map[reflect.Type]string{
	reflect.TypeFor[projections.Lock]():      "ExecutionLock", // apiv1.Lock is a lock as the locks bucket has it
	reflect.TypeFor[events.LockEntry]():      "ClearedHold",   // apiv1.LockEntry is a holder or waiter, with its time
	reflect.TypeFor[events.StartExecution](): "StartData",     // the data of a start CloudEvent
	reflect.TypeFor[workflow.FieldError]():   "Problem",       // an error's problems
}

// memberSchema is the schema of a member whose Go type says too little,
// by "pkg.Type.member", if it is one.
func (sb *schemaBuilder) memberSchema(key string) (jsonObject, bool) {
	switch key {
	case "apiv1.Error.problems":
		return jsonObject{"type": "array", "items": sb.schema(reflect.TypeFor[workflow.FieldError]())}, true
	case "apiv1.ActionRequest.action":
		return jsonObject{"type": "string", "enum": events.Actions}, true
	case "apiv1.KeyRequest.scopes":
		return jsonObject{"type": "array", "minItems": 1, "items": jsonObject{"type": "string", "enum": access.Scopes}}, true
	case "apiv1.StartRequest.input", "events.StartExecution.input":
		return jsonObject{"type": []string{"object", "null"}}, true
	}
	return nil, false
}

// typeSchemas are the schemas of types that encode themselves.
var typeSchemas = map[reflect.Type]jsonObject{
	reflect.TypeFor[time.Time]():            {"type": "string", "format": "date-time"},
	reflect.TypeFor[json.RawMessage]():      {}, // any JSON value
	reflect.TypeFor[events.TargetVersion](): {"anyOf": []any{jsonObject{"type": "integer", "minimum": 1}, jsonObject{"type": "string", "enum": []string{"latest"}}}},
}

// leftOut are members of wire types that the api never sends, or never
// reads: the api blanks execution tokens (neverSent), and refuses the
// members of a start's data that the api and the dispatcher set.
var leftOut = map[string]bool{
	"events.StartExecution.actor":          true,
	"events.StartExecution.chain":          true,
	"events.StartExecution.run":            true,
	"events.StartExecution.continued_from": true,
	"events.StartExecution.parent":         true,
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func (sb *schemaBuilder) fail(format string, args ...any) jsonObject {
	if sb.err == nil {
		sb.err = fmt.Errorf("openapi: "+format, args...)
	}
	return jsonObject{}
}

// schema is the schema of a value of type t.
func (sb *schemaBuilder) schema(t reflect.Type) jsonObject {
	if s, ok := typeSchemas[t]; ok {
		return s
	}
	if t.Implements(marshalerType) || t.Implements(textMarshalerType) ||
		reflect.PointerTo(t).Implements(marshalerType) || reflect.PointerTo(t).Implements(textMarshalerType) {
		return sb.fail("%s encodes itself: give its schema in typeSchemas", t)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return sb.schema(t.Elem())
	case reflect.Struct:
		return sb.ref(t)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return sb.fail("%s is bytes: give its schema in typeSchemas", t)
		}
		return jsonObject{"type": "array", "items": sb.schema(t.Elem())}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return sb.fail("%s has keys that are no strings", t)
		}
		return jsonObject{"type": "object", "additionalProperties": sb.schema(t.Elem())}
	case reflect.String:
		return jsonObject{"type": "string"}
	case reflect.Bool:
		return jsonObject{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return jsonObject{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return jsonObject{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return jsonObject{"type": "number"}
	case reflect.Interface:
		return jsonObject{}
	}
	return sb.fail("no schema for %s", t)
}

// ref refers to the component of struct type t, making it first.
func (sb *schemaBuilder) ref(t reflect.Type) jsonObject {
	if name, ok := sb.names[t]; ok {
		return schemaRef(name)
	}
	name := componentNames[t]
	if name == "" {
		name = t.Name()
	}
	for other, n := range sb.names {
		if n == name {
			return sb.fail("%s and %s are both named %s: name one in componentNames", t, other, name)
		}
	}
	sb.names[t] = name
	sb.components[name] = jsonObject{} // taken, while its members are made
	props, required := jsonObject{}, []string{}
	sb.members(t, t, goNames(t), props, &required)
	s := jsonObject{"type": "object", "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	if sb.strict[t] {
		s["additionalProperties"] = false
	}
	if d := sb.docs.prose(t.PkgPath()+"."+t.Name(), goNames(t)); d != "" {
		if rest, ok := strings.CutPrefix(d, t.Name()+" "); ok {
			d = name + " " + rest // "Lock is a scope's hold" of ExecutionLock
		}
		s["description"] = d
	}
	sb.components[name] = s
	return schemaRef(name)
}

// members adds the JSON members of struct type t (outer's, or a struct
// embedded in it) to props and required.
func (sb *schemaBuilder) members(outer, t reflect.Type, names map[string]string, props jsonObject, required *[]string) {
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			sb.members(outer, f.Type, names, props, required)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		key := outer.String() + "." + name
		if neverSent[key] || leftOut[key] {
			continue
		}
		if _, dup := props[name]; dup {
			sb.fail("%s has two members named %s", outer, name)
			continue
		}
		optional := false
		for o := range strings.SplitSeq(opts, ",") {
			switch o {
			case "omitempty", "omitzero":
				optional = true
			case "string":
				sb.fail("%s encodes a number as a string: give its schema in memberSchemas", key)
			}
		}
		s, ok := sb.memberSchema(key)
		if !ok {
			s = sb.schema(f.Type)
		}
		if d := sb.docs.prose(t.PkgPath()+"."+t.Name()+"."+f.Name, names); d != "" {
			s = withDescription(s, d)
		}
		props[name] = s
		if !optional {
			*required = append(*required, name)
		}
	}
}

// withDescription is s with a description, s left as it is (a $ref's
// schema is shared).
func withDescription(s jsonObject, d string) jsonObject {
	out := make(jsonObject, len(s)+1)
	for k, v := range s {
		out[k] = v
	}
	out["description"] = d
	return out
}

// goDocs are the doc comments of the types and struct fields of the
// packages whose types are on the wire, by "pkgpath.Type" and
// "pkgpath.Type.Field".
type goDocs map[string]string

// wirePackages are the packages whose types the api's bodies hold.
var wirePackages = []string{"jetflow.dev/pkg/apiv1", "jetflow.dev/pkg/projections", "jetflow.dev/pkg/events", "jetflow.dev/pkg/workflow"}

// readGoDocs reads the doc comments of wirePackages from their sources,
// found from this package's directory in the repository.
func readGoDocs() (goDocs, error) {
	docs := goDocs{}
	for _, pkg := range wirePackages {
		dir := filepath.Join("..", "..", "..", strings.TrimPrefix(pkg, "jetflow.dev/"))
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("openapi: read the sources of %s: %w", pkg, err)
		}
		fset := token.NewFileSet()
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
			if err != nil {
				return nil, fmt.Errorf("openapi: %w", err)
			}
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.TYPE {
					continue
				}
				for _, spec := range gd.Specs {
					ts := spec.(*ast.TypeSpec)
					doc := ts.Doc
					if doc == nil && len(gd.Specs) == 1 {
						doc = gd.Doc
					}
					docs[pkg+"."+ts.Name.Name] = doc.Text()
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, field := range st.Fields.List {
						text := field.Doc.Text()
						if text == "" {
							text = field.Comment.Text()
						}
						for _, n := range field.Names {
							docs[pkg+"."+ts.Name.Name+"."+n.Name] = text
						}
					}
				}
			}
		}
	}
	return docs, nil
}

// docLinkRe finds Go doc links: [Type], [pkg.Name], [Type.Method].
var docLinkRe = regexp.MustCompile(`\[([A-Z][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*|[a-z][a-z0-9]*\.[A-Za-z0-9_.]+)\]`)

// goIdentRe finds identifiers, dotted ones whole.
var goIdentRe = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*`)

// prose is a doc comment of a struct type or of one of its fields as a
// paragraph of the document: one line, without Go doc links' brackets,
// naming the struct's fields as the wire does (goNames maps each Go
// name to its member's), e.g. "Next is the cursor" is "`next` is the
// cursor".
func (d goDocs) prose(key string, goNames map[string]string) string {
	text := docLinkRe.ReplaceAllString(strings.Join(strings.Fields(d[key]), " "), "$1")
	first := true
	return goIdentRe.ReplaceAllStringFunc(text, func(id string) string {
		lead := first
		first = false
		// Where the comment begins, a field's name is the field; elsewhere
		// an acronym (NATS) may be the word, and the name of a type
		// (Definition) the type.
		if member, ok := goNames[id]; ok && (lead || strings.ToUpper(id) != id && !d.isType(id)) {
			return "`" + member + "`"
		}
		return id
	})
}

// isType reports whether name is the name of a type of wirePackages.
func (d goDocs) isType(name string) bool {
	for _, pkg := range wirePackages {
		if _, ok := d[pkg+"."+name]; ok {
			return true
		}
	}
	return false
}

// goNames maps the Go names of struct type t's fields (those of structs
// embedded in it too) to the names of their JSON members.
func goNames(t reflect.Type) map[string]string {
	out := map[string]string{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			for k, v := range goNames(f.Type) {
				out[k] = v
			}
		case f.IsExported():
			out[f.Name] = cmp.Or(name, f.Name)
		}
	}
	return out
}
