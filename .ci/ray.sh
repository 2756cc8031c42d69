#!/usr/bin/env bash
# A throwaway local Ray cluster for the tests and benchmarks: one head node whose state,
# logs, sockets and authentication token live in one folder, every port on loopback.
#
#   .ci/ray.sh start [DIR]   start a head node in DIR (default: a new temporary folder);
#                            prints, for eval, "export NOUS_ACTOR_TEST_RAY_ADDRESS=..."
#                            (and _DIR) plus the Ray settings every driver needs (below)
#   .ci/ray.sh stop DIR      stop that cluster's processes, and only those; remove DIR
#   .ci/ray.sh add-node DIR ADDRESS [RESOURCES]
#                            start another node (on this machine, loopback only) of the
#                            cluster at ADDRESS, its state and logs in DIR; RESOURCES:
#                            custom resources as JSON, e.g. '{"node_b": 1}'; no CPUs
#                            unless NOUS_ACTOR_TEST_RAY_NODE_CPUS says. Needs the
#                            cluster's settings in the environment (what "start"
#                            printed). Prints "export NOUS_ACTOR_TEST_RAY_NODE_ID=..."
#                            (and _DIR). "stop DIR" stops that node alone.
#   .ci/ray.sh kill DIR      SIGKILL every process of DIR's node(s) at once, and wait
#                            until they are gone (a node that dies); DIR is kept
#
# The Ray CLI is $RAY, or else the project's virtualenv (.venv/bin/ray), or else `ray` on
# PATH. Every wait is bounded.
#
# What every process that talks to the cluster (the drivers, i.e. the tests) must have
# in its environment, hence exported by "start":
#
#   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  the single-machine mode. On Linux, Ray rewrites
#       127.0.0.1 (in --node-ip-address and in a driver's address alike) to the machine's
#       outward IP and binds its gRPC servers to every interface; in this mode the node IP
#       stays 127.0.0.1 and the GCS, the raylet and every worker listen on 127.0.0.1 only.
#       A driver without it turns "127.0.0.1:PORT" into "<machine IP>:PORT", where nothing
#       listens, and hangs. Ray reads it when it is imported.
#   RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH=DIR/auth_token  token authentication on, with
#       a token of this cluster's own (not ~/.ray/auth_token, which is neither touched nor
#       read). Left unset, "ray start" turns authentication on only if ~/.ray/auth_token
#       happens to exist, and a driver given an explicit address never does: it would be
#       refused. Explicit on both sides, it works the same on every machine.
#   RAY_USAGE_STATS_ENABLED=0  no usage reporting.
#
# DIR must be short: Ray puts Unix sockets under DIR/session_*/sockets/ (108-byte limit).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OBJECT_STORE_BYTES="${NOUS_ACTOR_TEST_RAY_OBJECT_STORE:-200000000}"
NUM_CPUS="${NOUS_ACTOR_TEST_RAY_CPUS:-2}"

ray_cli() {
    if [ -n "${RAY:-}" ]; then
        echo "$RAY"
    elif [ -x "$ROOT/.venv/bin/ray" ]; then
        echo "$ROOT/.venv/bin/ray"
    elif command -v ray >/dev/null 2>&1; then
        command -v ray
    else
        echo "ray.sh: no Ray CLI; run make .venv/.installed (or set RAY)" >&2
        return 1
    fi
}

settings() {  # the environment of the cluster and of its drivers (see above)
    local dir="$1"
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    export RAY_AUTH_MODE=token
    export RAY_AUTH_TOKEN_PATH="$dir/auth_token"
    export RAY_USAGE_STATS_ENABLED=0
}

