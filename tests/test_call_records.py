"""The one ambiguous case of a forwarded call, made checkable.

A call sent to the process holding a session gets no answer when that process dies
after taking it: the caller gets `CallOutcomeUnknown` with the call's id, and
``session.applied(call_id)`` answers, from the session's next holder, with the seqs
the call appended or ``None``. The holder records the id in the transaction of the
call's events (the stores' ``write(..., calls=)``, ``applied_call``).

The faults are real: the holder process SIGKILLs itself inside its store's write,
once just before the transaction and once just after its commit, so that in both
cases the call was taken and never answered.
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND, end_child
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import (
    CALL_RECORD_SECONDS,
    CallOutcomeUnknown,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SQLiteStore,
)
from nous_actor.core.event import check_event
from nous_actor.core.log import _utcnow, new_event
from nous_actor.errors import StoreError
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.future import ForwardedFuture
from nous_actor.store import memory as memory_module
from nous_actor.store.sqlite import store as sqlite_module

ROOT = Path(__file__).resolve().parent.parent

# -- the stores' records ---------------------------------------------------------------------


def _events(first: int, n: int) -> list[Any]:
    return [
        new_event(first + k, "user_message", {"content": f"m{first + k}"}, None) for k in range(n)
    ]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        store: Any = MemoryStore()
    elif request.param == "sqlite":
        store = SQLiteStore(tmp_path / "calls.db")
    else:
        store = request.getfixturevalue("pg_stores")()
    try:
        yield store
    finally:
        store.close()


def test_a_write_records_its_calls_for_the_sessions_it_stored(any_store: Any) -> None:
    """Each call's first and last seq, for the sessions written; a session refused in the
    same write records none of its calls; an unknown id (or session) has no record."""
    assert any_store.write({"a": _events(0, 2), "b": _events(0, 1)}) == {}
    refused = any_store.write(
        {"a": _events(2, 3), "b": _events(0, 1)},  # b's seq 0 is stored: b is refused
        calls={"a": [("k-1", 2, 2), ("k-2", 3, 4)], "b": [("k-3", 0, 0)]},
    )
    assert set(refused) == {"b"}
    assert any_store.applied_call("a", "k-1") == (2, 2)
    assert any_store.applied_call("a", "k-2") == (3, 4)
    assert any_store.applied_call("b", "k-3") is None  # refused: not applied
    assert any_store.applied_call("a", "k-3") is None
    assert any_store.applied_call("nobody", "k-1") is None
    assert [e.seq for e in any_store.load("a")] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("rows", [3, 450])
def test_a_conflict_refuses_its_session_alone_in_a_write_of_any_size(
    any_store: Any, rows: int
) -> None:
    """A write of ``rows`` events and as many calls over three sessions (one statement, or
    several with SQLite's limit of rows per statement), one session's first seq already
    stored: that session alone is refused, with its calls; the others' events are stored
    once each, and every one of their calls is recorded."""
    assert any_store.write({"b": _events(0, 1)}) == {}
    per = rows // 3
    calls = {
        sid: [(f"{sid}-{k}", first + k, first + k) for k in range(per)]
        for sid, first in (("a", 0), ("c", 0), ("b", 0))
    }
    refused = any_store.write(
        # b's seq 0 is stored; its rows come last (with 450, in a later statement than
        # the first rows of the others)
        {sid: _events(0, per) for sid in ("a", "c", "b")},
        calls=calls,
    )
    assert set(refused) == {"b"}
    for sid in ("a", "c"):
        assert [e.seq for e in any_store.load(sid)] == list(range(per))
        assert [any_store.applied_call(sid, f"{sid}-{k}") for k in range(per)] == [
            (k, k) for k in range(per)
        ]
    assert [e.seq for e in any_store.load("b")] == [0]
    assert any_store.applied_call("b", "b-0") is None


def test_records_older_than_the_bound_are_forgotten_by_a_later_write(
    any_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record lives `CALL_RECORD_SECONDS` at least, and is forgotten after it (a store
    keeps no call forever); one within the bound stays."""
    any_store.write({"a": _events(0, 1)}, calls={"a": [("old", 0, 0)]})
    later = CALL_RECORD_SECONDS + 120
    if isinstance(any_store, MemoryStore):
        now = memory_module.scheduling.monotonic()
        monkeypatch.setattr(memory_module.scheduling, "monotonic", lambda: now + later)
    else:
        import time as time_module

        real = time_module.time
        module = sqlite_module if isinstance(any_store, SQLiteStore) else _postgres_module()
        monkeypatch.setattr(module.time, "time", lambda: real() + later)
    assert any_store.applied_call("a", "old") == (0, 0)  # not forgotten by reading
    any_store.write({"a": _events(1, 1)}, calls={"a": [("new", 1, 1)]})
    assert any_store.applied_call("a", "old") is None
    assert any_store.applied_call("a", "new") == (1, 1)


def _postgres_module() -> Any:
    from nous_actor.store.postgres import store as postgres_module

    return postgres_module


def test_local_appends_record_no_call(tmp_path: Path) -> None:
    """Only calls from another process carry an id: a process's own appends write no
    record (SQLite does not even make the table)."""
    import sqlite3

    with Sessions(SQLiteStore(tmp_path / "own.db")) as sessions:
        chat = sessions.open("chat")
        for i in range(20):
            chat.append("user_message", {"content": f"m{i}"}).get(timeout=BOUND)
    conn = sqlite3.connect(tmp_path / "own.db")
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert "calls" not in tables


def _sqlite_statements(store: SQLiteStore) -> list[str]:
    """The statements ``store``'s writing connection runs from now on, each named by its
    text up to its first parenthesis (SQLite traces a statement again at each step of a
    trigger it fires: one statement, however many times it is traced in a row)."""
    ran: list[str] = []

    def trace(sql: str) -> None:
        name = sql.split(" (")[0]
        if not name.startswith("--") and ran[-1:] != [name]:  # (a pragma function: not one)
            ran.append(name)

    store._connection.writer().set_trace_callback(trace)
    return ran


@pytest.mark.parametrize("view_made", [True, False])
def test_sqlite_a_write_of_forwarded_calls_is_one_statement_with_their_records(
    tmp_path: Path, view_made: bool
) -> None:
    """Once the calls' table is made (by the file's first forwarded call, a transaction),
    a write of known sessions' events with their calls' records is one statement (into
    the view whose trigger records each call with its events): the events and the
    records stored together, and a conflict in it stores neither (the transaction's way
    then refuses that session alone). A file whose calls' table came without the view (an
    earlier release's) gets it from the next write that forgets old records (and the
    write after it finds the schema changed, and looks again: a transaction)."""
    import sqlite3

    path = tmp_path / "calls.db"
    store = SQLiteStore(path)
    try:
        first = {"a": _events(0, 1), "b": _events(0, 1)}
        assert store.write(first, calls={"a": [("k0", 0, 0)]}) == {}
        if not view_made:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("DROP VIEW call_events")  # (its trigger goes with it)
            conn.close()
        store._forget_calls_at = 0  # the next write forgets old records: a transaction
        ran = _sqlite_statements(store)
        assert store.write({"a": _events(1, 1)}, calls={"a": [("k1", 1, 1)]}) == {}
        assert "INSERT INTO call_events" not in ran
        assert "BEGIN IMMEDIATE" in ran
        if not view_made:  # the schema changed since this store looked: it looks again
            ran = _sqlite_statements(store)
            assert store.write({"b": _events(1, 1)}, calls={"b": [("k1b", 1, 1)]}) == {}
            assert ran[0] == "INSERT INTO call_events"  # (stale: it wrote nothing)
            assert "BEGIN IMMEDIATE" in ran
        else:
            assert store.write({"b": _events(1, 1)}) == {}
        ran = _sqlite_statements(store)
        more = {"a": _events(2, 3), "b": _events(2, 1)}
        calls = {"a": [("k2", 2, 3), ("k3", 4, 4)], "b": [("k4", 2, 2)]}
        assert store.write(more, calls=calls) == {}
        assert ran == ["INSERT INTO call_events"]
        assert [store.applied_call("a", k) for k in ("k1", "k2", "k3")] == [(1, 1), (2, 3), (4, 4)]
        assert store.applied_call("b", "k4") == (2, 2)
        # b's seq 2 is stored: the one statement stores nothing, the transaction refuses b
        ran = _sqlite_statements(store)
        refused = store.write(
            {"a": _events(5, 1), "b": _events(2, 1)},
            calls={"a": [("k5", 5, 5)], "b": [("k6", 2, 2)]},
        )
        assert set(refused) == {"b"}
        assert ran[0] == "INSERT INTO call_events"
        assert "BEGIN IMMEDIATE" in ran
        assert store.applied_call("a", "k5") == (5, 5)
        assert store.applied_call("b", "k6") is None
        # No records given (an empty mapping): the plain statement, into the events' table
        ran = _sqlite_statements(store)
        assert store.write({"a": _events(6, 1)}, calls={}) == {}
        assert ran == ["INSERT INTO event_rows"]
        assert [e.seq for e in store.load("a")] == [0, 1, 2, 3, 4, 5, 6]
        assert [e.seq for e in store.load("b")] == [0, 1, 2]
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=12))
def test_an_actor_records_each_forwarded_calls_seqs_as_it_appended_them(sizes: list[int]) -> None:
    """Calls arriving with a `ForwardedFuture` (as the endpoint makes them), pipelined
    and of any size (append, append_many), each recorded with exactly the seqs it was
    answered with; local calls between them record nothing."""
    store = MemoryStore()
    with Sessions(store) as sessions:
        chat = sessions.open("chat")
        actor_ref = sessions._routes["chat"].ref
        assert actor_ref is not None

        futs: list[tuple[str, Any]] = []
        for k, size in enumerate(sizes):
            fut: ForwardedFuture[Any] = ForwardedFuture("chat", BOUND, f"t-{k}")
            parts = tuple(("user_message", {"content": f"{k}.{j}"}, None) for j in range(size))
            actor_ref.tell((SessionActor.h_append_many, (_checked(chat, parts),), fut))
            chat.append("user_message", {"content": f"local {k}"})  # no record
            futs.append((f"t-{k}", fut))
        for cid, fut in futs:
            seqs = tuple(ev.seq for ev in fut.get(timeout=BOUND))
            assert chat.applied(cid).get(timeout=BOUND) == seqs
        assert len(store._calls) == len(sizes)


