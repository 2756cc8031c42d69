"""Sessions on Ray, hardened: whose shards a driver stops, what an error promises, what a
wrong address does, and which constructor arguments are refused.

On the real local cluster of tests/ray_cluster.py; drivers and clients that must not be
connected to Ray yet run as real processes.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from bounds import wait_until

if TYPE_CHECKING:
    from postgres_server import Server
    from ray_cluster import RayCluster, RayScope

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

from nous_actor import (  # noqa: E402
    ClusterError,
    MemoryStore,
    SessionCrashed,
    SessionStopped,
)
from nous_actor.cluster.ray import RaySessions  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_failure(call: Callable[[], Any], timeout: float) -> Exception:
    """What ``call`` raises once it fails (it is repeated until then, for at most
    ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call()
        except Exception as exc:
            return exc
    raise AssertionError(f"the call kept succeeding for {timeout} s")


# -- close() stops only the shards it created -----------------------------------------------

SECOND_DRIVER = """
import functools, json, os
from nous_actor.store.postgres import PostgresStore
from nous_actor.cluster.ray import RaySessions

config = json.loads(os.environ["HARDENING_CONFIG"])
sessions = RaySessions(
    functools.partial(PostgresStore, config["dsn"], schema=config["schema"]),
    shards=2, name=config["name"], namespace=config["namespace"], timeout=30,
)
print(json.dumps([info["pid"] for info in sessions.shard_info()]), flush=True)
sessions.open(config["sid"]).append("user_message", {"content": "second"}).get()
sessions.close()
"""


@pytest.mark.parametrize("detached", [True, False], ids=["detached", "not-detached"])
def test_a_driver_that_reached_running_shards_by_name_leaves_them_serving_on_close(
    ray_scope: RayScope, pg_server: Server, schema: str, detached: bool
) -> None:
    """A second driver reaches the first driver's named shards, uses them and closes:
    the shards keep serving the first driver, which alone stops them on its close."""
    name = ray_scope.name("shards")
    factory = partial(PostgresStore, pg_server.dsn, schema=schema)
    first = RaySessions(
        factory, shards=2, name=name, namespace=ray_scope.namespace, detached=detached, timeout=30
    )
    try:
        chat = first.open("chat")
        chat.append("user_message", {"content": "first"}).get()
        pids = [info["pid"] for info in first.shard_info()]
        config = {
            "dsn": pg_server.dsn,
            "schema": schema,
            "name": name,
            "namespace": ray_scope.namespace,
            "sid": "chat",
        }
        done = ray_scope.run_driver(
            SECOND_DRIVER, timeout=120, env={"HARDENING_CONFIG": json.dumps(config)}
        )
        assert json.loads(done.stdout.splitlines()[0]) == pids  # reached, not started anew
        assert chat.append("user_message", {"content": "after"}).get(timeout=30).seq == 2
        assert [m.content for m in chat.derive_messages().get()] == ["first", "second", "after"]
        assert [info["pid"] for info in first.shard_info()] == pids
        first.close()
        if detached:
            assert sorted(ray_scope.named_actors()) == [f"{name}.0", f"{name}.1"]
        else:  # its creator's close stops them
            wait_until(lambda: not ray_scope.named_actors(), 30, "the shards stopped")
    finally:
        first.shutdown()


def test_a_failed_start_stops_only_the_shards_it_created(ray_scope: RayScope) -> None:
    """Of two named shards, one runs and one was stopped for good; a second RaySessions
    reaches the first and creates the other, which cannot start (no node has the
    resource it asks for). Its ClusterError stops the shard it created, not the other."""
    name = ray_scope.name("shards")
    first = RaySessions(MemoryStore, shards=2, name=name, namespace=ray_scope.namespace)
    try:
        chat = first.open(next(f"s-{n}" for n in range(100) if first.shard_of(f"s-{n}") == 0))
        chat.append("user_message", {"content": "one"}).get()
        ray.kill(first.shard_actor(1), no_restart=True)
        wait_until(lambda: ray_scope.named_actors() == [f"{name}.0"], 30, "shard 1 gone")
        with pytest.raises(ClusterError, match="1 of 2 shards did not start within 2 s"):
            RaySessions(
                MemoryStore,
                shards=2,
                name=name,
                namespace=ray_scope.namespace,
                start_timeout=2,
                actor_options={"resources": {"no-node-has-this": 1}},
            )
        assert chat.append("user_message", {"content": "two"}).get(timeout=30).seq == 1
        wait_until(lambda: ray_scope.named_actors() == [f"{name}.0"], 30, "the new shard 1 gone")
    finally:
        first.shutdown()


# -- what an error says about a restart ------------------------------------------------------


def test_a_shard_stopped_for_good_fails_calls_without_promising_a_restart(
    ray_cluster: RayCluster,
) -> None:
    """A shard killed with no_restart: its calls fail with SessionCrashed saying that Ray
    will not restart it and what to do, and so do later calls."""
    sessions = RaySessions(MemoryStore, shards=1, timeout=30)
    try:
        chat = sessions.open("doomed")
        chat.append("user_message", {"content": "one"}).get()
        ray.kill(sessions.shard_actor(0), no_restart=True)
        error = _first_failure(lambda: chat.count().get(timeout=30), 30)
        assert isinstance(error, SessionCrashed), repr(error)
        message = str(error)
        assert "Ray will not restart it" in message, message
        assert "killed by `ray.kill`" in message, message
        assert "make a new RaySessions" in message, message
        assert "later calls reach" not in message, message
        assert "restarting" not in message, message
        with pytest.raises(SessionCrashed, match="Ray will not restart it"):
            chat.append("user_message", {"content": "two"}).get(timeout=30)
        with pytest.raises(SessionStopped, match="Ray will not restart it"):
            sessions.shard_info()
    finally:
        sessions.shutdown()


def test_a_shard_whose_worker_dies_is_restarted_as_its_errors_promise(
    ray_cluster: RayCluster,
) -> None:
    """The shard's worker is SIGKILLed: every failed call says that Ray is restarting the
    shard, and a later call through the same handle reaches the restarted shard."""
    sessions = RaySessions(MemoryStore, shards=1, timeout=30)
    try:
        chat = sessions.open("phoenix")
        chat.append("user_message", {"content": "one"}).get()
        old_pid = sessions.shard_info()[0]["pid"]
        os.kill(old_pid, signal.SIGKILL)
        failures: list[Exception] = []
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"no call answered within 60 s: {failures}"
            try:
                chat.count().get(timeout=30)
            except SessionStopped as exc:
                failures.append(exc)
                continue
            if sessions.shard_info()[0]["pid"] != old_pid:
                break
        for exc in failures:
            assert isinstance(exc, SessionCrashed), repr(exc)
            assert "Ray is restarting the shard" in str(exc), str(exc)
            assert "will not restart" not in str(exc), str(exc)
    finally:
        sessions.shutdown()


# -- an address where no Ray cluster listens -------------------------------------------------

CONNECT = """
import sys, time
from nous_actor import ClusterError, MemoryStore
from nous_actor.cluster.ray import RaySessions

started = time.monotonic()
try:
    sessions = RaySessions(MemoryStore, shards=1, address=sys.argv[1], start_timeout=3)
except ClusterError as exc:
    print(f"ClusterError after {time.monotonic() - started:.2f} s: {exc}", flush=True)
else:
    sessions.open("probe").append("user_message", {"content": "hi"}).get()
    print(f"connected after {time.monotonic() - started:.2f} s", flush=True)
    sessions.close()
"""


def _connect_from_a_new_process(address: str, env: dict[str, str] | None = None) -> str:
    """What a process not connected to Ray yet prints after RaySessions(address=...), with
    start_timeout=3; it must be done within 60 s (else it hangs)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", CONNECT, address],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"RaySessions(address={address!r}) hung for 60 s") from None
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


class _Silent:
    """A TCP listener on loopback that accepts every connection and never says a word."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self.server.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        for conn in self.conns:
            conn.close()


class _Http:
    """A tiny HTTP/1 server on loopback (as a dashboard's port would be)."""

    def __init__(self) -> None:
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler
        )
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class _Grpc:
    """A gRPC server on loopback (HTTP/2, cleartext) that serves none of Ray's services:
    it answers the connection preface with its SETTINGS, as Ray's GCS does, then every
    call with UNIMPLEMENTED; or, ``mute``, never answers a call at all."""

    mute = False

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read(conn: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("the client closed the connection")
            data += chunk
        return data

    @staticmethod
    def _frame(conn: socket.socket, kind: int, flags: int, stream: int, payload: bytes) -> None:
        head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
        conn.sendall(head + payload)

    def _serve(self, conn: socket.socket) -> None:
        def header(name: bytes, value: bytes) -> bytes:  # HPACK: a literal, not indexed
            return bytes([0, len(name)]) + name + bytes([len(value)]) + value

        unimplemented = (
            b"\x88"  # :status 200 (HPACK static table)
            + header(b"content-type", b"application/grpc")
            + header(b"grpc-status", b"12")
            + header(b"grpc-message", b"unknown service")
        )
        try:
            self._read(conn, 24)  # the client's connection preface
            self._frame(conn, 4, 0, 0, b"")  # SETTINGS
            while True:
                head = self._read(conn, 9)
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._read(conn, int.from_bytes(head[:3], "big"))
                if kind == 4 and not flags & 1:  # SETTINGS: acknowledged
                    self._frame(conn, 4, 1, 0, b"")
                elif kind == 6 and not flags & 1:  # PING: answered
                    self._frame(conn, 6, 1, 0, payload)
                elif kind == 1 and not self.mute:  # a call: trailers only, END_STREAM
                    self._frame(conn, 1, 0x5, stream, unimplemented)
        except OSError:
            return

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(10)
        assert not self.thread.is_alive()
        for conn in self.conns:
            conn.close()


class _MuteGrpc(_Grpc):
    """A gRPC server that takes every call and never answers it."""

    mute = True


@pytest.mark.parametrize(
    ("listener", "says"),
    [
        (_Silent, "accepts connections but did not answer within 3 s"),
        (_Http, "like an HTTP/1 server"),
        (_Grpc, "speaks gRPC but is not a Ray cluster: it does not serve Ray's GCS"),
        (_MuteGrpc, "speaks gRPC but did not answer Ray's first request within 3 s"),
    ],
    ids=["silent", "http", "grpc", "mute-grpc"],
)
def test_an_address_where_something_else_listens_is_a_cluster_error_within_start_timeout(
    listener: type[_Silent | _Http | _Grpc], says: str
) -> None:
    """A listener that never answers, or an HTTP server: a ClusterError naming the address,
    what answered and what to pass, within start_timeout, never a hang."""
    server = listener()
    try:
        out = _connect_from_a_new_process(server.address)
    finally:
        server.close()
    found = re.match(r"ClusterError after ([0-9.]+) s: (.*)", out, re.S)
    assert found, out
    assert float(found.group(1)) < 6.0, out  # start_timeout (3 s), and Ray's import
    assert server.address in found.group(2), out
    assert says in found.group(2), out
    assert "`ray start --head` printed" in found.group(2), out


def test_a_cluster_that_refuses_this_process_is_a_cluster_error_within_start_timeout(
    ray_cluster: RayCluster, tmp_path: Any
) -> None:
    """Token authentication on, and another token: a ClusterError within start_timeout
    naming the address and the settings that give the token (Ray itself retries for 20 s,
    then says only that it could not connect)."""
    if os.environ.get("RAY_AUTH_MODE") != "token":
        pytest.skip("the cluster was not started by .ci/ray.sh: no token authentication")
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    env = {**ray_cluster.driver_env(), "RAY_AUTH_TOKEN_PATH": str(wrong)}
    out = _connect_from_a_new_process(ray_cluster.address, env=env)
    found = re.match(r"ClusterError after ([0-9.]+) s: (.*)", out, re.S)
    assert found, out
    assert float(found.group(1)) < 6.0, out
    assert f"the Ray cluster at {ray_cluster.address!r} refused this process" in out, out
    assert "RAY_AUTH_TOKEN_PATH" in out, out


def test_the_address_of_a_running_cluster_still_connects(ray_cluster: RayCluster) -> None:
    """The probe of an address lets a real Ray cluster's GCS through."""
    out = _connect_from_a_new_process(ray_cluster.address, env=ray_cluster.driver_env())
    assert out.startswith("connected after"), out


# -- constructor arguments --------------------------------------------------------------------

BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"store_factory": "postgresql://db/agents"}, TypeError, "store_factory must be a callable"),
    ({"shards": 0}, ValueError, "shards must be an int >= 1, got 0"),
    ({"shards": "4"}, ValueError, "shards must be an int >= 1, got '4'"),
    ({"name": 7}, TypeError, "name must be a str or None, got int"),
    ({"name": " "}, ValueError, "name must be a non-empty str"),
    ({"namespace": b"ns"}, TypeError, "namespace must be a str or None, got bytes"),
    ({"namespace": ""}, ValueError, "namespace must be a non-empty str"),
    ({"name": "x", "detached": "yes"}, TypeError, "detached must be True or False"),
    ({"detached": True}, ValueError, "detached shards need a name="),
    ({"address": 6379}, TypeError, "address must be a str .* or None, got int"),
    ({"address": "head-node"}, ClusterError, "cannot read the Ray address 'head-node'"),
    ({"timeout": -1}, ValueError, "timeout must be a finite number of seconds > 0"),
    ({"start_timeout": 0}, ValueError, "start_timeout must be a finite number of seconds > 0"),
    ({"start_timeout": "60"}, ValueError, "start_timeout must be a finite number of seconds"),
    ({"start_timeout": True}, ValueError, "start_timeout must be a finite number of seconds"),
    ({"max_sessions": 0}, ValueError, "max_sessions must be an int >= 1"),
    ({"idle_timeout": -5}, ValueError, "idle_timeout must be None or > 0 seconds"),
    ({"max_in_flight": 0}, ValueError, r"max_in_flight must be an int in \[1, 64\]"),
    ({"actor_options": "num_cpus=1"}, TypeError, "actor_options must be a mapping"),
    ({"actor_options": [("num_cpus", 1)]}, TypeError, "actor_options must be a mapping"),
    ({"actor_options": {"name": "x"}}, ValueError, "may not set 'name': pass name="),
    ({"actor_options": {"lifetime": "detached"}}, ValueError, "pass detached=True"),
    ({"actor_options": {"get_if_exists": True}}, ValueError, "may not set 'get_if_exists'"),
    ({"actor_options": {"num_cpu": 1}}, ValueError, "actor_options: Invalid option keyword"),
    ({"actor_options": {"num_cpus": -1}}, ValueError, "actor_options: .*cannot be negative"),
    ({"actor_options": {"resources": "gpu"}}, TypeError, "actor_options: .*'resources'"),
]


