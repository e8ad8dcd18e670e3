package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// stepByID returns the step instance id of x, failing the test if x has
// no such instance: a misspelt id must not pass for a step that never ran
// (its zero status is OpNone). Top-level steps are listed from the start;
// an instance inside a container, an on-error list or a later goto round
// is listed once it was reached (use requireNoStep for one that must not
// have been).
func stepByID(t *testing.T, x projections.Execution, id string) projections.Step {
	t.Helper()
	st, ok := findStep(x, id)
	require.True(t, ok, "execution %s has no step %q; it has %v", x.ID, id, stepIDs(x))
	return st
}

// findStep returns the step instance id of x, if x lists it. Conditions
// polled inside require.Eventually use it: they must not fail the test.
func findStep(x projections.Execution, id string) (projections.Step, bool) {
	if i := x.StepIndex(id); i >= 0 {
		return x.Steps[i], true
	}
	return projections.Step{}, false
}

// requireNoStep checks that the instance id (inside a container, an
// on-error list or a goto round) was never reached.
func requireNoStep(t *testing.T, x projections.Execution, id string) {
	t.Helper()
	_, ok := findStep(x, id)
	require.False(t, ok, "step %q of %s was reached", id, x.ID)
}

func stepIDs(x projections.Execution) []string {
	ids := make([]string, len(x.Steps))
	for i, st := range x.Steps {
		ids[i] = st.ID
	}
	return ids
}

func TestExpressionsVariablesConditionsOutputs(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: lang
input:
  type: object
  required: [host]
  properties:
    host: {type: string}
    replicas: {type: integer, minimum: 1}
steps:
  - id: setup
    kind: let
    vars:
      greeting: hello-${input.host}
      total: ${input.replicas * 2}
  - id: skipped
    kind: exec
    condition: ${input.replicas > 100}
    command: "false"
  - id: run
    kind: exec
    command: sh
    args: ["-c", "echo $GREETING $0", "${vars.total}"]
    env: {GREETING: "${vars.greeting}"}
    output: ${trim(result.stdout)}
  - id: done
    kind: return
    output:
      said: ${steps.run.output}
      skipped: ${steps.skipped.status}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "lang", Input: map[string]any{"host": "db1", "replicas": 2}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `{"said":"hello-db1 4","skipped":"skipped"}`, string(x.Output))
	require.Equal(t, projections.OpSkipped, stepByID(t, x, "skipped").Status)
	require.JSONEq(t, `"hello-db1"`, string(x.Vars["greeting"]))
	require.JSONEq(t, `4`, string(x.Vars["total"]))

	// The input schema is enforced at start, naming the field.
	resp, e := postJSON(t, s.info.APIURL+"/v1/executions", `{"workflow":"lang","input":{"host":"db1","replicas":0}}`, nil)
	require.Equal(t, http.StatusBadRequest, resp)
	require.Equal(t, "input.replicas", e.Field)
	resp, e = postJSON(t, s.info.APIURL+"/v1/executions", `{"workflow":"lang","input":{}}`, nil)
	require.Equal(t, http.StatusBadRequest, resp)
	require.Contains(t, e.Message, "host")

	// A bad expression is refused at apply time, naming line and field.
	_, err := s.c.ApplyWorkflow(ctx, []byte("name: badexpr\nsteps:\n  - id: a\n    kind: log\n    message: ${inptu.x}\n"))
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "steps[0].message", apiErr.Field)
	require.Contains(t, apiErr.Message, "line 5")
}

func TestFailAndRuntimeExpressionErrors(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: failing\nsteps:\n  - id: check\n    kind: fail\n    condition: ${input.bad}\n    message: refusing ${input.who}\n  - id: after\n    kind: noop\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "failing", Input: map[string]any{"bad": true, "who": "bob"}})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "refusing bob")
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "failing", Input: map[string]any{"bad": false}})
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, st.ID, 20*time.Second).Status)

	// A condition that does not give a boolean fails the step clearly.
	x = s.runToEnd(t, client.StartRequest{Workflow: "failing", Input: map[string]any{"bad": "yes"}})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "must give true or false")
}

