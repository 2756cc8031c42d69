"""The edges of NousSessionService's roll-forward (a call killed after its session-log
commit is completed by the next read): appends of one session killed all half-done, logs
written before calls were tagged for it, the reads that complete a call, and an event
appended twice at once (a retry racing the original); then what races an append from
another service (a delete), and configs of get_session that have no answer.

A kill is real (a child process SIGKILLs itself once its calls are half-done; the order
they interleave in is fixed by barriers inside that child), except in the property test,
which simulates it in this process (the state write raises) for many examples. Every wait
is bounded.
"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bounds import INTERPRETER_BOUND, run
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import EventType, MemoryStore, Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk.events import event_data
from nous_actor.integrations.adk.framework import SessionNotFoundError, StaleSessionError
from nous_actor.integrations.adk.ids import app_key, directory_key, session_key, user_key
from nous_actor.integrations.adk.records import RECORD_KEY, STATE_KEY
from nous_actor.integrations.adk.state import _ScopedState


def adk_event(t: str, delta: dict[str, Any] | None = None, ts: float = 1.0) -> Event:
    return Event(
        author="user",
        timestamp=ts,
        content=types.Content(role="user", parts=[types.Part(text=t)]),
        actions=EventActions(state_delta=delta or {}),
    )


async def records(sessions: Sessions, key: str, op: str) -> list[dict[str, Any]]:
    """The service's records of ``op`` in session ``key``'s log."""
    found = []
    for ev in await sessions.read(key).events():
        rec = ev.data.get(RECORD_KEY) if isinstance(ev.data, dict) else None
        if rec is not None and rec.get("op") == op:
            found.append(dict(rec))
    return found


async def listed(service: NousSessionService, user: str = "u") -> dict[str, dict[str, Any]]:
    return {
        s.id: dict(s.state)
        for s in (await service.list_sessions(app_name="a", user_id=user)).sessions
    }


# -- 1. two appends of one session, both half-done when the process is killed -------------

TWO_APPENDS = """
import asyncio, os, signal, sys
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from nous_actor import Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk.state import _ScopedState

path = sys.argv[1]
seen_original = _ScopedState.seen

async def main():
    store = SQLiteStore(path)
    registry = Sessions(store, timeout=20)
    first, second = NousSessionService(registry), NousSessionService(registry)
    await first.create_session(app_name="a", user_id="u", session_id="s", state={"user:n": 0})
    s1 = await first.get_session(app_name="a", user_id="u", session_id="s")
    s2 = await second.get_session(app_name="a", user_id="u", session_id="s")
    both_seen, both_written = asyncio.Barrier(2), asyncio.Barrier(2)

    async def seen(self, *args, **kwargs):  # both read the user's log before either writes
        got = await seen_original(self, *args, **kwargs)
        await asyncio.wait_for(both_seen.wait(), 20)
        return got

    async def kill(*args, **kwargs):  # both events are in the session's log: die
        await asyncio.wait_for(both_written.wait(), 20)
        os.kill(os.getpid(), signal.SIGKILL)

    _ScopedState.seen = seen
    _ScopedState.write_scoped = kill

    def event(n, ts):
        return Event(
            author="user", timestamp=ts,
            content=types.Content(role="user", parts=[types.Part(text=f"q{n}")]),
            actions=EventActions(state_delta={"user:n": n, "app:m": n, "own": n}),
        )

    await asyncio.gather(
        first.append_event(s1, event(1, 1.0)), second.append_event(s2, event(2, 2.0))
    )
    print("not killed", flush=True)

