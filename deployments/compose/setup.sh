#!/usr/bin/env bash
# Makes what compose.yaml mounts, in deployments/compose/secrets (or the
# directory given as $1), with deployments/cluster/setup.sh:
#   tls/          a THROWAWAY certificate authority and one certificate for
#                 the nodes n1, n2, n3 (and 127.0.0.1, localhost);
#   auth/         jetflow's NATS identities: the operator, the accounts,
#                 every role's creds, server.conf (the nodes include it);
#   admin.token   the api's bootstrap admin token (docs/security.md#http);
# and .env beside compose.yaml: the user id the services run as, so that
# they can read the files above (kept 0600).
# For trying jetflow on one machine: a real deployment gets its
# certificates from its own CA and keeps the operator's key elsewhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/secrets}

TLS_NAMES=n1,n2,n3 "$here/../cluster/setup.sh" "$out"

if [ ! -f "$out/admin.token" ]; then
  (umask 077; echo "jfa_$(openssl rand -hex 32)" > "$out/admin.token")
fi
# The nodes run as root in their containers; the jetflow services as the
# user who ran this script, who owns these files.
printf 'JETFLOW_UID=%s\nJETFLOW_GID=%s\n' "$(id -u)" "$(id -g)" > "$here/.env"

echo "admin token:           $out/admin.token (JETFLOW_TOKEN=\$(cat $out/admin.token))"
echo "compose settings:      $here/.env"