func TestDurableSleepAndSignals(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `
name: approval
steps:
  - id: nap
    kind: sleep
    duration: ${input.nap}
  - id: approve
    kind: wait
    signals: [approve, reject]
    match: ${signal.data.level >= 2}
    timeout: 20s
  - id: verdict
    kind: return
    output: ${steps.approve.output.name}
`)
	// Signal before the wait is reached: kept, then taken. A first signal
	// that does not match is left alone.
	began := time.Now()
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "approval", ID: "early", Input: map[string]any{"nap": "1s"}})
	require.NoError(t, err)
	_, err = s.c.Signal(ctx, "early", "approve", json.RawMessage(`{"level":1}`))
	require.NoError(t, err)
	_, err = s.c.Signal(ctx, "early", "reject", json.RawMessage(`{"level":3}`))
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.GreaterOrEqual(t, time.Since(began), time.Second, "the sleep lasted")
	require.JSONEq(t, `"reject"`, string(x.Output))
	require.Len(t, x.Signals, 2)
	require.Empty(t, x.Signals[0].TakenBy)
	require.Equal(t, "approve", x.Signals[1].TakenBy)

	// Signal while waiting.
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "approval", ID: "late", Input: map[string]any{"nap": "10ms"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, "late")
		st, ok := findStep(x, "approve")
		return err == nil && ok && st.Status == projections.OpWaiting
	}, 20*time.Second, 20*time.Millisecond)
	res, err := s.c.Signal(ctx, "late", "approve", json.RawMessage(`{"level":2}`))
	require.NoError(t, err)
	require.True(t, res.Recorded)
	x = s.waitDone(t, "late", 20*time.Second)
	require.JSONEq(t, `"approve"`, string(x.Output))

	// Signals to unknown or finished executions are refused.
	_, err = s.c.Signal(ctx, "nope", "approve", nil)
	require.True(t, client.IsStatus(err, http.StatusNotFound), "%v", err)
	_, err = s.c.Signal(ctx, "late", "approve", nil)
	require.True(t, client.IsStatus(err, http.StatusConflict), "%v", err)
}

func TestRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	s.apply(t, fmt.Sprintf(`
name: flaky
steps:
  - id: try
    kind: exec
    command: sh
    args: ["-c", "n=$(cat %[1]s/$JETFLOW_EXECUTION_ID 2>/dev/null || echo 0); echo $((n+1)) > %[1]s/$JETFLOW_EXECUTION_ID; [ $n -ge 2 ] || { echo transient >&2; exit 1; }"]
    retry:
      limit: 3
      backoff: {initial: 200ms, factor: 2}
  - id: never-retried
    kind: exec
    command: sh
    args: ["-c", "echo permanent >&2; exit 1"]
    condition: ${input.second}
    retry: {limit: 5, on: [transient]}
`, dir))
	began := time.Now()
	st, err := s.c.Start(ctx, client.StartRequest{Workflow: "flaky", ID: "flaky-1", Input: map[string]any{"second": false}})
	require.NoError(t, err)
	x := s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, 3, stepByID(t, x, "try").Attempt)
	require.GreaterOrEqual(t, time.Since(began), 600*time.Millisecond, "backoffs of 200ms then 400ms")
	counts := countTypes(s.history(t, st.ID))
	require.Equal(t, 2, counts[string(events.TypeStepRescheduled)])
	require.Equal(t, 2, counts[string(events.TypeTimerFired)])
	b, err := os.ReadFile(filepath.Join(dir, "flaky-1"))
	require.NoError(t, err)
	require.Equal(t, "3", strings.TrimSpace(string(b)))

	// An error the policy does not name is not retried.
	st, err = s.c.Start(ctx, client.StartRequest{Workflow: "flaky", ID: "flaky-2", Input: map[string]any{"second": true}})
	require.NoError(t, err)
	x = s.waitDone(t, st.ID, 30*time.Second)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Equal(t, 1, stepByID(t, x, "never-retried").Attempt)
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: slowop\nsteps:\n  - id: hang\n    kind: exec\n    command: sleep\n    args: [\"30\"]\n    timeout: 1s\n")
	s.apply(t, "name: nosignal\nsteps:\n  - id: w\n    kind: wait\n    signal: go\n    timeout: 1s\n")
	s.apply(t, "name: tooslow\ntimeout: 1s\nsteps:\n  - id: nap\n    kind: sleep\n    duration: 30s\n")
	for wf, want := range map[string]string{"slowop": "attempt 1 timed out after 1s", "nosignal": "timed out after 1s waiting for signal", "tooslow": "the workflow timed out after 1s"} {
		st, err := s.c.Start(ctx, client.StartRequest{Workflow: wf})
		require.NoError(t, err)
		x := s.waitDone(t, st.ID, 20*time.Second)
		require.Equal(t, projections.StatusFailed, x.Status, wf)
		require.Contains(t, x.Error, want, wf)
		require.Less(t, x.EndedAt.Sub(x.StartedAt), 10*time.Second, wf)
	}

	// The workflow's timeout runs its on-error steps, as any failure does:
	// here they rescue it, seeing the timeout as the error.
	s.apply(t, "name: rescued\ntimeout: 1s\non-error:\n  - {id: save, kind: return, output: \"rescued: ${error.message}\"}\nsteps:\n  - id: nap\n    kind: sleep\n    duration: 30s\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "rescued"})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `"rescued: the workflow timed out after 1s"`, string(x.Output))
	require.Equal(t, projections.OpWaiting, stepByID(t, x, "nap").Status, "the sleep went no further")
}

