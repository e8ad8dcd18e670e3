// Package api is jetflow's HTTP front door: workflow registration, starting
// executions (JSON or CloudEvents over HTTP), queries from read models and
// live progress over server-sent events. It never writes an execution's
// history: it publishes commands for the dispatcher.
package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/projector"
	"jetflow.dev/services/api/ui"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/pgstore"
	"jetflow.dev/services/api/visibility/sqlitestore"
)

// Config configures the api. Its durations and sizes must lie in
// [Ranges]; zero is the default.
type Config struct {
	// Addr to listen on. Default 127.0.0.1:8080.
	Addr string
	// StartWait is how long POST /v1/executions waits for the dispatcher to
	// accept or reject a start before answering 202. Default 5s.
	StartWait time.Duration
	// MaxBody caps request bodies, in bytes. Default 1 MiB.
	MaxBody int64
	// MaxReadModel is the largest read model the projector stores, in
	// bytes: a larger one leaves out its finished steps, oldest first
	// (GET /v1/executions/{id}/steps pages them all). Default 900 KiB,
	// never more than the server's message size allows.
	MaxReadModel int
	// ProjectorCache bounds the bytes of the execution states the
	// projector keeps between the events of an execution, as estimated
	// from their content. Default projector.DefaultCacheBytes (64 MiB).
	ProjectorCache int
	// ProjectorCoalesce is how long, under load (events coming fast), the
	// projector gathers events before it projects them, so that a read
	// model is written once for several events
	// (projector.Projector.Coalesce). Default
	// projector.DefaultCoalesce (200 ms); negative: never.
	ProjectorCoalesce time.Duration
	// ProjectorGather is how long, when not under load, the projector
	// waits after an event for the next ones (projector.Projector.Gather).
	// Default projector.DefaultGather (5 ms); negative: never.
	ProjectorGather time.Duration
	// Source is the CloudEvents source of commands it publishes. Default "jetflow/api".
	Source string
	// VisibilityDir holds the visibility index that GET /v1/executions
	// answers from, a SQLite database per namespace (<namespace>.db),
	// kept across restarts. "" keeps it in memory, fed again from the
	// read models at every start (docs/operations.md#the-visibility-index).
	VisibilityDir string
	// VisibilityCache bounds the page cache of a SQLite visibility
	// index's writer, in bytes (each reader's is a quarter of it). Default
	// sqlitestore.DefaultCacheBytes (64 MiB). It bounds memory with
	// VisibilityDir only (an index in memory is as large as the index).
	VisibilityCache int
	// VisibilityPostgres, when set, is the URL of a PostgreSQL database
	// that holds the visibility index instead (a schema per namespace,
	// jetflow_visibility_<namespace>), which api replicas may share
	// (docs/operations.md#the-visibility-index-in-postgresql). Exclusive
	// with VisibilityDir.
	VisibilityPostgres string
	// Listener, when set, is used instead of listening on Addr.
	Listener net.Listener
	// BindOnly: the projector's consumer exists (made by the bootstrap)
	// and may not be created or changed by this api.
	BindOnly bool
	// Namespaces are the namespaces served besides the default one (whose
	// connection Serve and New take), each a NATS account of its own.
	Namespaces []Namespace
	// Missing, when set, says which streams and buckets the api found
	// missing (GET /readyz answers 503 while any is).
	Missing func() []string
	// ReadyMaxLag is how far the read models may be behind the events
	// before GET /readyz answers 503: the age of the oldest event not yet
	// projected. Default 1m.
	ReadyMaxLag time.Duration
	// Registerer, when set, gets the api's metrics (Serve registers them):
	// parked read models and missing streams and buckets, and what the
	// projectors do (events, writes, lag).
	Registerer prometheus.Registerer
	// Tracer, when set, records a span for each start over HTTP and
	// starts the execution in its trace (tracing.go); without it a
	// caller's trace context is passed on as it came.
	Tracer trace.TracerProvider
	// freshWait bounds a list's wait for the visibility index to hold
	// what the read models held when it was asked (listFreshWait; tests
	// on a loaded machine wait longer).
	freshWait time.Duration
	// clock, when set, is GET /readyz's time (tests make a backlog old).
	clock func() time.Time
	// Auth says how callers authenticate (docs/api.md#authentication).
	// The zero value requires a token on every route but /healthz, and
	// accepts api keys only.
	Auth AuthConfig
}

