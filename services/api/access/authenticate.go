package access

import (
	"context"
	"strings"

	"jetflow.dev/pkg/events"
)

// Authenticator turns a request's Authorization header into a principal.
// A nil field is a kind of token it does not accept.
type Authenticator struct {
	Keys  *Keys
	Admin *AdminTokens
	OIDC  *OIDC
}

// Anonymous is the caller of an api that runs without authentication:
// it may do everything, everywhere.
var Anonymous = Principal{Subject: "anonymous", Method: events.ActorNone, Scopes: []Scope{ScopeAdmin},
	Namespaces: []string{AllNamespaces}}

// Authenticate checks the bearer token in header (an Authorization
// header's value). Errors wrap ErrNoToken, ErrBadToken (401) or
// ErrUnavailable (503); none holds the token.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (Principal, error) {
	scheme, token, _ := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	if header == "" {
		return Principal{}, ErrNoToken
	}
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return Principal{}, refused("use the header Authorization: Bearer <token>")
	}
	if a.Admin != nil {
		if p, ok := a.Admin.Match(token); ok {
			return p, nil
		}
	}
	switch {
	case strings.HasPrefix(token, KeyPrefix):
		if a.Keys == nil {
			return Principal{}, refused("this api accepts no api keys")
		}
		k, err := a.Keys.Lookup(ctx, token)
		if err != nil {
			return Principal{}, err
		}
		return k.Principal(), nil
	case isJWT(token):
		if a.OIDC == nil {
			return Principal{}, refused("this api is configured with no OIDC issuer")
		}
		return a.OIDC.Verify(ctx, token)
	}
	return Principal{}, refused("the token is neither an api key (jfk_...), an admin token, nor a JWT")
}
