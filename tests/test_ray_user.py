"""Sessions on Ray as a user meets them: a cluster whose head dies under a connected
driver, and a second driver that reaches running shards with another store.

The dead cluster is a throwaway one of its own (``.ci/ray.sh``), never the shared test
cluster; its driver runs as a real process.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from postgres_server import Server
    from ray_cluster import RayScope

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

from nous_actor import ClusterError  # noqa: E402
from nous_actor.cluster.ray import RaySessions  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "ray.sh"


# -- a cluster that dies under its driver ------------------------------------------------------

DEAD_HEAD_DRIVER = """
import json, os, sys, time
from nous_actor import MemoryStore
from nous_actor.cluster.ray import RaySessions

sessions = RaySessions(
    MemoryStore, shards=2, address=os.environ["RAY_ADDRESS"], timeout=3, start_timeout=30
)
chat = sessions.open("chat")
chat.append("user_message", {"content": "before"}).get()
print("ready", flush=True)
sys.stdin.readline()  # the cluster is dead now

def timed(call):
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        what = type(exc).__name__
    else:
        what = "ok"
    return [what, round(time.monotonic() - started, 2)]

found = {
    "append": timed(lambda: chat.append("user_message", {"content": "after"}).get()),
    "live": timed(sessions.live),
    "shard_info": timed(sessions.shard_info),
    "again": timed(lambda: RaySessions(MemoryStore, shards=1, timeout=3, start_timeout=3)),
    "close": timed(lambda: sessions.close(timeout=2)),
}
print(json.dumps(found), flush=True)
"""


def _start_cluster(folder: Path) -> dict[str, str]:
    """A throwaway cluster in ``folder``: what ``.ci/ray.sh start`` exports."""
    cli = Path(sys.executable).parent / "ray"
    env = {**os.environ, "NOUS_ACTOR_TEST_RAY_CPUS": "1"}
    if "RAY" not in env and cli.is_file():
        env["RAY"] = str(cli)
    try:
        out = subprocess.run(
            [str(SCRIPT), "start", str(folder)],
            check=True,
            timeout=150,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.fail(f"could not start a throwaway Ray cluster: {exc}", pytrace=False)
    return {
        key: value.strip("'")
        for key, _, value in (
            line.removeprefix("export ").partition("=")
            for line in out.splitlines()
            if line.startswith("export ")
        )
    }


def _read_line(driver: subprocess.Popen[str], timeout: float) -> str:
    """The first line ``driver`` prints, within ``timeout`` seconds."""
    assert driver.stdout is not None
    ready, _, _ = select.select([driver.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"the driver printed nothing within {timeout} s")
    line = driver.stdout.readline()
    if not line:
        raise AssertionError(f"the driver exited ({driver.wait(30)}) before it was ready")
    return line.strip()


def test_a_driver_whose_cluster_died_fails_every_call_within_its_bound(ray_cluster: Any) -> None:
    """The head (and every node) SIGKILLed under a connected driver: each call fails with
    a typed error within its bound; a new RaySessions in that process is a ClusterError
    within start_timeout (Ray itself would wait 60 s for its control store, then end the
    process); close returns at once."""
    folder = Path(f"/tmp/nray-{uuid.uuid4().hex[:8]}")
    try:
        exports = _start_cluster(folder)
        env = {
            **os.environ,
            **exports,
            "RAY_ADDRESS": exports["NOUS_ACTOR_TEST_RAY_ADDRESS"],
            "PYTHONPATH": str(ROOT),
        }
        driver = subprocess.Popen(
            [sys.executable, "-u", "-c", DEAD_HEAD_DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        try:
            assert driver.stdin is not None
            assert _read_line(driver, 120) == "ready"
            subprocess.run([str(SCRIPT), "kill", str(folder)], check=True, timeout=120)
            driver.stdin.write("go\n")
            driver.stdin.flush()
            try:
                out, err = driver.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                raise AssertionError("the driver hung on its dead cluster for 45 s") from None
            assert driver.returncode == 0, err[-3000:]
        finally:
            if driver.poll() is None:
                driver.kill()
            driver.wait(30)
            for stream in (driver.stdin, driver.stdout, driver.stderr):
                if stream is not None:
                    stream.close()
        found = json.loads(out.strip().splitlines()[-1])
        assert found["append"][0] == "SessionCrashed", found
        assert found["live"][0] == found["shard_info"][0] == "SessionStopped", found
        assert found["again"][0] == "ClusterError", found
        assert found["close"][0] == "ok", found
        for what, (_, took) in found.items():
            assert took < (3.0 if what == "close" else 5.0), found
    finally:
        subprocess.run([str(SCRIPT), "stop", str(folder)], timeout=120, check=False)


# -- running shards reached with another store -------------------------------------------------


def test_running_shards_refuse_a_driver_whose_store_factory_makes_another_store(
    ray_scope: RayScope, pg_server: Server, schema: str
) -> None:
    """A second RaySessions reaches the running shards of a name with a store_factory for
    another store: refused with a ClusterError naming both stores, before any call (the
    shards would write its sessions into their own store); the shards keep serving, and
    the same store is still accepted."""
    name = ray_scope.name("shards")
    first = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=schema),
        shards=2,
        name=name,
        namespace=ray_scope.namespace,
        timeout=30,
    )
    other = pg_server.fresh_schema()
    try:
        chat = first.open("chat")
        chat.append("user_message", {"content": "first"}).get()
        pids = [info["pid"] for info in first.shard_info()]
        with pytest.raises(ClusterError) as refused:
            RaySessions(
                partial(PostgresStore, pg_server.dsn, schema=other),
                shards=2,
                name=name,
                namespace=ray_scope.namespace,
                timeout=30,
            )
        message = str(refused.value)
        assert f"schema {schema}" in message, message
        assert f"schema {other}" in message, message
        assert "store_factory" in message, message
        assert [info["pid"] for info in first.shard_info()] == pids
        assert chat.append("user_message", {"content": "still"}).get(timeout=30).seq == 1
        same = RaySessions(
            partial(PostgresStore, pg_server.dsn, schema=schema),
            shards=2,
            name=name,
            namespace=ray_scope.namespace,
            timeout=30,
        )
        try:
            again = same.open("chat")
            assert again.append("user_message", {"content": "same"}).get(timeout=30).seq == 2
        finally:
            same.close()
        assert [m.content for m in chat.derive_messages().get()] == ["first", "still", "same"]
    finally:
        first.shutdown()
        pg_server.drop_schema(other)


# -- a driver that disconnected from Ray ---------------------------------------------------------

DISCONNECTED_DRIVER = """
import json, time
from nous_actor import MemoryStore
from nous_actor.cluster.ray import RaySessions

