"""Waits that end early, and bounds that are not numbers of seconds.

A caller that stops waiting (Ctrl-C, a cancelled task, a deadline) leaves nothing
behind that nobody holds: no turn left open until its lease ends, no subscription
fed for nobody, no waiter kept by a subscription polled with a short bound. A bound
that is not a number of seconds a wait can take (a string, NaN, ``None`` where a
number goes, past ``threading.TIMEOUT_MAX``) is refused with a typed error before
anything is sent or changed, where it failed half way (a registry half closed, a
session stopped anyway) or never returned.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND

from nous_actor import (
    CallTimeout,
    MemoryStore,
    Session,
    Sessions,
    SessionStopped,
    SQLiteStore,
    Subscription,
    TurnBusy,
)
from nous_actor.core.history import turns

T0 = datetime(2026, 1, 1, tzinfo=UTC)

_INTERRUPTED_OPEN = """
import json, os, signal, threading, time
from nous_actor import Session, TurnBusy
from nous_actor.core.history import turns

session = Session.start("chat", timeout={bound})
holder = session.turn(owner="holder").open()
# Ctrl-C while the next turn's open waits behind the open one (a real SIGINT).
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    session.turn(owner="interrupted").open()
    out = {{"open": "returned"}}
except KeyboardInterrupt:
    out = {{"open": "KeyboardInterrupt"}}
holder.close()
t = time.monotonic()
try:
    with session.turn(policy="enqueue", owner="next", timeout={bound}):
        pass
    out["next"] = "opened"
except TurnBusy as exc:
    out["next"] = f"TurnBusy: {{exc}}"
out["next_s"] = time.monotonic() - t
session.append("user_message", {{"content": "plain"}}).get()
out["ends"] = [(r["owner"], r.get("how")) for r in turns(session.log().get())]
session.stop()
print(json.dumps(out))
"""


def test_a_turn_whose_open_was_interrupted_is_let_go_at_once() -> None:
    """Ctrl-C while ``open()`` waits behind another turn: the session, which opens the
    turn once the other ends, lets it go at once (it held the session for nobody until
    its lease ran out, 300 s by default: the next turn and plain writes waited)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INTERRUPTED_OPEN.format(bound=BOUND))],
        capture_output=True,
        text=True,
        timeout=BOUND * 6,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["open"] == "KeyboardInterrupt"
    assert out["next"] == "opened"
    assert out["next_s"] < BOUND / 2
    # (Let go while it waited: it never opened.)
    assert out["ends"] == [["holder", "closed"], ["next", "closed"]]


def test_a_turn_open_failed_by_the_session_sends_nothing_more() -> None:
    """A turn the session refused (`TurnBusy`) was never open: nothing is abandoned."""
    session = Session.start("refused", timeout=BOUND)
    try:
        with session.turn(owner="holder"), pytest.raises(TurnBusy):
            session.turn(policy="reject", owner="refused").open()
        ended = [(r["owner"], r.get("how")) for r in turns(session.log().get(timeout=BOUND))]
        assert ended == [("holder", "closed")]
    finally:
        session.stop(timeout=BOUND)


def _fed_subscriptions() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Subscription) and not o._ended)


