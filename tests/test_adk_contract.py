"""ADK's session-service contract, run against NousSessionService and ADK's own services.

Ported from the generic tests of ADK's ``tests/unittests/sessions/
test_session_service.py`` (the tests that take its ``session_service``
fixture; ADK's PyPI artifacts ship no tests, so they were ported from its
repository and rewritten here). Each test runs against `NousSessionService`
on `MemoryStore` and `SQLiteStore`, and against ADK's `InMemorySessionService`
and `DatabaseSessionService` (SQLite in memory) as the reference, so every
assertion is checked against ADK's own behaviour. A reference service that
diverges from the contract is marked ``xfail(strict=True)`` with the reason,
as ADK's own conformance registry does.

Left out (they test one backend's machinery, not the contract): the
``DatabaseSessionService`` engine options (``pool_pre_ping``, time zones per
dialect, read-only session factories, Spanner), ``SqliteSessionService`` URL
parsing, rollback-on-commit-failure spies, ``prepare_tables`` races,
``_get_or_create_state`` rows, row-level locking, stale-session rejection
("modified in storage": here one actor writes each session, so a stale
`Session` object's append is kept in order, and refused only where its state
delta would lose an update; see test_adk.py),
timestamp-drift and storage-marker checks, the in-memory service's
same-object append, and Vertex AI's ``NotImplementedError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from bounds import RUN_BOUND as BOUND
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

from nous_actor import MemoryStore, Sessions, SQLiteStore
from nous_actor.integrations.adk import NousSessionService

T = TypeVar("T")

BACKENDS = ["nous_memory", "nous_sqlite", "adk_in_memory", "adk_database"]

# Reference services that fail a contract test today, with the reason.
DIVERGENCES: dict[tuple[str, str], str] = {
    ("adk_database", "test_padded_session_id_reads_and_deletes"): (
        "DatabaseSessionService stores the session id verbatim, so a padded id keeps its "
        "whitespace instead of being normalised as the in-memory service does"
    ),
}

Body = Callable[[BaseSessionService], Awaitable[None]]


@contextlib.asynccontextmanager
async def make_service(kind: str, tmp_path: Path) -> AsyncIterator[BaseSessionService]:
    if kind == "adk_in_memory":
        yield InMemorySessionService()
        return
    if kind == "adk_database":
        db = DatabaseSessionService("sqlite+aiosqlite:///:memory:")
        try:
            yield db
        finally:
            await db.close()
        return
    store = MemoryStore() if kind == "nous_memory" else SQLiteStore(tmp_path / "adk.db")
    registry = Sessions(store, timeout=20)
    try:
        yield NousSessionService(registry)
    finally:
        await registry.aclose()
        store.close()


@pytest.fixture(params=BACKENDS)
def use_service(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Body], None]:
    """Runs a test body against one service, on a fresh loop, bounded."""
    kind: str = request.param
    reason = DIVERGENCES.get((kind, request.node.originalname))
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    def go(body: Body) -> None:
        async def main() -> None:
            async with make_service(kind, tmp_path) as service:
                await asyncio.wait_for(body(service), BOUND)

        asyncio.run(main())

    return go


def text(t: str, role: str = "user") -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=t)])


def test_get_empty_session(use_service: Callable[[Body], None]) -> None:
    """A session never created is None."""

    async def body(service: BaseSessionService) -> None:
        assert not await service.get_session(app_name="my_app", user_id="u", session_id="123")

    use_service(body)


def test_create_get_session(use_service: Callable[[Body], None]) -> None:
    """A created session reads back equal, and is gone once deleted."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(
            app_name="my_app", user_id="u", state={"key": "value"}
        )
        assert (session.app_name, session.user_id, session.state) == (
            "my_app",
            "u",
            {"key": "value"},
        )
        assert session.id
        assert session.last_update_time <= datetime.now(UTC).timestamp()
        got = await service.get_session(app_name="my_app", user_id="u", session_id=session.id)
        assert got == session
        await service.delete_session(app_name="my_app", user_id="u", session_id=session.id)
        assert (
            await service.get_session(app_name="my_app", user_id="u", session_id=session.id)
            is None
        )

    use_service(body)


