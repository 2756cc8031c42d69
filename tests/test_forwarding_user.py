"""Forwarding as a web app meets it: several worker processes on one store, a session
held by one worker and called from another (a real process, over the socket), with the
behaviour of a call made where the session is held."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND, SLOW_BOUND, end_child

from nous_actor import Compactor, Sessions, SQLiteStore, TurnBusy, TurnInterrupted
from nous_actor.sessions.forwarding import LocalLink, SocketLink, socket_path
from nous_actor.store import MemoryStore
from nous_actor.store.base import Store

_HOLDER = """
import sys
from nous_actor import Sessions, SQLiteStore
store = SQLiteStore(sys.argv[1])
sessions = Sessions(store)
sessions.open(sys.argv[2]).append("user_message", {"content": "hello"}).get()
print("held", flush=True)
sys.stdin.readline()
sessions.close()
store.close()
"""

CALLER_BOUND = 4.0
"""The caller's registry's bound: a held write must be told `TurnBusy` within it."""


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    """A SQLite file whose session ``chat`` another process holds (until the test ends)."""
    path = tmp_path / "web.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), "chat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield path
    finally:
        end_child(holder, SLOW_BOUND)


def _contents(registry: Sessions) -> list[object]:
    events = registry.read("chat").events().get(timeout=BOUND)
    return [e.data.get("content") for e in events if e.type.value.endswith("_message")]


def test_a_forwarded_write_held_by_an_open_turn_is_told_turn_busy_within_its_bound(
    db: Path,
) -> None:
    """A plain write sent to the holder while a turn is open there waits for it at most
    its caller's bound (less a little), then fails with `TurnBusy` and is never applied,
    as it does where the session is held (it used to wait the holder's hour: its caller
    got `CallTimeout`, and the write was applied once the turn ended)."""
    with Sessions(SQLiteStore(db), timeout=CALLER_BOUND) as web:
        chat = web.open("chat")
        assert web.live() == []
        assert isinstance(chat._route.target(), SocketLink)  # type: ignore[union-attr]
        turn = chat.turn(owner="run-1", lease=SLOW_BOUND).open()
        began = time.monotonic()
        held = chat.append("user_message", {"content": "plain"})
        with pytest.raises(TurnBusy) as caught:
            held.get(timeout=SLOW_BOUND)
        assert time.monotonic() - began < CALLER_BOUND
        assert caught.value.holder == "run-1"
        assert caught.value.turn_id == turn.turn_id
        turn.append("assistant_message", {"content": "in turn"}).get(timeout=BOUND)
        turn.close()
        assert chat.count().get(timeout=BOUND) == 4  # hello, turn_start, in turn, turn_end
        assert _contents(web) == ["hello", "in turn"]


def test_a_forwarded_plain_write_inside_its_own_turn_block_fails_at_once(db: Path) -> None:
    """A plain write from inside the block of the turn open on the session would wait for
    its own turn to end: forwarded, it fails at once with `TurnBusy` saying to write
    through the turn, as it does where the session is held (it used to wait out its
    bound, and be applied after the turn). From inside the block of a turn on another
    session, it is applied as any."""
    with Sessions(SQLiteStore(db), timeout=SLOW_BOUND) as web:
        chat = web.open("chat")
        assert isinstance(chat._route.target(), SocketLink)  # type: ignore[union-attr]
        with web.open("other").turn(owner="run-0"):
            chat.append("user_message", {"content": "from another turn"}).get(timeout=BOUND)
        with chat.turn(owner="run-1") as turn:
            began = time.monotonic()
            with pytest.raises(TurnBusy, match=r"write through the turn") as caught:
                chat.append("user_message", {"content": "plain"}).get(timeout=SLOW_BOUND)
            assert time.monotonic() - began < SLOW_BOUND / 2
            assert caught.value.turn_id == turn.turn_id
            turn.append("assistant_message", {"content": "in turn"}).get(timeout=BOUND)
        assert _contents(web) == ["hello", "from another turn", "in turn"]


def test_a_forwarded_plain_write_inside_its_own_async_turn_block_fails_at_once(
    db: Path,
) -> None:
    """The same from an asyncio task inside its ``async with`` block."""

    async def run(chat: Any) -> None:
        async with chat.turn(owner="run-1") as turn:
            with pytest.raises(TurnBusy, match=r"asyncio task inside that turn's block"):
                await asyncio.wait_for(
                    chat.append("user_message", {"content": "plain"}), SLOW_BOUND / 2
                )
            await turn.append("assistant_message", {"content": "in turn"})

    with Sessions(SQLiteStore(db), timeout=SLOW_BOUND) as web:
        asyncio.run(run(web.open("chat")))
        assert _contents(web) == ["hello", "in turn"]


_HOLDER_WATCHING = """
import sys
from nous_actor import Sessions, SQLiteStore
from nous_actor.sessions.forwarding import endpoint
endpoint.WATCH_EVERY = 0.05  # (a test's pace: the looks come every minute)
store = SQLiteStore(sys.argv[1])
sessions = Sessions(store)
sessions.open("chat").append("user_message", {"content": "hello"}).get()
print(sessions._endpoint.address, flush=True)
sys.stdin.readline()
print(sessions.live(), flush=True)
sessions.close()
store.close()
"""


@pytest.mark.parametrize("removed", ["socket", "folder"])
def test_a_holder_whose_socket_a_cleaner_removed_is_called_again(
    tmp_path: Path, removed: str
) -> None:
    """A temp-folder cleaner removes a long-running worker's socket file (or its whole
    folder): the worker listens there again at its next look, so other workers call its
    sessions as before (they used to wait out their bound at every request, then be
    refused with `ConflictError`, until the worker restarted). Each look refreshes the
    file's times, so an age-based cleaner leaves it alone."""
    path = tmp_path / "web.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER_WATCHING, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        address = holder.stdout.readline().strip()
        sock = Path(socket_path(address) or "")
        assert sock.is_socket()
        os.utime(sock, (0, 0))
        deadline = time.monotonic() + SLOW_BOUND
        while sock.lstat().st_mtime == 0:  # refreshed at the next look
            assert time.monotonic() < deadline
            threading.Event().wait(0.01)
        if removed == "socket":
            sock.unlink()
        else:
            shutil.rmtree(sock.parent)
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as web:
            chat = web.open("chat")
            assert chat.append("user_message", {"content": "again"}).get(timeout=BOUND).seq == 1
            assert web.live() == []  # called there, not moved here
            assert sock.is_socket()
            assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        holder.stdin.write("live\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "['chat']"
        assert holder.wait(timeout=SLOW_BOUND) == 0
        assert not sock.parent.exists()  # its folder goes with it, as always
    finally:
        end_child(holder, SLOW_BOUND)


def _summary_here(messages: object) -> str:
    """A summariser the holder cannot import (this test module is not on its path), as
    one defined in the script a worker runs as ``__main__`` is not."""
    return "summary"


def test_a_forwarded_call_the_holder_cannot_unpickle_says_what_to_do(db: Path) -> None:
    """A compaction whose summariser the holder cannot import fails with a `TypeError`
    that says to define it in a module both processes import (it used to be a bare
    "the call could not be read"); nothing is applied and the session goes on."""
    compactor = Compactor(budget=1, keep_recent=1, summarise=_summary_here)
    with Sessions(SQLiteStore(db), timeout=SLOW_BOUND) as web:
        chat = web.open("chat")
        for i in range(4):
            chat.append_message({"role": "user", "content": f"m{i} " * 50}).get(timeout=BOUND)
        with pytest.raises(TypeError, match=r"module both processes import") as caught:
            chat.compact(compactor, force=True).get(timeout=BOUND)
        assert "test_forwarding_user" in str(caught.value)  # what it could not import
        with chat.turn(owner="run-1") as turn:
            with pytest.raises(TypeError, match=r"module both processes import"):
                turn.compact(compactor, force=True).get(timeout=BOUND)
            turn.append("assistant_message", {"content": "still open"}).get(timeout=BOUND)
        assert chat.count().get(timeout=BOUND) == 8  # hello, m0-m3, the turn's three


_HOLDER_CLOSING = """
import sys
from nous_actor import Sessions, SQLiteStore
store = SQLiteStore(sys.argv[1])
sessions = Sessions(store)
sessions.open("chat").append("user_message", {"content": "hello"}).get()
print("held", flush=True)
sys.stdin.readline()
sessions.close()  # a worker recycled: its registry closes, the process lives on a moment
print("closed", flush=True)
sys.stdin.readline()
store.close()
"""


def test_writes_held_by_a_turn_when_the_holder_closes_follow_the_session(
    tmp_path: Path,
) -> None:
    """Plain writes wait at the holder for a turn; the holder's registry closes (a worker
    recycled): they are not refused (they were not applied, and the caller lives), but
    go where the session is next, in order, once each (they used to fail with
    `SessionStopped`, "the session stopped before this call")."""
    path = tmp_path / "web.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER_CLOSING, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as web:
            chat = web.open("chat")
            turn = chat.turn(owner="run-1", lease=SLOW_BOUND).open()
            held = [chat.append("user_message", {"content": f"w{i}"}) for i in range(3)]
            # (The holder has them once it answers a read sent after them.)
            assert chat.count().get(timeout=BOUND) == 2
            holder.stdin.write("close\n")
            holder.stdin.flush()
            assert holder.stdout.readline() == "closed\n"
            seqs = [f.get(timeout=SLOW_BOUND).seq for f in held]
            assert seqs == sorted(seqs)
            stored = web.read("chat").events().get(timeout=BOUND)
            assert [e.data.get("content") for e in stored if e.type.value == "user_message"] == [
                "hello",
                "w0",
                "w1",
                "w2",
            ]
            assert [stored[s].data.get("content") for s in seqs] == ["w0", "w1", "w2"]
            assert web.live() == ["chat"]
            with pytest.raises(TurnInterrupted):  # (the session moved: a restart, for it)
                turn.append("assistant_message", {"content": "late"}).get(timeout=BOUND)
    finally:
        end_child(holder, SLOW_BOUND)


def test_a_turn_a_closed_registry_opened_elsewhere_ends_with_it(db: Path) -> None:
    """A worker's registry closes (its app shuts down) while a turn it opened on a session
    another process holds is open, its process living on: the turn ends as its holder
    gone, so the next request's turn opens at once (it used to stay open for its lease,
    five minutes by default, every other writer of the conversation waiting for it)."""
    with Sessions(SQLiteStore(db), timeout=SLOW_BOUND) as first:
        turn = first.open("chat").turn(owner="run-1").open()
        turn.append("user_message", {"content": "half a run"}).get(timeout=BOUND)
    with Sessions(SQLiteStore(db), timeout=SLOW_BOUND) as web:
        chat = web.open("chat")
        with chat.turn("reject", owner="run-2") as again:
            again.append("user_message", {"content": "next run"}).get(timeout=BOUND)
        ends = [e.data for e in chat.events().get(timeout=BOUND) if e.type.value == "turn_end"]
        assert [(d["owner"], d["how"], d.get("reason")) for d in ends] == [
            ("run-1", "interrupted", "holder_gone"),
            ("run-2", "closed", None),
        ]
        assert web.live() == []  # all along through the holder


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_writes_held_in_another_registry_of_this_process_follow_the_session(
    tmp_path: Path, kind: str
) -> None:
    """The same with two registries of one process on one store (a simulation's two
    "processes"): the writes held in the closing holder follow the session to the
    caller's registry (they used to fail with `SessionStopped`)."""
    if kind == "memory":
        store_a: Store = MemoryStore()
        store_b = store_a
    else:
        store_a, store_b = SQLiteStore(tmp_path / "app.db"), SQLiteStore(tmp_path / "app.db")
    a, b = Sessions(store_a, timeout=SLOW_BOUND), Sessions(store_b, timeout=SLOW_BOUND)
    try:
        a.open("chat").append("user_message", {"content": "hello"}).get(timeout=BOUND)
        chat = b.open("chat")
        assert isinstance(chat._route.target(), LocalLink)  # type: ignore[union-attr]
        turn = chat.turn(owner="run-1", lease=SLOW_BOUND).open()
        held = [chat.append("user_message", {"content": f"w{i}"}) for i in range(3)]
        assert chat.count().get(timeout=BOUND) == 2  # (they are held there now)
        a.close()
        seqs = [f.get(timeout=SLOW_BOUND).seq for f in held]
        stored = b.read("chat").events().get(timeout=BOUND)
        assert [stored[s].data["content"] for s in seqs] == ["w0", "w1", "w2"]
        assert seqs == sorted(seqs)
        assert b.live() == ["chat"]
        with pytest.raises(TurnInterrupted):
            turn.append("assistant_message", {"content": "late"}).get(timeout=BOUND)
    finally:
        b.close()
        a.close()
        for store in {id(store_a): store_a, id(store_b): store_b}.values():
            store.close()
