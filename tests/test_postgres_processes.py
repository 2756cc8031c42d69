"""PostgresStore across processes: one writer per session, kills, pauses, live watchers.

Each other process is a `Worker` (tests/postgres_server.py) driven line by line;
every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from postgres_server import Stores, Worker


# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.errors import ConflictError, FencedError  # noqa: E402
from nous_actor.sessions.handle import Session  # noqa: E402


def _expire_leases(stores: Stores) -> None:
    stores.server.sql(
        f"UPDATE \"{stores.schema}\".claims SET lease_until = now() - interval '1 second'"
    )


def test_two_processes_claim_one_session_and_one_is_refused(
    pg_workers: Callable[..., Worker],
) -> None:
    """Two processes claim the same session at once: one gets it, the other a
    ConflictError naming the first."""
    a, b = pg_workers(holder="host-a"), pg_workers(holder="host-b")
    a.send(op="claim", sid="s")
    b.send(op="claim", sid="s")
    replies = {"host-a": a.read(), "host-b": b.read()}
    winners = [name for name, r in replies.items() if r.get("ok")]
    assert len(winners) == 1, replies
    (loser,) = [r for r in replies.values() if not r.get("ok")]
    assert loser["error"] == "ConflictError"
    assert loser["holder"] == winners[0]
    assert winners[0] in loser["message"]


def test_a_writer_killed_mid_group_commit_loses_no_acknowledged_event(
    pg_stores: Stores, pg_workers: Callable[..., Worker]
) -> None:
    """SIGKILL a process while its sessions pipeline appends: every event it acknowledged
    is stored, each session is a gapless prefix, and a new writer takes over at once."""
    writer = pg_workers(lease=30)
    sessions = [f"s{i}" for i in range(4)]
    writer.ask(op="pipeline", sessions=sessions, n=3000, tag="w")
    acked: dict[str, dict[int, str]] = {sid: {} for sid in sessions}
    deadline = time.monotonic() + 60
    while sum(len(v) for v in acked.values()) < 400:
        assert time.monotonic() < deadline, "the writer acknowledged too little"
        line = writer.read(30)
        assert "failed" not in line, line
        if "ack" in line:
            sid, seq, content = line["ack"]
            acked[sid][seq] = content
    os.kill(writer.pid, signal.SIGKILL)
    writer.proc.wait(30)
    # The acknowledgements still in the pipe were acknowledged too.
    assert writer.proc.stdout is not None
    for raw in (writer._buffer + writer.proc.stdout.read()).splitlines():
        try:
            sid, seq, content = json.loads(raw)["ack"]
        except (ValueError, KeyError):
            continue  # a line cut by the kill, or another reply
        acked[sid][seq] = content
    store = pg_stores(lease=30)
    started = time.monotonic()
    for sid in sessions:
        claim_soon(store, sid)  # the dead writer's connection (and its lock) is gone
    takeover = time.monotonic() - started
    assert takeover < 5, f"takeover after a writer's death took {takeover:.2f} s"
    for sid in sessions:
        stored = {e.seq: e.data["content"] for e in store.load(sid)}
        assert sorted(stored) == list(range(len(stored))), "a gap in the stored seqs"
        for seq, content in acked[sid].items():
            assert stored.get(seq) == content, (sid, seq)


def claim_soon(store: Any, sid: str, within: float = 5.0) -> str:
    """Claim ``sid``, retrying while the server has not yet seen its dead holder go."""
    deadline = time.monotonic() + within
    while True:
        try:
            return str(store.claim(sid))
        except ConflictError:
            if time.monotonic() > deadline:
                raise
            store._closing.wait(0.01)


def test_a_paused_writer_is_fenced_after_its_lease_is_taken_over(
    pg_stores: Stores, pg_workers: Callable[..., Worker]
) -> None:
    """SIGSTOP a writer, expire its lease by SQL, let another take over, SIGCONT it: its
    write is fenced and stores nothing."""
    old = pg_workers(lease=30, holder="paused-host")
    assert old.ask(op="claim", sid="s") == {"ok": True}
    assert old.ask(op="write", sid="s", seqs=[0, 1, 2], tag="old") == {"refused": {}}
    os.kill(old.pid, signal.SIGSTOP)
    try:
        _expire_leases(pg_stores)
        new = pg_stores(lease=30, holder="new-host")
        new.claim("s")  # the lease expired: taken over although its holder lives
        assert [e.seq for e in new.load("s")] == [0, 1, 2]
        from datetime import UTC, datetime

        from nous_actor.core.event import Event

        now = datetime.now(UTC)
        assert new.write({"s": [Event(3, "user_message", now, {"content": "new-3"})]}) == {}
        old.send(op="write", sid="s", seqs=[3, 4], tag="old")
    finally:
        os.kill(old.pid, signal.SIGCONT)
    assert old.read(30) == {"refused": {"s": FencedError.__name__}}
    contents = [e.data["content"] for e in new.load("s")]
    assert contents == ["old-0", "old-1", "old-2", "new-3"]


def test_a_watcher_in_another_process_sees_every_event_once_across_a_takeover(
    pg_stores: Stores, pg_workers: Callable[..., Worker]
) -> None:
    """A process watching a session sees each committed event exactly once, in order,
    while its writer is killed and another process takes over and carries on."""
    watcher = pg_workers()
    assert watcher.ask(op="watch", sid="s", **{"from": 0}) == {"watching": True}
    first = pg_workers(lease=30)
    first.ask(op="pipeline", sessions=["s"], n=2000, tag="first")
    seen: list[int] = []
    first.read_until(lambda line: "ack" in line and line["ack"][1] >= 150, timeout=60)
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(30)
    second = pg_workers(lease=30)
    second.ask(op="pipeline", sessions=["s"], n=200, tag="second")
    second.read_until(lambda line: "finished" in line or "failed" in line, timeout=60)
    store = pg_stores()
    stored = [e.seq for e in store.load("s")]
    assert stored == list(range(len(stored)))
    contents: dict[int, Any] = {}
    deadline = time.monotonic() + 60
    while len(seen) < len(stored):
        assert time.monotonic() < deadline
        line = watcher.read(30)
        seq, content = line["event"]
        seen.append(seq)
        contents[seq] = content
    assert seen == stored, "each committed event exactly once, in order"
    assert contents == {e.seq: e.data["content"] for e in store.load("s")}
    assert any(str(c).startswith("second-") for c in contents.values())


def test_sessions_on_two_stores_hand_a_session_over(pg_stores: Stores) -> None:
    """A Session on one store stops; a Session on another store of the same database
    continues it from the store, the first store's later write is refused."""
    a, b = pg_stores(), pg_stores()
    first = Session.start("chat", store=a, timeout=10)
    first.append("user_message", {"content": "hello"}).get()
    first.stop()
    second = Session.start("chat", store=b, timeout=10)
    assert second.count().get() == 1
    assert second.append("assistant_message", {"content": "hi"}).get().seq == 1
    second.stop()
