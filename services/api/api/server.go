// Package api is jetflow's HTTP front door: workflow registration, starting
// executions (JSON or CloudEvents over HTTP), queries from read models and
// live progress over server-sent events. It never writes an execution's
// history: it publishes commands for the dispatcher.
package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
)

// Config configures the api.
type Config struct {
	// Addr to listen on. Default 127.0.0.1:8080.
	Addr string
	// StartWait is how long POST /v1/executions waits for the dispatcher to
	// accept or reject a start before answering 202. Default 5s.
	StartWait time.Duration
	// MaxBody caps request bodies, in bytes. Default 1 MiB.
	MaxBody int64
	// Source is the CloudEvents source of commands it publishes. Default "jetflow/api".
	Source string
	// Listener, when set, is used instead of listening on Addr.
	Listener net.Listener
	// BindOnly: the projector's consumer exists (made by the bootstrap)
	// and may not be created or changed by this api.
	BindOnly bool
}

func (c Config) withDefaults() Config {
	c.Addr = cmp.Or(c.Addr, "127.0.0.1:8080")
	c.StartWait = cmp.Or(c.StartWait, 5*time.Second)
	c.MaxBody = cmp.Or(c.MaxBody, int64(1<<20))
	c.Source = cmp.Or(c.Source, "jetflow/api")
	return c
}

// Server serves the HTTP api.
type Server struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	log   zerolog.Logger
	defs  *catalog.Store
	ids   *claim.Store
	execs jetstream.KeyValue
	// history is the events stream, where await checks that an event it
	// saw on a history subject is stored.
	history jetstream.Stream
}

// New returns a server bound to the jetflow buckets.
func New(ctx context.Context, cfg Config, nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger) (*Server, error) {
	cfg = cfg.withDefaults()
	defs, err := catalog.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	execs, err := js.KeyValue(ctx, events.BucketExecutions)
	if err != nil {
		return nil, fmt.Errorf("open executions bucket: %w", err)
	}
	history, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open events stream: %w", err)
	}
	return &Server{cfg: cfg, nc: nc, js: js, log: log, defs: defs, ids: ids, execs: execs, history: history}, nil
}

// route is one endpoint: its pattern ("METHOD /path"), its handler and
// the query parameters it takes (any other is a 400 naming it, so that a
// misspelt filter is never silently ignored).
type route struct {
	pattern string
	handler http.HandlerFunc
	params  []string
}

// routes lists every endpoint; docs/api.md documents each (a test checks).
func (s *Server) routes() []route {
	return []route{
		{"GET /healthz", s.health, nil},
		{"POST /v1/workflows", s.applyWorkflow, nil},
		{"GET /v1/workflows", s.listWorkflows, nil},
		{"GET /v1/workflows/{name}", s.getWorkflow, nil},
		{"GET /v1/workflows/{name}/versions/{version}", s.getWorkflowVersion, nil},
		{"POST /v1/executions", s.startExecution, nil},
		{"GET /v1/executions", s.listExecutions, []string{"workflow", "status", "limit", "after"}},
		{"GET /v1/executions/{id}", s.getExecution, []string{"at_seq"}},
		{"GET /v1/executions/{id}/events", s.executionEvents, []string{"from_seq"}},
		{"POST /v1/executions/{id}/signals/{name}", s.signalExecution, nil},
		{"POST /v1/executions/{id}/actions", s.executionAction, nil},
		{"GET /v1/locks", s.listLocks, nil},
		{"GET /v1/locks/{name}", s.getLock, nil},
		{"DELETE /v1/locks/{name}", s.clearLock, nil},
		{"GET /v1/settings", s.settings, nil},
		{"POST /v1/admin/projections/rebuild", s.rebuildProjections, []string{"from_seq"}},
	}
}

// Handler returns the api's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, onlyParams(rt.handler, rt.params...))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "/" && pattern != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, apiError{Code: "method_not_allowed",
				Message: fmt.Sprintf("%s %s is not supported; use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))})
			return
		}
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	return s.logRequests(mux)
}

// Run serves HTTP until ctx ends, then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	ln := s.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
		}
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info().Str("addr", ln.Addr().String()).Msg("api listening")
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	return nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.nc.Status() != nats.CONNECTED {
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable", Message: "not connected to NATS"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// onlyParams answers 400 to a request with a query parameter that is not
// in params, naming it and the ones the route takes.
func onlyParams(h http.HandlerFunc, params ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name := range r.URL.Query() {
			if slices.Contains(params, name) {
				continue
			}
			msg := fmt.Sprintf("unknown query parameter %q", name)
			if len(params) == 0 {
				msg += "; this endpoint takes none"
			} else {
				msg += "; use " + strings.Join(params, ", ")
			}
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: name, Message: msg})
			return
		}
		h(w, r)
	})
}

// apiError is the JSON body of every 4xx and 5xx answer.
type apiError struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Field    string `json:"field,omitempty"`
	Problems any    `json:"problems,omitempty"`
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	writeJSON(w, status, map[string]apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	zerolog.Ctx(r.Context()).Error().Err(err).Str("path", r.URL.Path).Msg("request failed")
	status := http.StatusInternalServerError
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		status = http.StatusServiceUnavailable
	}
	writeError(w, status, apiError{Code: "internal", Message: err.Error()})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		r = r.WithContext(s.log.WithContext(r.Context()))
		next.ServeHTTP(rec, r)
		s.log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Int("status", rec.status).
			Dur("took", time.Since(began)).Msg("http request")
	})
}
