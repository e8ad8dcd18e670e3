package access_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/access/accesstest"
)

// TestOIDC validates tokens of a local issuer: its signature through the
// issuer's JWKS, iss, aud and exp; scopes and namespaces from the claims.
func TestOIDC(t *testing.T) {
	t.Parallel()
	is := accesstest.NewIssuer(t)
	cfg, err := access.OIDCConfig{Issuer: is.URL, Audience: "jetflow"}.Validate()
	require.NoError(t, err)
	a := &access.Authenticator{OIDC: access.NewOIDC(cfg)}
	ctx := context.Background()
	good := accesstest.Claims{Subject: "alice", Audience: []string{"jetflow"}, Extra: map[string]any{
		"scope": "openid jetflow:read jetflow:signal jetflow:root email", "jetflow_namespaces": []string{"default", "team-a", "Not Valid"}}}

	p, err := a.Authenticate(ctx, "Bearer "+is.Token(t, good))
	require.NoError(t, err)
	require.Equal(t, access.Principal{Subject: "alice", Method: events.ActorOIDC,
		Scopes: []access.Scope{access.ScopeRead, access.ScopeSignal}, Namespaces: []string{"default", "team-a"}}, p)

	for _, tt := range []struct {
		name string
		mod  func(*accesstest.Claims)
		msg  string
	}{
		{"WrongAudience", func(c *accesstest.Claims) { c.Audience = []string{"another-app"} }, "audience"},
		{"Expired", func(c *accesstest.Claims) { c.Expiry = time.Now().Add(-time.Minute) }, "expired"},
		{"WrongIssuer", func(c *accesstest.Claims) { c.Issuer = "https://evil.example" }, "issued by a different provider"},
		{"NoSubject", func(c *accesstest.Claims) { c.Subject = "" }, "no sub claim"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mod(&c)
			tok := is.Token(t, c)
			_, err := a.Authenticate(ctx, "Bearer "+tok)
			require.ErrorIs(t, err, access.ErrBadToken)
			require.ErrorContains(t, err, tt.msg)
			require.NotContains(t, err.Error(), tok)
		})
	}
	t.Run("ForgedSignature", func(t *testing.T) {
		_, err := a.Authenticate(ctx, "Bearer "+is.Forged(t, good))
		require.ErrorIs(t, err, access.ErrBadToken)
		require.ErrorContains(t, err, "signature")
	})
	t.Run("ListClaims", func(t *testing.T) {
		c := good
		c.Extra = map[string]any{"scope": []string{"jetflow:admin"}, "jetflow_namespaces": "*"}
		p, err := a.Authenticate(ctx, "Bearer "+is.Token(t, c))
		require.NoError(t, err)
		require.Equal(t, []access.Scope{access.ScopeAdmin}, p.Scopes)
		require.Equal(t, []string{"*"}, p.Namespaces)
	})
	t.Run("OtherClaimNames", func(t *testing.T) {
		cfg, err := access.OIDCConfig{Issuer: is.URL, Audience: "jetflow", ScopesClaim: "roles", NamespacesClaim: "tenants"}.Validate()
		require.NoError(t, err)
		o := access.NewOIDC(cfg)
		c := good
		c.Extra = map[string]any{"roles": []string{"jetflow:operate"}, "tenants": []string{"team-b"}, "scope": "jetflow:admin"}
		p, err := o.Verify(ctx, is.Token(t, c))
		require.NoError(t, err)
		require.Equal(t, []access.Scope{access.ScopeOperate}, p.Scopes)
		require.Equal(t, []string{"team-b"}, p.Namespaces)
	})
}

func TestOIDCConfig(t *testing.T) {
	t.Parallel()
	c, err := access.OIDCConfig{}.Validate()
	require.NoError(t, err, "no issuer: OIDC is off")
	require.Empty(t, c.ScopesClaim)
	_, err = access.OIDCConfig{Audience: "x"}.Validate()
	require.ErrorContains(t, err, "without an issuer")
	_, err = access.OIDCConfig{Issuer: "https://id.example"}.Validate()
	require.ErrorContains(t, err, "audience")
	_, err = access.OIDCConfig{Issuer: "id.example", Audience: "x"}.Validate()
	require.ErrorContains(t, err, "not an http(s) URL")
	c, err = access.OIDCConfig{Issuer: "https://id.example", Audience: "x"}.Validate()
	require.NoError(t, err)
	require.Equal(t, "scope", c.ScopesClaim)
	require.Equal(t, "jetflow_namespaces", c.NamespacesClaim)
}

// TestOIDCIssuerDown: a token that cannot be checked is not refused as
// bad, it is unavailable (503), and the issuer is asked again later.
func TestOIDCIssuerDown(t *testing.T) {
	t.Parallel()
	cfg, err := access.OIDCConfig{Issuer: "http://127.0.0.1:1", Audience: "jetflow"}.Validate()
	require.NoError(t, err)
	_, err = access.NewOIDC(cfg).Verify(context.Background(), "a.b.c")
	require.ErrorIs(t, err, access.ErrUnavailable)
}
