"""The app's and each user's state logs are checkpointed as a session's log is: a fresh
service's read of a session whose events write ``app:`` and ``user:`` keys folds those
logs from their latest checkpoint, not from their first write, so the work of a cold read
is bounded however long the user's history grows; and the state read from a checkpoint
is the state a whole fold gives (the values, and what the roll-forward of a killed call
reads: each key's last write and the event it completes)."""

from __future__ import annotations

from typing import Any

import pytest
from bounds import run
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import MemoryStore, Sessions
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.adk import folds as adk_folds
from nous_actor.integrations.adk import records as adk_records
from nous_actor.integrations.adk import state as adk_state
from nous_actor.integrations.adk.folds import _StateView
from nous_actor.integrations.adk.ids import app_key, user_key
from nous_actor.integrations.adk.records import RECORD_KEY

EVERY = 8  # a checkpoint every this many writes of a state log (patched in: a short test)


@pytest.fixture
def every(monkeypatch: pytest.MonkeyPatch) -> int:
    for module in (adk_records, adk_state, adk_folds):
        if hasattr(module, "STATE_CHECKPOINT_EVERY"):
            monkeypatch.setattr(module, "STATE_CHECKPOINT_EVERY", EVERY)
    return EVERY


def scoped_event(i: int) -> Event:
    return Event(
        author="user",
        timestamp=1.0 + i,
        content=types.Content(role="user", parts=[types.Part(text=f"m{i}")]),
        actions=EventActions(state_delta={"user:t": i, f"user:k{i % 3}": i, "app:t": i, "own": i}),
    )


async def fill(service: NousSessionService, sid: str, n: int, first: int = 0) -> None:
    session = await service.create_session(app_name="a", user_id="u", session_id=sid)
    for i in range(first, first + n):
        await service.append_event(session, scoped_event(i))


def folded(service: NousSessionService, key: str) -> int:
    """How many events of the log of ``key`` the service's fold of it has read."""
    view: _StateView = service._logs._states[key]
    return view.read


def whole(view: _StateView) -> tuple[Any, ...]:
    return (view.seen, view.state, view.writes, view.writers)


@pytest.mark.parametrize("recent", [True, False])
def test_a_cold_read_folds_the_state_logs_from_their_latest_checkpoint(
    sessions: Sessions, every: int, recent: bool
) -> None:
    """However many writes the user's and the app's logs hold (every session of the user
    adds to them), a fresh service's get_session of a session writing ``user:`` and
    ``app:`` keys reads at most a few checkpoints' worth of those logs, and gives the
    state a whole read gives."""
    config = GetSessionConfig(num_recent_events=3) if recent else None

    async def cold_read() -> tuple[int, int, dict[str, Any]]:
        cold = NousSessionService(sessions)
        got = await cold.get_session(app_name="a", user_id="u", session_id="s0", config=config)
        assert got is not None
        return folded(cold, user_key("a", "u")), folded(cold, app_key("a")), dict(got.state)

    async def body() -> None:
        service = NousSessionService(sessions)
        await fill(service, "s0", 10)
        short = await cold_read()
        for k in range(1, 6):  # the user's history grows, in other sessions
            await fill(service, f"s{k}", 20, first=100 * k)
        long = await cold_read()
        for user_read, app_read, _ in (short, long):
            assert user_read <= 3 * every
            assert app_read <= 3 * every
        assert long[2] == {
            "own": 9,
            "user:t": 519,
            "user:k0": 519,
            "user:k1": 517,
            "user:k2": 518,
            "app:t": 519,
        }
        expected = await service.get_session(app_name="a", user_id="u", session_id="s0")
        assert expected is not None
        assert long[2] == dict(expected.state)

    run(body())


class Killed(Exception):
    """The death of the writing process, at the write that raises it (in-process)."""


async def state_records(sessions: Sessions, key: str) -> list[dict[str, Any]]:
    found = []
    for ev in await sessions.read(key).events():
        rec = ev.data.get(RECORD_KEY) if isinstance(ev.data, dict) else None
        if rec is not None and rec.get("op") == "state":
            found.append(dict(rec))
    return found


async def append_killed(
    sessions: Sessions, sid: str, delta: dict[str, Any], at: str
) -> tuple[str, int]:
    """Append an event with ``delta`` to a new session ``sid``, the call killed at its
    ``at`` write (`write_scoped` or `write_directory`); the event's (session key, seq)."""
    service = NousSessionService(sessions)
    session = await service.create_session(app_name="a", user_id="u", session_id=sid)

    async def die(self: adk_state._ScopedState, *args: Any, **kwargs: Any) -> Any:
        raise Killed

    with pytest.MonkeyPatch.context() as m:
        if at == "write_directory":
            original = adk_state._ScopedState.write_scoped

            async def scoped_then_die(self: adk_state._ScopedState, *a: Any, **k: Any) -> Any:
                await original(self, *a, **k)
                raise Killed

            m.setattr(adk_state._ScopedState, "write_scoped", scoped_then_die)
        else:
            m.setattr(adk_state._ScopedState, at, die)
        with pytest.raises(Killed):
            await service.append_event(
                session,
                scoped_event(0).model_copy(update={"actions": EventActions(state_delta=delta)}),
            )
    key = f"adk/s/a/u/{sid}"
    [*_, last] = await sessions.read(key).events()
    return key, last.seq


