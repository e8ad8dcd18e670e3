package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

func TestWorkflowRunsThroughAllServices(t *testing.T) {
	t.Parallel()
	// Every operation here ends within the agent's grace, however loaded
	// the machine: each is reported started only with its result.
	s := startStack(t, func(c *devstack.Config) { c.StartedAfter = time.Minute })
	ctx := context.Background()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "got": string(body), "key": r.Header.Get("Idempotency-Key"), "x": r.Header.Get("X-Test")})
	}))
	defer target.Close()

	a := s.apply(t, `
name: tour
steps:
  - id: hello
    kind: log
    message: hi
  - id: run
    kind: exec
    command: sh
    args: ["-c", "echo out-$GREETING; echo err >&2"]
    env: {GREETING: world}
  - id: call
    kind: http
    method: POST
    url: `+target.URL+`
    headers: {X-Test: yes}
    body: {"a": 1}
  - id: last
    kind: noop
`)
	require.Equal(t, 1, a.Version)
	require.True(t, a.Created)

	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "tour", Input: map[string]any{"n": 1}})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, st.HTTPStatus)
	x := s.waitDone(t, st.ID, 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"n":1}`, string(x.Input))
	require.Len(t, x.Steps, 4)
	for _, step := range x.Steps {
		require.Equal(t, projections.OpSucceeded, step.Status, step.ID)
		require.Equal(t, 1, step.Attempt)
		require.False(t, step.StartedAt.IsZero(), "the read model shows when %s started", step.ID)
		require.False(t, step.EndedAt.Before(step.StartedAt), step.ID)
	}
	var execOut struct {
		Stdout, Stderr string
		ExitCode       int `json:"exit_code"`
	}
	require.NoError(t, json.Unmarshal(x.Steps[1].Output, &execOut))
	require.Equal(t, "out-world\n", execOut.Stdout)
	require.Equal(t, "err\n", execOut.Stderr)
	var httpOut struct {
		Status int
		JSON   map[string]any
	}
	require.NoError(t, json.Unmarshal(x.Steps[2].Output, &httpOut))
	require.Equal(t, 200, httpOut.Status)
	require.Equal(t, "POST", httpOut.JSON["method"])
	require.JSONEq(t, `{"a":1}`, httpOut.JSON["got"].(string))
	require.Equal(t, "yes", httpOut.JSON["x"])
	require.Equal(t, events.TaskID(st.ID, "call", 1), httpOut.JSON["key"])

	evs := s.history(t, st.ID)
	folded := requireLinear(t, evs)
	require.Equal(t, projections.StatusSucceeded, folded.Status)
	for _, step := range []string{"hello", "run", "call", "last"} {
		require.Equal(t, 1, countTypes(evs)[string(events.TypeStepSucceeded)+"/"+step], step)
	}
	// The operation states were passed in Cloudify's order.
	var order []events.Type
	for _, ev := range evs {
		if ok, isOK := ev.Data.(*events.StepSucceeded); isOK && ok.Then != nil && ok.Then.StepID == "run" {
			order = append(order, events.TypeStepDispatched) // with the success before it
		}
		if p, ok := ev.Data.(interface{ EventType() events.Type }); ok && strings.HasPrefix(string(p.EventType()), "io.jetflow.step.") {
			if sid := stepOf(ev); sid == "run" {
				order = append(order, ev.Type)
			}
		}
	}
	// pending and sending are one event (nothing comes between them), and
	// sent and started are recorded with the success (sent_at, task_seq;
	// started_at, delivery).
	require.Equal(t, []events.Type{events.TypeStepDispatched, events.TypeStepSucceeded}, order)
	for _, ev := range evs {
		if ok, isOK := ev.Data.(*events.StepSucceeded); isOK && ok.StepID == "run" {
			require.False(t, ok.SentAt.IsZero(), "step.succeeded carries the sending")
			require.Positive(t, ok.TaskSeq, "step.succeeded carries the task's sequence")
			require.False(t, ok.StartedAt.IsZero(), "step.succeeded carries the start")
			require.Equal(t, 1, ok.Delivery)
			require.True(t, ok.StartedAt.Equal(x.Steps[1].StartedAt), "the read model's start is the event's")
		}
	}

	// The api's history endpoint returns the same events from a sequence.
	apiEvs, err := s.c.Events(ctx, st.ID, evs[3].Seq)
	require.NoError(t, err)
	require.Len(t, apiEvs, len(evs)-3)
	require.Equal(t, evs[3].ID, apiEvs[0].ID)

	// Following over SSE from the start replays everything and ends at the terminal event.
	var followed []client.Event
	require.NoError(t, s.c.Follow(ctx, st.ID, 0, func(ev client.Event) error { followed = append(followed, ev); return nil }))
	require.Len(t, followed, len(evs))
	require.Equal(t, events.TypeExecutionSucceeded, followed[len(followed)-1].Type)

	// Listing filters by workflow and status (the list comes from the read
	// models, which may be a moment behind the history).
	s.waitProjected(t)
	list, _, err := s.c.ListExecutions(ctx, client.ListOptions{Workflow: "tour", Status: "succeeded"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, st.ID, list[0].ID)
	require.Equal(t, 4, list[0].Done)
	list, _, err = s.c.ListExecutions(ctx, client.ListOptions{Workflow: "tour", Status: "failed"})
	require.NoError(t, err)
	require.Empty(t, list)
}

func stepOf(ev events.Event) string {
	var d struct {
		StepID string `json:"step_id"`
	}
	b, _ := json.Marshal(ev.Data)
	_ = json.Unmarshal(b, &d)
	return d.StepID
}

func TestFailingStepFailsExecution(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, `
name: fails
steps:
  - id: ok
    kind: noop
  - id: boom
    kind: exec
    command: sh
    args: ["-c", "echo broken >&2; exit 3"]
  - id: never
    kind: noop
