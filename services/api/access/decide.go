package access

import (
	"fmt"
	"slices"
	"strings"

	"jetflow.dev/pkg/events"
)

// Scope is what a caller may do.
type Scope string

// Scopes. ScopeAdmin implies every other.
const (
	// ScopeRead: every GET (executions, histories, live events, workflows, locks, settings).
	ScopeRead Scope = "read"
	// ScopeStart: start executions.
	ScopeStart Scope = "start"
	// ScopeSignal: send signals to executions.
	ScopeSignal Scope = "signal"
	// ScopeOperate: operators' actions (cancel, force-cancel, kill,
	// resume, force-resume, replay) and clearing locks.
	ScopeOperate Scope = "operate"
	// ScopeAdmin: register workflows, rebuild read models, manage keys;
	// and everything else.
	ScopeAdmin Scope = "admin"
	// ScopeAny is no scope a key or token holds: what a route needs that
	// takes any valid token, whatever its scopes (GET /v1/whoami). Every
	// principal has it; it is not one of Scopes, so no key is made with it.
	ScopeAny Scope = "any"
)

// Scopes lists the scopes, from the least to the most powerful.
var Scopes = []Scope{ScopeRead, ScopeStart, ScopeSignal, ScopeOperate, ScopeAdmin}

// AllNamespaces, in a principal's namespaces, grants every namespace.
const AllNamespaces = "*"

// ParseScopes reads scope names; it refuses an unknown one and an empty list.
func ParseScopes(names []string) ([]Scope, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("access: name at least one scope (%s)", scopeNames())
	}
	out := make([]Scope, 0, len(names))
	for _, n := range names {
		s := Scope(strings.TrimSpace(n))
		if !slices.Contains(Scopes, s) {
			return nil, fmt.Errorf("access: scope %q is not one of %s", n, scopeNames())
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func scopeNames() string {
	names := make([]string, len(Scopes))
	for i, s := range Scopes {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// NamespaceRule says what a namespace may be called (as in NATS accounts).
const NamespaceRule = "use 1 to 32 lower-case letters, digits or '-', starting with a letter"

// ValidNamespace reports whether ns can name a namespace.
func ValidNamespace(ns string) bool {
	if len(ns) < 1 || len(ns) > 32 || ns[0] < 'a' || ns[0] > 'z' {
		return false
	}
	for _, r := range ns {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// ParseNamespaces reads the namespaces a key grants: names, or "*" alone.
func ParseNamespaces(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("access: name at least one namespace, or %q for all", AllNamespaces)
	}
	var out []string
	for _, n := range names {
		n = strings.TrimSpace(n)
		switch {
		case n == AllNamespaces && len(names) > 1:
			return nil, fmt.Errorf("access: %q grants every namespace: give it alone", AllNamespaces)
		case n != AllNamespaces && !ValidNamespace(n):
			return nil, fmt.Errorf("access: namespace %q: %s", n, NamespaceRule)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Principal is an authenticated caller.
type Principal struct {
	// Subject is who: an api key's name, an OIDC token's sub, "admin-token"
	// for the bootstrap admin token, "anonymous" without authentication.
	Subject string
	// Method is how it authenticated: events.ActorAPIKey, ActorOIDC or ActorNone.
	Method string
	// KeyID is the api key's id (admin-token-<hash prefix> for an admin token).
	KeyID string
	// Scopes it holds; Namespaces it may act in ("*": all).
	Scopes     []Scope
	Namespaces []string
}

// Actor is the principal as operator events record it.
func (p Principal) Actor() *events.Actor {
	return &events.Actor{Subject: p.Subject, Method: p.Method, KeyID: p.KeyID}
}

// Has reports whether p holds scope s (admin holds them all; everyone
// holds ScopeAny).
func (p Principal) Has(s Scope) bool {
	return s == ScopeAny || slices.Contains(p.Scopes, s) || slices.Contains(p.Scopes, ScopeAdmin)
}

// Grants reports whether p may act in namespace ns.
func (p Principal) Grants(ns string) bool {
	return slices.Contains(p.Namespaces, AllNamespaces) || slices.Contains(p.Namespaces, ns)
}

// Denial says why a request is refused.
type Denial int

// Reasons to refuse.
const (
	// Allowed: nothing is refused.
	Allowed Denial = iota
	// MissingScope: the caller lacks the route's scope (403).
	MissingScope
	// NamespaceNotGranted: the caller may not act in the request's
	// namespace (403; 404 for a lookup, so that nothing of another tenant
	// is confirmed).
	NamespaceNotGranted
)

// Decision is the verdict on one request.
type Decision struct {
	Denial Denial
	// Message names what is missing (the scope, the namespace).
	Message string
}

// Decide is the authorization decision: whether p may use a route that
// needs scope need, in namespace ns (ignored when global: the route is
// not about one namespace, such as key management). Scope is checked
// before namespace, so that a caller without the scope learns nothing
// about namespaces.
func Decide(p Principal, need Scope, ns string, global bool) Decision {
	if !p.Has(need) {
		held := "none"
		if len(p.Scopes) > 0 {
			names := make([]string, len(p.Scopes))
			for i, s := range p.Scopes {
				names[i] = string(s)
			}
			held = strings.Join(names, ", ")
		}
		return Decision{Denial: MissingScope, Message: fmt.Sprintf("this needs the scope %s; %s %q holds %s", need, p.what(), p.Subject, held)}
	}
	if !global && !p.Grants(ns) {
		return Decision{Denial: NamespaceNotGranted, Message: fmt.Sprintf("%s %q is not granted the namespace %q", p.what(), p.Subject, ns)}
	}
	return Decision{}
}

func (p Principal) what() string {
	switch p.Method {
	case events.ActorOIDC:
		return "the OIDC subject"
	case events.ActorNone:
		return "the caller"
	}
	return "the key"
}

// CanGrant says why p may not create a key with these scopes and
// namespaces ("" if it may): nobody hands out more than it holds, so an
// admin of one namespace cannot make a key for another, or for all.
func CanGrant(p Principal, scopes []Scope, namespaces []string) string {
	for _, s := range scopes {
		if s == ScopeAny {
			// What a route needs, never what a key holds (Has grants it to
			// everyone): ParseScopes refuses it, and so does this.
			return fmt.Sprintf("scope %s: no key holds it", s)
		}
		if !p.Has(s) {
			return fmt.Sprintf("scope %s: you do not hold it", s)
		}
	}
	if slices.Contains(p.Namespaces, AllNamespaces) {
		return ""
	}
	for _, ns := range namespaces {
		if ns == AllNamespaces {
			return fmt.Sprintf("namespaces %q: you are granted only %s", AllNamespaces, strings.Join(p.Namespaces, ", "))
		}
		if !p.Grants(ns) {
			return fmt.Sprintf("namespace %q: you are not granted it", ns)
		}
	}
	return ""
}

// CanManage reports whether p may see and revoke a key granting
// namespaces: only if p could have made it.
func CanManage(p Principal, namespaces []string) bool {
	return p.Has(ScopeAdmin) && CanGrant(p, nil, namespaces) == ""
}
