package dispatch

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/tracing"
)

// The dispatcher's spans (package tracing): an execution's run, and each
// step attempt under it, recorded once what they cover has ended, from
// the history's times. With Config.Tracer nil, nothing is recorded and
// no trace context is added to events or tasks (a start's own is still
// kept on its ExecutionStarted: the history says who asked).

// run is the execution's run number: 0 from its start, one more for each
// resume and replay (a span each; the fold counts both in Resumes).
func run(x *projections.Execution) int { return x.Resumes }

// newTrace is the trace context of an execution started without one: a
// trace of its own (ids derived from the execution's id), sampled as the
// provider's sampler decides once, here; the start records it, so that
// every later span follows that decision.
func (d *Dispatcher) newTrace(id string) (traceparent, tracestate string) {
	ctx := tracing.WithIDs(context.Background(), tracing.TraceID(id), tracing.ExecutionSpanID(id, 0))
	// Started for its sampling decision and context only: never ended,
	// so never exported (the execution's span is recorded at its end).
	_, sp := d.cfg.Tracer.Tracer(tracing.Instrumentation).Start(ctx, "execution", trace.WithNewRoot())
	return tracing.Context{SC: sp.SpanContext()}.Header()
}

// traceOf is the trace context of x's current run (its span's), and
// whether x has one.
func (d *Dispatcher) traceOf(x *projections.Execution) (tracing.Context, bool) {
	if d.cfg.Tracer == nil || x.ID == "" {
		return tracing.Context{}, false
	}
	return tracing.Root(x.ID, x.TraceParent, x.TraceState).With(tracing.ExecutionSpanID(x.ID, run(x))), true
}

// traceEvent sets the trace context of an event appended to x's history:
// a start's is the command's (the caller's); any other's is the run's.
func (d *Dispatcher) traceEvent(x *execState, ev *events.Event) {
	if _, ok := ev.Data.(*events.ExecutionStarted); ok {
		ev.TraceParent, ev.TraceState = x.startTrace[0], x.startTrace[1]
		return
	}
	if c, ok := d.traceOf(&x.state); ok {
		ev.TraceParent, ev.TraceState = c.Header()
	}
}

// traceTask sets the trace context of a task: its step attempt's span,
// which the agent's span is a child of.
func (d *Dispatcher) traceTask(x *execState, task *events.Event, taskID string) {
	if c, ok := d.traceOf(&x.state); ok {
		task.TraceParent, task.TraceState = c.With(tracing.StepSpanID(taskID)).Header()
	}
}

// traced records the spans that the append of ev (before to after) ended.
func (d *Dispatcher) traced(before, after *projections.Execution, ev *events.Event) {
	if d.cfg.Tracer == nil {
		return
	}
	runCtx, _ := d.traceOf(after)
	switch p := ev.Data.(type) {
	case *events.StepSucceeded:
		d.traceStep(after, runCtx, p.StepID, ev, "")
	case *events.ExecutionSucceeded:
		if p.Step != nil { // the last step's success, carried by the end
			d.traceStep(after, runCtx, p.Step.StepID, ev, "")
		}
	case *events.StepFailed:
		d.traceStep(after, runCtx, p.StepID, ev, p.Error)
	case *events.StepSkipped:
		d.traceStep(after, runCtx, p.StepID, ev, "")
	}
	if before.Status.Settled() || !after.Status.Settled() {
		return
	}
	caller := tracing.Parse(after.TraceParent, after.TraceState)
	// A start recorded with its own run's context (newTrace) is a root,
	// as is one recorded with none (before tracing was on).
	root := !caller.Valid() || caller.SC.SpanID() == tracing.ExecutionSpanID(after.ID, 0)
	parent := tracing.Root(after.ID, after.TraceParent, after.TraceState)
	start := after.StartedAt
	if run(after) > 0 && !after.ResumedAt.IsZero() {
		start = after.ResumedAt
	}
	tracing.Record(d.cfg.Tracer, tracing.Span{
		Name: "execution " + after.Workflow, Parent: parent, Root: root, ID: tracing.ExecutionSpanID(after.ID, run(after)),
		Start: start, End: ev.Time, Err: after.Error,
		Attrs: []attribute.KeyValue{
			attribute.String("jetflow.execution.id", after.ID), attribute.String("jetflow.workflow", after.Workflow),
			attribute.Int("jetflow.workflow.version", after.Version), attribute.String("jetflow.execution.status", string(after.Status)),
			attribute.Int("jetflow.execution.run", run(after)),
		},
	})
}

// traceStep records the span of step id's attempt that ev ended, under
// the run's span.
func (d *Dispatcher) traceStep(after *projections.Execution, runCtx tracing.Context, id string, ev *events.Event, failure string) {
	i := after.StepIndex(id)
	if i < 0 || !runCtx.Valid() {
		return
	}
	st := &after.Steps[i]
	taskID := st.TaskID
	if taskID == "" {
		taskID = events.TaskID(after.ID, st.ID, st.Attempt)
	}
	start := st.ScheduledAt
	if start.IsZero() {
		start = ev.Time
	}
	attrs := []attribute.KeyValue{
		attribute.String("jetflow.execution.id", after.ID), attribute.String("jetflow.step.id", st.ID),
		attribute.String("jetflow.step.kind", st.Kind), attribute.Int("jetflow.step.attempt", st.Attempt),
		attribute.String("jetflow.step.status", string(st.Status)),
	}
	if st.Agent != "" {
		attrs = append(attrs, attribute.String("jetflow.agent", st.Agent))
	}
	tracing.Record(d.cfg.Tracer, tracing.Span{
		Name: fmt.Sprintf("step %s", st.ID), Parent: runCtx, ID: tracing.StepSpanID(taskID),
		Start: start, End: ev.Time, Err: failure, Attrs: attrs,
	})
}