@pytest.mark.parametrize("kind", ["session", "registry"])
def test_an_asubscribe_whose_caller_stopped_waiting_leaves_no_subscription(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``asubscribe`` cancelled while the session registers it (a request's deadline,
    ``asyncio.wait_for``): the subscription the caller no longer waits for is closed
    when it lands (it was fed for nobody, holding every event up to its buffer, until
    the session stopped)."""
    registered, go = threading.Event(), threading.Event()

    async def run(handle: Any) -> None:
        register = type(handle)._register

        def held_register(self: Any, sub: Subscription, timeout: float) -> None:
            register(self, sub, timeout)
            registered.set()  # registered: its caller leaves now
            go.wait(BOUND)

        monkeypatch.setattr(type(handle), "_register", held_register)
        for i in range(50):
            handle.append("user_message", {"content": str(i)}, T0)
        await handle.count()
        loop = asyncio.get_running_loop()
        for _ in range(5):
            registered.clear()
            go.clear()
            asking = asyncio.create_task(handle.asubscribe())
            assert await loop.run_in_executor(None, registered.wait, BOUND)
            asking.cancel()
            go.set()
            with pytest.raises(asyncio.CancelledError):
                await asking
        monkeypatch.undo()
        async with await handle.asubscribe() as mine:
            assert (await mine.aget(BOUND)).seq == 0
        # (asyncio.run ends once the loop's executor has run every registration, and
        # the loop the callbacks that close the ones nobody waited for.)

    before = _fed_subscriptions()
    registry = Sessions(MemoryStore(), timeout=BOUND) if kind == "registry" else None
    session = Session.start("subs", timeout=BOUND) if registry is None else None
    try:
        handle = registry.open("subs") if registry is not None else session
        asyncio.run(run(handle))
        assert _fed_subscriptions() == before  # (while the session still runs)
    finally:
        if registry is not None:
            registry.close()
        if session is not None:
            session.stop(timeout=BOUND)


def test_polling_an_idle_subscription_keeps_no_waiter() -> None:
    """``aget`` with a short bound on an idle feed, again and again: each timed-out
    poll leaves nothing behind (each left a waiter, until the next event)."""
    session = Session.start("poll", timeout=BOUND)
    sub = session.subscribe()

    async def poll() -> int:
        timed_out = 0
        for _ in range(200):
            with pytest.raises(CallTimeout):
                await sub.aget(0.0001)
            timed_out += 1
        return timed_out

    try:
        assert asyncio.run(poll()) == 200
        assert sub._waiters == []
        session.append("user_message", {"content": "then"}, T0).get(timeout=BOUND)
        assert asyncio.run(sub.aget(BOUND)).seq == 0
    finally:
        sub.close()
        session.stop(timeout=BOUND)


def test_aget_with_no_time_to_wait_answers_what_is_pending() -> None:
    """``aget(0)`` answers a pending event, as ``get(0)`` does (it timed out before
    looking); with nothing pending, it times out at once."""
    session = Session.start("zero", timeout=BOUND)
    for i in range(2):
        session.append("user_message", {"content": str(i)}, T0).get(timeout=BOUND)
    sub = session.subscribe()
    try:
        assert sub.get(timeout=0).seq == 0
        assert asyncio.run(sub.aget(0)).seq == 1
        with pytest.raises(CallTimeout):
            asyncio.run(sub.aget(0))
    finally:
        sub.close()
        session.stop(timeout=BOUND)


BAD_BOUNDS = [
    ("5", TypeError),
    ([1], TypeError),
    (True, TypeError),
    (math.nan, ValueError),
]
"""(A call's own bound may be 0 or less, at once, or infinite, no bound: not bad.)"""


@pytest.mark.parametrize(("bad", "error"), BAD_BOUNDS)
def test_a_bad_bound_is_refused_before_anything_is_changed(
    bad: object, error: type[Exception]
) -> None:
    """Each wait's own bound, checked before it sends or stops anything: the session,
    its subscription and the registry are as they were, and work on (a registry's
    ``close`` closed its sessions' routes, then failed; a session's ``stop`` stopped it,
    then failed; a subscription's ``get(nan)`` spun a CPU for ever)."""
    registry = Sessions(MemoryStore(), timeout=BOUND)
    try:
        chat = registry.open("chat")
        first = chat.append("user_message", {"content": "1"}, T0)
        sub = chat.subscribe()
        with pytest.raises(error, match="timeout"):
            first.get(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            sub.get(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            asyncio.run(sub.aget(bad))  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            chat.subscribe(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            chat.stop(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            registry.close(timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            asyncio.run(registry.aclose(timeout=bad))  # type: ignore[arg-type]
        assert registry.live() == ["chat"]
        assert chat.append("user_message", {"content": "2"}, T0).get(timeout=BOUND).seq == 1
        assert [sub.get(timeout=BOUND).seq for _ in range(2)] == [0, 1]
        assert registry.open("other").count().get(timeout=BOUND) == 0
    finally:
        registry.close()


@pytest.mark.parametrize(("bad", "error"), BAD_BOUNDS)
def test_a_stores_own_watch_refuses_a_bad_bound(
    bad: object, error: type[Exception], tmp_path: Path
) -> None:
    """``store.watch(timeout=)`` called directly: its gets failed later, or timed out
    at once, instead of the call saying what to pass."""
    for store in (MemoryStore(), SQLiteStore(tmp_path / "w.db")):
        try:
            with pytest.raises(error, match="timeout"):
                store.watch("s", timeout=bad)  # type: ignore[arg-type]
            s = Session.start("s", store=store, timeout=BOUND)
            s.append("user_message", {"content": "x"}, T0).get(timeout=BOUND)
            s.stop()
            with store.watch("s", timeout=math.inf) as w:  # (no bound: a valid one)
                assert w.get(timeout=BOUND).seq == 0
        finally:
            store.close()


@pytest.mark.parametrize("where", ["Session.start", "Sessions", "turn"])
def test_a_bound_past_what_a_wait_takes_is_refused_when_made(where: str) -> None:
    """A bound past ``threading.TIMEOUT_MAX`` (a float's ``1e308``): refused where it is
    given, saying the limit (accepted, every call on the session raised
    ``OverflowError``, after it was applied; a registry's could not even be closed)."""
    if where == "turn":
        session = Session.start("huge-turn", timeout=BOUND)
        try:
            with pytest.raises(ValueError, match="TIMEOUT_MAX"):
                session.turn(timeout=1e308)
        finally:
            session.stop(timeout=BOUND)
    elif where == "Sessions":
        with pytest.raises(ValueError, match="TIMEOUT_MAX"):
            Sessions(MemoryStore(), timeout=1e10)
    else:
        with pytest.raises(ValueError, match="TIMEOUT_MAX"):
            Session.start("huge", timeout=1e308)


def test_a_stopped_registry_refuses_after_a_bad_close_was_refused() -> None:
    """After a refused ``close``, a good one closes everything (nothing was half done)."""
    registry = Sessions(MemoryStore(), timeout=BOUND)
    chat = registry.open("chat")
    chat.append("user_message", {"content": "1"}, T0).get(timeout=BOUND)
    with pytest.raises(TypeError):
        registry.close(timeout=None)  # type: ignore[arg-type]
    registry.close(timeout=BOUND)
    assert registry.live() == []
    with pytest.raises(SessionStopped):
        chat.append("user_message", {"content": "2"}, T0).get(timeout=BOUND)


def test_bad_arguments_of_reads_and_upkeep_are_refused_saying_what_to_pass(
    tmp_path: Any,
) -> None:
    """Arguments a read or the registry's upkeep took without looking: refused with a
    typed error that says what to pass, and nothing changes (``since(-1)`` on a handle
    answered every event where the registry's reader refused it; ``list_sessions`` of a
    path failed inside with ``index() takes at least 1 argument``; ``restart_count(5)``
    and ``passivate_idle("x")`` answered as if asked rightly; ``compact(force="no")``
    forced the compaction)."""
    from nous_actor import Compactor, SQLiteStore, list_sessions

    store = SQLiteStore(tmp_path / "x.db")
    registry = Sessions(store, timeout=BOUND)
    try:
        chat = registry.open("a")
        chat.append("user_message", {"content": "hi"}, T0).get(timeout=BOUND)
        with pytest.raises(ValueError, match="seq >= 0"):
            chat.since(-1)
        with pytest.raises(ValueError, match="seq >= 0"):
            registry.read("a").since(-1)
        with pytest.raises(TypeError, match=r"takes a store .* open it first"):
            list_sessions(str(tmp_path / "x.db"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="takes a store"):
            list_sessions(None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="session_id must be a str"):
            registry.restart_count(5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="passivate_idle"):
            registry.passivate_idle("x")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="force"):
            chat.compact(Compactor(budget=10**6), force="no")  # type: ignore[arg-type]
        assert [e.seq for e in chat.since(0).get(timeout=BOUND)] == [0]
        assert [i.session_id for i in list_sessions(store)] == ["a"]
    finally:
        registry.close()
        store.close()
