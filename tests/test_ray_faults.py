"""Sessions on Ray under real faults: a shard's worker killed mid-writes, a shard paused
until its lease is gone, a driver that dies, a cluster that is not there.

Nothing acknowledged may be lost; nothing may hang; the store's fencing alone
decides who writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from bounds import wait_until

if TYPE_CHECKING:
    from postgres_server import Server

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

from nous_actor import (  # noqa: E402
    ClusterError,
    ConflictError,
    Session,
    SessionCrashed,
    SessionStopped,
)
from nous_actor.cluster.ray import RaySessions, shard_of  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ids_on(shard: int, shards: int, n: int) -> list[str]:
    """``n`` fresh session ids that all live on ``shard``."""
    found: list[str] = []
    while len(found) < n:
        sid = f"s-{uuid.uuid4().hex[:10]}"
        if shard_of(sid, shards) == shard:
            found.append(sid)
    return found


class Writers:
    """Threads that pipeline appends of unique contents to sessions and record which
    were acknowledged; a failed append (the shard was lost) is not retried."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles
        self.acked: dict[str, list[str]] = {h.session_id: [] for h in handles}
        self.failed: list[BaseException] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(h,), daemon=True) for h in handles
        ]

    def _run(self, handle: Any) -> None:
        n = 0
        while not self.stop.is_set():
            batch = []
            for _ in range(10):
                text = f"{handle.session_id}:{n}"
                n += 1
                batch.append((text, handle.append("user_message", {"content": text})))
            for text, fut in batch:
                try:
                    fut.get(timeout=30)
                except SessionStopped as exc:  # SessionCrashed: in flight at the kill
                    with self.lock:
                        self.failed.append(exc)
                    continue
                with self.lock:
                    self.acked[handle.session_id].append(text)

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
            assert not t.is_alive()


def _stored(pg_server: Server, schema: str, sid: str) -> list[str]:
    with PostgresStore(pg_server.dsn, schema=schema) as store:
        return [ev.data["content"] for ev in store.load(sid)]


@pytest.mark.parametrize("how", ["sigkill", "ray.kill"])
def test_a_shard_killed_mid_writes_loses_nothing_acknowledged_and_handles_keep_working(
    ray_cluster: Any, pg_server: Server, schema: str, how: str
) -> None:
    """Three sessions on one shard take pipelined appends from three threads; the
    shard's worker is killed. Ray restarts it; every acknowledged append is in the
    store exactly once, the calls in flight failed with SessionCrashed, and the same
    handles reach the restarted shard."""
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=schema), shards=2, timeout=30
    )
    try:
        handles = [sessions.open(sid) for sid in _ids_on(0, 2, 3)]
        old_pid = sessions.shard_info()[0]["pid"]
        with Writers(handles) as writers:
            wait_until(lambda: writers.count() >= 150, 60, "150 appends acknowledged")
            if how == "sigkill":
                os.kill(old_pid, signal.SIGKILL)
            else:
                ray.kill(sessions.shard_actor(0), no_restart=False)
            at_kill = writers.count()
            wait_until(lambda: writers.count() >= at_kill + 150, 60, "appends after the kill")
        assert sessions.shard_info()[0]["pid"] != old_pid
        assert all(isinstance(e, SessionCrashed) for e in writers.failed), writers.failed
        for h in handles:
            stored = _stored(pg_server, schema, h.session_id)
            assert len(stored) == len(set(stored))  # nothing twice
            assert set(writers.acked[h.session_id]) <= set(stored)  # nothing acked lost
            assert [e.data["content"] for e in h.events().get()] == stored
            # Each thread's acknowledged appends are stored in the order it made them.
            order = {text: i for i, text in enumerate(stored)}
            acked = [order[t] for t in writers.acked[h.session_id]]
            assert acked == sorted(acked)
    finally:
        sessions.shutdown()


