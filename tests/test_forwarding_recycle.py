"""A holder recycled while other processes run turns through it.

A web worker recycled by its server (a rolling deploy) closes its registry while
other workers run agent turns on the sessions it holds. Its close waits, within
its bound, for those turns to end before it stops their sessions: no other
worker's run fails because this one was recycled. A turn still open at the bound
ends as before. A holder that ends without closing its registry hands back the
calls that waited there for a turn, and a holder that cannot be reached is named
as such when an open gives up on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from bounds import BOUND, SLOW_BOUND, end_child

from nous_actor import Sessions, SQLiteStore
from nous_actor.errors import ConflictError, TurnInterrupted
from nous_actor.sessions.forwarding.links import socket_path
from nous_actor.store import shared

_HOLDER = """
import sys, time
from nous_actor import Sessions, SQLiteStore
store = SQLiteStore(sys.argv[1])
sessions = Sessions(store)
sessions.open("c").append("user_message", {"content": "hello"}).get()
print("held", flush=True)
bound = float(sys.stdin.readline())
print("closing", flush=True)
began = time.monotonic()
sessions.close(timeout=bound)
print(f"closed {time.monotonic() - began:.3f}", flush=True)
store.close()
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    return holder


def _close(holder: subprocess.Popen[str], bound: float) -> None:
    assert holder.stdin is not None
    assert holder.stdout is not None
    holder.stdin.write(f"{bound}\n")
    holder.stdin.flush()
    assert holder.stdout.readline() == "closing\n"


def _closed(holder: subprocess.Popen[str]) -> float:
    assert holder.stdout is not None
    line = holder.stdout.readline()
    assert line.startswith("closed "), line
    assert holder.wait(timeout=SLOW_BOUND) == 0
    return float(line.split()[1])


def test_a_recycled_holder_lets_other_processes_turns_end_before_it_stops(
    tmp_path: Path,
) -> None:
    """A child holds a session; this process runs a turn on it through the child, and a
    second turn queues behind it; the child closes its registry (as a recycled worker
    does) while the turn runs: the turn goes on writing and closes normally (before
    the fix it ended at the close, ``TurnInterrupted`` with reason ``restart``), the
    child's close returns once it did, and the queued turn then opens where the
    session is next."""
    path = tmp_path / "web.db"
    holder = _holder(path)
    try:
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as callers:
            chat = callers.open("c")
            run = chat.turn(owner="run", lease=SLOW_BOUND).open()
            run.append_message({"role": "user", "content": "q"}).get()
            queued: list[object] = []

            def second() -> None:
                try:
                    with chat.turn(owner="next", lease=SLOW_BOUND) as turn:
                        turn.append_message({"role": "user", "content": "next"}).get()
                    queued.append("done")
                except BaseException as exc:
                    queued.append(exc)

            waiter = threading.Thread(target=second)
            waiter.start()
            _close(holder, SLOW_BOUND)
            for k in range(3):  # the run goes on while the holder closes
                run.append_message({"role": "assistant", "content": f"a{k}"}).get()
            end = run.close()
            assert end is not None
            assert end.data["how"] == "closed"
            assert _closed(holder) < SLOW_BOUND
            waiter.join(SLOW_BOUND)
            assert not waiter.is_alive()
            assert queued == ["done"]
            events = chat.events().get(timeout=BOUND)
            contents = [e.data.get("content") for e in events if e.type.value.endswith("message")]
            assert contents == ["hello", "q", "a0", "a1", "a2", "next"]
            ends = [e.data for e in events if e.type.value == "turn_end"]
            assert [(d["owner"], d["how"]) for d in ends] == [
                ("run", "closed"),
                ("next", "closed"),
            ]
    finally:
        end_child(holder, BOUND)


