"""NousSessionService's calls as ADK's database service makes them, one transaction each:
a call killed part-way (after its session-log commit, before its ``app:``/``user:`` state
or directory writes) is completed by the next read of that session (roll-forward), never
over a newer value and never twice; state values JSON cannot store (NaN, infinities) are
refused before anything is written; an equal event appended again is stored once.

A death is simulated in this process (the write after the session-log commit raises, and
a fresh service, as a new process would, reads the store), and is real in one test (a
child process SIGKILLs itself at that point). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bounds import INTERPRETER_BOUND, run
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from nous_actor import Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk.ids import app_key, directory_key, session_key, user_key
from nous_actor.integrations.adk.records import RECORD_KEY
from nous_actor.integrations.adk.state import _ScopedState


class Killed(Exception):
    """The death of the writing process, at the write that raises it."""


def text(t: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=t)])


def adk_event(t: str, delta: dict[str, Any] | None = None, ts: float = 1.0) -> Event:
    return Event(
        author="user", timestamp=ts, content=text(t), actions=EventActions(state_delta=delta or {})
    )


def die_at(monkeypatch: pytest.MonkeyPatch, method: str, deleted_only: bool = False) -> None:
    """Make `_ScopedState.<method>` raise `Killed` (with ``deleted_only``: only a deletion's
    directory write), as if the process died there."""
    original = getattr(_ScopedState, method)

    async def dying(self: _ScopedState, *args: Any, **kwargs: Any) -> Any:
        if not deleted_only or kwargs.get("deleted"):
            raise Killed(method)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(_ScopedState, method, dying)


async def records(sessions: Sessions, key: str, op: str) -> list[dict[str, Any]]:
    """The service's records of ``op`` in session ``key``'s log."""
    events = await sessions.read(key).events()
    found = []
    for ev in events:
        rec = ev.data.get(RECORD_KEY) if isinstance(ev.data, dict) else None
        if rec is not None and rec.get("op") == op:
            found.append(dict(rec))
    return found


async def listed(service: NousSessionService, user: str = "u") -> dict[str, dict[str, Any]]:
    return {
        s.id: dict(s.state)
        for s in (await service.list_sessions(app_name="a", user_id=user)).sessions
    }


# -- 1. a call killed after its session-log commit is rolled forward -----------------------


@pytest.mark.parametrize("first", ["get", "list", "append"])
def test_killed_append_is_completed_by_the_next_read(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """An append killed before its app/user state and directory writes: the next read of
    the session (whichever comes first) writes them, once."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        s = await writer.create_session(
            app_name="a", user_id="u", session_id="s", state={"user:n": 0}
        )
        with monkeypatch.context() as m:
            die_at(m, "write_scoped")
            with pytest.raises(Killed):
                await writer.append_event(s, adk_event("q", {"user:n": 1, "app:m": 1, "own": 1}))
        reader = NousSessionService(sessions)  # a fresh process's service
        if first == "list":
            assert await listed(reader) == {"s": {"own": 1, "user:n": 1, "app:m": 1}}
        elif first == "append":
            fresh = await reader.get_session(app_name="a", user_id="u", session_id="s")
            assert fresh is not None
            await reader.append_event(fresh, adk_event("next", {"k": 2}, ts=2.0))
        got = await reader.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert got.state["user:n"] == 1
        assert got.state["app:m"] == 1
        assert got.state["own"] == 1
        assert got.events[0].actions.state_delta == {"user:n": 1, "app:m": 1, "own": 1}
        assert (await listed(reader))["s"]["own"] == 1
        assert await reader.get_user_state(app_name="a", user_id="u") == {"n": 1}
        # Read again, by a third service: nothing is written twice.
        again = NousSessionService(sessions)
        assert await again.get_session(app_name="a", user_id="u", session_id="s") is not None
        expected = {"own": 1, "user:n": 1, "app:m": 1} | ({"k": 2} if first == "append" else {})
        assert await listed(again) == {"s": expected}
        # The create's and the append's, each written once:
        assert len(await records(sessions, user_key("a", "u"), "state")) == 2
        assert len(await records(sessions, app_key("a"), "state")) == 1

    run(body())