asyncio.run(main())
"""


def test_two_appends_killed_half_done_end_with_the_later_one(tmp_path: Path) -> None:
    """Two appends of one session, each killed after its event and before its ``user:``
    and ``app:`` writes (a real SIGKILL): the next read completes both in the order of the
    session's log, so the state holds the later event's values (as ADK's database service
    commits them, one transaction after the other), not the earlier one's."""
    path = tmp_path / "adk.db"
    child = subprocess.run(
        [sys.executable, "-c", TWO_APPENDS, str(path)],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    async def body() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        try:
            service = NousSessionService(registry)
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            assert got is not None
            assert len(got.events) == 2
            last = got.events[-1].actions.state_delta["own"]
            assert got.state == {"own": last, "user:n": last, "app:m": last}
            assert await service.get_user_state(app_name="a", user_id="u") == {"n": last}
            fresh = NousSessionService(registry)
            assert await listed(fresh) == {"s": {"own": last, "user:n": last, "app:m": last}}
            # Each event's parts written once (and the create's user part):
            assert len(await records(registry, user_key("a", "u"), "state")) == 3
            assert len(await records(registry, app_key("a"), "state")) == 2
        finally:
            await registry.aclose()
            store.close()

    run(body())


class Killed(Exception):
    """The death of the writing process, at the write that raises it (in-process)."""


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["user:a", "user:b", "app:c", "own"]),
            st.integers(0, 9),
            min_size=1,
        ).filter(lambda d: any(":" in k for k in d)),
        min_size=2,
        max_size=4,
    )
)
def test_appends_killed_half_done_together_complete_in_log_order(
    deltas: list[dict[str, int]],
) -> None:
    """Any number of appends of one session (each from a service of its own, as from
    worker processes), each with ``app:``/``user:`` keys and killed after its event and
    before its state writes (simulated here, all of them half-done at once): the next
    read gives the state that folding the events' deltas in the log's order gives."""
    store = MemoryStore()
    registry = Sessions(store, timeout=20)

    async def body() -> None:
        await NousSessionService(registry).create_session(
            app_name="a", user_id="u", session_id="s"
        )
        services = [NousSessionService(registry) for _ in deltas]
        objects = [
            await service.get_session(app_name="a", user_id="u", session_id="s")
            for service in services
        ]
        all_seen = asyncio.Barrier(len(deltas))
        original = _ScopedState.seen

        async def seen(self: _ScopedState, *args: Any, **kwargs: Any) -> Any:
            got = await original(self, *args, **kwargs)
            await asyncio.wait_for(all_seen.wait(), 20)  # none writes before all read
            return got

        async def die(self: _ScopedState, *args: Any, **kwargs: Any) -> Any:
            raise Killed

        with pytest.MonkeyPatch.context() as m:
            m.setattr(_ScopedState, "seen", seen)
            m.setattr(_ScopedState, "write_scoped", die)
            calls = [
                service.append_event(obj, adk_event(f"e{i}", dict(delta), ts=float(i + 1)))
                for i, (service, obj, delta) in enumerate(
                    zip(services, objects, deltas, strict=True)
                )
                if obj is not None
            ]
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
        assert all(isinstance(r, Killed) for r in results), results
        got = await NousSessionService(registry).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert got is not None
        expected: dict[str, Any] = {}
        for ev in got.events:
            expected.update(ev.actions.state_delta)
        assert got.state == expected
        user = {k.removeprefix("user:"): v for k, v in expected.items() if k.startswith("user:")}
        assert await NousSessionService(registry).get_user_state(app_name="a", user_id="u") == user

    try:
        run(body())
    finally:
        registry.close()
        store.close()


# -- 4. the same event appended twice at once (a retry racing the original) ----------------


@pytest.mark.parametrize("delta", [{}, {"n": 1, "user:k": 1}])
@pytest.mark.parametrize("services", ["one", "two"])
def test_an_event_appended_twice_at_once_is_stored_once(
    sessions: Sessions, delta: dict[str, Any], services: str
) -> None:
    """An append and its retry racing it (the same event: same id, equal), by one service
    or by two (two worker processes' services): stored once, its delta applied once, and
    each object holds it once."""

    async def body() -> None:
        one = NousSessionService(sessions)
        other = one if services == "one" else NousSessionService(sessions)
        await one.create_session(app_name="a", user_id="u", session_id="s")
        s1 = await one.get_session(app_name="a", user_id="u", session_id="s")
        s2 = await other.get_session(app_name="a", user_id="u", session_id="s")
        assert s1 is not None
        assert s2 is not None
        e = adk_event("hi", dict(delta))
        copy = e.model_copy(deep=True)
        await asyncio.wait_for(
            asyncio.gather(one.append_event(s1, e), other.append_event(s2, copy)), 20
        )
        got = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert got is not None
        assert [ev.id for ev in got.events] == [e.id]
        assert [ev.id for ev in s1.events] == [e.id]
        assert [ev.id for ev in s2.events] == [e.id]
        if delta:
            assert got.state == {"n": 1, "user:k": 1}
            assert len(await records(sessions, user_key("a", "u"), "state")) == 1

    run(body())