def test_create_and_list_sessions(use_service: Callable[[Body], None]) -> None:
    """Every created session is listed with its state."""

    async def body(service: BaseSessionService) -> None:
        ids = [f"session{i}" for i in range(5)]
        for sid in ids:
            await service.create_session(
                app_name="my_app", user_id="u", session_id=sid, state={"key": "value" + sid}
            )
        listed = (await service.list_sessions(app_name="my_app", user_id="u")).sessions
        assert {s.id for s in listed} == set(ids)
        assert all(s.state == {"key": "value" + s.id} for s in listed)
        assert all(s.events == [] for s in listed)

    use_service(body)


def test_list_sessions_all_users(use_service: Callable[[Body], None]) -> None:
    """A listing is per user, or of every user of the app when the user is None."""

    async def body(service: BaseSessionService) -> None:
        for user, sid in (("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")):
            await service.create_session(
                app_name="my_app", user_id=user, session_id=sid, state={"key": sid}
            )
        await service.create_session(app_name="other_app", user_id="user1", session_id="x")
        one = (await service.list_sessions(app_name="my_app", user_id="user1")).sessions
        assert {s.id: s.state for s in one} == {"s1a": {"key": "s1a"}, "s1b": {"key": "s1b"}}
        two = (await service.list_sessions(app_name="my_app", user_id="user2")).sessions
        assert [(s.id, s.user_id, s.state) for s in two] == [("s2a", "user2", {"key": "s2a"})]
        every = (await service.list_sessions(app_name="my_app", user_id=None)).sessions
        assert {(s.user_id, s.id) for s in every} == {
            ("user1", "s1a"),
            ("user1", "s1b"),
            ("user2", "s2a"),
        }

    use_service(body)


def test_list_sessions_ordered_by_last_update_time(use_service: Callable[[Body], None]) -> None:
    """Listed sessions come oldest update first, as BaseSessionService documents."""

    async def body(service: BaseSessionService) -> None:
        made = []
        for sid in ("a", "b", "c"):
            made.append(await service.create_session(app_name="app", user_id="u", session_id=sid))
        # "a" is updated last, so it is listed last.
        later = max(s.last_update_time for s in made) + 10
        await service.append_event(made[0], Event(author="user", timestamp=later))
        listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
        assert [s.id for s in listed] == ["b", "c", "a"]
        assert listed[-1].last_update_time == pytest.approx(later, abs=1e-6)

    use_service(body)


def test_app_state_is_shared_by_all_users_of_app(use_service: Callable[[Body], None]) -> None:
    """app: keys set at creation or by an event are seen by every session of the app."""

    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"app:k1": "v1"}
        )
        await service.append_event(
            s1,
            Event(
                invocation_id="inv1",
                author="user",
                actions=EventActions(state_delta={"app:k2": "v2"}),
            ),
        )
        s2 = await service.create_session(app_name="my_app", user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        again = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None
        assert (again.state.get("app:k1"), again.state.get("app:k2")) == ("v1", "v2")

    use_service(body)


def test_user_state_is_shared_only_by_user_sessions(use_service: Callable[[Body], None]) -> None:
    """user: keys are seen by the user's sessions alone."""

    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"user:k1": "v1"}
        )
        await service.append_event(
            s1,
            Event(
                invocation_id="inv1",
                author="user",
                actions=EventActions(state_delta={"user:k2": "v2"}),
            ),
        )
        s1b = await service.create_session(app_name="my_app", user_id="u1", session_id="s1b")
        assert s1b.state == {"user:k1": "v1", "user:k2": "v2"}
        s2 = await service.create_session(app_name="my_app", user_id="u2", session_id="s2")
        assert s2.state == {}

    use_service(body)


def test_session_state_is_not_shared(use_service: Callable[[Body], None]) -> None:
    """Unprefixed keys belong to their session alone."""

    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"sk1": "v1"}
        )
        await service.append_event(
            s1,
            Event(
                invocation_id="inv1",
                author="user",
                actions=EventActions(state_delta={"sk2": "v2"}),
            ),
        )
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got is not None
        assert (got.state.get("sk1"), got.state.get("sk2")) == ("v1", "v2")
        s1b = await service.create_session(app_name="my_app", user_id="u1", session_id="s1b")
        assert s1b.state == {}

    use_service(body)