def test_killed_append_after_its_state_writes_gets_its_directory_entry(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append killed between its state writes and its directory write: the next read
    writes the directory entry, and the state it wrote already is not written again."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        s = await writer.create_session(app_name="a", user_id="u", session_id="s")
        with monkeypatch.context() as m:
            die_at(m, "write_directory")
            with pytest.raises(Killed):
                await writer.append_event(s, adk_event("q", {"user:n": 1, "own": 1}))
        reader = NousSessionService(sessions)
        assert await listed(reader) == {"s": {"own": 1, "user:n": 1}}
        assert len(await records(sessions, user_key("a", "u"), "state")) == 1

    run(body())


def test_killed_create_is_completed_and_cannot_be_created_again(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create killed after its create record: its ``user:`` state is not lost, it is
    listed, and creating it again is refused as for any existing session."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        with monkeypatch.context() as m:
            die_at(m, "write_scoped")
            with pytest.raises(Killed):
                await writer.create_session(
                    app_name="a", user_id="u", session_id="c", state={"user:n": 5, "own": 1}
                )
        reader = NousSessionService(sessions)
        with pytest.raises(AlreadyExistsError):
            await reader.create_session(app_name="a", user_id="u", session_id="c")
        got = await reader.get_session(app_name="a", user_id="u", session_id="c")
        assert got is not None
        assert got.state == {"own": 1, "user:n": 5}
        assert await listed(reader) == {"c": {"own": 1, "user:n": 5}}
        assert await reader.get_user_state(app_name="a", user_id="u") == {"n": 5}

    run(body())


@pytest.mark.parametrize("first", ["get", "list", "delete"])
def test_killed_delete_leaves_no_ghost(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """A delete killed before its directory write: the session is gone from listings too,
    deleting it again does nothing, and its id may be created again."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        await writer.create_session(app_name="a", user_id="u", session_id="d")
        await writer.create_session(app_name="a", user_id="u", session_id="other")
        with monkeypatch.context() as m:
            die_at(m, "write_directory", deleted_only=True)
            with pytest.raises(Killed):
                await writer.delete_session(app_name="a", user_id="u", session_id="d")
        reader = NousSessionService(sessions)
        if first == "get":
            assert await reader.get_session(app_name="a", user_id="u", session_id="d") is None
        elif first == "delete":
            await reader.delete_session(app_name="a", user_id="u", session_id="d")
        assert list(await listed(reader)) == ["other"]
        assert list(await listed(NousSessionService(sessions))) == ["other"]
        assert len(await records(sessions, directory_key("a", "u"), "session_deleted")) == 1
        await reader.create_session(app_name="a", user_id="u", session_id="d")
        assert sorted(await listed(reader)) == ["d", "other"]

    run(body())


def test_roll_forward_never_overwrites_a_newer_value(
    sessions: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed append's ``user:`` key written since by another session keeps that newer
    value when the append is completed; its other keys are written."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        s = await writer.create_session(app_name="a", user_id="u", session_id="s")
        with monkeypatch.context() as m:
            die_at(m, "write_scoped")
            with pytest.raises(Killed):
                await writer.append_event(s, adk_event("q", {"user:n": 1, "user:x": 1}))
        other = NousSessionService(sessions)
        o = await other.create_session(app_name="a", user_id="u", session_id="o")
        await other.append_event(o, adk_event("newer", {"user:n": 7}))
        reader = NousSessionService(sessions)
        got = await reader.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert got.state == {"user:n": 7, "user:x": 1}
        assert await reader.get_user_state(app_name="a", user_id="u") == {"n": 7, "x": 1}

    run(body())


def test_roll_forward_beside_a_live_call_writes_once(sessions: Sessions) -> None:
    """A read while a live call is between its session-log commit and its state write
    completes that call; the call then writes nothing twice."""

    async def body() -> None:
        writer = NousSessionService(sessions)
        s = await writer.create_session(app_name="a", user_id="u", session_id="s")
        entered, release = asyncio.Event(), asyncio.Event()
        original = _ScopedState.write_scoped

        async def paused(self: _ScopedState, *args: Any, **kwargs: Any) -> Any:
            entered.set()
            await release.wait()
            return await original(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(_ScopedState, "write_scoped", paused)
            call = asyncio.ensure_future(
                writer.append_event(s, adk_event("q", {"user:n": 1, "own": 1}))
            )
            await asyncio.wait_for(entered.wait(), 10)
            m.undo()
            reader = NousSessionService(sessions)
            got = await reader.get_session(app_name="a", user_id="u", session_id="s")
            assert got is not None
            assert got.state == {"own": 1, "user:n": 1}
            release.set()
            await call
        assert s.state == {"own": 1, "user:n": 1}
        assert len(await records(sessions, user_key("a", "u"), "state")) == 1
        assert await listed(NousSessionService(sessions)) == {"s": {"own": 1, "user:n": 1}}

    run(body())


CHILD = """
import asyncio, os, signal, sys
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from nous_actor import Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk.state import _ScopedState

path, mode = sys.argv[1], sys.argv[2]

async def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    store = SQLiteStore(path)
    registry = Sessions(store, timeout=20)
    service = NousSessionService(registry)
    s = await service.create_session(
        app_name="a", user_id="u", session_id="s", state={"user:n": 0}
    )
    _ScopedState.write_scoped = kill
    if mode == "delete":
        _ScopedState.write_directory = kill
        await service.delete_session(app_name="a", user_id="u", session_id="s")
    elif mode == "create":
        await service.create_session(
            app_name="a", user_id="u", session_id="c", state={"user:n": 5}
        )
    else:
        event = Event(
            author="user", timestamp=1.0,
            content=types.Content(role="user", parts=[types.Part(text="q")]),
            actions=EventActions(state_delta={"user:n": 1, "own": 1}),
        )
        await service.append_event(s, event)
    print("not killed", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["append", "create", "delete"])
def test_sigkill_after_the_session_log_commit_is_rolled_forward(tmp_path: Path, mode: str) -> None:
    """A child process SIGKILLed right after a call's session-log commit: a fresh process
    sees the call completed (append, create) or the session gone everywhere (delete)."""
    path = tmp_path / "adk.db"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), mode],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert os.path.exists(path)

    async def body() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        service = NousSessionService(registry)
        try:
            seen = await listed(service)
            users = await service.get_user_state(app_name="a", user_id="u")
            if mode == "append":
                assert seen == {"s": {"own": 1, "user:n": 1}}
                assert users == {"n": 1}
            elif mode == "create":
                assert seen == {"s": {"user:n": 5}, "c": {"user:n": 5}}
                assert users == {"n": 5}
                with pytest.raises(AlreadyExistsError):
                    await service.create_session(app_name="a", user_id="u", session_id="c")
            else:
                assert seen == {}
                assert await service.get_session(app_name="a", user_id="u", session_id="s") is None
        finally:
            await registry.aclose()
            store.close()

    run(body())


# -- 2. values JSON cannot store are refused before anything is written --------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_state_values_are_refused_up_front(sessions: Sessions, value: float) -> None:
    """A NaN or infinite state value is the documented TypeError, nothing of the call
    stored: in create_session's state and in an event's state delta, nested too."""

    async def body() -> None:
        service = NousSessionService(sessions)
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await service.create_session(
                app_name="a", user_id="u", session_id="c", state={"user:score": value}
            )
        assert await service.get_session(app_name="a", user_id="u", session_id="c") is None
        assert await service.get_user_state(app_name="a", user_id="u") == {}
        assert await run_count(sessions, session_key("a", "u", "c")) == 0
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        before = await run_count(sessions, session_key("a", "u", "s"))
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await service.append_event(s, adk_event("q", {"score": {"deep": [value]}}))
        assert await run_count(sessions, session_key("a", "u", "s")) == before
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert got.events == []
        assert got.state == {}

    run(body())


async def run_count(sessions: Sessions, key: str) -> int:
    """How many events session ``key``'s log holds (0: none stored)."""
    return await sessions.read(key).count()


# -- 3. an equal event appended again is stored once ---------------------------------------


def test_equal_event_appended_again_is_stored_once(sessions: Sessions) -> None:
    """An event appended again (a retried call), by the same object or by a fresh one, is
    returned as is and not stored again; its state delta is not applied twice."""

    async def body() -> None:
        service = NousSessionService(sessions)
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        e = adk_event("hi", {"n": 1, "user:n": 1})
        assert await service.append_event(s, e) is e
        assert await service.append_event(s, e) is e
        fresh = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert fresh is not None
        copy = e.model_copy(deep=True)
        assert await NousSessionService(sessions).append_event(fresh, copy) is copy
        assert [ev.id for ev in fresh.events] == [e.id]
        assert [ev.id for ev in s.events] == [e.id]
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [ev.id for ev in got.events] == [e.id]
        assert len(await records(sessions, user_key("a", "u"), "state")) == 1

    run(body())


def test_event_with_a_stored_id_but_other_content_is_kept(sessions: Sessions) -> None:
    """An event carrying a stored event's id with other content is another event (as ADK's
    in-memory service keeps it): it is stored."""

    async def body() -> None:
        service = NousSessionService(sessions)
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        e = adk_event("hi", {"n": 1})
        await service.append_event(s, e)
        other = adk_event("other", {"n": 2}, ts=2.0)
        other.id = e.id
        await service.append_event(s, other)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [ev.id for ev in got.events] == [e.id, e.id]
        assert got.state == {"n": 2}

    run(body())
