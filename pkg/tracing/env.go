package tracing

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// FromEnv makes a service's tracer provider from the standard OTEL_*
// variables (getenv reads them):
//
//   - OTEL_TRACES_EXPORTER: "otlp" or "none"; unset, it is "otlp" when an
//     OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), else "none";
//   - OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: "http/protobuf" (the default);
//     "grpc" is not built in;
//   - the OTLP exporter's own (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT,
//     _HEADERS, _TIMEOUT, _INSECURE, ...), OTEL_SERVICE_NAME and
//     OTEL_RESOURCE_ATTRIBUTES (service.name defaults to jetflow-SERVICE),
//     OTEL_TRACES_SAMPLER and its argument, and OTEL_BSP_* for batching.
//
// With tracing off it returns a nil provider (nothing recorded, no
// trace context added to events) and a shutdown that does nothing.
// shutdown flushes the spans still batched (for up to 5 s) and stops.
func FromEnv(ctx context.Context, service string, getenv func(string) string) (tp trace.TracerProvider, shutdown func(), err error) {
	none := func() {}
	exporter := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	if exporter == "" {
		exporter = "none"
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			exporter = "otlp"
		}
	}
	switch exporter {
	case "none":
		return nil, none, nil
	case "otlp":
	default:
		return nil, none, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: jetflow exports traces with otlp, or none", exporter)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(v)); p != "" {
			if p != "http/protobuf" {
				return nil, none, fmt.Errorf("%s=%q: jetflow's OTLP exporter speaks http/protobuf (a collector listens for it on port 4318)", v, p)
			}
			break
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, none, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(attribute.String("service.name", "jetflow-"+service)),
		resource.Environment(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, none, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	p := NewProvider(exp, false, sdktrace.WithResource(res))
	return p, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx) // a collector that is gone loses the last spans, and nothing else
	}, nil
}
