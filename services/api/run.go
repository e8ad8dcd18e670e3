package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/internal/svcrun"
)

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f := svc.NewFlags("jetflow-api", getenv)
	common := f.AddCommon()
	addr := f.String("http", "JETFLOW_HTTP_ADDR", "127.0.0.1:8080", "HTTP listen address")
	startWait := f.Duration("start-wait", "JETFLOW_START_WAIT", 5*time.Second, "how long a start request waits for the dispatcher")
	noAuth := f.Bool("no-http-auth", "JETFLOW_NO_HTTP_AUTH", false,
		"serve without authentication: anyone who reaches the api may do anything (experiments only)")
	adminTokens := f.String("admin-token-file", "JETFLOW_ADMIN_TOKEN_FILE", "",
		"file of bootstrap admin tokens, one a line (to create the first api keys; rotate by editing it)")
	issuer := f.String("oidc-issuer", "JETFLOW_OIDC_ISSUER", "", "OIDC issuer URL whose JWTs are accepted (discovery, JWKS)")
	audience := f.String("oidc-audience", "JETFLOW_OIDC_AUDIENCE", "", "audience the OIDC tokens must be for (required with -oidc-issuer)")
	scopesClaim := f.String("oidc-scopes-claim", "JETFLOW_OIDC_SCOPES_CLAIM", "scope", "claim holding the token's jetflow:<scope> values")
	nsClaim := f.String("oidc-namespaces-claim", "JETFLOW_OIDC_NAMESPACES_CLAIM", "jetflow_namespaces", "claim holding the namespaces the token grants")
	cacheTTL := f.Duration("key-cache-ttl", "JETFLOW_KEY_CACHE_TTL", 5*time.Second,
		"how long an api key looked up is trusted (a key revoked on another replica stops working within it; at most 1m)")
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	authCfg := api.AuthConfig{Disabled: *noAuth, AdminTokenFile: *adminTokens, CacheTTL: *cacheTTL,
		OIDC: access.OIDCConfig{Issuer: *issuer, Audience: *audience, ScopesClaim: *scopesClaim, NamespacesClaim: *nsClaim}}
	log, err := svcrun.Logger(stderr, common, "api")
	if err != nil {
		return err
	}
	names, err := common.ServedNamespaces()
	if err != nil {
		return err
	}
	if !slices.Contains(names, auth.DefaultNamespace) {
		return fmt.Errorf("-namespaces: the api serves the default namespace (it holds the api keys), and others beside it")
	}
	nss, closeAll, err := svcrun.OpenAll(ctx, common, auth.RoleAPI, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not an error
		}
		return err
	}
	defer closeAll()
	cfg := api.Config{Addr: *addr, StartWait: *startWait, BindOnly: common.Restricted(), Auth: authCfg}
	var def svcrun.Namespace
	for _, ns := range nss {
		if ns.Name == auth.DefaultNamespace {
			def = ns
		} else {
			cfg.Namespaces = append(cfg.Namespaces, api.Namespace{Name: ns.Name, NC: ns.NC, JS: ns.JS})
		}
	}
	return api.Serve(ctx, cfg, def.NC, def.JS, log)
}
