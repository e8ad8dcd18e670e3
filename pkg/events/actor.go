package events

import (
	"fmt"
	"strings"
)

// How an actor authenticated ([Actor.Method]).
const (
	// ActorAPIKey: an HTTP caller with an api key (or the api's bootstrap
	// admin token, whose KeyID starts with "admin-token-").
	ActorAPIKey = "api-key"
	// ActorOIDC: an HTTP caller with a JWT from the api's OIDC issuer.
	ActorOIDC = "oidc"
	// ActorNATS: a command published straight on NATS. JetStream stores no
	// publisher's identity, so Subject names the role that may publish on
	// the command's subject (client, janitor), not a person.
	ActorNATS = "nats"
	// ActorNone: an HTTP caller of an api that runs without authentication
	// (an insecure dev stack, for experiments); Subject is "anonymous".
	ActorNone = "none"
)

// MaxActorSubject bounds an actor's subject.
const MaxActorSubject = 256

// Actor is who asked for a command, as authenticated: by the api (an api
// key, an OIDC token) or, for a command published on NATS, by the role
// NATS lets publish on its subject. Operator events record it; the
// free-text requested_by beside it is only a remark. The dispatcher
// accepts an actor only from the api's command subjects
// (jf.commands.api.<kind>, which only the api identity may publish on).
type Actor struct {
	// Subject is who: an api key's name, an OIDC token's sub, or a NATS role.
	Subject string `json:"subject"`
	// Method is how it authenticated: api-key, oidc, nats or none.
	Method string `json:"method"`
	// KeyID is the api key's id, for Method api-key.
	KeyID string `json:"key_id,omitempty"`
}

// Check reports what is wrong with a (nil: nothing).
func (a *Actor) Check() error {
	switch a.Method {
	case ActorAPIKey, ActorOIDC, ActorNATS, ActorNone:
	default:
		return fmt.Errorf("actor: method %q is not api-key, oidc, nats or none", a.Method)
	}
	if a.Subject == "" || len(a.Subject) > MaxActorSubject || strings.ContainsAny(a.Subject, "\n\r") {
		return fmt.Errorf("actor: subject must be 1 to %d bytes on one line", MaxActorSubject)
	}
	if len(a.KeyID) > 64 {
		return fmt.Errorf("actor: key_id is longer than 64 bytes")
	}
	return nil
}

// String is how people read an actor: "alice (api-key k1)", "client (nats)".
func (a *Actor) String() string {
	if a == nil {
		return ""
	}
	if a.KeyID != "" {
		return a.Subject + " (" + a.Method + " " + a.KeyID + ")"
	}
	return a.Subject + " (" + a.Method + ")"
}

// CommandActor returns the actor a command carries (nil if it carries
// none, or is no command that can carry one).
func CommandActor(p Payload) *Actor {
	switch c := p.(type) {
	case *StartExecution:
		return c.Actor
	case *SignalExecution:
		return c.Actor
	case *ExecutionAction:
		return c.Actor
	case *ClearLock:
		return c.Actor
	}
	return nil
}

// SetCommandActor sets the actor of a command that can carry one; it
// reports false for any other payload.
func SetCommandActor(p Payload, a *Actor) bool {
	switch c := p.(type) {
	case *StartExecution:
		c.Actor = a
	case *SignalExecution:
		c.Actor = a
	case *ExecutionAction:
		c.Actor = a
	case *ClearLock:
		c.Actor = a
	default:
		return false
	}
	return true
}
