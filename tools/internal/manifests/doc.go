// Package manifests checks jetflow's deployment files offline, for make
// lint: the Kubernetes manifests of deployments/k8s decoded strictly into
// the typed k8s.io/api objects (an unknown field is an error) and the
// compose file of deployments/compose loaded by compose-go (which
// validates it against the compose schema it embeds), then the
// cross-references neither checks: probes on ports the containers have,
// a disruption budget per Deployment, Secrets that secrets.sh creates,
// every service with resources, probes and its own NATS identity, the
// NATS URL listing every node, ports published on loopback only, and the
// compose balancer (a pinned caddy image whose committed Caddyfile
// balances over every api and checks their /readyz) as the apis' only
// published address.
package manifests
