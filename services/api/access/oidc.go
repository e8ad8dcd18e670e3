package access

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"jetflow.dev/pkg/events"
)

// OIDCConfig configures the validation of JWTs from an OIDC issuer.
type OIDCConfig struct {
	// Issuer is the issuer's URL (discovery at
	// Issuer/.well-known/openid-configuration). "" turns OIDC off.
	Issuer string
	// Audience must be in the token's aud. Required with Issuer.
	Audience string
	// ScopesClaim holds the token's scopes: space-separated (or a list of)
	// jetflow:<scope> values; others are ignored. Default "scope".
	ScopesClaim string
	// NamespacesClaim holds the namespaces the token grants (a list, or
	// space-separated; "*" for all). A token without it grants none.
	// Default "jetflow_namespaces".
	NamespacesClaim string
	// HTTPClient fetches the discovery document and the keys. Default
	// http.DefaultClient with a 10s timeout.
	HTTPClient *http.Client
}

// ScopePrefix starts the scope values jetflow reads from a token.
const ScopePrefix = "jetflow:"

// Validate applies the defaults and checks c.
func (c OIDCConfig) Validate() (OIDCConfig, error) {
	if c.Issuer == "" {
		if c.Audience != "" {
			return c, errors.New("access: an OIDC audience without an issuer: set the issuer too")
		}
		return c, nil
	}
	if !strings.HasPrefix(c.Issuer, "https://") && !strings.HasPrefix(c.Issuer, "http://") {
		return c, fmt.Errorf("access: OIDC issuer %q is not an http(s) URL", c.Issuer)
	}
	if c.Audience == "" {
		return c, errors.New("access: an OIDC issuer needs the audience its tokens are for")
	}
	if c.ScopesClaim == "" {
		c.ScopesClaim = "scope"
	}
	if c.NamespacesClaim == "" {
		c.NamespacesClaim = "jetflow_namespaces"
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	return c, nil
}

// OIDC verifies JWTs with github.com/coreos/go-oidc/v3: the signature
// with the issuer's JWKS (fetched, and fetched again when a token names
// an unknown key), iss, aud and exp. The issuer is discovered at the
// first token, and again after a failure, so that the api starts while
// the issuer is down.
type OIDC struct {
	cfg      OIDCConfig
	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
}

// NewOIDC returns a verifier for cfg (which Validate checked).
func NewOIDC(cfg OIDCConfig) *OIDC { return &OIDC{cfg: cfg} }

func (o *OIDC) get(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.verifier != nil {
		return o.verifier, nil
	}
	// The provider keeps its context to fetch keys later: not the request's.
	pctx := oidc.ClientContext(context.WithoutCancel(ctx), o.cfg.HTTPClient)
	dctx, cancel := context.WithTimeout(pctx, 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, o.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("%w: OIDC discovery at %s: %w", ErrUnavailable, o.cfg.Issuer, err)
	}
	// NewProvider's key set keeps dctx; make one that lives on.
	var meta struct {
		JWKS string   `json:"jwks_uri"`
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := p.Claims(&meta); err != nil || meta.JWKS == "" {
		return nil, fmt.Errorf("%w: OIDC discovery at %s names no jwks_uri", ErrUnavailable, o.cfg.Issuer)
	}
	keys := oidc.NewRemoteKeySet(pctx, meta.JWKS)
	o.verifier = oidc.NewVerifier(o.cfg.Issuer, keys, &oidc.Config{ClientID: o.cfg.Audience, SupportedSigningAlgs: meta.Algs})
	return o.verifier, nil
}

// Verify checks raw and returns its principal.
func (o *OIDC) Verify(ctx context.Context, raw string) (Principal, error) {
	v, err := o.get(ctx)
	if err != nil {
		return Principal{}, err
	}
	tok, err := v.Verify(ctx, raw)
	if err != nil {
		return Principal{}, refused("OIDC token: %s", strings.TrimPrefix(err.Error(), "oidc: "))
	}
	if tok.Subject == "" {
		return Principal{}, refused("OIDC token: no sub claim")
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Principal{}, refused("OIDC token: claims: %s", err)
	}
	p := Principal{Subject: tok.Subject, Method: events.ActorOIDC}
	for _, v := range claimValues(claims[o.cfg.ScopesClaim]) {
		if s, ok := strings.CutPrefix(v, ScopePrefix); ok {
			if scopes, err := ParseScopes([]string{s}); err == nil {
				p.Scopes = append(p.Scopes, scopes...)
			}
		}
	}
	for _, ns := range claimValues(claims[o.cfg.NamespacesClaim]) {
		if ns == AllNamespaces || ValidNamespace(ns) {
			p.Namespaces = append(p.Namespaces, ns)
		}
	}
	return p, nil
}

// claimValues reads a claim that is a space-separated string or a list of strings.
func claimValues(v any) []string {
	switch c := v.(type) {
	case string:
		return strings.Fields(c)
	case []any:
		var out []string
		for _, e := range c {
			if s, ok := e.(string); ok {
				out = append(out, strings.Fields(s)...)
			}
		}
		return out
	}
	return nil
}