// AuthConfig configures the authentication of HTTP callers.
type AuthConfig struct {
	// Disabled turns authentication off: every caller may do everything,
	// in every namespace, recorded as the actor {anonymous, none}. For an
	// insecure dev stack only.
	Disabled bool
	// AdminTokenFile lists bootstrap admin tokens, one a line, so that a
	// fresh deployment can create api keys. "" for none.
	AdminTokenFile string
	// OIDC validates JWTs from an issuer; off while OIDC.Issuer is "".
	OIDC access.OIDCConfig
	// CacheTTL is how long an api key looked up is trusted: a key revoked
	// on another api replica stops working within it. Default 5s, at most 1m.
	CacheTTL time.Duration
}

// validate checks the settings and applies the defaults.
func (c AuthConfig) validate() (AuthConfig, error) {
	if c.Disabled && (c.AdminTokenFile != "" || c.OIDC.Issuer != "") {
		return c, errors.New("api: authentication is off, yet an admin token file or an OIDC issuer is set: turn it on or drop them")
	}
	if err := Ranges.CacheTTL.Check("api: Auth.CacheTTL", c.CacheTTL); err != nil {
		return c, err
	}
	var err error
	c.OIDC, err = c.OIDC.Validate()
	return c, err
}

// Ranges are the values Config's numeric settings may take once their
// defaults are applied (zero is the default). Validate checks them, and
// jetflow-api's flags take the same.
var Ranges = struct {
	StartWait, CacheTTL svc.Range[time.Duration]
	ProjectorCoalesce   svc.Range[time.Duration]
	ProjectorGather     svc.Range[time.Duration]
	ReadyMaxLag         svc.Range[time.Duration]
	MaxBody             svc.Range[int64]
	MaxReadModel        svc.Range[int]
	ProjectorCache      svc.Range[int]
	VisibilityCache     svc.Range[int]
}{
	// A few pages' worth per query, to 64 GiB.
	VisibilityCache: svc.Range[int]{Min: sqlitestore.MinCacheBytes, Max: 64 << 30},
	// From a few small executions to 64 GiB.
	ProjectorCache: svc.Range[int]{Min: 64 << 10, Max: 64 << 30},
	// Read models may lag that much behind under load; 0 is never.
	ProjectorCoalesce: svc.Range[time.Duration]{Min: 0, Max: 10 * time.Second},
	// A few events' worth when idle; 0 is never.
	ProjectorGather: svc.Range[time.Duration]{Min: 0, Max: time.Second},
	// Small enough for a KV value; large enough for a few steps.
	MaxReadModel: svc.Range[int]{Min: 16 << 10, Max: 64 << 20},
	// A request waits that long for the dispatcher: past a minute,
	// clients and proxies give up first.
	StartWait: svc.Range[time.Duration]{Min: time.Millisecond, Max: time.Minute},
	// A key revoked through another replica works that long.
	CacheTTL: svc.Range[time.Duration]{Min: time.Millisecond, Max: time.Minute},
	// Up to NATS's largest message.
	MaxBody: svc.Range[int64]{Min: 1 << 10, Max: 64 << 20},
	// Above the projector's gathering under load (10 s at most); below a
	// day.
	ReadyMaxLag: svc.Range[time.Duration]{Min: 15 * time.Second, Max: 24 * time.Hour},
}

