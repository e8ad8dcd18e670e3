#!/usr/bin/env bash
# Creates (or replaces) the Secrets that jetflow's manifests and the NATS
# chart's values name, in namespace $1, with kubectl's current context:
#   nats-tls               ca.crt, tls.crt, tls.key: the NATS nodes' certificate
#                          (client and route connections) and its authority
#   jetflow-nats-ca        ca.crt: the authority alone, for the services
#   jetflow-nats-auth      server.conf: the operator and accounts the nodes trust
#   jetflow-creds-<role>   nats.creds: one NATS identity per role (admin for
#                          the bootstrap Job; api, dispatcher, agent, janitor)
#   jetflow-admin-token    admin.token: the api's bootstrap admin token
# The identities are made by jetflow auth init in AUTH_DIR (default
# ./jetflow-auth): keep that directory, and the operator's key in it
# (operator.nk), on an admin machine; it is never sent to the cluster.
# The certificate: give your own with TLS_CERT, TLS_KEY and TLS_CA (files),
# or get a THROWAWAY authority (30 days) made here, in AUTH_DIR/tls.
# Nothing is written to the repository. Needs kubectl, openssl and the
# jetflow CLI (make build; JETFLOW=path to use another).
set -euo pipefail
ns=${1:?usage: secrets.sh NAMESPACE   (env: AUTH_DIR, TLS_CERT, TLS_KEY, TLS_CA, JETFLOW)}
here=$(cd "$(dirname "$0")" && pwd)
auth=${AUTH_DIR:-./jetflow-auth}
jetflow=${JETFLOW:-$here/../../bin/jetflow}
release=nats   # the NATS chart's release name (nats-values.yaml)

[ -x "$jetflow" ] || { echo "secrets.sh: $jetflow not found: run make build first (or set JETFLOW)" >&2; exit 2; }
command -v kubectl >/dev/null || { echo "secrets.sh: kubectl is needed" >&2; exit 2; }
command -v openssl >/dev/null || { echo "secrets.sh: openssl is needed" >&2; exit 2; }
[[ "$ns" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || { echo "secrets.sh: \"$ns\" is not a namespace name" >&2; exit 2; }

"$jetflow" auth init --dir "$auth"

if [ -n "${TLS_CERT:-}" ]; then
  cert=$TLS_CERT key=${TLS_KEY:?TLS_KEY goes with TLS_CERT} ca=${TLS_CA:?TLS_CA goes with TLS_CERT}
else
  tls=$auth/tls
  mkdir -p "$tls"
  cert=$tls/server.pem key=$tls/server-key.pem ca=$tls/ca.pem
  if [ ! -f "$ca" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=jetflow throwaway CA" \
      -keyout "$tls/ca-key.pem" -out "$ca" 2>/dev/null
  fi
  if [ ! -f "$cert" ]; then
    # the names clients and routes use: the pods through the headless
    # Service (routes, JETFLOW_NATS_URL) and the chart's client Service
    h=$release-headless
    sans="DNS:$release,DNS:$release.$ns,DNS:$release.$ns.svc,DNS:$release.$ns.svc.cluster.local"
    sans="$sans,DNS:*.$h,DNS:*.$h.$ns,DNS:*.$h.$ns.svc,DNS:*.$h.$ns.svc.cluster.local"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=jetflow nats" -keyout "$key" -out "$tls/server.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" > "$tls/server.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$ca" -CAkey "$tls/ca-key.pem" -CAcreateserial \
      -days 30 -extfile "$tls/server.ext" -out "$cert" 2>/dev/null
    rm -f "$tls/server.csr" "$tls/server.ext"
  fi
  chmod 600 "$tls"/*-key.pem
fi

if [ ! -f "$auth/admin.token" ]; then
  (umask 077; echo "jfa_$(openssl rand -hex 32)" > "$auth/admin.token")
fi

# apply NAME ARGS...: create the Secret, or replace what it holds.
apply() {
  local name=$1; shift
  kubectl create secret generic "$name" --namespace "$ns" "$@" --dry-run=client -o yaml | kubectl apply -f -
}
apply nats-tls --from-file=ca.crt="$ca" --from-file=tls.crt="$cert" --from-file=tls.key="$key"
apply jetflow-nats-ca --from-file=ca.crt="$ca"
apply jetflow-nats-auth --from-file=server.conf="$auth/server.conf"
for role in admin api dispatcher agent janitor; do
  apply "jetflow-creds-$role" --from-file=nats.creds="$auth/default/$role.creds"
done
apply jetflow-admin-token --from-file=admin.token="$auth/admin.token"

echo "secrets.sh: Secrets applied in namespace $ns; the admin token is in $auth/admin.token"
