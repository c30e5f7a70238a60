#!/usr/bin/env bash
# Runs a command beside a throwaway PostgreSQL cluster:
#   .ci/postgres.sh cargo nextest run -p agentmesh-controlplane
# initdb in a temporary directory (as the `postgres` user when run as root:
# PostgreSQL refuses to run as root), listening on 127.0.0.1 only on a free
# port, trust authentication for local connections only. Exports
# AGENTMESH_TEST_POSTGRES_URL (an admin URL; each test creates a database
# of its own) and AGENTMESH_REQUIRE_POSTGRES=1 for the command, and stops
# and deletes the cluster at exit, whatever the command did. Exits with the
# command's status.
set -euo pipefail

PG_BIN="${PG_BIN:-}"
if [ -z "$PG_BIN" ]; then
    for v in 17 16 15; do
        if [ -x "/usr/lib/postgresql/$v/bin/initdb" ]; then PG_BIN="/usr/lib/postgresql/$v/bin"; break; fi
    done
fi
if [ -z "$PG_BIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing PostgreSQL (Debian package postgresql) for the storage tests" >&2
    timeout 600 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    for v in 17 16 15; do
        if [ -x "/usr/lib/postgresql/$v/bin/initdb" ]; then PG_BIN="/usr/lib/postgresql/$v/bin"; break; fi
    done
fi
if [ -z "$PG_BIN" ]; then
    echo "error: no PostgreSQL binaries (initdb) found; install postgresql or set PG_BIN" >&2
    exit 1
fi

# Who runs the server: root may not, so root hands it to `postgres`.
as_pg() { "$@"; }
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        echo "error: running as root and there is no 'postgres' user to run the server" >&2
        exit 1
    fi
    as_pg() { runuser -u postgres -- "$@"; }
fi

dir=$(mktemp -d /tmp/agentmesh-pg.XXXXXX)
chmod 0700 "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
stop() {
    as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

# A free port: bind port 0 on loopback and read what the kernel chose.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

as_pg "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2; exit 1; }
# A test database per test: enough connections for nextest's parallel tests,
# each with a small pool; fsync off (throwaway data, faster tests).
as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -w -t 60 -l "$dir/server.log" \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c max_connections=400 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }

export AGENTMESH_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
# Under this script the PostgreSQL half of every test must run: a test that
# cannot reach the server fails instead of noting that it did not run.
export AGENTMESH_REQUIRE_POSTGRES=1
echo "==> PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (AGENTMESH_TEST_POSTGRES_URL)" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