sessions = RaySessions(MemoryStore, shards=1, timeout=5)
chat = sessions.open("chat")
chat.append("user_message", {"content": "before"}).get()
feed = chat.subscribe(0)
assert feed.get(timeout=5).seq == 0
pending = [chat.append("user_message", {"content": str(i)}) for i in range(300)]
ray.shutdown()

def timed(call):
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        what = type(exc).__name__ + ": " + str(exc)
    else:
        what = "ok"
    return [what, round(time.monotonic() - started, 2)]

deadline = time.monotonic() + 5

def outcome(future):
    try:
        future.get(timeout=max(deadline - time.monotonic(), 0.01))
    except Exception as exc:
        return type(exc).__name__
    return "ok"

found = {
    "append": timed(lambda: chat.append("user_message", {"content": "after"}).get()),
    # Ray may drop the answers of calls in flight: the call above found out, and failed
    # them (a call waiting for its answer meanwhile waits until its bound).
    "pending": sorted({outcome(future) for future in pending}),
    "open": timed(lambda: sessions.open("other")),
    "live": timed(sessions.live),
    "shard_info": timed(sessions.shard_info),
    "feed": timed(lambda: [feed.get(timeout=5) for _ in range(1000)]),  # ends, after
    # the events it had when ray.shutdown() was called
    "close": timed(sessions.close),
    "connected": ray.is_initialized(),
}
print(json.dumps(found), flush=True)
"""


def test_calls_after_ray_shutdown_fail_with_session_stopped_and_start_no_ray(
    ray_scope: RayScope,
) -> None:
    """The driver called ray.shutdown() with a RaySessions open: its calls fail at once
    with SessionStopped saying to connect again (and those in flight then, whose answers
    Ray may drop, with the first call after), never starting a local Ray instance
    (what Ray does for a call made while not connected); close returns."""
    done = ray_scope.run_driver(DISCONNECTED_DRIVER, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found.pop("connected") is False, found  # no local Ray instance was started
    # Calls in flight at ray.shutdown() were answered, or failed with SessionStopped.
    assert set(found.pop("pending")) <= {"ok", "SessionStopped"}, found
    for what in ("append", "open", "live", "shard_info"):
        error, took = found[what]
        assert error.startswith("SessionStopped: "), found
        assert "ray.shutdown()" in error, found
        assert took < 2.0, found
    assert found["feed"][0].startswith("SessionStopped: "), found  # the feed ended
    assert found["close"][0] == "ok", found