def test_temp_state_is_not_persisted_in_state_or_events(
    use_service: Callable[[Body], None],
) -> None:
    """temp: keys reach the caller's Session object only: never the stored state or event."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        event = Event(
            invocation_id="inv1",
            author="user",
            actions=EventActions(state_delta={"temp:k1": "v1", "sk": "v2"}),
        )
        await service.append_event(session=session, event=event)
        assert (session.state.get("temp:k1"), session.state.get("sk")) == ("v1", "v2")
        assert "temp:k1" not in event.actions.state_delta
        got = await service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert got is not None
        assert got.state.get("sk") == "v2"
        assert "temp:k1" not in got.state
        assert "temp:k1" not in got.events[0].actions.state_delta
        assert got.events[0].actions.state_delta.get("sk") == "v2"

    use_service(body)


def test_temp_state_visible_across_sequential_events(use_service: Callable[[Body], None]) -> None:
    """A temp: key set by one event is readable from the Session object before the next."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1", session_id="s_seq")
        first = Event(
            invocation_id="inv1",
            author="agent1",
            actions=EventActions(state_delta={"temp:output": "result"}),
        )
        await service.append_event(session=session, event=first)
        assert session.state.get("temp:output") == "result"
        assert "temp:output" not in first.actions.state_delta

    use_service(body)


def test_get_session_respects_user_id(use_service: Callable[[Body], None]) -> None:
    """The same session id under two users is two sessions."""

    async def body(service: BaseSessionService) -> None:
        s1 = await service.create_session(app_name="my_app", user_id="u1", session_id="s1")
        await service.append_event(s1, Event(invocation_id="inv1", author="user"))
        await service.create_session(app_name="my_app", user_id="u2", session_id="s1")
        got = await service.get_session(app_name="my_app", user_id="u2", session_id="s1")
        assert got is not None
        assert got.user_id == "u2"
        assert got.events == []

    use_service(body)


def test_create_session_with_existing_id_raises_error(
    use_service: Callable[[Body], None],
) -> None:
    """Creating an existing session raises AlreadyExistsError."""

    async def body(service: BaseSessionService) -> None:
        await service.create_session(app_name="my_app", user_id="u", session_id="existing")
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name="my_app", user_id="u", session_id="existing")

    use_service(body)


def test_padded_session_id_reads_and_deletes(use_service: Callable[[Body], None]) -> None:
    """A session id with surrounding whitespace names the same session as the stripped id."""

    async def body(service: BaseSessionService) -> None:
        await service.create_session(app_name="app", user_id="u", session_id="  s1 ")
        got = await service.get_session(app_name="app", user_id="u", session_id="s1")
        assert got is not None
        assert got.id == "s1"
        padded = await service.get_session(app_name="app", user_id="u", session_id=" s1  ")
        assert padded is not None
        assert padded.id == "s1"
        await service.delete_session(app_name="app", user_id="u", session_id=" s1 ")
        assert await service.get_session(app_name="app", user_id="u", session_id="s1") is None

    use_service(body)


def test_append_event_bytes(use_service: Callable[[Body], None]) -> None:
    """Binary parts and metadata blobs read back equal."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        content = types.Content(
            role="user",
            parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
        )
        event = Event(
            invocation_id="invocation",
            author="user",
            content=content,
            grounding_metadata=grounding,
        )
        await service.append_event(session=session, event=event)
        assert session.events[0].content == content
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got is not None
        assert len(got.events) == 1
        assert got.events[0].content == content
        assert got.events[0].grounding_metadata == grounding

    use_service(body)


def test_append_event_complete(use_service: Callable[[Body], None]) -> None:
    """An event with every field set reads back equal: the stored session equals the object."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        event = Event(
            invocation_id="invocation",
            author="user",
            content=text("test_text"),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
            ),
            long_running_tool_ids={"tool1"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="input transcription", finished=True),
            output_transcription=types.Transcription(text="output transcription", finished=True),
        )
        await service.append_event(session=session, event=event)
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got == session

    use_service(body)


