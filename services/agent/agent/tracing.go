package agent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/tracing"
)

// startSpan starts the span of an operation's run, a child of the step
// attempt's span whose context the task carries (package tracing); nil
// when the agent does not trace (Config.Tracer) or the task is in no
// trace. The operation's context holds it.
func (a *Agent) startSpan(ctx context.Context, ev events.Event, task *events.Task, delivery int) (context.Context, trace.Span) {
	if a.cfg.Tracer == nil {
		return ctx, nil
	}
	parent := tracing.Parse(ev.TraceParent, ev.TraceState)
	if !parent.Valid() {
		return ctx, nil
	}
	ctx = trace.ContextWithRemoteSpanContext(ctx, parent.SC)
	return a.cfg.Tracer.Tracer(tracing.Instrumentation).Start(ctx, "operation "+task.Kind,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("jetflow.execution.id", task.ExecutionID), attribute.String("jetflow.step.id", task.StepID),
			attribute.String("jetflow.step.kind", task.Kind), attribute.Int("jetflow.step.attempt", task.Attempt),
			attribute.Int("jetflow.task.delivery", delivery), attribute.String("jetflow.agent", a.cfg.Name),
			attribute.String("jetflow.queue", task.Queue)))
}

// endSpan ends span (nil: none) with the operation's outcome.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