def test_a_paused_shard_that_comes_back_is_fenced_and_stores_nothing(
    ray_cluster: Any, pg_server: Server, schema: str
) -> None:
    """A shard's worker is paused (SIGSTOP) with an append in flight; its lease runs
    out and a writer elsewhere takes the session over. When the old shard resumes,
    its append fails and nothing of it is stored: the store alone decided. Once the
    new writer lets go, the same Ray handle takes the session back, with everything."""
    sid = f"paused-{uuid.uuid4().hex[:8]}"
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=schema, lease=3.0),
        shards=1,
        timeout=30,
    )
    pid = sessions.shard_info()[0]["pid"]
    try:
        chat = sessions.open(sid)
        chat.append("user_message", {"content": "one"}).get()
        os.kill(pid, signal.SIGSTOP)
        try:
            late = chat.append("user_message", {"content": "from the paused shard"})
            pg_server.sql(
                f"UPDATE \"{schema}\".claims SET lease_until = now() - interval '1 second' "
                "WHERE session_id = %s",
                (sid,),
            )
            with PostgresStore(pg_server.dsn, schema=schema, holder="node-b") as store:
                other = Session.start(sid, store=store, timeout=10)
                other.append("user_message", {"content": "from node b"}).get()
                os.kill(pid, signal.SIGCONT)
                with pytest.raises((ConflictError, SessionStopped)):
                    late.get(timeout=30)
                with pytest.raises((ConflictError, SessionStopped)):
                    chat.append("user_message", {"content": "while b holds it"}).get()
                assert [e.data["content"] for e in store.load(sid)] == ["one", "from node b"]
                other.stop()
        finally:
            os.kill(pid, signal.SIGCONT)
        sessions.open(sid)  # open() tries a session the shard gave up on again
        assert [m.content for m in chat.derive_messages().get()] == ["one", "from node b"]
        chat.append("user_message", {"content": "back"}).get()
        assert _stored(pg_server, schema, sid) == ["one", "from node b", "back"]
    finally:
        sessions.shutdown()


DRIVER = """
import functools, json, os, sys
import ray
from nous_actor.store.postgres import PostgresStore
from nous_actor.cluster.ray import RaySessions

config = json.loads(sys.argv[1])
ray.init(address=config["address"], logging_level="warning", log_to_driver=False)
sessions = RaySessions(
    functools.partial(PostgresStore, config["dsn"], schema=config["schema"]),
    shards=2, name=config["name"], namespace=config["namespace"], detached=True,
)
chat = sessions.open(config["sid"])
for i in range(20):
    chat.append("user_message", {"content": str(i)}).get()
print(json.dumps([s["pid"] for s in sessions.shard_info()]), flush=True)
sys.stdin.read()
"""


def test_a_driver_that_dies_leaves_detached_shards_serving(
    ray_cluster: Any, pg_server: Server, schema: str
) -> None:
    """A driver starts detached shards, appends, and is killed with SIGKILL. The shards
    keep running; another driver finds them by name and carries on."""
    config = {
        "address": ray_cluster.address,
        "dsn": pg_server.dsn,
        "schema": schema,
        "name": f"detached-{uuid.uuid4().hex[:8]}",
        "namespace": "nous-actor-tests",
        "sid": "kept",
    }
    with subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as driver:
        try:
            line = _readline(driver, 120)
        finally:
            driver.kill()  # SIGKILL: the driver gets no chance to clean up
            driver.wait(30)
    pids = json.loads(line)

    def reach(shards: int = 2) -> RaySessions:
        """The shards of that name, as another driver reaches them."""
        return RaySessions(
            partial(PostgresStore, pg_server.dsn, schema=schema),
            shards=shards,
            name=config["name"],
            namespace=config["namespace"],
            detached=True,
        )

    sessions = reach()
    try:
        assert [s["pid"] for s in sessions.shard_info()] == pids  # the same processes
        chat = sessions.open("kept")
        assert [m.content for m in chat.derive_messages().get()] == [str(i) for i in range(20)]
        assert chat.append("user_message", {"content": "20"}).get().seq == 20
        sessions.close()  # detached: close leaves them serving
        assert reach().open("kept").count().get() == 21
        with pytest.raises(ClusterError, match="run as 2 shards"):
            reach(shards=3)
    finally:
        sessions.shutdown()


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got or not got[0]:
        raise AssertionError(f"the driver printed nothing within {timeout} s")
    return got[0]


NO_CLUSTER = """
import functools, sys, time
from nous_actor import ClusterError, MemoryStore
from nous_actor.cluster.ray import RaySessions

address = sys.argv[1]
started = time.monotonic()
try:
    RaySessions(MemoryStore, address=address, start_timeout=10)
except ClusterError as exc:
    print(f"ClusterError after {time.monotonic() - started:.1f}s: {exc}")
else:
    print("connected")
"""


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("127.0.0.1:1", "no Ray cluster answers at '127.0.0.1:1'"),
        ("no port here", "cannot read the Ray address"),
    ],
)
def test_no_cluster_at_the_address_is_a_clear_error_not_a_hang(
    ray_cluster: Any, address: str, says: str
) -> None:
    """In a process not connected to Ray yet: a ClusterError naming the address and
    what to do, within seconds."""
    out = subprocess.run(
        [sys.executable, "-c", NO_CLUSTER, address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ClusterError after"), out.stdout + out.stderr
    assert says in out.stdout
    assert "ray start --head" in out.stdout or "host:port" in out.stdout