def test_session_last_update_time_updates_on_event(use_service: Callable[[Body], None]) -> None:
    """An appended event's timestamp becomes the session's last update time."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        original = session.last_update_time
        stamp = original + 10
        await service.append_event(
            session, Event(invocation_id="invocation", author="user", timestamp=stamp)
        )
        assert session.last_update_time == pytest.approx(stamp, abs=1e-6)
        again = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert again is not None
        assert again.last_update_time == pytest.approx(stamp, abs=1e-6)
        assert again.last_update_time > original

    use_service(body)


def test_get_session_with_config(use_service: Callable[[Body], None]) -> None:
    """num_recent_events and after_timestamp select the latest events, alone or together."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        for i in range(1, 6):
            await service.append_event(session, Event(author="user", timestamp=i))

        async def read(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name="my_app",
                user_id="user",
                session_id=session.id,
                config=GetSessionConfig(**config) if config else None,
            )
            assert got is not None
            return [e.timestamp for e in got.events]

        assert await read() == [1, 2, 3, 4, 5]
        assert await read(num_recent_events=0) == []
        assert await read(num_recent_events=3) == [3, 4, 5]
        assert await read(after_timestamp=4.0) == [4, 5]
        assert await read(after_timestamp=50.0) == []
        assert await read(after_timestamp=4.0, num_recent_events=3) == [4, 5]

    use_service(body)


def test_partial_events_are_not_persisted(use_service: Callable[[Body], None]) -> None:
    """A partial event is neither added to the object nor stored."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="user")
        await service.append_event(session, Event(author="user", partial=True))
        assert session.events == []
        got = await service.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got is not None
        assert got.events == []

    use_service(body)


def test_append_event_to_missing_session_raises(use_service: Callable[[Body], None]) -> None:
    """Appending to a session that was never stored (or was deleted) raises a ValueError."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        await service.delete_session(app_name="app", user_id="u", session_id="s")
        with pytest.raises(ValueError, match=r"(?i)not found|missing|no session"):
            await service.append_event(session, Event(author="user", content=text("lost")))
        assert await service.get_session(app_name="app", user_id="u", session_id="s") is None

    use_service(body)


def test_get_user_state_returns_empty_dict_when_no_state_exists(
    use_service: Callable[[Body], None],
) -> None:
    """A user without user: state has an empty one."""

    async def body(service: BaseSessionService) -> None:
        assert not await service.get_user_state(app_name="my_app", user_id="u1")

    use_service(body)


def test_get_user_state_returns_state_written_via_append_event(
    use_service: Callable[[Body], None],
) -> None:
    """get_user_state gives the user: keys an event wrote, unprefixed, and nothing else."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1")
        await service.append_event(
            session,
            Event(
                author="system",
                actions=EventActions(
                    state_delta={"user:profile": {"name": "Alice"}, "session_key": 1}
                ),
            ),
        )
        state = await service.get_user_state(app_name="my_app", user_id="u1")
        assert state == {"profile": {"name": "Alice"}}

    use_service(body)


def test_get_user_state_is_not_visible_across_users(use_service: Callable[[Body], None]) -> None:
    """One user's user: state is not another's."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1")
        await service.append_event(
            session,
            Event(author="system", actions=EventActions(state_delta={"user:secret": "u1 only"})),
        )
        assert not await service.get_user_state(app_name="my_app", user_id="u2")

    use_service(body)


def test_get_user_state_is_not_visible_across_apps(use_service: Callable[[Body], None]) -> None:
    """A user's state in one app is not their state in another."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1")
        await service.append_event(
            session,
            Event(author="system", actions=EventActions(state_delta={"user:data": "app a"})),
        )
        assert not await service.get_user_state(app_name="other_app", user_id="u1")

    use_service(body)


def test_get_user_state_available_before_session_is_created(
    use_service: Callable[[Body], None],
) -> None:
    """User state is readable without a session id."""

    async def body(service: BaseSessionService) -> None:
        first = await service.create_session(app_name="my_app", user_id="u1")
        await service.append_event(
            first,
            Event(author="system", actions=EventActions(state_delta={"user:ctx": {"v": 1}})),
        )
        assert await service.get_user_state(app_name="my_app", user_id="u1") == {"ctx": {"v": 1}}

    use_service(body)


def test_get_user_state_reflects_latest_write(use_service: Callable[[Body], None]) -> None:
    """The latest write of a user: key wins."""

    async def body(service: BaseSessionService) -> None:
        session = await service.create_session(app_name="my_app", user_id="u1")
        for n in (1, 2):
            await service.append_event(
                session,
                Event(author="system", actions=EventActions(state_delta={"user:counter": n})),
            )
        state = await service.get_user_state(app_name="my_app", user_id="u1")
        assert state["counter"] == 2

    use_service(body)
