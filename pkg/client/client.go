// Package client is a Go client for jetflow's HTTP api. The bodies it
// sends and reads are the wire types of package apiv1, which the api
// answers with: most types here are aliases of them.
package client

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/projections"
)

// Client talks to one api base URL.
type Client struct {
	Base string
	HTTP *http.Client
	// Token is sent as Authorization: Bearer <Token> ("" for none): an api
	// key, an admin token or an OIDC token (docs/api.md#authentication).
	Token string
	// Namespace is sent as Jetflow-Namespace ("" for the api's default).
	Namespace string
	// RetryFor is how long a request answered 503 (or 502, 504: the api
	// or NATS is away or between leaders) is tried again, with the same
	// Idempotency-Key, waiting as Retry-After says: reads, and the
	// commands that carry a key (Start, Signal, Act: each call makes one
	// unless the context gives one, WithIdempotencyKey). 0 is
	// DefaultRetryFor; negative never retries.
	RetryFor time.Duration
}

// DefaultRetryFor is how long a request is retried by default.
const DefaultRetryFor = 30 * time.Second

type idempotencyKey struct{}

// WithIdempotencyKey returns ctx whose commands (Start, Signal, Act) are
// sent with Idempotency-Key key: the same key is the same command, so a
// retry, by this client or by the caller after an error, never runs it
// twice. Without one, each call makes its own.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// commandHeader returns hdr with the command's Idempotency-Key: key if
// given, else the context's, else a new one.
func commandHeader(ctx context.Context, hdr http.Header, key string) http.Header {
	if key == "" {
		key, _ = ctx.Value(idempotencyKey{}).(string)
	}
	if key == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		key = "jetflow-client-" + hex.EncodeToString(b)
	}
	hdr = hdr.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr.Set("Idempotency-Key", key)
	return hdr
}

// Option sets an optional setting of a Client.
type Option func(*Client)

// WithToken authenticates every request with the bearer token t.
func WithToken(t string) Option { return func(c *Client) { c.Token = t } }

// WithNamespace makes every request about namespace ns.
func WithNamespace(ns string) Option { return func(c *Client) { c.Namespace = ns } }

// New returns a client for base, e.g. "http://127.0.0.1:8080".
func New(base string, opts ...Option) *Client {
	c := &Client{Base: strings.TrimRight(base, "/"), HTTP: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// authorize adds the client's token and namespace to req.
func (c *Client) authorize(req *http.Request) {
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if c.Namespace != "" {
		req.Header.Set("Jetflow-Namespace", c.Namespace)
	}
}

// IsDenied reports whether err is an api answer that the caller is not
// authenticated (401) or not allowed (403).
func IsDenied(err error) bool {
	return IsStatus(err, http.StatusUnauthorized) || IsStatus(err, http.StatusForbidden)
}

// Error is an api error answer, with its HTTP status; requests return it
// as a *Error.
type Error = apiv1.Error

// ErrUnreachable is wrapped by errors of requests that got no answer from
// the api (nothing listens at the base URL, the connection broke, a
// timeout): the api may be down, or elsewhere.
var ErrUnreachable = errors.New("client: api unreachable")

// unreachable wraps a transport error; a cancelled ctx stays itself.
func (c *Client) unreachable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return &unreachableError{what: what, base: c.Base, err: err}
}

type unreachableError struct {
	what, base string
	err        error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%s: cannot reach the api at %s (is it running? start it with `jetflow dev`, or point --api or JETFLOW_API at it): %v",
		e.what, e.base, e.err)
}
func (e *unreachableError) Unwrap() error        { return e.err }
func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }

