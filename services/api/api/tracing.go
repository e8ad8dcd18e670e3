package api

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/tracing"
)

// traceStart gives a start command its trace context (the CloudEvents
// distributed-tracing extension): the command's own if the caller's
// CloudEvent carried one, else the W3C traceparent header of the HTTP
// request. With a tracer the api records a span of its own under it (or
// a new trace) and the command carries that span's. The returned func
// ends the span.
func (s *Server) traceStart(r *http.Request, cmd *events.Event, start *events.StartExecution) func() {
	parent := tracing.Parse(cmd.TraceParent, cmd.TraceState)
	if !parent.Valid() {
		parent = tracing.FromContext(propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	}
	if s.cfg.Tracer == nil {
		cmd.TraceParent, cmd.TraceState = parent.Header()
		return func() {}
	}
	ctx := r.Context()
	if parent.Valid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent.SC)
	}
	_, span := s.cfg.Tracer.Tracer(tracing.Instrumentation).Start(ctx, "start "+start.Workflow,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("jetflow.execution.id", start.ExecutionID), attribute.String("jetflow.workflow", start.Workflow)))
	cmd.TraceParent, cmd.TraceState = tracing.Context{SC: span.SpanContext()}.Header()
	return func() { span.End() }
}
