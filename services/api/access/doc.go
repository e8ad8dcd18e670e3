// Package access authenticates the api's HTTP callers and decides what
// they may do. A caller presents a bearer token: an api key
// (jfk_<id>_<secret>, kept as a SHA-256 hash in the JF_API_KEYS bucket),
// a bootstrap admin token (listed in a file the api reads), or a JWT from
// an OIDC issuer. Each yields a [Principal]: who, how it authenticated,
// its scopes and its namespaces. [Decide] is the authorization decision,
// a pure function of the principal, the scope a route needs and the
// request's namespace.
package access