// IsStatus reports whether err is an api error with the given HTTP status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// do sends a request and decodes its answer into out. A read, or a
// command with an Idempotency-Key, answered 502, 503 or 504 is sent again
// for up to RetryFor.
func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, body io.Reader, out any) (int, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = io.ReadAll(body); err != nil {
			return 0, fmt.Errorf("read body of %s %s: %w", method, path, err)
		}
	}
	retry := (method == http.MethodGet && path != "/healthz" && path != "/readyz") || hdr.Get("Idempotency-Key") != ""
	retryFor := cmp.Or(c.RetryFor, DefaultRetryFor)
	began := time.Now()
	for attempt := 1; ; attempt++ {
		status, wait, err := c.once(ctx, method, path, hdr, payload, out)
		if !retry || retryFor < 0 || wait < 0 || time.Since(began)+wait > retryFor {
			return status, err
		}
		if wait == 0 {
			wait = min(250*time.Millisecond<<min(attempt-1, 3), 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return status, err
		case <-time.After(wait):
		}
	}
}

// once sends a request once. wait is -1 unless the answer may be retried
// (502, 503, 504); then it is what Retry-After asks (0: not said).
func (c *Client) once(ctx context.Context, method, path string, hdr http.Header, payload []byte, out any) (status int, wait time.Duration, err error) {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, body)
	if err != nil {
		return 0, -1, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c.authorize(req)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, -1, c.unreachable(ctx, method+" "+path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, -1, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		wait = -1
		switch resp.StatusCode {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			wait = 0
			if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n >= 0 {
				wait = min(time.Duration(n)*time.Second, 5*time.Second)
			}
		}
		return resp.StatusCode, wait, decodeError(resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, -1, fmt.Errorf("decode answer of %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, -1, nil
}

// decodeError reads an api error answer ({"error": {...}}), or keeps the
// body as the message when it is not one.
func decodeError(status int, body []byte) *Error {
	var wrapper apiv1.ErrorBody
	if json.Unmarshal(body, &wrapper) != nil || wrapper.Error == nil {
		return &Error{Status: status, Code: "http", Message: strings.TrimSpace(string(body))}
	}
	wrapper.Error.Status = status
	return wrapper.Error
}

// Applied is the answer to ApplyWorkflow.
type Applied = apiv1.Applied

// ApplyWorkflow registers a YAML or JSON definition.
func (c *Client) ApplyWorkflow(ctx context.Context, definition []byte) (Applied, error) {
	var a Applied
	_, err := c.do(ctx, http.MethodPost, "/v1/workflows", http.Header{"Content-Type": {"application/yaml"}}, bytes.NewReader(definition), &a)
	return a, err
}

// WorkflowSummary is a row of ListWorkflows.
type WorkflowSummary = apiv1.WorkflowSummary

// ListWorkflows lists registered workflows.
func (c *Client) ListWorkflows(ctx context.Context) ([]WorkflowSummary, error) {
	var out apiv1.WorkflowList
	_, err := c.do(ctx, http.MethodGet, "/v1/workflows", nil, nil, &out)
	return out.Workflows, err
}

// Workflow is a workflow's latest version and its version numbers.
type Workflow = apiv1.Workflow

// WorkflowVersion is one stored version of a workflow, its definition as
// JSON and as YAML.
type WorkflowVersion = apiv1.WorkflowVersion

// Workflow returns a registered workflow: its latest version, with the
// definition, and every version number.
func (c *Client) Workflow(ctx context.Context, name string) (Workflow, error) {
	var out Workflow
	_, err := c.do(ctx, http.MethodGet, "/v1/workflows/"+url.PathEscape(name), nil, nil, &out)
	return out, err
}

// WorkflowVersion returns one stored version of a workflow.
func (c *Client) WorkflowVersion(ctx context.Context, name string, version int) (WorkflowVersion, error) {
	var out WorkflowVersion
	_, err := c.do(ctx, http.MethodGet, "/v1/workflows/"+url.PathEscape(name)+"/versions/"+strconv.Itoa(version), nil, nil, &out)
	return out, err
}

// StartRequest starts an execution. It is [apiv1.StartRequest] with the
// input as a map, to fill in (a test holds the two in step).
type StartRequest struct {
	Workflow string         `json:"workflow"`
	Version  int            `json:"version,omitempty"`
	Input    map[string]any `json:"input,omitempty"`
	ID       string         `json:"id,omitempty"`
	// WaitAfterFail: a failure suspends the execution instead of ending it.
	WaitAfterFail bool `json:"wait_after_fail,omitempty"`
	// DryRun walks the workflow without running any operation.
	DryRun bool `json:"dry_run,omitempty"`
	// IdempotencyKey, sent as the Idempotency-Key header, makes the same
	// request sent again (its answer was lost) the same start: it answers
	// 200 with the execution instead of 409 for an id already used.
	IdempotencyKey string `json:"-"`
}

// Started is the answer to Start, with its HTTP status.
type Started = apiv1.Started

// Start starts an execution.
func (c *Client) Start(ctx context.Context, r StartRequest) (Started, error) {
	if _, given := ctx.Value(idempotencyKey{}).(string); !given && r.IdempotencyKey == "" && r.ID == "" {
		// The api would derive the id from the key this call makes; name
		// a new one as the api does without a key (time-ordered).
		r.ID = uuid.Must(uuid.NewV7()).String()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return Started{}, err
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	var s Started
	s.HTTPStatus, err = c.do(ctx, http.MethodPost, "/v1/executions", commandHeader(ctx, hdr, r.IdempotencyKey), bytes.NewReader(b), &s)
	return s, err
}

// Execution returns an execution's state.
func (c *Client) Execution(ctx context.Context, id string) (projections.Execution, error) {
	return c.ExecutionAt(ctx, id, 0)
}

// ExecutionAt returns an execution's state as it was at stream sequence
// atSeq (0 = now).
func (c *Client) ExecutionAt(ctx context.Context, id string, atSeq uint64) (projections.Execution, error) {
	var x projections.Execution
	path := "/v1/executions/" + url.PathEscape(id)
	if atSeq > 0 {
		path += "?at_seq=" + strconv.FormatUint(atSeq, 10)
	}
	_, err := c.do(ctx, http.MethodGet, path, nil, nil, &x)
	return x, err
}

// StepPage is a page of an execution's step instances.
type StepPage = apiv1.StepPage

// Steps returns the execution's step instances from offset, at most limit
// (0: the api's default, 100): all of them, also of an execution whose
// read model leaves finished ones out.
func (c *Client) Steps(ctx context.Context, id string, offset, limit int) (StepPage, error) {
	q := url.Values{"offset": {strconv.Itoa(offset)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p StepPage
	_, err := c.do(ctx, http.MethodGet, "/v1/executions/"+url.PathEscape(id)+"/steps?"+q.Encode(), nil, nil, &p)
	return p, err
}

// Ready is the api's readiness.
type Ready = apiv1.Ready

// Ready returns the api's readiness: connected, and how many read models
// its projectors have parked.
func (c *Client) Ready(ctx context.Context) (Ready, error) {
	var r Ready
	_, err := c.do(ctx, http.MethodGet, "/readyz", nil, nil, &r)
	return r, err
}

// Health is the api's liveness answer.
type Health = apiv1.Health

// Health returns the api's liveness: alive, its NATS connection and its
// version (never retried: the answer is the point).
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	_, err := c.do(ctx, http.MethodGet, "/healthz", nil, nil, &h)
	return h, err
}

// ListOptions filters ListExecutions.
type ListOptions struct {
	Workflow, Status, After string
	Limit                   int
	// Damaged lists the damaged (quarantined) executions only.
	Damaged bool
	// Sort is the order: "" (the api's default: id, or with a time range
	// that time, latest first), "id", "started_desc", "started_asc",
	// "ended_desc" or "ended_asc". After is a cursor of a list in the
	// same order.
	Sort string
	// StartedAfter, StartedBefore, EndedAfter and EndedBefore bound the
	// executions' start and end (at or after, before); zero: unbounded.
	StartedAfter, StartedBefore, EndedAfter, EndedBefore time.Time
	// Attrs are search attribute filters, each "name:value".
	Attrs []string
}

// query is the list's query for the page after after.
func (o ListOptions) query(after string, limit int) url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"workflow": o.Workflow, "status": o.Status, "after": after, "sort": o.Sort} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for k, t := range map[string]time.Time{"started_after": o.StartedAfter, "started_before": o.StartedBefore,
		"ended_after": o.EndedAfter, "ended_before": o.EndedBefore} {
		if !t.IsZero() {
			q.Set(k, t.Format(time.RFC3339Nano))
		}
	}
	for _, a := range o.Attrs {
		q.Add("attr", a)
	}
	q.Set("limit", strconv.Itoa(limit))
	if o.Damaged {
		q.Set("damaged", "true")
	}
	return q
}

// ExecutionSummary is a row of ListExecutions.
type ExecutionSummary = apiv1.ExecutionSummary

// ExecutionList is a page of executions, as GET /v1/executions answers.
type ExecutionList = apiv1.ExecutionList

// EventList is a history, as GET /v1/executions/{id}/events answers.
type EventList = apiv1.EventList

// ListExecutions lists executions; next is the cursor of the next page
// ("" at the end). The api examines a bounded number of executions per
// request and may answer a partial page (a filter that is not part of the
// range its index scans): ListExecutions then asks again from where it
// stopped, until the page is full, the list ends, or it has asked
// listFill times (then the page is short, and next goes on).
func (c *Client) ListExecutions(ctx context.Context, o ListOptions) (list []ExecutionSummary, next string, err error) {
	limit := cmp.Or(o.Limit, 50)
	after := o.After
	list = []ExecutionSummary{} // none: an empty list, as the api answers ([] in JSON)
	for asked := 1; ; asked++ {
		var out ExecutionList
		if _, err = c.do(ctx, http.MethodGet, "/v1/executions?"+o.query(after, limit-len(list)).Encode(), nil, nil, &out); err != nil {
			return list, "", err
		}
		list = append(list, out.Executions...)
		if !out.Partial || out.Next == "" || len(list) >= limit || asked == listFill {
			return list, out.Next, nil
		}
		after = out.Next
	}
}

// ExecutionCounts is how many executions are in each status, as GET
// /v1/executions/_counts answers.
type ExecutionCounts = apiv1.ExecutionCounts

// CountExecutions counts the executions by status: all of the
// namespace's, or with workflow set, that workflow's. The api answers 503
// while its index is being fed (the client retries it).
func (c *Client) CountExecutions(ctx context.Context, workflow string) (ExecutionCounts, error) {
	var out ExecutionCounts
	path := "/v1/executions/_counts"
	if workflow != "" {
		path += "?" + url.Values{"workflow": {workflow}}.Encode()
	}
	_, err := c.do(ctx, http.MethodGet, path, nil, nil, &out)
	return out, err
}

// listFill bounds the requests ListExecutions makes to fill one page.
const listFill = 10

// Event is a history event as the api shows it.
type Event = apiv1.Event

// Events returns the history from stream sequence fromSeq.
func (c *Client) Events(ctx context.Context, id string, fromSeq uint64) ([]Event, error) {
	var out EventList
	_, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/executions/%s/events?from_seq=%d", url.PathEscape(id), fromSeq), nil, nil, &out)
	return out.Events, err
}

// Follow streams the history live (server-sent events) from fromSeq and
// calls fn for each event until the execution is settled as of its latest
// events (it ended, or it is suspended: see [projections.Status.Settled]),
// fn returns an error, or ctx ends. A cancelled execution that is resumed
// is followed on. It reconnects with Last-Event-ID if the stream breaks,
// for up to FollowReconnectFor without progress (an api restarting: a
// development stack rebuilt and started again takes tens of seconds).
func (c *Client) Follow(ctx context.Context, id string, fromSeq uint64, fn func(Event) error) error {
	last := uint64(0)
	if fromSeq > 0 {
		last = fromSeq - 1
	}
	failing := time.Now()
	for attempt := 0; ; attempt++ {
		before := last
		done, err := c.followOnce(ctx, id, last, func(ev Event) error {
			last = ev.Seq
			return fn(ev)
		})
		if done || ctx.Err() != nil {
			return err
		}
		if last != before {
			attempt, failing = 0, time.Now() // it made progress: count failures afresh
		}
		var apiErr *Error
		if errors.As(err, &apiErr) || time.Since(failing) > FollowReconnectFor {
			return err
		}
		if errors.Is(err, io.EOF) && attempt == 0 {
			// The server ended the stream: it does so once the execution
			// is settled, and answers the next request with 204 then.
			// Asking again at once tells that from a broken connection.
			continue
		}
		select {
		case <-time.After(time.Duration(min(attempt+1, 10)) * 200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// FollowReconnectFor is how long Follow keeps reconnecting to a stream
// that broke without bringing any event.
var FollowReconnectFor = 2 * time.Minute

// followOnce reads one event stream. done is true when there is nothing
// more to follow (204) or the stream cannot be followed (an api error, an
// error from fn); io.EOF means the server ended the stream.
func (c *Client) followOnce(ctx context.Context, id string, last uint64, fn func(Event) error) (done bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/v1/executions/"+url.PathEscape(id)+"/events", nil)
	if err != nil {
		return true, err
	}
	req.Header.Set("Accept", "text/event-stream")
	c.authorize(req)
	if last > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(last, 10))
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return false, c.unreachable(ctx, "follow "+id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent {
		return true, nil // settled, and nothing after last
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return true, decodeError(resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimSpace(strings.TrimPrefix(line, "data:")))
		case line == "" && data.Len() > 0:
			var ev Event
			if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
				return true, fmt.Errorf("decode event: %w", err)
			}
			data.Reset()
			if err := fn(ev); err != nil {
				return true, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, io.EOF
}

// Settings are the system-wide values services recorded (GET
// /v1/settings); a value no service recorded yet is "".
type Settings = apiv1.Settings

// Settings returns the system-wide settings.
func (c *Client) Settings(ctx context.Context) (Settings, error) {
	var out Settings
	_, err := c.do(ctx, http.MethodGet, "/v1/settings", nil, nil, &out)
	return out, err
}

// Rebuilt is the answer to RebuildProjections.
type Rebuilt = apiv1.Rebuilt

// RebuildProjections re-projects the read models from a stream sequence.
func (c *Client) RebuildProjections(ctx context.Context, fromSeq uint64) (Rebuilt, error) {
	var out Rebuilt
	_, err := c.do(ctx, http.MethodPost, fmt.Sprintf("/v1/admin/projections/rebuild?from_seq=%d", fromSeq), nil, nil, &out)
	return out, err
}

// Signaled is the answer to Signal.
type Signaled = apiv1.Signaled

// Signal sends a named signal with JSON data (nil for none) to an execution.
func (c *Client) Signal(ctx context.Context, id, name string, data json.RawMessage) (Signaled, error) {
	return c.SignalOnce(ctx, id, name, data, "")
}

// SignalOnce is Signal with an Idempotency-Key (none if key is ""): the
// same request sent again (its answer was lost) is the same signal,
// recorded once.
func (c *Client) SignalOnce(ctx context.Context, id, name string, data json.RawMessage, key string) (Signaled, error) {
	var out Signaled
	var body io.Reader
	if len(data) > 0 {
		body = bytes.NewReader(data)
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/executions/"+url.PathEscape(id)+"/signals/"+url.PathEscape(name),
		commandHeader(ctx, http.Header{"Content-Type": {"application/json"}}, key), body, &out)
	return out, err
}

// ActionRequest asks for an operator's action on an execution.
type ActionRequest = apiv1.ActionRequest

// Acted is the answer to an action.
type Acted = apiv1.Acted

// Act asks for an action (cancel, force-cancel, kill) on execution id.
func (c *Client) Act(ctx context.Context, id string, req ActionRequest) (Acted, error) {
	var out Acted
	b, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, http.MethodPost, "/v1/executions/"+url.PathEscape(id)+"/actions",
		commandHeader(ctx, http.Header{"Content-Type": {"application/json"}}, ""), bytes.NewReader(b), &out)
	return out, err
}
