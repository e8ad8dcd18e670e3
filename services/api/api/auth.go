package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/services/api/access"
)

type (
	principalKey struct{}
	tenantKey    struct{}
	noteKey      struct{}
)

// requestNote is what the request log says of who asked.
type requestNote struct{ subject, method, keyID, namespace string }

// guard authenticates and authorizes a request for rt before h serves
// it: 401 without a valid token, 403 without the route's scope or the
// namespace (404 for a lookup, see route.hidden), 404 for a namespace
// this api does not serve. The principal and the namespace's tenant go
// into the request's context.
func (s *Server) guard(rt route, h http.Handler) http.Handler {
	if rt.scope == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := access.Anonymous
		if s.authn != nil {
			var err error
			if p, err = s.authn.Authenticate(r.Context(), r.Header.Get("Authorization")); err != nil {
				s.refuseToken(w, r, rt, err)
				return
			}
		}
		ns := cmp.Or(r.Header.Get(NamespaceHeader), DefaultNamespace)
		if note, ok := r.Context().Value(noteKey{}).(*requestNote); ok {
			*note = requestNote{subject: p.Subject, method: p.Method, keyID: p.KeyID, namespace: ns}
		}
		if !rt.global && !access.ValidNamespace(ns) {
			writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: NamespaceHeader,
				Message: fmt.Sprintf("namespace %q: %s", ns, access.NamespaceRule)})
			return
		}
		switch d := access.Decide(p, rt.scope, ns, rt.global); d.Denial {
		case access.MissingScope:
			writeError(w, http.StatusForbidden, apiError{Code: "forbidden", Scope: string(rt.scope), Message: d.Message})
			return
		case access.NamespaceNotGranted:
			if rt.hidden != nil {
				writeError(w, http.StatusNotFound, rt.hidden(r))
				return
			}
			writeError(w, http.StatusForbidden, apiError{Code: "forbidden", Namespace: ns, Message: d.Message})
			return
		}
		t := s.def
		if !rt.global {
			var ok bool
			if t, ok = s.tenants[ns]; !ok {
				writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: NamespaceHeader,
					Message: fmt.Sprintf("namespace %q is not served by this api (it serves %s)", ns, strings.Join(s.served(), ", "))})
				return
			}
		}
		ctx := context.WithValue(context.WithValue(r.Context(), principalKey{}, p), tenantKey{}, t)
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// refuseToken answers a request whose token was refused: 401, or 503
// when it could not be checked. The answer and the log say why, never
// with the token.
func (s *Server) refuseToken(w http.ResponseWriter, r *http.Request, rt route, err error) {
	log := zerolog.Ctx(r.Context())
	if errors.Is(err, access.ErrUnavailable) {
		log.Error().Err(err).Str("path", r.URL.Path).Msg("cannot check a token")
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable", Message: err.Error()})
		return
	}
	challenge := `Bearer realm="jetflow"`
	needs := fmt.Sprintf("a token with the scope %s", rt.scope)
	if rt.scope == access.ScopeAny {
		needs = "a token, of any scope"
	}
	msg := "this needs " + needs + ": send Authorization: Bearer <token> (an api key, the admin token or an OIDC token)"
	if !errors.Is(err, access.ErrNoToken) {
		challenge += `, error="invalid_token"`
		msg = strings.TrimPrefix(err.Error(), access.ErrBadToken.Error()+": ")
		log.Info().Str("reason", msg).Str("path", r.URL.Path).Msg("token refused")
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, http.StatusUnauthorized, apiError{Code: "unauthenticated", Message: msg})
}

// served lists the namespaces this api serves.
func (s *Server) served() []string {
	out := make([]string, 0, len(s.tenants))
	for ns := range s.tenants {
		out = append(out, ns)
	}
	return out
}

// ns is the tenant of the request whose context is ctx (the default
// namespace's outside a guarded route).
func (s *Server) ns(ctx context.Context) *tenant {
	if t, ok := ctx.Value(tenantKey{}).(*tenant); ok {
		return t
	}
	return s.def
}

// at is the tenant of request r.
func (s *Server) at(r *http.Request) *tenant { return s.ns(r.Context()) }

// principalOf is who made request r, as authenticated.
func principalOf(r *http.Request) access.Principal {
	if p, ok := r.Context().Value(principalKey{}).(access.Principal); ok {
		return p
	}
	return access.Anonymous
}

// actorOf is who made request r, as its commands record it.
func actorOf(r *http.Request) *events.Actor { return principalOf(r).Actor() }
