// Package accesstest runs a local OIDC issuer for tests: discovery, a
// JWKS with a key it generates, and tokens it signs with
// github.com/go-jose/go-jose/v4.
package accesstest

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Issuer is an OIDC issuer on a loopback port.
type Issuer struct {
	URL string
	key *rsa.PrivateKey
	kid string
}

// NewIssuer starts an issuer that serves until the test ends.
func NewIssuer(t testing.TB) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &Issuer{key: key, kid: "test-key-1"}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	is.URL = srv.URL
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": is.URL, "jwks_uri": is.URL + "/jwks", "authorization_endpoint": is.URL + "/authorize",
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			{Key: &is.key.PublicKey, KeyID: is.kid, Algorithm: string(jose.RS256), Use: "sig"}}})
	})
	return is
}

// Claims are a token's claims; Issuer, Subject, Audience and Expiry are
// filled in by Token when empty.
type Claims struct {
	Issuer   string
	Subject  string
	Audience []string
	Expiry   time.Time
	// Extra claims (scope, jetflow_namespaces, ...).
	Extra map[string]any
}

// Token signs c with the issuer's key.
func (is *Issuer) Token(t testing.TB, c Claims) string {
	t.Helper()
	return is.sign(t, is.key, c)
}

// Forged signs c with another key under the issuer's key id: a token
// whose signature the issuer's JWKS does not verify.
func (is *Issuer) Forged(t testing.TB, c Claims) string {
	t.Helper()
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return is.sign(t, other, c)
}

func (is *Issuer) sign(t testing.TB, key *rsa.PrivateKey, c Claims) string {
	t.Helper()
	if c.Issuer == "" {
		c.Issuer = is.URL
	}
	if c.Expiry.IsZero() {
		c.Expiry = time.Now().Add(time.Hour)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", is.kid))
	if err != nil {
		t.Fatal(err)
	}
	std := jwt.Claims{Issuer: c.Issuer, Subject: c.Subject, Audience: jwt.Audience(c.Audience),
		Expiry: jwt.NewNumericDate(c.Expiry), IssuedAt: jwt.NewNumericDate(time.Now().Add(-time.Minute))}
	raw, err := jwt.Signed(sig).Claims(std).Claims(c.Extra).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
