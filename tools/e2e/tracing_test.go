package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/tools/internal/devstack"
)

// TestOneTracePerExecution: a start over HTTP with a W3C traceparent is
// one trace: the api's span under the caller's, the execution's under
// the api's, a span per step attempt under the execution's (a retried
// step has two, the first failed), and the agent's run of each operation
// under its attempt's: the task carried the attempt's trace context.
func TestOneTracePerExecution(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(exp, true)
	s := startStack(t, func(c *devstack.Config) { c.Tracer = tp })
	marker := filepath.Join(t.TempDir(), "failed-once")
	s.apply(t, fmt.Sprintf(`
name: traced
steps:
  - {id: first, kind: noop}
  - id: second
    kind: exec
    command: sh
    args: ["-c", "test -f %s || { touch %s; exit 1; }"]
    retry: {limit: 2, backoff: {initial: 10ms, factor: 1}}
`, marker, marker))

	const callerTrace, callerSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, err := http.NewRequest(http.MethodPost, s.info.APIURL+"/v1/executions", strings.NewReader(`{"workflow": "traced", "id": "tr-1"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, []int{http.StatusCreated, http.StatusAccepted}, resp.StatusCode)
	x := s.waitDone(t, "tr-1", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.True(t, strings.HasPrefix(x.TraceParent, "00-"+callerTrace+"-"), "the start records its trace context: %q", x.TraceParent)

	// Spans are recorded when what they cover has ended: the execution's
	// comes with its end, the agent's as each operation ends.
	var spans tracetest.SpanStubs
	poll(t, 30*time.Second, "the execution's spans are recorded", func() (bool, string) {
		spans = exp.GetSpans()
		var names []string
		for _, sp := range spans {
			names = append(names, sp.Name)
		}
		return len(byName(spans, "execution traced")) == 1 && len(byName(spans, "operation exec")) == 2, fmt.Sprint(names)
	})
	for _, sp := range spans {
		require.Equal(t, callerTrace, sp.SpanContext.TraceID().String(), "span %q is in the caller's trace", sp.Name)
	}
	api := one(t, spans, "start traced")
	require.Equal(t, callerSpan, api.Parent.SpanID().String(), "the api's span is the caller's child")
	require.Equal(t, trace.SpanKindServer, api.SpanKind)

	exec := one(t, spans, "execution traced")
	require.Equal(t, api.SpanContext.SpanID(), exec.Parent.SpanID(), "the execution's span is the api's child")
	require.Equal(t, tracing.ExecutionSpanID("tr-1", 0), exec.SpanContext.SpanID())
	require.Equal(t, x.StartedAt, exec.StartTime.UTC(), "the execution's span starts at its recorded start")
	require.Equal(t, x.EndedAt, exec.EndTime.UTC(), "and ends at its recorded end")

	first := one(t, spans, "step first")
	require.Equal(t, exec.SpanContext.SpanID(), first.Parent.SpanID())
	second := byName(spans, "step second")
	require.Len(t, second, 2, "a span per attempt")
	var failed, succeeded int
	for _, st := range second {
		require.Equal(t, exec.SpanContext.SpanID(), st.Parent.SpanID())
		if st.Status.Code == codes.Error {
			failed++
		} else {
			succeeded++
		}
	}
	require.Equal(t, 1, failed, "the first attempt failed")
	require.Equal(t, 1, succeeded)

	noop := one(t, spans, "operation noop")
	require.Equal(t, first.SpanContext.SpanID(), noop.Parent.SpanID(), "the agent's span is its attempt's child")
	attempts := map[trace.SpanID]bool{second[0].SpanContext.SpanID(): true, second[1].SpanContext.SpanID(): true}
	for _, op := range byName(spans, "operation exec") {
		require.True(t, attempts[op.Parent.SpanID()], "each run of the exec is under one of its attempts' spans")
		delete(attempts, op.Parent.SpanID())
	}
	t.Logf("%d spans in one trace", len(spans))

	t.Log("a start over NATS with no trace context is a trace of its own, its execution's span the root")
	ev := events.New("tracing-test", "", "", time.Now(), &events.StartExecution{Workflow: "traced", ExecutionID: "tr-2"})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = s.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	x = s.waitDone(t, "tr-2", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	var root tracetest.SpanStub
	poll(t, 30*time.Second, "tr-2's execution span is recorded", func() (bool, string) {
		for _, sp := range exp.GetSpans() {
			if sp.SpanContext.TraceID() == tracing.TraceID("tr-2") && sp.Name == "execution traced" {
				root = sp
				return true, ""
			}
		}
		return false, fmt.Sprint(len(exp.GetSpans()), " spans")
	})
	require.False(t, root.Parent.IsValid(), "a root")
	require.Equal(t, tracing.ExecutionSpanID("tr-2", 0), root.SpanContext.SpanID())
	require.NoError(t, tp.Shutdown(context.Background()))
}

func byName(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, sp := range spans {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	got := byName(spans, name)
	require.Len(t, got, 1, "one span %q", name)
	return got[0]
}

// TestASampledOutExecutionRecordsNoSpan: the sampler decides once per
// execution, at its start: with every new trace sampled out, an execution
// started without a trace context records no span at all, the api's,
// the execution's, its steps' or the agent's, and its start records the
// decision (flags 00) for every later span to follow.
func TestASampledOutExecutionRecordsNoSpan(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(exp, true, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	s := startStack(t, func(c *devstack.Config) { c.Tracer = tp })
	s.apply(t, "name: unsampled\nsteps:\n  - {id: a, kind: noop}\n  - {id: b, kind: noop}\n")
	// Over HTTP the api's span decides; over NATS, with no trace context,
	// the dispatcher's start does.
	x := s.runToEnd(t, client.StartRequest{Workflow: "unsampled", ID: "us-1"})
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.True(t, strings.HasSuffix(x.TraceParent, "-00"), "the start records the decision: %q", x.TraceParent)
	ev := events.New("tracing-test", "", "", time.Now(), &events.StartExecution{Workflow: "unsampled", ExecutionID: "us-2"})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = s.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	x = s.waitDone(t, "us-2", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	require.Equal(t, "00-"+tracing.TraceID("us-2").String()+"-"+tracing.ExecutionSpanID("us-2", 0).String()+"-00", x.TraceParent,
		"a start without a trace context records a trace of its own, and the sampler's decision")
	require.NoError(t, tp.ForceFlush(context.Background()))
	require.Empty(t, exp.GetSpans(), "a sampled-out execution records no span")
}