def _checked(chat: Session, parts: tuple[Any, ...]) -> Any:
    """The checked, frozen parts ``append_many`` sends for ``parts``."""
    return tuple(check_event(0, t, _utcnow(), d) for t, d, _ in parts)


def test_applied_refuses_a_bad_id_before_sending() -> None:
    with Sessions(MemoryStore()) as sessions:
        chat = sessions.open("chat")
        with pytest.raises(TypeError, match="call_id"):
            chat.applied(7)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="empty"):
            chat.applied("")
        assert chat.applied("never-sent").get(timeout=BOUND) is None
        assert chat.count().get(timeout=BOUND) == 0


def test_a_store_without_records_says_so() -> None:
    """A store of the user's without ``applied_call``: the check fails with a
    `StoreError` that says what to do instead, and the session lives on."""

    class Plain(MemoryStore):
        applied_call = None  # type: ignore[assignment]

    with Sessions(Plain()) as sessions:
        chat = sessions.open("chat")
        with pytest.raises(StoreError, match="records no forwarded calls"):
            chat.applied("x-1").get(timeout=BOUND)
        assert chat.append("user_message", {"content": "still here"}).get(timeout=BOUND).seq == 0


def test_the_error_survives_a_trip_between_processes() -> None:
    import pickle

    err = CallOutcomeUnknown("chat", "went away", "abc-1f")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CallOutcomeUnknown
    assert (back.session_id, back.call_id, back.message) == ("chat", "abc-1f", "went away")
    assert isinstance(back, SessionCrashed)


