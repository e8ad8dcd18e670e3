#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for the visibility index's tests:
# a fresh cluster in a temporary directory, owned by the postgres user
# (the server refuses to run as root), listening on 127.0.0.1 only, on a
# free port, with trust authentication (nothing else can reach it).
#
#   tools/ci/postgres.sh start   prints  JETFLOW_TEST_POSTGRES=<url>  and
#                                         JETFLOW_POSTGRES_DIR=<dir>
#   tools/ci/postgres.sh stop <dir>       stops it and removes <dir>
#
# .ci/run evals start's output and stops the server when it exits.
set -euo pipefail

bindir() {
  if command -v pg_ctl >/dev/null; then dirname "$(command -v pg_ctl)"; return; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$d" ]; then echo "postgres.sh: PostgreSQL is not installed (make deps/postgres)" >&2; exit 1; fi
  echo "$d"
}

# as runs a command as the server's owner: postgres when we are root.
as() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
  bin=$(bindir)
  dir=$(mktemp -d "${TMPDIR:-/tmp}/jetflow-pg.XXXXXX")
  chmod 755 "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
  as "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  # A free port: a random one, another if the server cannot bind it.
  for try in 1 2 3 4 5 6 7 8; do
    port=$((20000 + RANDOM % 40000))
    if as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-k $dir -p $port -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
      start >/dev/null; then
      break
    fi
    if [ "$try" = 8 ]; then cat "$dir/server.log" >&2; exit 1; fi
  done
  echo "JETFLOW_TEST_POSTGRES=postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
  echo "JETFLOW_POSTGRES_DIR=$dir"
  ;;
stop)
  dir=${2:?usage: postgres.sh stop <dir>}
  bin=$(bindir)
  if [ -d "$dir/data" ]; then as "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true; fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start | stop <dir>" >&2
  exit 2
  ;;
esac
