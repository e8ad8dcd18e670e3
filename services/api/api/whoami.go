package api

import (
	"net/http"

	"jetflow.dev/pkg/apiv1"
)

// whoami answers who the caller is, as its token was authenticated: its
// subject, how it authenticated, its key's id, its scopes and the
// namespaces it may use. Any valid token may ask (the UI offers only the
// actions the token can take from it); nothing secret is in it.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	out := apiv1.Whoami{Subject: p.Subject, Method: p.Method, KeyID: p.KeyID,
		Scopes: make([]string, 0, len(p.Scopes)), Namespaces: append([]string{}, p.Namespaces...)}
	for _, sc := range p.Scopes {
		out.Scopes = append(out.Scopes, string(sc))
	}
	writeJSON(w, http.StatusOK, out)
}