# -- a holder killed between taking a call and answering it ---------------------------------

_HOLDER = r"""
import json, os, signal, sys
from nous_actor import Sessions, SQLiteStore

kind, where, when = sys.argv[1], sys.argv[2], sys.argv[3]
held = sys.argv[4] if len(sys.argv) > 4 else "chat"
if kind == "sqlite":
    base = SQLiteStore
    args = (where,)
    kwargs = {}
else:
    from nous_actor.store.postgres import PostgresStore as base
    dsn, schema = where.split("|")
    args = (dsn,)
    kwargs = {"schema": schema, "lease": 2.0}


def _fatal(data):
    return "fatal" in json.dumps(data)


class Dying(base):
    def write(self, appends, calls=None):
        fatal = any(_fatal(ev.data) for evs in appends.values() for ev in evs)
        if fatal and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)  # taken, never written
        out = super().write(appends, calls)
        if fatal:
            os.kill(os.getpid(), signal.SIGKILL)  # committed, never answered
        return out


sessions = Sessions(Dying(*args, **kwargs))
chat = sessions.open(held)
if held == "chat":
    chat.append("user_message", {"content": "held here"}).get()
else:
    chat.count().get()  # opened: held here
print("ready", flush=True)
sys.stdin.readline()
sessions.close()
"""