def test_distinct_events_appended_at_once_are_all_stored(sessions: Sessions) -> None:
    """Many different events appended at once to one session, from two services: every one
    is stored, once (the write that checks for a racing retry never drops another's)."""

    async def body() -> None:
        one, other = NousSessionService(sessions), NousSessionService(sessions)
        await one.create_session(app_name="a", user_id="u", session_id="s")
        s1 = await one.get_session(app_name="a", user_id="u", session_id="s")
        s2 = await other.get_session(app_name="a", user_id="u", session_id="s")
        assert s1 is not None
        assert s2 is not None
        events = [adk_event(f"m{i}", ts=float(i)) for i in range(24)]
        calls = [
            (one if i % 2 else other).append_event(s1 if i % 2 else s2, e)
            for i, e in enumerate(events)
        ]
        await asyncio.wait_for(asyncio.gather(*calls), 60)
        got = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert got is not None
        assert sorted(ev.id for ev in got.events) == sorted(e.id for e in events)

    run(body())


# -- 3. the recent-events read completes a killed call's app: and user: state -------------

KILLED_APPEND = """
import asyncio, os, signal, sys
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from nous_actor import Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk.state import _ScopedState

path = sys.argv[1]

def event(t, delta, ts):
    return Event(
        author="user", timestamp=ts,
        content=types.Content(role="user", parts=[types.Part(text=t)]),
        actions=EventActions(state_delta=delta),
    )

async def kill(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    store = SQLiteStore(path)
    registry = Sessions(store, timeout=20)
    service = NousSessionService(registry)
    s = await service.create_session(
        app_name="a", user_id="u", session_id="s", state={"user:n": 0}
    )
    for i in range(300):  # past a checkpoint: the recent read starts from that
        await service.append_event(s, event(f"m{i}", {"k": i}, float(i)))
    _ScopedState.write_scoped = kill
    await service.append_event(s, event("last", {"user:n": 1, "app:m": 1, "own": 1}, 1e6))
    print("not killed", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("recent", [0, 1, 5])
def test_a_recent_events_read_completes_a_killed_append(tmp_path: Path, recent: int) -> None:
    """A process SIGKILLed after an append's session-log commit, before its ``user:`` and
    ``app:`` writes: a fresh process's first read, of the latest events only, gives the
    append's state (as a whole read does), and the user's state holds it after."""
    path = tmp_path / "adk.db"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_APPEND, str(path)],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    async def body() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        try:
            service = NousSessionService(registry)
            got = await service.get_session(
                app_name="a",
                user_id="u",
                session_id="s",
                config=GetSessionConfig(num_recent_events=recent),
            )
            assert got is not None
            assert len(got.events) == recent
            assert got.state == {"k": 299, "own": 1, "user:n": 1, "app:m": 1}
            assert await service.get_user_state(app_name="a", user_id="u") == {"n": 1}
            whole = await NousSessionService(registry).get_session(
                app_name="a", user_id="u", session_id="s"
            )
            assert whole is not None
            assert whole.state == got.state
            assert await listed(NousSessionService(registry)) == {"s": got.state}
            # The create's user part and the append's: each written once.
            assert len(await records(registry, user_key("a", "u"), "state")) == 2
            assert len(await records(registry, app_key("a"), "state")) == 1
        finally:
            await registry.aclose()
            store.close()

    run(body())


# -- 2. logs written before calls were tagged read as they did -----------------------------


def test_logs_of_an_untagged_release_read_unchanged(sessions: Sessions) -> None:
    """Sessions written by a release before calls carried their ``app:``/``user:`` parts:
    no completion tag on any event, state records naming no source, directory entries
    written only when a session's own state changed (so its later events have none). They
    read as written: the state and user state unchanged (a ``user:`` key another session
    wrote later keeps that value), every session listed with its state, nothing of their
    state written again; a recent-events read and a whole read agree."""

    async def body() -> None:
        t = datetime(2026, 1, 1, tzinfo=UTC)

        async def write(key: str, items: list[tuple[EventType, dict[str, Any]]]) -> None:
            handle = await sessions.aopen(key)
            await handle.append_many([(et, data, t) for et, data in items])

        def rec(op: dict[str, Any]) -> tuple[EventType, dict[str, Any]]:
            return EventType.REQUEST_HEADER, {RECORD_KEY: op}

        def old_event(text: str, delta: dict[str, Any], ts: float) -> tuple[EventType, Any]:
            e = adk_event(text, delta, ts)
            etype, data = event_data(e)
            own = {k: v for k, v in delta.items() if ":" not in k}
            if own:
                data[STATE_KEY] = own
            return etype, data

        # Session "s": created with user:n=1, an event with user:n=2 and own x=1, then
        # one without state (no directory entry), then one with user:n=3 only.
        await write(
            session_key("a", "u", "s"),
            [
                rec({"op": "create", "state": {"own": 0}}),
                old_event("one", {"user:n": 2, "x": 1}, 10.0),
                old_event("two", {}, 11.0),
                old_event("three", {"user:n": 3}, 12.0),
            ],
        )
        # Session "o" wrote user:n=9 after all of s's writes.
        await write(
            session_key("a", "u", "o"),
            [rec({"op": "create", "state": {}}), old_event("o1", {"user:n": 9}, 20.0)],
        )
        await write(
            user_key("a", "u"),
            [
                rec({"op": "state", "delta": {"n": 1}}),
                rec({"op": "state", "delta": {"n": 2}}),
                rec({"op": "state", "delta": {"n": 3}}),
                rec({"op": "state", "delta": {"n": 9}}),
            ],
        )
        await write(
            directory_key("a", "u"),
            [
                rec({"op": "session", "id": "s", "seq": 0, "state": {"own": 0}}),
                rec({"op": "session", "id": "s", "seq": 1, "state": {"own": 0, "x": 1}}),
                rec({"op": "session", "id": "o", "seq": 0, "state": {}}),
            ],
        )
        user_records = len(await records(sessions, user_key("a", "u"), "state"))
        service = NousSessionService(sessions)
        recent = await service.get_session(
            app_name="a", user_id="u", session_id="s", config=GetSessionConfig(num_recent_events=1)
        )
        assert recent is not None
        assert recent.state == {"own": 0, "x": 1, "user:n": 9}
        assert await listed(service) == {
            "s": {"own": 0, "x": 1, "user:n": 9},
            "o": {"user:n": 9},
        }
        got = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert got is not None
        assert got.state == {"own": 0, "x": 1, "user:n": 9}
        assert [e.content.parts[0].text for e in got.events] == ["one", "two", "three"]
        assert await service.get_user_state(app_name="a", user_id="u") == {"n": 9}
        assert len(await records(sessions, user_key("a", "u"), "state")) == user_records
        assert await records(sessions, app_key("a"), "state") == []
        # The missing directory entries (of each session's events after its last own
        # state change) are written once, by the first reader; later readers write none.
        entries = await records(sessions, directory_key("a", "u"), "session")
        assert len(entries) == 5
        assert {(e["id"], e["seq"], e.get("ts")) for e in entries[3:]} == {
            ("s", 3, 12.0),
            ("o", 1, 20.0),
        }
        for reader in (service, NousSessionService(sessions)):
            await reader.get_session(app_name="a", user_id="u", session_id="s")
            await listed(reader)
        assert len(await records(sessions, directory_key("a", "u"), "session")) == 5

    run(body())


@pytest.mark.parametrize("racing", [False, True])
def test_an_object_given_a_stored_event_writes_on_after_it(
    sessions: Sessions, racing: bool
) -> None:
    """A retried append (its first try stored by another object, before it or racing it)
    gives the object the event and what it wrote: the object's next write of those keys
    is not refused as stale, while an object that did not see that write still is."""

    async def body() -> None:
        service = NousSessionService(sessions)
        await service.create_session(app_name="a", user_id="u", session_id="s")
        s1 = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert s1 is not None
        s2_service = NousSessionService(sessions)
        s2 = await s2_service.get_session(app_name="a", user_id="u", session_id="s")
        assert s2 is not None
        s3 = await s2_service.get_session(app_name="a", user_id="u", session_id="s")
        assert s3 is not None
        e = adk_event("hi", {"n": 1, "user:c": 1})
        copy = e.model_copy(deep=True)
        if racing:
            await asyncio.wait_for(
                asyncio.gather(service.append_event(s1, e), s2_service.append_event(s2, copy)),
                20,
            )
        else:
            await service.append_event(s1, e)
            await s2_service.append_event(s2, copy)
        assert [ev.id for ev in s2.events] == [e.id]
        assert s2.state == {"n": 1, "user:c": 1}
        await s2_service.append_event(s2, adk_event("next", {"n": 2, "user:c": 2}, ts=2.0))
        got = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="s"
        )
        assert got is not None
        assert got.state == {"n": 2, "user:c": 2}
        assert [ev.content.parts[0].text for ev in got.events] == ["hi", "next"]
        with pytest.raises(StaleSessionError):  # s3 saw neither write
            await s2_service.append_event(s3, adk_event("old", {"user:c": 3}, ts=3.0))

    run(body())


# -- bad inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"after_timestamp": math.nan}, "after_timestamp is NaN"),
        ({"num_recent_events": -1}, "num_recent_events must be at least 0"),
        ({"num_recent_events": -1, "after_timestamp": 1.0}, "num_recent_events must be"),
    ],
)
def test_a_get_session_config_without_an_answer_is_refused(
    sessions: Sessions, fields: dict[str, Any], message: str
) -> None:
    """A ``GetSessionConfig`` whose filter has no answer (a NaN time, which no timestamp
    is at or after, yet ADK's in-memory service gives every event for; a negative count,
    which ADK's own config refuses and a built one bypasses) is a ValueError saying what
    to give, by a service that read the session before and by a fresh one alike."""

    async def body() -> None:
        service = NousSessionService(sessions)
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        await service.append_event(s, adk_event("hi"))
        config = GetSessionConfig.model_construct(**fields)
        for reader in (service, NousSessionService(sessions)):
            with pytest.raises(ValueError, match=message):
                await reader.get_session(app_name="a", user_id="u", session_id="s", config=config)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert len(got.events) == 1

    run(body())


# -- a delete landing between an append's read and its write --------------------------------


def test_an_append_outpaced_by_a_delete_stores_nothing(sessions: Sessions) -> None:
    """A delete (by another service, as from another worker process) that lands after an
    append read the session and before it wrote: the append raises SessionNotFoundError
    and stores nothing, so the deleted session is not listed again, nor its ``user:`` keys
    written; its id may be created again, empty."""

    async def body() -> None:
        writer, deleter = NousSessionService(sessions), NousSessionService(sessions)
        s = await writer.create_session(app_name="a", user_id="u", session_id="s")
        original = _ScopedState.seen
        deleted = False

        async def seen(self: _ScopedState, *args: Any, **kwargs: Any) -> Any:
            nonlocal deleted
            if not deleted:
                deleted = True
                await deleter.delete_session(app_name="a", user_id="u", session_id="s")
            return await original(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(_ScopedState, "seen", seen)
            with pytest.raises(SessionNotFoundError):
                await writer.append_event(s, adk_event("late", {"user:n": 1, "own": 1}))
        assert deleted
        fresh = NousSessionService(sessions)
        assert await listed(fresh) == {}
        assert await fresh.get_session(app_name="a", user_id="u", session_id="s") is None
        assert await fresh.get_user_state(app_name="a", user_id="u") == {}
        again = await fresh.create_session(app_name="a", user_id="u", session_id="s")
        assert again.state == {}
        assert await listed(NousSessionService(sessions)) == {"s": {}}

    run(body())
