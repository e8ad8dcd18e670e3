#!/usr/bin/env bash
# Makes what the secure local cluster needs, in deployments/cluster/secrets
# (or the directory given as $1):
#   tls/   a THROWAWAY certificate authority (valid 30 days, its key beside
#          it) and one certificate for the three nodes (127.0.0.1,
#          localhost, and the host names in $TLS_NAMES, comma-separated:
#          deployments/compose gives n1,n2,n3), for client and route
#          connections;
#   auth/  jetflow's NATS identities (jetflow auth init): the operator, the
#          accounts, every role's creds, and server.conf, which the node
#          configurations include.
# For trying TLS and permissions on one machine only: a real deployment
# gets its certificates from its own CA and keeps the operator's key safe.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/secrets}
jetflow=${JETFLOW:-$here/../../bin/jetflow}
days=30

if [ ! -x "$jetflow" ]; then
  echo "setup.sh: $jetflow not found: run make build first (or set JETFLOW)" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "setup.sh: openssl is needed" >&2; exit 2; }

sans="IP:127.0.0.1,DNS:localhost"
IFS=, read -ra names <<< "${TLS_NAMES:-}"
for n in "${names[@]}"; do
  [[ "$n" =~ ^[A-Za-z0-9.-]+$ ]] || { echo "setup.sh: TLS_NAMES: \"$n\" is not a host name" >&2; exit 2; }
  sans="$sans,DNS:$n"
done

mkdir -p "$out/tls"
chmod 700 "$out"
tls=$out/tls
if [ ! -f "$tls/ca.pem" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=jetflow throwaway CA" \
    -keyout "$tls/ca-key.pem" -out "$tls/ca.pem" 2>/dev/null
fi
if [ ! -f "$tls/server.pem" ]; then
  openssl req -newkey rsa:2048 -nodes -subj "/CN=jetflow nats" \
    -keyout "$tls/server-key.pem" -out "$tls/server.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$sans" > "$tls/server.ext"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca-key.pem" -CAcreateserial \
    -days "$days" -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
  rm -f "$tls/server.csr" "$tls/server.ext"
fi
chmod 600 "$tls"/*-key.pem

"$jetflow" auth init --dir "$out/auth"

echo "certificate authority: $tls/ca.pem (services: JETFLOW_NATS_CA)"
echo "identities:            $out/auth/default/<role>.creds (services: JETFLOW_NATS_CREDS)"