def _make(kwargs: dict[str, Any], address: str = "127.0.0.1:1") -> RaySessions:
    """RaySessions(**kwargs), at ``address`` unless they give one (by default, where
    nothing listens: an argument let through meets a ClusterError, not the error its
    check must raise)."""
    args = dict(kwargs)
    factory = args.pop("store_factory", MemoryStore)
    args.setdefault("address", address)
    return RaySessions(factory, **args)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"), BAD_ARGUMENTS, ids=[str(k) for k, _, _ in BAD_ARGUMENTS]
)
def test_a_bad_constructor_argument_is_refused_with_a_typed_error_saying_what_to_pass(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each bad argument of RaySessions: its own typed error, whose message names the
    argument and what it must be."""
    with pytest.raises(error, match=match):
        _make(kwargs)


CHECK_ALL = """
import json, os
import ray
from test_ray_hardening import BAD_ARGUMENTS, _make

seen = []
for kwargs, error, _ in BAD_ARGUMENTS:
    try:
        _make(kwargs, os.environ["NOUS_ACTOR_TEST_RAY_ADDRESS"])  # a cluster that runs
    except Exception as exc:
        seen.append([type(exc).__name__, isinstance(exc, error), ray.is_initialized()])
    else:
        seen.append(["nothing", False, ray.is_initialized()])
print(json.dumps(seen))
"""


def test_bad_constructor_arguments_are_refused_before_anything_starts(
    ray_cluster: RayCluster,
) -> None:
    """In a process not connected to Ray, given the address of a running cluster, each bad
    argument is refused before Ray is even reached: the process is still not connected."""
    out = subprocess.run(
        [sys.executable, "-c", CHECK_ALL],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=ray_cluster.driver_env(),
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert len(seen) == len(BAD_ARGUMENTS)
    for (kwargs, error, _), (got, right, connected) in zip(BAD_ARGUMENTS, seen, strict=True):
        assert right, f"{kwargs}: {got}, not {error.__name__}"
        assert not connected, f"{kwargs}: connected to Ray before refusing it"