`)
	st, err := s.c.Start(context.Background(), client.StartRequest{Workflow: "fails", ID: "fails-1"})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 20*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "boom")
	require.Contains(t, x.Error, "exit status 3")
	require.Equal(t, projections.OpFailed, x.Steps[1].Status)
	var out struct {
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exit_code"`
	}
	require.NoError(t, json.Unmarshal(x.Steps[1].Output, &out))
	require.Equal(t, 3, out.ExitCode)
	require.Equal(t, "broken\n", out.Stderr)
	require.Equal(t, projections.OpNone, x.Steps[2].Status, "a step after the failure never runs")
}

// ceStart builds a start command CloudEvent.
func ceStart(t *testing.T, source, id string, data string) events.Event {
	t.Helper()
	var p events.StartExecution
	require.NoError(t, json.Unmarshal([]byte(data), &p))
	return events.Event{ID: id, Type: events.TypeStartExecution, Source: source, Time: time.Now().UTC(), Data: &p}
}

func TestSameCloudEventTwiceStartsOneExecution(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: once\nsteps:\n  - id: a\n    kind: noop\n")
	ev := ceStart(t, "urn:test:orders", "order-42", `{"workflow":"once","input":{"order":42}}`)

	// Binary mode, published twice with plain NATS publish and no
	// Nats-Msg-Id, so JetStream's dedupe window does not help: the
	// dispatcher must recognise the command itself.
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	require.Equal(t, "order-42", msg.Header.Get("ce-id"))
	require.NoError(t, s.nc.PublishMsg(msg))
	require.NoError(t, s.nc.PublishMsg(msg))
	// Structured mode, same source and id: still the same command.
	structured, err := events.EncodeStructured(ev)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(&nats.Msg{Subject: bus.SubjectStart, Data: structured,
		Header: nats.Header{"content-type": {"application/cloudevents+json"}}}))

	// As the nats CLI sends it (nats pub jf.commands.start BODY -H K:V ...):
	// header keys exactly as typed, here in canonical HTTP case.
	byHand := nats.NewMsg(bus.SubjectStart)
	for _, kv := range [][2]string{{"Ce-Specversion", "1.0"}, {"Ce-Id", "order-42"}, {"Ce-Source", "urn:test:orders"},
		{"Ce-Type", string(events.TypeStartExecution)}, {"Content-Type", "application/json"}} {
		byHand.Header.Add(kv[0], kv[1])
	}
	byHand.Data = []byte(`{"workflow":"once","input":{"order":42}}`)
	require.NoError(t, s.nc.PublishMsg(byHand))

	id := events.DerivedExecutionID(events.CommandKey(ev.Source, ev.ID))
	x := s.waitDone(t, id, 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status)
	require.JSONEq(t, `{"order":42}`, string(x.Input))

	// Wait until the dispatcher consumed all three commands, then check.
	s.waitCommandsHandled(t)
	evs := s.history(t, id)
	require.Equal(t, 1, countTypes(evs)[string(events.TypeExecutionStarted)])
	require.Equal(t, 1, countTypes(evs)[string(events.TypeExecutionSucceeded)])
	s.waitProjected(t)
	list, _, err := s.c.ListExecutions(context.Background(), client.ListOptions{Workflow: "once"})
	require.NoError(t, err)
	require.Len(t, list, 1)

	// Over HTTP the same CloudEvent answers 200 with the existing execution.
	body, _ := events.EncodeStructured(ev)
	resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/cloudevents+json", bytes.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestExplicitExecutionIDIsUniqueForever(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: uniq\nsteps:\n  - id: a\n    kind: noop\n")
	s.apply(t, "name: other\nsteps:\n  - id: b\n    kind: noop\n")
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "uniq", ID: "job-1"})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, st.HTTPStatus)
	s.waitDone(t, "job-1", 20*time.Second)
	before := s.history(t, "job-1")

	// Over HTTP: 409 with a JSON error naming the field, for any workflow.
	for _, wf := range []string{"uniq", "other"} {
		_, err = s.c.Start(ctx, client.StartRequest{Workflow: wf, ID: "job-1"})
		require.True(t, client.IsStatus(err, http.StatusConflict), "%v", err)
		var apiErr *client.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, "id", apiErr.Field)
	}

	// Over NATS: the dispatcher publishes a rejection and changes nothing.
	ev := ceStart(t, "urn:test:cli", "another-command", `{"workflow":"other","execution_id":"job-1"}`)
	sub, err := s.nc.SubscribeSync(bus.RejectionSubject(events.CommandKey(ev.Source, ev.ID)))
	require.NoError(t, err)
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(msg))
	m, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	rej, err := bus.Decode(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, events.CodeConflict, rej.Data.(*events.CommandRejected).Code)
	require.Contains(t, rej.Data.(*events.CommandRejected).Reason, "already used")

	after := s.history(t, "job-1")
	require.Equal(t, len(before), len(after), "a refused start changes nothing")
	_, err = s.js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
}