// TestRetryStepHonoursOn: a retry step whose policy names the errors it
// retries (on) is skipped for another, so the on-error steps after it go
// on (here a return rescues the execution), and retries those it names
// up to its limit.
func TestRetryStepHonoursOn(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	s.apply(t, `
name: picky
steps:
  - id: op
    kind: exec
    command: sh
    args: ["-c", "exit ${input.code}"]
    on-error:
      - {id: again, kind: retry, retry: {limit: 2, on: ["exit status 3"]}}
      - {id: rescue, kind: return, output: "not retried: ${error.message}"}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "picky", Input: map[string]any{"code": 1}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Equal(t, 1, stepByID(t, x, "op").Attempt, "a permanent error is not retried")
	again := stepByID(t, x, "op/on-error1/again")
	require.Equal(t, projections.OpSkipped, again.Status)
	require.Contains(t, again.Error, "the error is not one it retries (on: exit status 3)")

	x = s.runToEnd(t, client.StartRequest{Workflow: "picky", Input: map[string]any{"code": 3}})
	require.Equal(t, 2, stepByID(t, x, "op").Attempt, "a transient error is retried, up to the limit")
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, "no retries left", "the retry step fails once the limit is reached, as documented")
}

func TestCallCustomOperation(t *testing.T) {
	t.Parallel()
	greet := operation.HandlerFunc(func(_ context.Context, task operation.Task) (any, error) {
		var in struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(task.Input, &in); err != nil {
			return nil, err
		}
		return map[string]string{"greeting": "hello " + in.Name, "key": task.TaskID}, nil
	})
	s := startStack(t, func(c *devstack.Config) { c.Handlers = map[string]operation.Handler{"greet": greet} })
	s.apply(t, "name: custom\nsteps:\n  - id: hi\n    kind: call\n    operation: greet\n    input: {name: \"${input.who}\"}\n    output: ${result.greeting}\n  - id: missing\n    kind: call\n    operation: nobody-handles-this\n    condition: ${input.missing}\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "custom", Input: map[string]any{"who": "ada", "missing": false}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `"hello ada"`, string(stepByID(t, x, "hi").Output))

	x = s.runToEnd(t, client.StartRequest{Workflow: "custom", Input: map[string]any{"who": "bo", "missing": true}})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Error, `no handler for operation kind "nobody-handles-this"`)
}

func TestSignalRetriedWithIdempotencyKey(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: waiter\nsteps:\n  - {id: gate, kind: wait, signal: go, timeout: 30s}\n")
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "waiter", ID: "w1"})
	require.NoError(t, err)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.info.APIURL+"/v1/executions/w1/signals/note", strings.NewReader(`{"n":1}`))
		req.Header.Set("Idempotency-Key", "note-1")
		resp, err := apiHTTP.Do(req)
		require.NoError(t, err)
		var body struct {
			Recorded bool `json:"recorded"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.True(t, body.Recorded)
	}
	_, err = s.c.Signal(ctx, "w1", "go", nil)
	require.NoError(t, err)
	x := s.waitDone(t, "w1", 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	notes := 0
	for _, sig := range x.Signals {
		if sig.Name == "note" {
			notes++
		}
	}
	require.Equal(t, 1, notes, "the retried signal is recorded once")
}

// TestSignalAsCloudEventOnNATS sends a signal the way any NATS client can:
// a CloudEvent io.jetflow.execution.signal on jf.commands.signal. The same
// event sent twice, while the execution still waits (its gate is not
// reached yet, so the signal is kept), is one signal: the second copy is
// recognised, not recorded again nor refused.
func TestSignalAsCloudEventOnNATS(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, `name: natsgate
steps:
  - {id: hold, kind: wait, signal: ready, timeout: 60s}
  - {id: gate, kind: wait, signal: go, timeout: 60s, output: "${result.data.who}"}
`)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "natsgate", ID: "ng1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "ng1", "hold", projections.OpWaiting)
	sig := events.Event{ID: "sig-1", Type: events.TypeSignalExecution, Source: "urn:test:ops", Time: time.Now().UTC(),
		Data: &events.SignalExecution{ExecutionID: "ng1", Name: "go", Data: json.RawMessage(`{"who":"ops"}`)}}
	msg, err := bus.Encode(bus.SubjectSignal, sig)
	require.NoError(t, err)
	// Plain NATS publishes without Nats-Msg-Id: JetStream keeps both
	// copies, and the dispatcher must recognise the second itself.
	require.NoError(t, s.nc.PublishMsg(msg))
	require.NoError(t, s.nc.PublishMsg(msg))
	s.waitCommandsHandled(t)
	x, err := s.c.Execution(ctx, "ng1")
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, x.Status, "both copies came while the execution waited")
	require.Equal(t, projections.OpNone, stepByID(t, x, "gate").Status, "the signal is kept for the gate")
	s.requireNoRejection(t, events.CommandKey(sig.Source, sig.ID))
	s.requireCountStays(t, "ng1", string(events.TypeSignalReceived), 1)

	res, err := s.c.Signal(ctx, "ng1", "ready", nil)
	require.NoError(t, err)
	require.True(t, res.Recorded)
	x = s.waitDone(t, "ng1", 20*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.JSONEq(t, `"ops"`, string(stepByID(t, x, "gate").Output))
	require.Len(t, x.Signals, 2)
	require.Equal(t, "go", x.Signals[0].Name)
	require.Equal(t, "gate", x.Signals[0].TakenBy)
	require.Equal(t, "hold", x.Signals[1].TakenBy)
	require.Equal(t, 2, countTypes(s.history(t, "ng1"))[string(events.TypeSignalReceived)])

	// A signal for an unknown execution is rejected with a reason.
	bad := sig
	bad.ID, bad.Data = "sig-2", &events.SignalExecution{ExecutionID: "nobody", Name: "go"}
	sub, err := s.nc.SubscribeSync(bus.RejectionSubject(events.CommandKey(bad.Source, bad.ID)))
	require.NoError(t, err)
	msg, err = bus.Encode(bus.SubjectSignal, bad)
	require.NoError(t, err)
	require.NoError(t, s.nc.PublishMsg(msg))
	m, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	rej, err := bus.Decode(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, events.CodeNotFound, rej.Data.(*events.CommandRejected).Code)
}
