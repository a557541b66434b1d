#!/usr/bin/env bash
# Run a throwaway PostgreSQL server on a local port, for capgate's decision-log tests and benches.
#
#   bash scripts/postgres-server.sh start   # initdb a fresh data folder, start, wait, create the db
#   bash scripts/postgres-server.sh stop    # stop the server started by `start`, delete its data
#
# `start` prints the connection URL (postgresql://capgate@127.0.0.1:PORT/capgate) on stdout and
# writes it and the data folder into $CAPGATE_PG_STATE_DIR (default ./.postgres-server): url,
# data/, server.log. The server listens on 127.0.0.1 only, with trust authentication (it is a
# test server: nothing but local processes can reach it, and its data is deleted on stop).
#
# It uses Debian's `postgresql` package (initdb, pg_ctl; found under /usr/lib/postgresql/*/bin,
# or set CAPGATE_PG_BIN). PostgreSQL refuses to run as root, so as root the server runs as the
# `postgres` user (created by the package), else as `nobody`; the state folder is handed to it.
# Settings: CAPGATE_PG_START_TIMEOUT (seconds to wait for the server, default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${CAPGATE_PG_STATE_DIR:-$ROOT/.postgres-server}
START_TIMEOUT=${CAPGATE_PG_START_TIMEOUT:-60}

log() { echo "postgres-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

find_bin() {
    if [ -n "${CAPGATE_PG_BIN:-}" ]; then
        echo "$CAPGATE_PG_BIN"
        return
    fi
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return
        fi
    done
    command -v initdb >/dev/null 2>&1 && dirname "$(command -v initdb)" && return
    die "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql package or set CAPGATE_PG_BIN"
}

# Run a command as the server's user (root may not run PostgreSQL).
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        setpriv --reuid="$OWNER" --regid="$(id -g "$OWNER")" --init-groups -- "$@"
    else
        "$@"
    fi
}

pick_owner() {
    if [ "$(id -u)" -ne 0 ]; then
        OWNER=$(id -un)
    elif id postgres >/dev/null 2>&1; then
        OWNER=postgres
    else
        OWNER=nobody
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

stop() {
    pick_owner
    if [ -f "$STATE/data/postmaster.pid" ]; then
        local bin
        bin=$(find_bin)
        log "stopping server (data $STATE/data)"
        as_owner "$bin/pg_ctl" -D "$STATE/data" -m fast -w -t 30 stop >/dev/null 2>&1 || {
            local pid
            pid=$(head -n 1 "$STATE/data/postmaster.pid" 2>/dev/null || true)
            [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
        }
    fi
    rm -rf "$STATE/data" "$STATE/url" "$STATE/socket"
}

start() {
    local bin
    bin=$(find_bin)
    mkdir -p "$STATE"
    stop
    pick_owner
    mkdir -p "$STATE/data" "$STATE/socket"
    if [ "$(id -u)" -eq 0 ]; then
        chown "$OWNER" "$STATE" "$STATE/data" "$STATE/socket"
        # The server's user must be able to reach the state folder through its parents.
        local up=$STATE
        while [ "$up" != "/" ]; do
            up=$(dirname "$up")
            as_owner test -x "$up" || die "$OWNER cannot enter $up; set CAPGATE_PG_STATE_DIR to a folder it can reach"
        done
    fi
    chmod 700 "$STATE/data"
    local t0=$SECONDS
    as_owner "$bin/initdb" -D "$STATE/data" -U capgate --auth=trust --encoding=UTF8 --no-locale \
        --no-sync >"$STATE/initdb.log" 2>&1 || { cat "$STATE/initdb.log" >&2; die "initdb failed"; }
    local port
    port=$(free_port)
    log "starting on 127.0.0.1:$port as $OWNER (log $STATE/server.log)"
    # Durability stays on (fsync, synchronous_commit): the tests kill writers and expect committed
    # rows to survive, as in production.
    as_owner "$bin/pg_ctl" -D "$STATE/data" -l "$STATE/server.log" -w -t "$START_TIMEOUT" \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$STATE/socket -c max_connections=200" \
        start >/dev/null || { tail -n 40 "$STATE/server.log" >&2 || true; die "the server did not start"; }
    as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U capgate capgate ||
        { stop; die "could not create the capgate database"; }
    local url="postgresql://capgate@127.0.0.1:$port/capgate"
    echo "$url" >"$STATE/url"
    log "ready after $((SECONDS - t0)) s: $url"
    echo "$url"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start | stop" ;;
esac