func TestStartOverHTTPCloudEventBinding(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, "name: cehttp\nsteps:\n  - id: a\n    kind: noop\n")

	// Binary mode: ce- headers, JSON body is the data.
	req, _ := http.NewRequest(http.MethodPost, s.info.APIURL+"/v1/executions",
		strings.NewReader(`{"workflow":"cehttp","execution_id":"ce-bin-1","input":{"k":"v"}}`))
	req.Header.Set("Ce-Specversion", "1.0")
	req.Header.Set("Ce-Id", "evt-1")
	req.Header.Set("Ce-Source", "urn:test:http")
	req.Header.Set("Ce-Type", string(events.TypeStartExecution))
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// Structured mode without an execution id: derived from source and id.
	body := `{"specversion":"1.0","id":"evt-2","source":"urn:test:http","type":"io.jetflow.execution.start",
	  "datacontenttype":"application/json","data":{"workflow":"cehttp"}}`
	resp, err = apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/cloudevents+json", strings.NewReader(body))
	require.NoError(t, err)
	var started client.Started
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&started))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, events.DerivedExecutionID(events.CommandKey("urn:test:http", "evt-2")), started.ID)

	// The same CloudEvent id from another source is another command.
	other := strings.Replace(body, "urn:test:http", "urn:test:elsewhere", 1)
	resp, err = apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/cloudevents+json", strings.NewReader(other))
	require.NoError(t, err)
	var second client.Started
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&second))
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.NotEqual(t, started.ID, second.ID)

	for _, id := range []string{"ce-bin-1", started.ID, second.ID} {
		x := s.waitDone(t, id, 20*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status)
	}

	// A CloudEvent of the wrong type is a 400 naming the field.
	resp, err = apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/cloudevents+json",
		strings.NewReader(strings.Replace(body, "io.jetflow.execution.start", "com.example.other", 1)))
	require.NoError(t, err)
	var e struct {
		Error client.Error `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "type", e.Error.Field)
}

func TestBadInputGetsClearErrors(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()

	_, err := s.c.ApplyWorkflow(ctx, []byte("name: bad\nsteps:\n  - id: a\n    kind: noop\n  - id: b\n    kind: teleport\n"))
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, http.StatusBadRequest, apiErr.Status)
	require.Equal(t, "steps[1].kind", apiErr.Field)
	require.Contains(t, apiErr.Message, "line 6")
	require.Contains(t, apiErr.Message, `unknown step kind "teleport"`)

	_, err = s.c.ApplyWorkflow(ctx, []byte("name: bad\nsteps: [\n"))
	require.True(t, client.IsStatus(err, http.StatusBadRequest), "%v", err)

	// Versioning: a changed definition is a new version, the same one is not.
	v1 := s.apply(t, "name: ver\nsteps:\n  - id: a\n    kind: noop\n")
	same := s.apply(t, "name: ver\nsteps:\n  - id: a\n    kind: noop\n")
	v2 := s.apply(t, "name: ver\nsteps:\n  - id: a\n    kind: noop\n  - id: b\n    kind: noop\n")
	require.Equal(t, []int{1, 1, 2}, []int{v1.Version, same.Version, v2.Version})
	require.False(t, same.Created)
	x := s.runToEnd(t, client.StartRequest{Workflow: "ver", Version: 1})
	require.Equal(t, 1, x.Version)
	require.Len(t, x.Steps, 1, "an execution keeps the version it started with")

	// The answer to a start says which version runs: the one named, or
	// the latest once the dispatcher has started it (201, or the same
	// request again: 200); a 202 for a start naming none cannot say.
	for _, c := range []struct{ named, want int }{{1, 1}, {0, 2}} {
		req := client.StartRequest{Workflow: "ver", Version: c.named, IdempotencyKey: fmt.Sprintf("ver-named-%d", c.named)}
		st, err := s.c.Start(ctx, req)
		require.NoError(t, err)
		switch st.HTTPStatus {
		case http.StatusCreated:
			require.Equal(t, c.want, st.Version, "%+v", st)
		case http.StatusAccepted: // a loaded machine
			require.Equal(t, c.named, st.Version, "%+v", st)
		default:
			t.Fatalf("start answered %d: %+v", st.HTTPStatus, st)
		}
		require.Equal(t, c.want, s.waitDone(t, st.ID, 20*time.Second).Version)
		again, err := s.c.Start(ctx, req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, again.HTTPStatus)
		require.Equal(t, c.want, again.Version, "%+v", again)
	}

	for name, req := range map[string]struct {
		body   string
		status int
		field  string
	}{
		"UnknownWorkflow": {`{"workflow":"nope"}`, 404, "workflow"},
		"UnknownVersion":  {`{"workflow":"ver","version":9}`, 404, "version"},
		"BadID":           {`{"workflow":"ver","id":"has space"}`, 400, "id"},
		"InputNotObject":  {`{"workflow":"ver","input":[1,2]}`, 400, "input"},
		"UnknownField":    {`{"workflow":"ver","colour":"red"}`, 400, "colour"},
		"NotJSON":         {`workflow=ver`, 400, ""},
	} {
		resp, err := apiHTTP.Post(s.info.APIURL+"/v1/executions", "application/json", strings.NewReader(req.body))
		require.NoError(t, err, name)
		var e struct {
			Error client.Error `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e), name)
		resp.Body.Close()
		require.Equal(t, req.status, resp.StatusCode, name)
		require.Equal(t, req.field, e.Error.Field, name)
		require.NotEmpty(t, e.Error.Message, name)
	}
	_, err = s.c.Execution(ctx, "does-not-exist")
	require.True(t, client.IsStatus(err, http.StatusNotFound))
	_, err = s.c.Events(ctx, "does-not-exist", 0)
	require.True(t, client.IsStatus(err, http.StatusNotFound))
}