def _start_holder(kind: str, where: str, when: str, held: str = "chat") -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, kind, where, when, held],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: lines.put(out.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=BOUND)
    except queue.Empty:
        proc.kill()
        raise AssertionError("the holder did not start") from None
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the holder failed to start: {line!r}")
    return proc


def _reads_behind_a_killed_call(make_store: Callable[[], Any], kind: str, where: str) -> None:
    """Reads sent behind a write whose holder dies committing it were taken by the
    holder and never answered: each goes where the session is next (here, once the dead
    holder's claim is taken over) and is answered there, never with
    `CallOutcomeUnknown` (a read changed nothing); the write alone is ambiguous."""
    proc = _start_holder(kind, where, "after")
    try:
        with Sessions(make_store()) as sessions:
            chat = sessions.open("chat")
            assert sessions.live() == []  # held by the other process: forwarded
            assert chat.append("user_message", {"content": "one"}).get(timeout=BOUND).seq == 1
            call = chat.append("user_message", {"content": "fatal", "fatal": True})
            count, events = chat.count(), chat.events()
            asked = chat.applied("nobody-0")
            with pytest.raises(CallOutcomeUnknown) as info:
                call.get(timeout=BOUND)
            assert proc.wait(BOUND) == -9
            assert count.get(timeout=BOUND) == 3  # the write was committed, then the death
            assert [e.data["content"] for e in events.get(timeout=BOUND)] == [
                "held here",
                "one",
                "fatal",
            ]
            assert asked.get(timeout=BOUND) is None
            assert chat.applied(info.value.call_id).get(timeout=BOUND) == (2,)
            assert sessions.live() == ["chat"]
    finally:
        _end(proc)


def test_sqlite_reads_behind_a_call_whose_holder_died_are_answered_by_the_next(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "app.db")
    _reads_behind_a_killed_call(lambda: SQLiteStore(path), "sqlite", path)


def test_postgres_reads_behind_a_call_whose_holder_died_are_answered_by_the_next(
    pg_server: Any,
) -> None:
    _on_postgres(pg_server, _reads_behind_a_killed_call)