// Validate checks a configuration, its defaults applied: New does, and a
// program may before it connects.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := cmp.Or(
		Ranges.StartWait.Check("api: StartWait", c.StartWait),
		Ranges.MaxBody.Check("api: MaxBody", c.MaxBody),
		Ranges.MaxReadModel.Check("api: MaxReadModel", cmp.Or(c.MaxReadModel, 900<<10)),
		Ranges.ProjectorCache.Check("api: ProjectorCache (-projector-cache-bytes, JETFLOW_PROJECTOR_CACHE_BYTES)", cmp.Or(c.ProjectorCache, projector.DefaultCacheBytes)),
		Ranges.VisibilityCache.Check("api: VisibilityCache (-visibility-cache-bytes, JETFLOW_VISIBILITY_CACHE_BYTES)", cmp.Or(c.VisibilityCache, sqlitestore.DefaultCacheBytes)),
		Ranges.ProjectorCoalesce.Check("api: ProjectorCoalesce (-projector-coalesce, JETFLOW_PROJECTOR_COALESCE)", max(c.ProjectorCoalesce, 0)),
		Ranges.ProjectorGather.Check("api: ProjectorGather (-projector-gather, JETFLOW_PROJECTOR_GATHER)", max(c.ProjectorGather, 0)),
		Ranges.ReadyMaxLag.Check("api: ReadyMaxLag (-ready-max-lag, JETFLOW_READY_MAX_LAG)", c.ReadyMaxLag),
	); err != nil {
		return err
	}
	if fi, err := os.Stat(c.VisibilityDir); c.VisibilityDir != "" && err == nil && !fi.IsDir() {
		return fmt.Errorf("api: VisibilityDir %q (-visibility-dir, JETFLOW_VISIBILITY_DIR) is a file; give a directory", c.VisibilityDir)
	}
	if c.VisibilityDir != "" && c.VisibilityPostgres != "" {
		return errors.New("api: both VisibilityDir (-visibility-dir, JETFLOW_VISIBILITY_DIR) and VisibilityPostgres (-visibility-postgres, " +
			"JETFLOW_VISIBILITY_POSTGRES) are set: the index is in one place, give one of them")
	}
	if c.VisibilityPostgres != "" {
		if err := pgstore.CheckURL(c.VisibilityPostgres); err != nil {
			return fmt.Errorf("api: VisibilityPostgres (-visibility-postgres, JETFLOW_VISIBILITY_POSTGRES): %w", err)
		}
	}
	if c.Listener == nil {
		if _, port, err := net.SplitHostPort(c.Addr); err != nil || port == "" {
			return fmt.Errorf("api: Addr %q (-http, JETFLOW_HTTP_ADDR): give host:port, e.g. 127.0.0.1:8080", c.Addr)
		}
	}
	_, err := c.Auth.validate()
	return err
}

func (c Config) withDefaults() Config {
	c.Addr = cmp.Or(c.Addr, "127.0.0.1:8080")
	c.StartWait = cmp.Or(c.StartWait, 5*time.Second)
	c.MaxBody = cmp.Or(c.MaxBody, int64(1<<20))
	c.Source = cmp.Or(c.Source, "jetflow/api")
	c.Auth.CacheTTL = cmp.Or(c.Auth.CacheTTL, 5*time.Second)
	c.freshWait = cmp.Or(c.freshWait, listFreshWait)
	c.ReadyMaxLag = cmp.Or(c.ReadyMaxLag, DefaultReadyMaxLag)
	return c
}

// Namespace is a namespace the api serves besides the default one: its
// NATS account's connection (with the api role's identity there).
type Namespace struct {
	Name string
	NC   *nats.Conn
	JS   jetstream.JetStream
}

// DefaultNamespace is the namespace of a request that names none.
const DefaultNamespace = "default"

// NamespaceHeader names the namespace a request is about.
const NamespaceHeader = "Jetflow-Namespace"

// tenant is what the api holds for one namespace it serves: its
// connection and the stores bound to it. Today the api serves the
// default namespace only; serving more is a tenant per namespace's
// connection (a NATS account each, see docs/security.md).
type tenant struct {
	name  string
	nc    *nats.Conn
	js    jetstream.JetStream
	defs  *catalog.Store
	ids   *claim.Store
	execs jetstream.KeyValue
	// hist is the events stream: histories, their first events, and
	// whether an event await saw on a history subject is stored.
	hist *history.Store
}

func openTenant(ctx context.Context, name string, nc *nats.Conn, js jetstream.JetStream) (*tenant, error) {
	defs, err := catalog.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	execs, err := js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return nil, fmt.Errorf("open executions bucket: %w", err)
	}
	hist, err := history.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	return &tenant{name: name, nc: nc, js: js, defs: defs, ids: ids, execs: execs, hist: hist}, nil
}

// Server serves the HTTP api.
type Server struct {
	cfg Config
	log zerolog.Logger
	// tenants are the namespaces served; def is the default one's, which
	// holds the api keys.
	tenants map[string]*tenant
	def     *tenant
	keys    *access.Keys
	// authn is nil when authentication is off.
	authn *access.Authenticator
	// projectors are the read-model projectors Serve runs, by namespace
	// (none when the server runs without them).
	projectors map[string]*projector.Projector
	// projectorLag is their read models' lag when written (metrics).
	projectorLag *prometheus.HistogramVec
	// listDuration is how long lists from the visibility index take
	// (metrics).
	listDuration *prometheus.HistogramVec
	// feeds keep the visibility indexes Serve runs, by namespace (none
	// when the server runs without them: lists read the read models).
	feeds map[string]*visibility.Feed
	// backlogs caches, by namespace, the projector's backlog that GET
	// /readyz read last (readiness.go).
	backlogs backlogCache
	// caughtUp are the namespaces whose read models and index have been
	// caught up once since the api started (readiness.go).
	caughtUp onceSet
	// stopping is closed when the api begins to stop (Run): the waits
	// that could outlast the shutdown's grace end then (await, event
	// streams), while the other requests under way finish.
	stopping     chan struct{}
	stoppingOnce sync.Once
}

