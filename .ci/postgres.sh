#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests and benchmarks: a cluster of its own in
# one folder, reachable only through a Unix socket in that folder (no TCP port).
#
#   .ci/postgres.sh start [DIR]   make a cluster in DIR (default: a new temporary folder),
#                                 start it, create the database; prints
#                                 "export NOUS_ACTOR_TEST_PG_DSN=..." for eval
#   .ci/postgres.sh restart DIR   stop the server (fast: sessions are cut) and start it again
#   .ci/postgres.sh down DIR      stop the server, keeping its data (an outage)
#   .ci/postgres.sh up DIR        start a server stopped by "down"
#   .ci/postgres.sh stop DIR      stop the server and remove DIR
#
# The server binaries are found under /usr/lib/postgresql/*/bin (Debian's layout; the
# newest version wins) or on PATH. Run as root, the server runs as the "postgres" user
# (initdb refuses root); otherwise as the caller. Every wait is bounded.
set -euo pipefail

DB="${NOUS_ACTOR_TEST_PG_DB:-nous_actor_test}"

bindir() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$found" ] && [ -x "$found/initdb" ]; then
        echo "$found"
    elif command -v initdb >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    else
        echo "postgres.sh: no PostgreSQL server binaries (initdb); install them, e.g." \
            "apt-get install -y postgresql" >&2
        return 1
    fi
}

as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

start() {
    local dir="${1:-}" bin user
    bin="$(bindir)"
    if [ -z "$dir" ]; then
        dir="$(mktemp -d "${TMPDIR:-/tmp}/nous-pg.XXXXXX")"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    case "$dir" in
        *[!A-Za-z0-9/._-]*)
            echo "postgres.sh: use a folder whose path has only letters, digits and /._-" >&2
            return 1 ;;
    esac
    if [ "$(id -u)" = 0 ]; then
        chown postgres "$dir"
        user=postgres
    else
        user="$(id -un)"
    fi
    chmod 700 "$dir"
    as_server_user "$bin/initdb" -D "$dir/data" -U "$user" --auth=trust -E UTF8 \
        --locale=C --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        return 1
    }
    # In the configuration file, so that every later start (restart, up) uses them.
    as_server_user sh -c "cat >> '$dir/data/postgresql.conf'" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
max_connections = 300
CONF
    as_server_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        start >/dev/null || {
        cat "$dir/server.log" >&2
        return 1
    }
    as_server_user "$bin/createdb" -h "$dir" -U "$user" "$DB"
    echo "export NOUS_ACTOR_TEST_PG_DSN='postgresql:///$DB?host=$dir&user=$user'"
    echo "export NOUS_ACTOR_TEST_PG_DIR='$dir'"
}

restart() {
    local dir="${1:?usage: postgres.sh restart DIR}" bin
    bin="$(bindir)"
    as_server_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 \
        restart >/dev/null
}

down() {
    local dir="${1:?usage: postgres.sh down DIR}" bin
    bin="$(bindir)"
    as_server_user "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
}

up() {
    local dir="${1:?usage: postgres.sh up DIR}" bin
    bin="$(bindir)"
    as_server_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
}

stop() {
    local dir="${1:?usage: postgres.sh stop DIR}" bin
    bin="$(bindir)"
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_server_user "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null || true
    fi
    rm -rf "$dir"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    restart) shift; restart "$@" ;;
    down) shift; down "$@" ;;
    up) shift; up "$@" ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start [DIR] | restart DIR | down DIR | up DIR | stop DIR" >&2; exit 2 ;;
esac