def test_a_recycled_holder_waits_for_other_processes_turns_no_longer_than_its_bound(
    tmp_path: Path,
) -> None:
    """A turn another process keeps open past the closing holder's bound (half its close
    timeout) ends at the bound as before: the close waited for it that long and returns
    within its timeout, and the turn's next call fails with ``TurnInterrupted``."""
    path = tmp_path / "web.db"
    holder = _holder(path)
    try:
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as callers:
            chat = callers.open("c")
            run = chat.turn(owner="run", lease=SLOW_BOUND * 3).open()
            run.append_message({"role": "user", "content": "q"}).get()
            _close(holder, 1.0)
            assert 0.5 <= _closed(holder) < SLOW_BOUND
            with pytest.raises(TurnInterrupted):
                run.append_message({"role": "assistant", "content": "late"}).get()
    finally:
        end_child(holder, BOUND)


def test_an_open_refused_by_an_unreachable_holder_says_so(tmp_path: Path) -> None:
    """A live holder whose socket file is gone (a temp-folder cleaner removed it): an
    open in another process gives up at its bound with a `ConflictError` that says the
    holder could not be reached at its address and what to do, not one that tells it
    to use a handle it has no way to get."""
    path = tmp_path / "web.db"
    holder = _holder(path)
    try:
        store = SQLiteStore(path)
        found = shared.holder_address(store, "c")
        assert found is not None
        assert found[1] is not None
        sock = socket_path(found[1])
        assert sock is not None
        os.unlink(sock)
        with Sessions(store, timeout=0.5) as callers:
            with pytest.raises(ConflictError) as caught:
                callers.open("c").count().get(timeout=SLOW_BOUND)
            message = str(caught.value)
            assert "could not be reached" in message
            assert found[1] in message
            assert "open(id, wait=" in message
            assert "stop it first" not in message
            assert callers.live() == []
    finally:
        end_child(holder, BOUND)


_EXITS = """
import sys
from nous_actor import Sessions, SQLiteStore
sessions = Sessions(SQLiteStore(sys.argv[1]))
sessions.open("c").append("user_message", {"content": "hello"}).get()
print("held", flush=True)
sys.stdin.readline()
"""  # (and the program ends without closing anything)


def test_calls_waiting_in_a_holder_that_exits_without_closing_follow_the_session(
    tmp_path: Path,
) -> None:
    """This process runs a turn on a session a child holds, and sends it writes through
    the plain handle and a second turn, which wait in the child for the turn; the child
    ends without closing its registry: the writes and the queued turn were not applied
    there, so they follow the session (here, its next holder) and succeed, in order,
    where before the fix each failed with `CallOutcomeUnknown` (``applied`` answering
    ``None``)."""
    path = tmp_path / "web.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _EXITS, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as callers:
            chat = callers.open("c")
            run = chat.turn(owner="run", lease=SLOW_BOUND).open()
            waiting = [chat.append_message({"role": "user", "content": f"w{k}"}) for k in range(3)]
            queued: list[object] = []

            def second() -> None:
                try:
                    with chat.turn(owner="next", lease=SLOW_BOUND) as turn:
                        turn.append_message({"role": "user", "content": "next"}).get()
                    queued.append("done")
                except BaseException as exc:
                    queued.append(exc)

            waiter = threading.Thread(target=second)
            waiter.start()  # (its turn is taken by the child, or refused after its exit)
            # A read goes after the calls sent before it on the one link: once answered,
            # the child took the writes (each waits there for the turn).
            assert chat.count().get() == 2
            holder.stdin.write("exit\n")
            holder.stdin.flush()
            assert holder.wait(timeout=SLOW_BOUND) == 0
            seqs = [f.get().seq for f in waiting]
            waiter.join(SLOW_BOUND)
            assert not waiter.is_alive()
            assert queued == ["done"]
            events = chat.events().get(timeout=BOUND)
            contents = [e.data.get("content") for e in events if e.type.value.endswith("message")]
            assert contents[:4] == ["hello", "w0", "w1", "w2"]
            assert contents[4:] == ["next"]
            assert seqs == sorted(seqs)
            del run
    finally:
        end_child(holder, BOUND)