// New returns a server bound to the jetflow buckets of the default
// namespace, on nc.
func New(ctx context.Context, cfg Config, nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	auth, err := cfg.Auth.validate()
	if err != nil {
		return nil, err
	}
	cfg.Auth = auth
	def, err := openTenant(ctx, DefaultNamespace, nc, js)
	if err != nil {
		return nil, err
	}
	keys, err := access.OpenKeys(ctx, js, access.KeysConfig{CacheTTL: cfg.Auth.CacheTTL})
	if err != nil {
		return nil, fmt.Errorf("%w (run jetflow bootstrap: this version adds the bucket %s)", err, bus.BucketAPIKeys)
	}
	s := &Server{stopping: make(chan struct{}), cfg: cfg, log: log, tenants: map[string]*tenant{DefaultNamespace: def}, def: def, keys: keys,
		projectors: map[string]*projector.Projector{}, projectorLag: newLagHistogram(), listDuration: newListHistogram(), feeds: map[string]*visibility.Feed{}}
	for _, ns := range cfg.Namespaces {
		if ns.Name == DefaultNamespace || s.tenants[ns.Name] != nil {
			return nil, fmt.Errorf("api: namespace %s is given twice", ns.Name)
		}
		t, err := openTenant(ctx, ns.Name, ns.NC, ns.JS)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns.Name, err)
		}
		s.tenants[ns.Name] = t
	}
	if cfg.Auth.Disabled {
		log.Warn().Msg("HTTP authentication is off: anyone who reaches the api may do anything")
		return s, nil
	}
	s.authn = &access.Authenticator{Keys: keys}
	if f := cfg.Auth.AdminTokenFile; f != "" {
		if s.authn.Admin, err = access.OpenAdminTokens(f, cfg.Auth.CacheTTL, nil); err != nil {
			return nil, err
		}
	}
	if cfg.Auth.OIDC.Issuer != "" {
		s.authn.OIDC = access.NewOIDC(cfg.Auth.OIDC)
	}
	log.Info().Bool("admin_token_file", s.authn.Admin != nil).Str("oidc_issuer", cfg.Auth.OIDC.Issuer).
		Stringer("key_cache_ttl", cfg.Auth.CacheTTL).Msg("HTTP callers authenticate")
	return s, nil
}

// route is one endpoint: its pattern ("METHOD /path"), its handler, the
// query parameters it takes (any other is a 400 naming it, so that a
// misspelt filter is never silently ignored), and who may call it.
type route struct {
	pattern string
	handler http.HandlerFunc
	params  []string
	// scope is what the caller needs ("" for a public route,
	// access.ScopeAny for any valid token).
	scope access.Scope
	// hidden, for a route that reads one thing by its id or name, is the
	// answer to a caller not granted the request's namespace: the 404 of
	// a thing that does not exist, so that another tenant's ids and
	// names are not confirmed.
	hidden func(*http.Request) apiError
	// global: the route is not about one namespace (key management).
	global bool
}

// notFound answers like a handler that found no such thing.
func notFound(field, format string) func(*http.Request) apiError {
	return func(r *http.Request) apiError {
		return apiError{Code: "not_found", Field: field, Message: fmt.Sprintf(format, r.PathValue(field))}
	}
}

