// Package tracing is jetflow's OpenTelemetry tracing: the W3C trace
// context that travels in CloudEvents (the distributed-tracing extension,
// traceparent and tracestate), the span ids that every service derives
// from an execution's history, and the tracer provider a service program
// makes from the standard OTEL_* environment variables.
//
// One trace per execution: the caller's span (an HTTP request, or the
// traceparent of a start command sent over NATS) is the parent of the
// execution's span; each step attempt is a span under it; the agent's run
// of the operation is a span under the step attempt's. The dispatcher
// records spans when what they cover has ended, with the times the
// history holds, so a dispatcher that dies mid-step loses no span: the
// next one records it. Their ids are derived from the history (the
// execution's id, a step attempt's task id), so the dispatcher that sends
// a task and the one that records its end (perhaps another, after a
// failover) name the same span, and the agent's span under it is linked
// without any state kept between them.
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Instrumentation is the tracer name every jetflow span is made with.
const Instrumentation = "jetflow.dev/pkg/tracing"

// Context is a parsed traceparent (and tracestate): the span context an
// event was produced in. The zero Context is no trace.
type Context struct {
	SC trace.SpanContext
}

// Valid reports whether c names a trace.
func (c Context) Valid() bool { return c.SC.IsValid() }

// Parse reads a W3C traceparent and tracestate (as the CloudEvents
// distributed-tracing extension carries them). Anything malformed is no
// trace: tracing never refuses a command.
func Parse(traceparent, tracestate string) Context {
	if traceparent == "" {
		return Context{}
	}
	carrier := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		carrier["tracestate"] = tracestate
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return Context{}
	}
	return Context{SC: sc}
}

// Header returns c as a traceparent and tracestate ("" for no trace).
func (c Context) Header() (traceparent, tracestate string) {
	if !c.Valid() {
		return "", ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithRemoteSpanContext(context.Background(), c.SC), carrier)
	return carrier["traceparent"], carrier["tracestate"]
}

// FromContext is the span context of ctx (an HTTP server span, say).
func FromContext(ctx context.Context) Context {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return Context{}
	}
	return Context{SC: sc}
}

// With returns c with its span id replaced by span (same trace, flags
// and state): the context of a span derived from the history.
func (c Context) With(span trace.SpanID) Context {
	return Context{SC: c.SC.WithSpanID(span).WithRemote(false)}
}

// TraceID is the trace of an execution started without a trace context:
// derived from its id, so that every service finds the same one.
func TraceID(executionID string) trace.TraceID {
	h := sha256.Sum256([]byte("jetflow trace\x00" + executionID))
	var id trace.TraceID
	copy(id[:], h[:16])
	return id
}

func spanID(parts ...string) trace.SpanID {
	h := sha256.New()
	for _, p := range parts {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var id trace.SpanID
	copy(id[:], h.Sum(nil)[:8])
	if !id.IsValid() { // all zeroes: one chance in 2^64
		id[7] = 1
	}
	return id
}

// ExecutionSpanID is the span of an execution's run: its first (run 0,
// from its start) or its n-th after n resumes or replays.
func ExecutionSpanID(executionID string, run int) trace.SpanID {
	return spanID("execution", executionID, fmt.Sprint(run))
}

// StepSpanID is the span of a step attempt, named by its task id
// (events.TaskID: the execution, the step and the attempt, which a
// history never repeats).
func StepSpanID(taskID string) trace.SpanID { return spanID("step", taskID) }

// Root is the trace context of an execution: the traceparent its start
// was recorded with, or, without one, a trace of its own (TraceID), sampled.
func Root(executionID, traceparent, tracestate string) Context {
	if c := Parse(traceparent, tracestate); c.Valid() {
		return c
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: TraceID(executionID), SpanID: ExecutionSpanID(executionID, 0),
		TraceFlags: trace.FlagsSampled})
	return Context{SC: sc}
}

type idsKey struct{}

// chosen are the ids the next span started with a context takes.
type chosen struct {
	trace trace.TraceID // for a new root only
	span  trace.SpanID
}

// IDs generates span ids: those a context names (WithIDs), else random
// ones. Install it in a provider with sdktrace.WithIDGenerator
// (NewProvider does).
type IDs struct{}

var _ sdktrace.IDGenerator = IDs{}

// NewIDs implements sdktrace.IDGenerator: a new root's trace and span.
func (IDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	c, _ := ctx.Value(idsKey{}).(chosen)
	tid, sid := c.trace, c.span
	if !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	if !sid.IsValid() {
		sid = randomSpanID()
	}
	return tid, sid
}

// NewSpanID implements sdktrace.IDGenerator: a child's span.
func (IDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if c, ok := ctx.Value(idsKey{}).(chosen); ok && c.span.IsValid() {
		return c.span
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// WithIDs makes the next span started with ctx take span as its id, and
// traceID if it is a new root.
func WithIDs(ctx context.Context, traceID trace.TraceID, span trace.SpanID) context.Context {
	return context.WithValue(ctx, idsKey{}, chosen{trace: traceID, span: span})
}

// Span is a span recorded after the fact, from the history's times.
type Span struct {
	Name       string
	Parent     Context // the trace, and the parent span (none: a root)
	Root       bool    // no parent span: the execution's own trace
	ID         trace.SpanID
	Start, End time.Time
	Attrs      []attribute.KeyValue
	Err        string // the span failed, with this description
}

// Record records s with tp (nothing without a provider or a trace).
func Record(tp trace.TracerProvider, s Span) {
	if tp == nil || !s.Parent.Valid() {
		return
	}
	ctx := WithIDs(context.Background(), s.Parent.SC.TraceID(), s.ID)
	opts := []trace.SpanStartOption{trace.WithTimestamp(s.Start), trace.WithAttributes(s.Attrs...)}
	if s.Root {
		opts = append(opts, trace.WithNewRoot())
	} else {
		ctx = trace.ContextWithRemoteSpanContext(ctx, s.Parent.SC)
	}
	_, span := tp.Tracer(Instrumentation).Start(ctx, s.Name, opts...)
	if s.Err != "" {
		span.SetStatus(codes.Error, s.Err)
	}
	span.End(trace.WithTimestamp(s.End))
}

// Noop is a provider that records nothing.
func Noop() trace.TracerProvider { return noop.NewTracerProvider() }

// NewProvider returns a provider exporting to exp in batches (or, with
// sync, at each span's end: for tests), sampling as its parent says
// (ParentBased(AlwaysSample)), and naming spans by the history (IDs).
func NewProvider(exp sdktrace.SpanExporter, sync bool, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	proc := sdktrace.NewBatchSpanProcessor(exp)
	if sync {
		proc = sdktrace.NewSimpleSpanProcessor(exp)
	}
	return sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(proc),
		sdktrace.WithIDGenerator(IDs{})}, opts...)...)
}