start() {
    local dir="${1:-}" ray address="" deadline
    ray="$(ray_cli)"
    if [ -z "$dir" ]; then
        dir="$(mktemp -d /tmp/nray.XXXXXX)"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    check_dir "$dir" || return 1
    chmod 700 "$dir"
    settings "$dir"
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$dir/auth_token")
    # --port=0: the GCS picks a free port, written to DIR/ray_current_cluster.
    if ! timeout 120 "$ray" start --head --node-ip-address=127.0.0.1 --port=0 \
        --temp-dir="$dir" --disable-usage-stats --include-dashboard=false \
        --object-store-memory="$OBJECT_STORE_BYTES" --num-cpus="$NUM_CPUS" \
        --log-style=record >"$dir/start.log" 2>&1; then
        cat "$dir/start.log" >&2
        stop "$dir" >&2 || true
        return 1
    fi
    deadline=$((SECONDS + 60))  # the address, then a cluster that answers
    while :; do
        if [ -z "$address" ] && [ -s "$dir/ray_current_cluster" ]; then
            address="$(head -n 1 "$dir/ray_current_cluster")"
        fi
        if [ -n "$address" ] &&
            timeout 20 "$ray" status --address="$address" >"$dir/status.log" 2>&1; then
            break
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "ray.sh: the cluster in $dir does not answer (address '${address}')" >&2
            cat "$dir/start.log" "$dir/status.log" >&2 2>/dev/null || true
            stop "$dir" >&2 || true
            return 1
        fi
        sleep 0.1
    done
    case "$address" in
        127.0.0.1:*) ;;
        *)
            echo "ray.sh: the cluster came up on $address, not on loopback" >&2
            stop "$dir" >&2 || true
            return 1 ;;
    esac
    echo "export NOUS_ACTOR_TEST_RAY_ADDRESS='$address'"
    echo "export NOUS_ACTOR_TEST_RAY_DIR='$dir'"
    echo "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
    echo "export RAY_AUTH_MODE=token"
    echo "export RAY_AUTH_TOKEN_PATH='$dir/auth_token'"
    echo "export RAY_USAGE_STATS_ENABLED=0"
}

members() {
    # The cluster's processes: those whose command line names DIR/session_* (the GCS,
    # the raylet, the monitors), those whose stdout or stderr goes to a log there (the
    # workers and agents, which rename themselves "ray::..." and may have lost their
    # parent), and all their descendants. Drivers (the tests) write their own logs there
    # too, but not their stdout or stderr: they are left alone.
    local pattern="$1/session_" pid target
    local -A seed=()
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
        [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
        if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$pattern"; then
            seed[$pid]=1
            continue
        fi
        for target in "/proc/$pid/fd/1" "/proc/$pid/fd/2"; do
            case "$(readlink "$target" 2>/dev/null || true)" in
                "$pattern"*) seed[$pid]=1 ;;
            esac
        done
    done
    [ "${#seed[@]}" -gt 0 ] || return 0
    # Descendants: the closure over parent pids, in one snapshot.
    ps -eo pid=,ppid= | SEED="${!seed[*]}" awk '
        BEGIN { n = split(ENVIRON["SEED"], s, " "); for (i = 1; i <= n; i++) keep[s[i]] = 1 }
        { parent[$1] = $2 }
        END {
            do {
                grew = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
            } while (grew)
            for (p in keep) print p
        }'
}

alive() {  # those of the given pids still running (zombies count as gone)
    local pid state
    for pid in "$@"; do
        state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)"
        if [ -n "$state" ] && [ "$state" != Z ]; then
            echo "$pid"
        fi
    done
}

wait_gone() {  # wait_gone TENTHS PID...: wait until none runs, at most TENTHS/10 s
    local tenths="$1" i
    shift
    for i in $(seq "$tenths"); do
        [ -z "$(alive "$@")" ] && return 0
        sleep 0.1
    done
    [ -z "$(alive "$@")" ]
}

signal() {
    local sig="$1"
    shift
    [ "$#" -gt 0 ] && kill "-$sig" "$@" 2>/dev/null || true
}

stop() {
    # Not "ray stop": it ends every Ray process of the machine, other clusters' too.
    # The raylet goes first (its agents and workers fate-share with it), the GCS last,
    # as "ray stop" does; what outlives its grace period gets SIGKILL.
    local dir="${1:?usage: ray.sh stop DIR}" pids raylets others gcs left
    dir="$(cd "$dir" 2>/dev/null && pwd || echo "$dir")"
    mapfile -t pids < <(members "$dir")
    if [ "${#pids[@]}" -gt 0 ]; then
        raylets=() others=() gcs=()
        for pid in "${pids[@]}"; do
            case "$(cat "/proc/$pid/comm" 2>/dev/null || true)" in
                raylet) raylets+=("$pid") ;;
                gcs_server) gcs+=("$pid") ;;
                *) others+=("$pid") ;;
            esac
        done
        signal TERM "${raylets[@]}"
        wait_gone 30 "${raylets[@]}" || true
        signal TERM "${others[@]}"
        wait_gone 30 "${others[@]}" || true
        signal TERM "${gcs[@]}"
        wait_gone 30 "${gcs[@]}" || true
        mapfile -t left < <(alive "${pids[@]}")
        signal KILL "${left[@]}"
        if ! wait_gone 100 "${pids[@]}"; then
            echo "ray.sh: processes of $dir outlived SIGKILL: $(alive "${pids[@]}")" >&2
            return 1
        fi
    fi
    rm -rf "$dir"
}