// routes lists every endpoint and the scope it needs; docs/api.md
// documents each with its scope, and so does the OpenAPI document
// (openapi.json, with the query parameters; tests check both), and the
// middleware authorizes from it.
func (s *Server) routes() []route {
	read, start, signal, operate, admin := access.ScopeRead, access.ScopeStart, access.ScopeSignal, access.ScopeOperate, access.ScopeAdmin
	anyToken := access.ScopeAny
	execNotFound := notFound("id", "execution %q does not exist")
	return []route{
		{pattern: "GET /healthz", handler: s.health},
		{pattern: "GET /readyz", handler: s.ready},
		{pattern: "GET /v1/openapi.json", handler: s.openAPIDocument},
		{pattern: "GET /v1/whoami", handler: s.whoami, scope: anyToken, global: true},
		{pattern: "POST /v1/workflows", handler: s.applyWorkflow, scope: admin},
		{pattern: "GET /v1/workflows", handler: s.listWorkflows, scope: read},
		{pattern: "GET /v1/workflows/{name}", handler: s.getWorkflow, scope: read, hidden: notFound("name", "workflow %q is not registered")},
		{pattern: "GET /v1/workflows/{name}/versions/{version}", handler: s.getWorkflowVersion, scope: read,
			hidden: func(r *http.Request) apiError {
				return apiError{Code: "not_found", Field: "version",
					Message: fmt.Sprintf("workflow %q has no version %s", r.PathValue("name"), r.PathValue("version"))}
			}},
		{pattern: "POST /v1/executions", handler: s.startExecution, scope: start},
		{pattern: "GET /v1/executions", handler: s.listExecutions, params: listParams, scope: read},
		{pattern: "GET /v1/executions/_counts", handler: s.countExecutions, params: []string{"workflow"}, scope: read},
		{pattern: "GET /v1/executions/{id}", handler: s.getExecution, params: []string{"at_seq"}, scope: read, hidden: execNotFound},
		{pattern: "GET /v1/executions/{id}/events", handler: s.executionEvents, params: []string{"from_seq"}, scope: read, hidden: execNotFound},
		{pattern: "GET /v1/executions/{id}/steps", handler: s.executionSteps, params: []string{"offset", "limit"}, scope: read, hidden: execNotFound},
		{pattern: "POST /v1/executions/{id}/signals/{name}", handler: s.signalExecution, scope: signal},
		{pattern: "POST /v1/executions/{id}/actions", handler: s.executionAction, scope: operate},
		{pattern: "GET /v1/locks", handler: s.listLocks, scope: read},
		{pattern: "GET /v1/locks/{name}", handler: s.getLock, scope: read, hidden: notFound("name", "lock %q is not held or waited for")},
		{pattern: "DELETE /v1/locks/{name}", handler: s.clearLock, scope: operate},
		{pattern: "GET /v1/settings", handler: s.settings, scope: read},
		{pattern: "POST /v1/admin/projections/rebuild", handler: s.rebuildProjections, params: []string{"from_seq"}, scope: admin},
		{pattern: "GET /v1/admin/projections/parked", handler: s.parkedProjections, scope: admin},
		{pattern: "POST /v1/admin/keys", handler: s.createKey, scope: admin, global: true},
		{pattern: "GET /v1/admin/keys", handler: s.listKeys, scope: admin, global: true},
		{pattern: "DELETE /v1/admin/keys/{id}", handler: s.revokeKey, scope: admin, global: true},
	}
}

// Handler returns the api's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, s.guard(rt, onlyParams(rt.handler, rt.params...)))
	}
	// The operator UI: its page at / and its files under /ui/. It holds
	// no data; its script calls the routes above with the operator's token.
	page := ui.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET "+ui.Prefix, page)
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

// errStopping is why a request's context ends when the api stopped
// (Run) before the request did.
var errStopping = errors.New("the api is stopping")

// shutdownGrace is how long a stopping api lets the requests under way
// finish (Run).
const shutdownGrace = 5 * time.Second

// Run serves HTTP until ctx ends, then shuts down gracefully: it takes no
// new request, and those under way get their answers within
// shutdownGrace (a command stored and not answered yet: 202 accepted; an
// event stream ends). A request still running after that has its context
// ended with errStopping and answers 503 unavailable if it can.
func (s *Server) Run(ctx context.Context) error {
	ln := s.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
		}
	}
	s.log.Info().Str("addr", ln.Addr().String()).Msg("api listening")
	return serveGracefully(ctx, ln, s.Handler(), shutdownGrace, s.stop)
}

// lastWords is how long the requests whose contexts ended with
// errStopping have to answer before their connections close.
const lastWords = time.Second

// serveGracefully serves h on ln until ctx ends. Then it calls stopping,
// takes no new request and lets those under way finish for grace (their
// contexts outlive ctx); it ends the contexts of those still running with
// errStopping, gives them lastWords to answer (503, stoppedUnder), and
// closes the connections left.
func serveGracefully(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration, stopping func()) error {
	base, stopRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopRequests(nil)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return base }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	stopping()
	shutdown := func(d time.Duration) error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
		defer cancel()
		return srv.Shutdown(sctx)
	}
	if shutdown(grace) != nil {
		stopRequests(errStopping)
		if shutdown(lastWords) != nil {
			_ = srv.Close()
		}
	}
	return nil
}

// stop tells the waits under way that the api stops (stopping).
func (s *Server) stop() { s.stoppingOnce.Do(func() { close(s.stopping) }) }