def _on_postgres(pg_server: Any, run: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """``run(make_store, "postgres", where, *args, **kwargs)`` on a fresh schema of the
    server (a holder's stores lease their claims for 2 s), dropped afterwards."""
    from nous_actor.store.postgres import PostgresStore

    schema = pg_server.fresh_schema()
    try:
        run(
            lambda: PostgresStore(pg_server.dsn, schema=schema, lease=2.0),
            "postgres",
            f"{pg_server.dsn}|{schema}",
            *args,
            **kwargs,
        )
    finally:
        pg_server.drop_schema(schema)


def _kill_mid_call(
    make_store: Callable[[], Any], kind: str, where: str, when: str, batch: bool
) -> None:
    proc = _start_holder(kind, where, when)
    try:
        with Sessions(make_store()) as sessions:
            chat = sessions.open("chat")
            assert sessions.live() == []  # held by the other process: forwarded
            assert chat.append("user_message", {"content": "one"}).get(timeout=BOUND).seq == 1
            fatal = {"content": "fatal", "fatal": True}
            call = (
                chat.append_many([("user_message", fatal)] * 3)
                if batch
                else chat.append("user_message", fatal)
            )
            with pytest.raises(CallOutcomeUnknown) as info:
                call.get(timeout=BOUND)
            assert proc.wait(BOUND) == -9
            err = info.value
            assert err.session_id == "chat"
            assert err.call_id in str(err)  # the message names what to ask
            seqs = chat.applied(err.call_id).get(timeout=BOUND)
            stored = sessions.read("chat").events().get(timeout=BOUND)
            contents = [e.data["content"] for e in stored]
            if when == "after":
                assert seqs == ((2, 3, 4) if batch else (2,))
                assert contents == ["held here", "one"] + ["fatal"] * len(seqs)
            else:
                assert seqs is None
                assert contents == ["held here", "one"]
            # Told "not applied", the caller sends it again; the session goes on here.
            again = chat.append("user_message", {"content": "next"}).get(timeout=BOUND)
            assert again.seq == len(stored)
            assert sessions.live() == ["chat"]
    finally:
        _end(proc)


@pytest.mark.parametrize("batch", [False, True], ids=["append", "append_many"])
@pytest.mark.parametrize("when", ["before", "after"], ids=["before_commit", "after_commit"])
def test_sqlite_a_holder_killed_mid_call_leaves_a_checkable_call(
    tmp_path: Path, when: str, batch: bool
) -> None:
    path = str(tmp_path / "app.db")
    _kill_mid_call(lambda: SQLiteStore(path), "sqlite", path, when, batch)


@pytest.mark.parametrize("when", ["before", "after"], ids=["before_commit", "after_commit"])
def test_postgres_a_holder_killed_mid_call_leaves_a_checkable_call(
    pg_server: Any, when: str
) -> None:
    _on_postgres(pg_server, _kill_mid_call, when, batch=True)


# -- the adapters never show the ambiguity --------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"], ids=["before_commit", "after_commit"])
def test_an_agents_session_stores_a_batch_once_when_its_holder_dies_mid_call(
    tmp_path: Path, when: str
) -> None:
    """`NousSession.add_items` to a session another process holds, which dies with the
    batch taken (just before its commit, or just after it): the call returns, and the
    batch is stored exactly once (looked up by its call's id, sent again only if it was
    not applied)."""
    agents = pytest.importorskip("nous_actor.integrations.openai_agents")
    path = str(tmp_path / "app.db")
    proc = _start_holder("sqlite", path, when)
    try:
        with Sessions(SQLiteStore(path)) as sessions:
            nous = agents.NousSession("chat", sessions)

            async def main() -> list[Any]:
                await nous.add_items([{"role": "user", "content": "one"}])
                await nous.add_items(
                    [
                        {"role": "user", "content": "fatal", "fatal": True},
                        {"role": "assistant", "content": "reply"},
                    ]
                )
                return await nous.get_items()

            items = asyncio.run(asyncio.wait_for(main(), BOUND))
            assert proc.wait(BOUND) == -9
            assert [i["content"] for i in items] == ["held here", "one", "fatal", "reply"]
    finally:
        _end(proc)


def test_an_adk_event_is_stored_once_when_its_holder_dies_after_the_commit(
    tmp_path: Path,
) -> None:
    """ADK's `append_event` through `NousSessionService` to a session another process
    holds, which dies right after committing the event: the call returns the event,
    stored once."""
    adk = pytest.importorskip("nous_actor.integrations.adk")
    from google.adk.events import Event as AdkEvent
    from google.genai import types

    path = str(tmp_path / "app.db")
    with Sessions(SQLiteStore(path)) as first:
        service = adk.NousSessionService(first)
        made = asyncio.run(service.create_session(app_name="app", user_id="u", session_id="s"))
        key = adk.session_key("app", "u", "s")
    proc = _start_holder("sqlite", path, "after", key)
    try:
        with Sessions(SQLiteStore(path)) as sessions:
            service = adk.NousSessionService(sessions)

            async def main() -> Any:
                session = await service.get_session(app_name="app", user_id="u", session_id="s")
                assert session is not None
                event = AdkEvent(
                    author="user",
                    invocation_id="inv-1",
                    content=types.Content(role="user", parts=[types.Part(text="fatal")]),
                    custom_metadata={"fatal": True},
                )
                await service.append_event(session, event)
                return await service.get_session(app_name="app", user_id="u", session_id="s")

            after = asyncio.run(asyncio.wait_for(main(), BOUND))
            assert proc.wait(BOUND) == -9
            texts = [e.content.parts[0].text for e in after.events if e.content]
            assert texts == ["fatal"]
            assert made.id == "s"
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[str]) -> None:
    end_child(proc, BOUND)