check_dir() {  # check_dir DIR: a usable folder for Ray's state (see "start")
    case "$1" in
        *[!A-Za-z0-9/._-]*)
            echo "ray.sh: use a folder whose path has only letters, digits and /._-" >&2
            return 1 ;;
    esac
    if [ "${#1}" -gt 40 ]; then
        echo "ray.sh: $1 is too long for Ray's socket paths; use e.g. /tmp/nray.XXXXXX" >&2
        return 1
    fi
}

python_cli() {  # the interpreter of the Ray CLI (or $PYTHON)
    local ray line
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
        return
    fi
    ray="$(ray_cli)" || return 1
    line="$(head -n 1 "$ray")"
    case "$line" in
        "#!/usr/bin/env "*python*) echo "${line#\#!/usr/bin/env }" ;;
        "#!"*python*) echo "${line#\#!}" ;;
        *) echo python3 ;;
    esac
}

# A node joining a cluster on this machine. Not "ray start --address": the CLI refuses to
# add a node in the single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), and outside
# it rewrites 127.0.0.1 to the machine's outward IP. So this starts the node as "ray start"
# does inside (and as Ray's own cluster_utils does for several nodes on one machine): a
# ray._private.node.Node, its processes left running when this script exits.
# argv: DIR ADDRESS RESOURCES(JSON) CPUS OBJECT_STORE_BYTES; prints the node id.
NODE_LAUNCHER='
import json, sys
from ray._private.authentication.authentication_token_setup import (
    ensure_token_if_auth_enabled,
)
from ray._private.node import Node
from ray._private.parameter import RayParams

folder, address, resources, cpus, store = sys.argv[1:]
ensure_token_if_auth_enabled(None, create_token_if_missing=False)
params = RayParams(
    gcs_address=address,
    node_ip_address="127.0.0.1",
    node_name=folder,
    temp_dir=folder,
    num_cpus=int(cpus),
    resources=json.loads(resources),
    object_store_memory=int(store),
    # Every port picked free: the head and its workers run on this machine too.
    node_manager_port=0,
    object_manager_port=0,
    min_worker_port=0,
    max_worker_port=0,
    dashboard_agent_listen_port=0,
)
node = Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False, connect_only=False)
print(node.node_id, flush=True)
'

add_node() {
    local usage="usage: ray.sh add-node DIR ADDRESS [RESOURCES]"
    local dir="${1:?$usage}" address="${2:?$usage}" resources="${3:-}" python node_id
    python="$(python_cli)" || return 1
    case "$address" in
        127.0.0.1:*) ;;
        *) echo "ray.sh: add-node joins a cluster on loopback, not $address" >&2; return 1 ;;
    esac
    if [ "${RAY_AUTH_MODE:-}" = token ] && [ ! -s "${RAY_AUTH_TOKEN_PATH:-}" ]; then
        echo "ray.sh: RAY_AUTH_TOKEN_PATH names no token (export what 'start' printed)" >&2
        return 1
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    check_dir "$dir" || return 1
    chmod 700 "$dir"
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
    if ! node_id="$(timeout 120 "$python" -c "$NODE_LAUNCHER" "$dir" "$address" \
        "${resources:-"{}"}" "${NOUS_ACTOR_TEST_RAY_NODE_CPUS:-0}" \
        "${NOUS_ACTOR_TEST_RAY_NODE_OBJECT_STORE:-100000000}" 2>"$dir/start.log")"; then
        cat "$dir/start.log" >&2
        stop "$dir" >&2 || true
        return 1
    fi
    echo "export NOUS_ACTOR_TEST_RAY_NODE_ID='${node_id##*$'\n'}'"
    echo "export NOUS_ACTOR_TEST_RAY_NODE_DIR='$dir'"
}

kill_all() {
    local dir="${1:?usage: ray.sh kill DIR}" pids
    dir="$(cd "$dir" 2>/dev/null && pwd || echo "$dir")"
    mapfile -t pids < <(members "$dir")
    signal KILL "${pids[@]}"
    if ! wait_gone 100 "${pids[@]}"; then
        echo "ray.sh: processes of $dir outlived SIGKILL: $(alive "${pids[@]}")" >&2
        return 1
    fi
    echo "${#pids[@]}"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    add-node) shift; add_node "$@" ;;
    kill) shift; kill_all "$@" ;;
    *) echo "usage: $0 start [DIR] | stop DIR | add-node DIR ADDRESS [RESOURCES] | kill DIR" >&2
       exit 2 ;;
esac
