package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/tracing"
)

const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestParseAndHeader(t *testing.T) {
	c := tracing.Parse(parent, "vendor=x")
	require.True(t, c.Valid())
	tp, ts := c.Header()
	require.Equal(t, parent, tp)
	require.Equal(t, "vendor=x", ts)
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"} {
		c := tracing.Parse(bad, "")
		require.False(t, c.Valid(), bad)
		tp, _ := c.Header()
		require.Empty(t, tp, "no trace gives no header")
	}
}

// TestIDsAreDerivedFromTheHistory: every service names a span the same
// way, and different executions, runs and attempts differently.
func TestIDsAreDerivedFromTheHistory(t *testing.T) {
	require.Equal(t, tracing.ExecutionSpanID("e1", 0), tracing.ExecutionSpanID("e1", 0))
	require.NotEqual(t, tracing.ExecutionSpanID("e1", 0), tracing.ExecutionSpanID("e1", 1))
	require.NotEqual(t, tracing.ExecutionSpanID("e1", 0), tracing.ExecutionSpanID("e2", 0))
	require.NotEqual(t, tracing.StepSpanID("e1.a.1"), tracing.StepSpanID("e1.a.2"))
	require.NotEqual(t, tracing.StepSpanID("e1"), tracing.ExecutionSpanID("e1", 0))
	require.Equal(t, tracing.TraceID("e1"), tracing.TraceID("e1"))
	require.True(t, tracing.TraceID("e1").IsValid())

	root := tracing.Root("e1", "", "")
	require.True(t, root.Valid(), "an execution started without a trace has one of its own")
	require.Equal(t, tracing.TraceID("e1"), root.SC.TraceID())
	require.True(t, root.SC.IsSampled())
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", tracing.Root("e1", parent, "").SC.TraceID().String())
}

// TestRecordTakesTheDerivedIDs: a span recorded after the fact has the id
// and times it is given, under its parent, or as a root of the given trace.
func TestRecordTakesTheDerivedIDs(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := tracing.NewProvider(exp, true)
	defer func() { require.NoError(t, tp.Shutdown(context.Background())) }()
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	caller := tracing.Parse(parent, "")
	tracing.Record(tp, tracing.Span{Name: "child", Parent: caller, ID: tracing.ExecutionSpanID("e1", 0), Start: start, End: start.Add(time.Second), Err: "boom"})
	own := tracing.Root("e2", "", "")
	tracing.Record(tp, tracing.Span{Name: "root", Parent: own, Root: true, ID: tracing.ExecutionSpanID("e2", 0), Start: start, End: start.Add(time.Second)})
	tracing.Record(nil, tracing.Span{Name: "no provider", Parent: caller, ID: tracing.StepSpanID("x")})
	tracing.Record(tp, tracing.Span{Name: "no trace", ID: tracing.StepSpanID("x")})
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	child, root := spans[0], spans[1]
	require.Equal(t, "child", child.Name)
	require.Equal(t, caller.SC.TraceID(), child.SpanContext.TraceID())
	require.Equal(t, caller.SC.SpanID(), child.Parent.SpanID())
	require.Equal(t, tracing.ExecutionSpanID("e1", 0), child.SpanContext.SpanID())
	require.Equal(t, start, child.StartTime.UTC())
	require.Equal(t, start.Add(time.Second), child.EndTime.UTC())
	require.Equal(t, "boom", child.Status.Description)
	require.Equal(t, "root", root.Name)
	require.False(t, root.Parent.IsValid(), "a root has no parent")
	require.Equal(t, tracing.TraceID("e2"), root.SpanContext.TraceID())
	require.Equal(t, tracing.ExecutionSpanID("e2", 0), root.SpanContext.SpanID())

	// A span started the usual way under one of these gets a random id.
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), caller.SC)
	_, sp := tp.Tracer("t").Start(ctx, "usual")
	sp.End()
	require.Len(t, exp.GetSpans(), 3)
	usual := exp.GetSpans()[2]
	require.NotEqual(t, tracing.ExecutionSpanID("e1", 0), usual.SpanContext.SpanID())
	require.Equal(t, caller.SC.SpanID(), usual.Parent.SpanID())
}

func TestFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	ctx := context.Background()
	tp, flush, err := tracing.FromEnv(ctx, "api", env())
	require.NoError(t, err)
	require.Nil(t, tp, "off without an exporter or endpoint")
	flush()
	tp, _, err = tracing.FromEnv(ctx, "api", env("OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"))
	require.NoError(t, err)
	require.Nil(t, tp, "none wins over an endpoint")

	tp, flush, err = tracing.FromEnv(ctx, "api", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"))
	require.NoError(t, err)
	require.NotNil(t, tp, "an endpoint turns OTLP on")
	flush()

	_, _, err = tracing.FromEnv(ctx, "api", env("OTEL_TRACES_EXPORTER", "zipkin"))
	require.ErrorContains(t, err, "OTEL_TRACES_EXPORTER")
	_, _, err = tracing.FromEnv(ctx, "api", env("OTEL_TRACES_EXPORTER", "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"))
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") && strings.Contains(err.Error(), "http/protobuf"), err.Error())
}