def test_a_call_killed_before_its_state_is_completed_past_a_checkpoint(
    sessions: Sessions, every: int
) -> None:
    """A call killed after its event and before its ``user:`` write, then many writes of
    the user's state by other sessions (checkpoints written since): a fresh service's read
    of its session writes its key nobody wrote since, and leaves the key written since as
    it is (each key's last write is kept in a checkpoint); it looks back past the
    checkpoint for the call's state record once: the next fresh read folds from there."""

    async def body() -> None:
        await append_killed(sessions, "old", {"user:mine": "old", "user:t": "old"}, "write_scoped")
        service = NousSessionService(sessions)
        await fill(service, "new", 4 * every)
        cold = NousSessionService(sessions)
        got = await cold.get_session(app_name="a", user_id="u", session_id="old")
        assert got is not None
        assert got.state["user:mine"] == "old"
        assert got.state["user:t"] == 4 * every - 1  # written since the killed call read it
        again = NousSessionService(sessions)  # completed once: not looked for again
        assert await again.get_session(app_name="a", user_id="u", session_id="old") == got
        assert folded(again, user_key("a", "u")) <= 3 * every
        user = await NousSessionService(sessions).get_user_state(app_name="a", user_id="u")
        assert user["mine"] == "old"
        assert user["t"] == 4 * every - 1

    run(body())


def test_a_call_killed_after_its_state_is_not_written_twice_past_a_checkpoint(
    sessions: Sessions, every: int
) -> None:
    """A call killed after its ``user:`` write and before its directory entry, then many
    writes of the user's state by other sessions (checkpoints written since): a fresh
    service's read of its session completes the directory entry and finds the state record
    written before the checkpoint: the record is not written again."""

    async def body() -> None:
        source = await append_killed(sessions, "old", {"user:mine": "old"}, "write_directory")
        service = NousSessionService(sessions)
        await fill(service, "new", 4 * every)
        cold = NousSessionService(sessions)
        got = await cold.get_session(app_name="a", user_id="u", session_id="old")
        assert got is not None
        assert got.state["user:mine"] == "old"
        recs = [
            r
            for r in await state_records(sessions, user_key("a", "u"))
            if r.get("source") == list(source)
        ]
        assert len(recs) == 1, recs
        listed = await cold.list_sessions(app_name="a", user_id="u")
        assert {s.id for s in listed.sessions} == {"old", "new"}

    run(body())


def test_state_read_from_a_checkpoint_is_the_whole_fold(sessions: Sessions, every: int) -> None:
    """The fold of the user's log started from its latest checkpoint holds what the fold
    from its first write holds: the state, each key's last write and its writer."""

    async def body() -> None:
        service = NousSessionService(sessions)
        for k in range(3):
            await fill(service, f"s{k}", 2 * every + k, first=100 * k)
        key = user_key("a", "u")
        log = await sessions.read(key).events()
        assert any(e.data.get(RECORD_KEY, {}).get("op") == "checkpoint" for e in log)
        cold = NousSessionService(sessions)
        from_checkpoint = await cold._logs.state(key)
        assert from_checkpoint.base > 0
        full = _StateView()
        full.catch_up(await cold._logs.log(key))
        assert whole(from_checkpoint) == whole(full)

    run(body())


@settings(max_examples=25, deadline=None)
@given(
    every=st.integers(1, 4),
    writes=st.lists(
        st.tuples(
            st.sampled_from(["s0", "s1", "s2"]),
            st.dictionaries(
                st.sampled_from(["user:a", "user:b", "app:c", "own"]),
                st.integers(0, 9),
                min_size=1,
            ),
        ),
        max_size=12,
    ),
)
def test_any_history_folds_alike_from_a_checkpoint(
    every: int, writes: list[tuple[str, dict[str, int]]]
) -> None:
    """Whatever appends of whichever sessions wrote the user's and the app's state, and
    however often they are checkpointed, a fresh service folds each log from its latest
    checkpoint to what the fold from its first write gives (the state, each key's last
    write and the event that write completes) and reads the state a whole fold gives."""
    store = MemoryStore()
    registry = Sessions(store, timeout=20)

    async def body() -> None:
        service = NousSessionService(registry)
        for sid in ("s0", "s1", "s2"):
            await service.create_session(app_name="a", user_id="u", session_id=sid)
        for i, (sid, delta) in enumerate(writes):
            event = scoped_event(i).model_copy(
                update={"actions": EventActions(state_delta=dict(delta))}
            )
            session = await service.get_session(app_name="a", user_id="u", session_id=sid)
            assert session is not None  # loaded anew: it has seen every write
            await service.append_event(session, event)
        cold = NousSessionService(registry)
        got = await cold.get_session(app_name="a", user_id="u", session_id="s0")
        assert got is not None
        for key in (user_key("a", "u"), app_key("a")):
            full = _StateView()
            full.catch_up(await cold._logs.log(key))
            assert whole(await cold._logs.state(key)) == whole(full)
        expected: dict[str, Any] = {}
        for sid, delta in writes:
            expected.update({k: v for k, v in delta.items() if ":" in k or sid == "s0"})
        assert got.state == expected

    with pytest.MonkeyPatch.context() as m:
        for module in (adk_records, adk_state, adk_folds):
            m.setattr(module, "STATE_CHECKPOINT_EVERY", every)
        try:
            run(body())
        finally:
            registry.close()
            store.close()
