package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/api/projector"
	"jetflow.dev/services/api/visibility/sqlitestore"
	"jetflow.dev/services/internal/metrics"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	p := svcrun.New(auth.RoleAPI, getenv, stderr)
	addr := p.String("http", "JETFLOW_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	startWait := p.DurationIn("start-wait", "JETFLOW_START_WAIT", 5*time.Second, api.Ranges.StartWait,
		"how long a start request waits for the dispatcher")
	noAuth := p.Bool("no-http-auth", "JETFLOW_NO_HTTP_AUTH", false,
		"serve without authentication: anyone who reaches the api may do anything (experiments only)")
	adminTokens := p.String("admin-token-file", "JETFLOW_ADMIN_TOKEN_FILE", "",
		"file of bootstrap admin tokens, one a line (to create the first api keys; rotate by editing it)")
	issuer := p.String("oidc-issuer", "JETFLOW_OIDC_ISSUER", "", "OIDC issuer URL whose JWTs are accepted (discovery, JWKS)")
	audience := p.String("oidc-audience", "JETFLOW_OIDC_AUDIENCE", "", "audience the OIDC tokens must be for (required with -oidc-issuer)")
	scopesClaim := p.String("oidc-scopes-claim", "JETFLOW_OIDC_SCOPES_CLAIM", "scope", "claim holding the token's jetflow:<scope> values")
	nsClaim := p.String("oidc-namespaces-claim", "JETFLOW_OIDC_NAMESPACES_CLAIM", "jetflow_namespaces", "claim holding the namespaces the token grants")
	maxModel := p.IntIn("max-read-model", "JETFLOW_MAX_READ_MODEL", 900<<10, api.Ranges.MaxReadModel,
		"the largest read model stored, in bytes: a larger one leaves out its finished steps, oldest first (never more than the server's message size)")
	projCache := p.IntIn("projector-cache-bytes", "JETFLOW_PROJECTOR_CACHE_BYTES", projector.DefaultCacheBytes, api.Ranges.ProjectorCache,
		"bytes the projector's cached execution states may hold, as estimated from their content (at most 20000 states)")
	coalesce := p.DurationIn("projector-coalesce", "JETFLOW_PROJECTOR_COALESCE", projector.DefaultCoalesce, api.Ranges.ProjectorCoalesce,
		"while events come fast (64 or more in this time), how long the projector gathers them before it writes the read models, so that each is written once for several events (they lag that much more; 0: write at every batch)")
	gather := p.DurationIn("projector-gather", "JETFLOW_PROJECTOR_GATHER", projector.DefaultGather, api.Ranges.ProjectorGather,
		"when not under load, how long the projector waits after an event for the next ones before it writes the read models (one execution at a time: several of its steps in one write; they lag that much more; 0: each event as it comes)")
	cacheTTL := p.DurationIn("key-cache-ttl", "JETFLOW_KEY_CACHE_TTL", 5*time.Second, api.Ranges.CacheTTL,
		"how long an api key looked up is trusted (a key revoked on another replica stops working within it)")
	readyMaxLag := p.DurationIn("ready-max-lag", "JETFLOW_READY_MAX_LAG", api.DefaultReadyMaxLag, api.Ranges.ReadyMaxLag,
		"how far the read models may be behind the events (the oldest event not yet projected) before /readyz answers 503")
	visibilityDir := p.String("visibility-dir", "JETFLOW_VISIBILITY_DIR", "",
		"directory of the visibility index that lists executions (a SQLite database per namespace, kept across restarts; empty: in memory, fed again from the read models at every start)")
	visibilityCache := p.IntIn("visibility-cache-bytes", "JETFLOW_VISIBILITY_CACHE_BYTES", sqlitestore.DefaultCacheBytes, api.Ranges.VisibilityCache,
		"bytes of the SQLite visibility index's page cache for its writer (each reader's is a quarter), with -visibility-dir only: full at about 100,000 executions; smaller saves memory and fills a large index more slowly")
	visibilityPostgres := p.String("visibility-postgres", "JETFLOW_VISIBILITY_POSTGRES", "",
		"URL of a PostgreSQL database holding the visibility index instead of -visibility-dir (a schema per namespace; api replicas may share it), e.g. postgres://jetflow:secret@db:5432/jetflow")
	metricsAddr := p.String("metrics-addr", "JETFLOW_API_METRICS_ADDR", "",
		"host:port of the Prometheus /metrics endpoint, e.g. 127.0.0.1:9465 (empty: off)")
	if err := p.Parse(args); err != nil {
		return err
	}
	cfg := api.Config{Addr: *addr, StartWait: *startWait, BindOnly: p.Common.Restricted(), MaxReadModel: *maxModel,
		ProjectorCache: *projCache, ProjectorCoalesce: svc.NeverIfZero(*coalesce), ProjectorGather: svc.NeverIfZero(*gather), VisibilityDir: *visibilityDir,
		VisibilityCache: *visibilityCache, VisibilityPostgres: *visibilityPostgres,
		Auth: api.AuthConfig{Disabled: *noAuth, AdminTokenFile: *adminTokens, CacheTTL: *cacheTTL,
			OIDC: access.OIDCConfig{Issuer: *issuer, Audience: *audience, ScopesClaim: *scopesClaim, NamespacesClaim: *nsClaim}}}
	cfg.ReadyMaxLag = *readyMaxLag
	if err := cfg.Validate(); err != nil { // before waiting for NATS
		return err
	}
	tp, flush, err := tracing.FromEnv(ctx, "api", getenv) // the OTEL_* variables (docs/observability.md)
	if err != nil {
		return err
	}
	defer flush()
	cfg.Tracer = tp
	if *metricsAddr != "" {
		reg := metrics.Registry()
		stop, err := metrics.Serve("-metrics-addr", *metricsAddr, reg, p.Log)
		if err != nil {
			return err
		}
		defer stop()
		cfg.Registerer = reg
	}
	names, err := p.Common.ServedNamespaces()
	if err != nil {
		return err
	}
	if !slices.Contains(names, auth.DefaultNamespace) {
		return fmt.Errorf("-namespaces: the api serves the default namespace (it holds the api keys), and others beside it")
	}
	nss, closeAll, err := p.OpenAll(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not an error
		}
		return err
	}
	defer closeAll()
	var def svcrun.Namespace
	for _, ns := range nss {
		if ns.Name == auth.DefaultNamespace {
			def = ns
		} else {
			cfg.Namespaces = append(cfg.Namespaces, api.Namespace{Name: ns.Name, NC: ns.NC, JS: ns.JS})
		}
	}
	cfg.Missing = func() []string {
		var out []string
		for _, ns := range nss {
			out = append(out, ns.Topology.Missing()...) // unauthenticated: no namespace names
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return api.Serve(ctx, cfg, def.NC, def.JS, p.Log)
}