// stoppedUnder reports whether r's context ended because the api stopped
// before r was answered (Run).
func stoppedUnder(r *http.Request) bool {
	return errors.Is(context.Cause(r.Context()), errStopping)
}

// unavailableStopping answers 503 unavailable, with Retry-After, to a
// request the api stopped under: another api, or this one restarted,
// answers it when it is sent again.
func unavailableStopping(w http.ResponseWriter) {
	w.Header().Set("Retry-After", RetryAfter)
	writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
		Message: "the api is stopping: retry (a command with the same Idempotency-Key)"})
}

// health is liveness: 200 while the api serves HTTP, with its NATS
// connection's state. NATS being away does not make it fail (restarting
// the api cures nothing there; /readyz answers 503 meanwhile), as on the
// other services' probes.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, apiv1.Health{Status: "ok", NATS: s.def.nc.Status().String(), Version: svc.Version()})
}

// onlyParams answers 400 to a request with a query parameter that is not
// in params, naming it and the ones the route takes.
func onlyParams(h http.HandlerFunc, params ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name := range r.URL.Query() {
			if slices.Contains(params, name) {
				continue
			}
			field, msg := name, fmt.Sprintf("unknown query parameter %q", name)
			if name == "" { // "?=2": the query names no parameter
				field, msg = "query", fmt.Sprintf("a query parameter has no name (%q)", nameless(r.URL.RawQuery))
			}
			if len(params) == 0 {
				msg += "; this endpoint takes none"
			} else {
				msg += "; use " + strings.Join(params, ", ")
			}
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: field, Message: msg})
			return
		}
		h(w, r)
	})
}

// nameless is the first part of a raw query with no parameter name
// ("=2" of "a=1&=2"), or the whole query if none is found as it is.
func nameless(raw string) string {
	for part := range strings.SplitSeq(raw, "&") {
		if strings.HasPrefix(part, "=") {
			return part
		}
	}
	return raw
}

// apiError is the JSON body of every 4xx and 5xx answer, under "error".
type apiError = apiv1.Error

func writeError(w http.ResponseWriter, status int, e apiError) {
	writeJSON(w, status, apiv1.ErrorBody{Error: &e})
}

// rawProblems is v, a list of problems, as the JSON of an error's problems.
func rawProblems(v any) json.RawMessage {
	b, err := rawJSON(v)
	if err != nil {
		return nil // lists of plain structs always encode
	}
	return b
}

// rawJSON is json.Marshal with < > & as they are, as writeJSON writes
// them: a raw field in a body reads as the rest of it.
func rawJSON(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	// Not HTML, whatever a browser guesses from < in it.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Bodies are JSON for programs and people, never HTML: "<=" stays
	// "<=", not "\u003c=" (a JSON decoder reads either).
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// RetryAfter is the Retry-After of a 503: NATS is away, slow or between
// leaders, and the same request (with the same idempotency key) can
// succeed in a moment.
const RetryAfter = "1"

// internal answers a request that failed on NATS or JetStream: 503
// unavailable with Retry-After when the failure is transient (a timeout,
// no responders, a stream between leaders), else 500 internal.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	if stoppedUnder(r) {
		zerolog.Ctx(r.Context()).Debug().Err(err).Str("path", r.URL.Path).Msg("request cut short by the api's stop")
		unavailableStopping(w)
		return
	}
	if bus.Transient(err) && r.Context().Err() == nil {
		zerolog.Ctx(r.Context()).Warn().Err(err).Str("path", r.URL.Path).Msg("request failed, retryable")
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
			Message: err.Error() + " (NATS is away or between leaders: retry; a command with the same Idempotency-Key)"})
		return
	}
	zerolog.Ctx(r.Context()).Error().Err(err).Str("path", r.URL.Path).Msg("request failed")
	writeError(w, http.StatusInternalServerError, apiError{Code: "internal", Message: err.Error()})
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

// logRequests logs each request at debug level: never its headers or
// body (they carry tokens), but who it was, as authenticated.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		note := &requestNote{}
		r = r.WithContext(context.WithValue(s.log.WithContext(r.Context()), noteKey{}, note))
		next.ServeHTTP(rec, r)
		s.log.Debug().Str("method", r.Method).Str("path", r.URL.Path).Int("status", rec.status).
			Str("subject", note.subject).Str("auth_method", note.method).Str("key_id", note.keyID).Str("namespace", note.namespace).
			Dur("took", time.Since(began)).Msg("http request")
	})
}
