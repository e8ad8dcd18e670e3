package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/tracing"
)

// traceSink is -tracing's OTLP/HTTP receiver: it takes the spans the
// services export, as a collector would, and counts what came, so that
// the CPU figures include recording, encoding and sending every span.
type traceSink struct {
	srv            *http.Server
	tp             trace.TracerProvider
	shutdown       func()
	requests, size atomic.Int64
	spans          atomic.Int64
}

// startTraceSink serves a receiver on a loopback port and returns the
// tracer provider the services record with: the one jetflow dev makes
// from the OTEL_* variables (their defaults: every execution sampled,
// spans exported in batches), exporting to the receiver.
func startTraceSink(ctx context.Context) (*traceSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &traceSink{}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		s.size.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = s.srv.Serve(ln) }()
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + ln.Addr().String()}
	for k, v := range env {
		if err := os.Setenv(k, v); err != nil { // the OTLP exporter reads them from the environment
			_ = s.srv.Close()
			return nil, err
		}
	}
	tp, shutdown, err := tracing.FromEnv(ctx, "bench", func(k string) string { return env[k] })
	if err != nil {
		_ = s.srv.Close()
		return nil, err
	}
	if p, ok := tp.(*sdktrace.TracerProvider); ok {
		p.RegisterSpanProcessor(spanCounter{&s.spans})
	}
	s.tp, s.shutdown = tp, shutdown
	return s, nil
}

// report flushes the spans still batched and says what the receiver got.
func (s *traceSink) report(out io.Writer) {
	s.shutdown()
	_ = s.srv.Close()
	perSpan := 0.0
	if n := s.spans.Load(); n > 0 {
		perSpan = float64(s.size.Load()) / float64(n)
	}
	fmt.Fprintf(out, "traces (-tracing): %d spans recorded, %d export requests, %.1f MiB received over OTLP/HTTP (%.0f B a span)\n",
		s.spans.Load(), s.requests.Load(), float64(s.size.Load())/(1<<20), perSpan)
}

// spanCounter counts the spans ended.
type spanCounter struct{ n *atomic.Int64 }

func (c spanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c spanCounter) OnEnd(sdktrace.ReadOnlySpan)                     { c.n.Add(1) }
func (c spanCounter) Shutdown(context.Context) error                  { return nil }
func (c spanCounter) ForceFlush(context.Context) error                { return nil }
