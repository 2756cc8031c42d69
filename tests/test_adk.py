"""NousSessionService beyond ADK's contract: ids, the chat view, compaction, runs as turns.

A real ADK `Runner` runs with a scripted model (a `BaseLlm` subclass: no
network). Crashes are real (`nous_actor.sessions.faults.crash`). Every wait is
bounded; runs are ordered by events, never by sleeps.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from bounds import RUN_BOUND as BOUND
from bounds import run
from google.adk.agents.llm_agent import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.apps.app import App, EventsCompactionConfig
from google.adk.apps.llm_event_summarizer import LlmEventSummarizer
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session as AdkSession
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from nous_actor import MemoryStore, Sessions, Store, TurnBusy
from nous_actor.core.event import EventType
from nous_actor.core.history import replaced
from nous_actor.core.ids import check_session_id
from nous_actor.integrations import adk
from nous_actor.integrations.adk import (
    ADK_EVENT_KEY,
    NousRunPlugin,
    NousSessionService,
    parse_key,
    refused_by_turn,
    session_key,
)
from nous_actor.sessions.faults import crash

T = TypeVar("T")


def text(t: str, role: str = "user") -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=t)])


class ScriptedLlm(BaseLlm):
    """Answers each request from ``script(request, n)`` (n counts the calls); keeps the
    requests it saw."""

    model: str = "scripted"
    script: Any = None
    seen: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(llm_request)
        reply = await self.script(llm_request, len(self.seen))
        yield reply


def model_text(t: str) -> LlmResponse:
    return LlmResponse(content=text(t, "model"))


def request_texts(request: LlmRequest) -> list[str]:
    return [p.text for c in request.contents for p in c.parts or [] if p.text]


# -- ids --------------------------------------------------------------------------------------


@given(st.text(max_size=40), st.text(max_size=40), st.text(min_size=1, max_size=40))
def test_session_keys_round_trip(app: str, user: str, sid: str) -> None:
    """Any app, user and session id map to a valid session id and back, or (too long once
    encoded) to a ValueError."""
    try:
        key = session_key(app, user, sid)
    except ValueError as exc:
        assert "longer than the 256" in str(exc)
        encoded = [adk._part(x, "part") for x in (app, user, sid)]
        assert len("adk/s///") + sum(map(len, encoded)) > 256
        return
    check_session_id(key)
    assert parse_key(key) == ("session", (app, user, sid))


def test_session_key_refuses_what_cannot_be_an_id() -> None:
    """Non-str parts are a TypeError; an id too long once encoded a ValueError naming the fix."""
    with pytest.raises(TypeError, match="user_id must be a str"):
        session_key("app", 7, "s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="use a shorter app name, user id or session id"):
        session_key("app", "u", "/" * 100)
    with pytest.raises(ValueError, match="not the id of an ADK session"):
        parse_key("chat-1")


def test_service_refuses_bad_arguments(sessions: Sessions) -> None:
    """Bad arguments at the service's entry points are typed errors."""
    with pytest.raises(TypeError, match=r"takes a nous_actor\.Sessions registry"):
        NousSessionService("app.db")  # type: ignore[arg-type]
    service = NousSessionService(sessions)

    async def body() -> None:
        with pytest.raises(TypeError, match="state must be a dict"):
            await service.create_session(app_name="a", user_id="u", state=[1])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="cannot be stored as JSON"):
            await service.create_session(app_name="a", user_id="u", state={"k": object()})
        with pytest.raises(TypeError, match="config must be a GetSessionConfig"):
            await service.get_session(
                app_name="a",
                user_id="u",
                session_id="s",
                config={"num_recent_events": 1},  # type: ignore[arg-type]
            )
        s = await service.create_session(app_name="a", user_id="u")
        with pytest.raises(TypeError, match="event must be an ADK Event"):
            await service.append_event(s, {"author": "user"})  # type: ignore[arg-type]

    run(body())
    with pytest.raises(ValueError, match="policy"):
        service.plugin("sometimes")  # type: ignore[arg-type]


# -- the log ----------------------------------------------------------------------------------


def test_events_have_a_chat_view(sessions: Sessions) -> None:
    """User text, function calls, function responses and model text derive to messages."""
    service = NousSessionService(sessions)

    async def body() -> list[Any]:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        call = types.Part.from_function_call(name="add", args={"x": 1})
        call.function_call.id = "c1"  # type: ignore[union-attr]
        response = types.Part.from_function_response(name="add", response={"sum": 3})
        response.function_response.id = "c1"  # type: ignore[union-attr]
        thought = types.Part(text="let me add", thought=True)
        for content, author in (
            (text("add 1"), "user"),
            (types.Content(role="model", parts=[thought, call]), "agent"),
            (types.Content(role="user", parts=[response]), "agent"),
            (text("it is 3", "model"), "agent"),
        ):
            await service.append_event(s, Event(author=author, content=content))
        await service.append_event(
            s, Event(author="agent", actions=EventActions(state_delta={"k": 1}))
        )
        handle = await sessions.aopen(session_key("a", "u", "s"))
        return await handle.derive_messages()

    messages = run(body())
    assert [(m.role.value, m.content) for m in messages] == [
        ("user", "add 1"),
        ("assistant", None),
        ("tool", '[{"sum": 3}]'),
        ("assistant", "it is 3"),
    ]
    assert messages[1].reasoning_content == "let me add"
    assert [dict(c) for c in messages[1].tool_calls] == [
        {"id": "c1", "name": "add", "arguments": '{"x": 1}'}
    ]
    assert messages[2].tool_call_id == "c1"
    assert all(ADK_EVENT_KEY in m.metadata for m in messages)


def test_compaction_replaces_the_range_it_covers_and_keeps_history(sessions: Sessions) -> None:
    """An ADK compaction event hides the events it covers behind its summary on the surface,
    while get_session still returns every event and audit names what it replaced."""
    service = NousSessionService(sessions)

    async def body() -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        for i in range(1, 5):
            role = "user" if i % 2 else "model"
            await service.append_event(
                s, Event(author="x", content=text(f"m{i}", role), timestamp=float(i))
            )
        summary = EventCompaction(
            start_timestamp=1.0, end_timestamp=3.0, compacted_content=text("m1..m3", "model")
        )
        await service.append_event(
            s, Event(author="user", actions=EventActions(compaction=summary), timestamp=5.0)
        )
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert len(got.events) == 5
        assert got.events[-1].actions.compaction == summary
        handle = await sessions.aopen(session_key("a", "u", "s"))
        assert [m.content for m in await handle.derive_messages()] == ["m1..m3", "m4"]
        log = await handle.log()
        [summary_event] = [e for e in log.events() if e.surface_op is not None]
        hidden = replaced(log, summary_event.seq)
        contents = [e.data.get("content") for e in log.events() if e.seq in hidden]
        assert contents == ["m1", "m2", "m3"]

    run(body())


def test_recent_events_are_read_from_the_tail(sessions: Sessions) -> None:
    """A fresh service's get_session with num_recent_events reads the tail of the log back to
    the last state checkpoint (no fold of the whole history), and gives what a whole read
    gives: the same latest events, the same state, the same last update."""

    async def fill() -> None:
        service = NousSessionService(sessions)
        s = await service.create_session(
            app_name="a", user_id="u", session_id="long", state={"k": -1}
        )
        for i in range(600):
            delta = {"k": i, f"key{i % 7}": i} if i % 3 == 0 else {}
            await service.append_event(
                s,
                Event(
                    author="user",
                    content=text(f"m{i}"),
                    actions=EventActions(state_delta=delta),
                ),
            )

    run(fill())
    key = session_key("a", "u", "long")

    async def read(n: int) -> None:
        cold = NousSessionService(sessions)
        got = await cold.get_session(
            app_name="a",
            user_id="u",
            session_id="long",
            config=GetSessionConfig(num_recent_events=n),
        )
        assert not cold._logs.folded(key)  # the whole history was not folded
        whole = await NousSessionService(sessions).get_session(
            app_name="a", user_id="u", session_id="long"
        )
        assert got is not None
        assert whole is not None
        assert got.events == whole.events[max(0, len(whole.events) - n) :]
        assert got.state == whole.state
        assert got.last_update_time == whole.last_update_time

    for n in (0, 1, 7, 300, 700):
        run(read(n))
    handle = sessions.open(key)
    checkpoints = [
        e
        for e in handle.events().get(timeout=BOUND)
        if e.data.get("adk", {}).get("op") == "checkpoint"
    ]
    assert len(checkpoints) == 2


def test_lookups_of_unknown_ids_leave_nothing_running(sessions: Sessions) -> None:
    """get_session of ids never created (whole or recent) returns None and stops the empty
    sessions it opened; such an id can then be created."""
    service = NousSessionService(sessions)

    async def body() -> None:
        for i in range(5):
            recent = GetSessionConfig(num_recent_events=3) if i % 2 else None
            got = await service.get_session(
                app_name="a", user_id="u", session_id=f"nobody-{i}", config=recent
            )
            assert got is None
        assert not [k for k in sessions.live() if k.startswith("adk/s/")]
        made = await service.create_session(app_name="a", user_id="u", session_id="nobody-0")
        assert made.id == "nobody-0"

    run(body())


def test_listed_sessions_are_plain_adk_sessions(sessions: Sessions) -> None:
    """Listed sessions equal validated ADK sessions, and each returned session is its own:
    changing one (its state, nested values too, a field) changes no other and nothing
    stored."""
    service = NousSessionService(sessions)

    async def body() -> None:
        for sid in ("x", "y"):
            await service.create_session(
                app_name="a", user_id="u", session_id=sid, state={"k": [sid]}
            )
        x, y = (await service.list_sessions(app_name="a", user_id="u")).sessions
        assert x == AdkSession(
            id=x.id,
            app_name="a",
            user_id="u",
            state={"k": [x.id]},
            last_update_time=x.last_update_time,
        )
        x.state["k"].append("changed")
        x.last_update_time = 5.0
        x.events.append(Event(author="user"))
        assert y.state == {"k": [y.id]}
        assert y.events == []
        assert y.last_update_time != 5.0
        assert "last_update_time" in y.model_fields_set
        again = (await service.list_sessions(app_name="a", user_id="u")).sessions
        assert [s.state for s in again] == [{"k": ["x"]}, {"k": ["y"]}]
        got = await service.get_session(app_name="a", user_id="u", session_id="x")
        assert got is not None
        got.state["k"].append("changed")
        fresh = await service.get_session(app_name="a", user_id="u", session_id="x")
        assert fresh is not None
        assert fresh.state == {"k": ["x"]}

    run(body())


def test_delete_keeps_history_and_the_id_can_be_created_again(sessions: Sessions) -> None:
    """A deleted session is gone for ADK (get, list) while its log keeps every event; created
    again, it starts empty."""
    service = NousSessionService(sessions)

    async def body() -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s", state={"k": 1})
        await service.append_event(s, Event(author="user", content=text("old")))
        await service.delete_session(app_name="a", user_id="u", session_id="s")
        assert (await service.list_sessions(app_name="a", user_id="u")).sessions == []
        handle = await sessions.aopen(session_key("a", "u", "s"))
        assert "old" in [e.data.get("content") for e in await handle.events()]
        again = await service.create_session(app_name="a", user_id="u", session_id="s")
        assert again.state == {}
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert got.events == []
        listed = (await service.list_sessions(app_name="a", user_id="u")).sessions
        assert [(x.id, x.state) for x in listed] == [("s", {})]

    run(body())


def test_sessions_survive_a_new_registry(tmp_path: Path) -> None:
    """On SQLite, a new registry and service read back the events and every scope's state."""
    path = tmp_path / "adk.db"

    async def write() -> Any:
        service = NousSessionService.sqlite(path)
        s = await service.create_session(
            app_name="a", user_id="u", session_id="s", state={"k": 1, "app:a": 2, "user:b": 3}
        )
        await service.append_event(
            s,
            Event(author="user", content=text("hi"), actions=EventActions(state_delta={"k": 4})),
        )
        await service.close()
        return s

    written = run(write())

    async def read() -> None:
        service = NousSessionService.sqlite(path)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got == written
        assert got.state == {"k": 4, "app:a": 2, "user:b": 3}
        listed = (await service.list_sessions(app_name="a")).sessions
        assert [(x.id, x.state) for x in listed] == [("s", got.state)]
        await service.close()

    run(read())


def test_a_stale_session_object_appends_in_order(sessions: Sessions) -> None:
    """Two copies of one session both append (one writer per session: none is stale)."""
    service = NousSessionService(sessions)

    async def body() -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        one = await service.get_session(app_name="a", user_id="u", session_id="s")
        two = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert one is not None
        assert two is not None
        await asyncio.gather(
            service.append_event(
                one, Event(author="user", actions=EventActions(state_delta={"a": 1}))
            ),
            service.append_event(
                two, Event(author="user", actions=EventActions(state_delta={"b": 2}))
            ),
        )
        got = await service.get_session(app_name="a", user_id="u", session_id=s.id)
        assert got is not None
        assert len(got.events) == 2
        assert got.state == {"a": 1, "b": 2}

    run(body())


def test_a_stale_session_object_that_would_lose_an_update_is_refused(sessions: Sessions) -> None:
    """A Session object whose state delta writes a key another writer changed since it was
    loaded is refused with ADK's StaleSessionError, nothing stored; other keys, and the
    object's own earlier writes, never make it stale."""
    service = NousSessionService(sessions)

    async def body() -> None:
        await service.create_session(app_name="a", user_id="u", session_id="s")

        async def load() -> AdkSession:
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            assert got is not None
            return got

        def delta(**kv: Any) -> Event:
            return Event(author="user", actions=EventActions(state_delta=kv))

        one, two = await load(), await load()
        await service.append_event(one, delta(n=1))
        await service.append_event(one, delta(n=2))  # its own write: not stale
        await service.append_event(two, delta(m=1))  # another key: kept
        await service.append_event(two, Event(author="user", content=text("hi")))  # no state
        with pytest.raises(StaleSessionError):
            await service.append_event(two, delta(n=10))
        with pytest.raises(StaleSessionError):  # user: keys too
            await service.append_event(one, delta(**{"user:k": 1, "m": 5}))
        got = await load()
        assert got.state == {"n": 2, "m": 1}
        assert len(got.events) == 4
        assert [e.actions.state_delta for e in two.events] == [{"m": 1}, {}]
        await service.append_event(got, delta(n=3, m=3))  # loaded after: current
        await service.append_event(one, delta(**{"user:k": 1}))
        with pytest.raises(StaleSessionError):
            await service.append_event(got, delta(**{"user:k": 2}))
        final = await load()
        assert final.state == {"n": 3, "m": 3, "user:k": 1}

    run(body())


STALE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("load"), st.integers(0, 2)),
        st.tuples(
            st.just("write"),
            st.integers(0, 2),
            st.sets(st.sampled_from(["k", "j", "user:k", "app:k"]), min_size=1, max_size=2),
        ),
        st.tuples(st.just("event"), st.integers(0, 2)),
    ),
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(STALE_OPS)
def test_stale_is_refused_exactly_where_an_update_would_be_lost(
    ops: list[tuple[Any, ...]],
) -> None:
    """Three Session objects of one session write state keys (session, user: and app:) in any
    order: a write is refused as stale exactly when one of its keys was written, since the
    object was loaded, by someone else (or by it, then by someone else); the stored state
    is the model's."""
    store = MemoryStore()
    registry = Sessions(store, timeout=20)
    service = NousSessionService(registry)

    async def body() -> None:
        await service.create_session(app_name="a", user_id="u", session_id="s")
        clock = 0
        last: dict[str, int] = {}  # key -> clock of its last stored write
        state: dict[str, int] = {}
        objects: dict[int, tuple[AdkSession, int, dict[str, int]]] = {}

        async def load(i: int) -> None:
            got = await service.get_session(app_name="a", user_id="u", session_id="s")
            assert got is not None
            objects[i] = (got, clock, {})

        for i in range(3):
            await load(i)
        for op in ops:
            clock += 1
            if op[0] == "load":
                await load(op[1])
                continue
            obj, loaded, own = objects[op[1]]
            if op[0] == "event":
                await service.append_event(obj, Event(author="user", content=text("x")))
                continue
            keys = sorted(op[2])
            stale = any(last.get(k, -1) > own.get(k, loaded) for k in keys)
            event = Event(
                author="user", actions=EventActions(state_delta=dict.fromkeys(keys, clock))
            )
            if stale:
                with pytest.raises(StaleSessionError):
                    await service.append_event(obj, event)
                continue
            await service.append_event(obj, event)
            for k in keys:
                last[k] = own[k] = clock
                state[k] = clock
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert got.state == state

    try:
        run(body())
    finally:
        registry.close()
        store.close()


def test_two_runs_without_the_plugin_do_not_lose_a_state_update(sessions: Sessions) -> None:
    """Without the plugin, two concurrent runs whose tool read-modify-writes user:calls: the
    second write would lose the first, so it is refused (StaleSessionError, as ADK's
    database service refuses it), and the stored count is the first run's."""
    service = NousSessionService(sessions)

    async def body() -> None:
        both_read = asyncio.Barrier(2)

        async def count(tool_context: ToolContext) -> int:
            """Counts a call."""
            seen = int(tool_context.state.get("user:calls", 0))
            await asyncio.wait_for(both_read.wait(), BOUND)
            tool_context.state["user:calls"] = seen + 1
            return seen + 1

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            if request.contents[-1].parts[0].function_response is None:  # type: ignore[index]
                return LlmResponse(
                    content=types.Content(
                        role="model", parts=[types.Part.from_function_call(name="count", args={})]
                    )
                )
            return model_text("counted")

        agent = LlmAgent(name="helper", model=ScriptedLlm(script=script), tools=[count])
        runner = Runner(app=App(name="a", root_agent=agent), session_service=service)
        await service.create_session(app_name="a", user_id="u", session_id="s")
        done = await asyncio.gather(
            collect(runner, "s", "one"), collect(runner, "s", "two"), return_exceptions=True
        )
        failed = [r for r in done if isinstance(r, BaseException)]
        assert len(failed) == 1, done
        assert isinstance(failed[0], StaleSessionError), failed
        assert await service.get_user_state(app_name="a", user_id="u") == {"calls": 1}

    run(body())


def test_listed_last_update_time_is_get_sessions(sessions: Sessions) -> None:
    """list_sessions gives each session the last_update_time get_session gives it: after a
    run in a turn (its turn_end written after the last event), events stamped in the past,
    events with and without state, a checkpoint."""
    service = NousSessionService(sessions)

    async def answer(request: LlmRequest, n: int) -> LlmResponse:
        return model_text("ok")

    runner = make_runner(service, ScriptedLlm(script=answer), service.plugin())

    async def body() -> None:
        s1 = await service.create_session(app_name="a", user_id="u", session_id="run")
        await collect(runner, "run", "hello")
        s2 = await service.create_session(app_name="a", user_id="u", session_id="past")
        await service.append_event(s2, Event(author="user", content=text("x"), timestamp=5.5))
        s3 = await service.create_session(app_name="a", user_id="u", session_id="state")
        await service.append_event(
            s3, Event(author="user", actions=EventActions(state_delta={"k": 1}), timestamp=7.25)
        )
        await service.append_event(s3, Event(author="user", content=text("y"), timestamp=6.0))
        s4 = await service.create_session(app_name="a", user_id="u", session_id="long")
        for i in range(adk.CHECKPOINT_EVERY + 1):
            await service.append_event(s4, Event(author="user", timestamp=100.0 + i))
        await service.create_session(app_name="a", user_id="u", session_id="fresh")
        s6 = await service.create_session(app_name="a", user_id="u", session_id="raced")
        await asyncio.gather(  # concurrent appends: their directory records race too
            *(
                service.append_event(
                    s6,
                    Event(
                        author="user",
                        actions=EventActions(state_delta={f"k{i}": i} if i % 2 else {}),
                        timestamp=50.0 + i,
                    ),
                )
                for i in range(12)
            )
        )
        del s1
        listed = (await service.list_sessions(app_name="a", user_id="u")).sessions
        assert len(listed) == 6
        for every in (listed, (await service.list_sessions(app_name="a")).sessions):
            for x in every:
                got = await service.get_session(app_name="a", user_id="u", session_id=x.id)
                assert got is not None
                assert x.last_update_time == got.last_update_time, x.id
                assert x.state == got.state, x.id
        assert {x.id: x.last_update_time for x in listed}["past"] == 5.5
        assert {x.id: x.last_update_time for x in listed}["state"] == 6.0

    run(body())


# -- runs -------------------------------------------------------------------------------------


def make_runner(service: NousSessionService, llm: ScriptedLlm, plugin: NousRunPlugin) -> Runner:
    agent = LlmAgent(name="helper", model=llm, instruction="Be brief.")
    return Runner(app=App(name="a", root_agent=agent, plugins=[plugin]), session_service=service)


async def collect(runner: Runner, session_id: str, message: str) -> list[Event]:
    return [
        e
        async for e in runner.run_async(
            user_id="u", session_id=session_id, new_message=text(message)
        )
    ]


def test_a_runner_runs_end_to_end_in_a_turn(sessions: Sessions) -> None:
    """A Runner with a tool call stores every event, inside one turn of the session."""
    service = NousSessionService(sessions)

    def add(x: int, y: int) -> int:
        """Adds two numbers."""
        return x + y

    async def script(request: LlmRequest, n: int) -> LlmResponse:
        if n == 1:
            return LlmResponse(
                content=types.Content(
                    role="model",
                    parts=[types.Part.from_function_call(name="add", args={"x": 1, "y": 2})],
                )
            )
        return model_text("3")

    llm = ScriptedLlm(script=script)
    agent = LlmAgent(name="helper", model=llm, tools=[add])
    app = App(name="a", root_agent=agent, plugins=[service.plugin()])
    runner = Runner(app=app, session_service=service)

    async def body() -> None:
        await service.create_session(app_name="a", user_id="u", session_id="s")
        yielded = await collect(runner, "s", "add 1 and 2")
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [e.id for e in got.events[1:]] == [e.id for e in yielded if not e.partial], (
            [(e.author, e.content) for e in got.events],
            [(e.author, e.content) for e in yielded],
        )
        assert got.events[0].content == text("add 1 and 2")
        assert got.events[-1].content.parts[0].text == "3"  # type: ignore[union-attr,index]
        handle = await sessions.aopen(session_key("a", "u", "s"))
        log = await handle.events()
        kinds = [e.type for e in log]
        assert kinds.count(EventType.TURN_START) == 1
        assert kinds.index(EventType.TURN_START) < kinds.index(EventType.USER_MESSAGE)
        assert kinds[-1] is EventType.TURN_END
        assert log[-1].data["how"] == "closed"
        roles = [m.role.value for m in await handle.derive_messages()]
        assert roles == ["user", "assistant", "tool", "assistant"]

    run(body())


class SignallingPlugin(NousRunPlugin):
    """The service's plugin, telling the test when a run reaches its first hook."""

    def __init__(self, service: NousSessionService, reached: dict[str, asyncio.Event]) -> None:
        super().__init__(service, "enqueue", 300.0, 60.0)
        self.reached = reached

    async def on_user_message_callback(
        self, *, invocation_context: Any, user_message: Any
    ) -> None:
        for part in user_message.parts or []:
            if part.text in self.reached:
                self.reached[part.text].set()
        await super().on_user_message_callback(
            invocation_context=invocation_context, user_message=user_message
        )


def test_two_concurrent_runs_never_interleave(sessions: Sessions) -> None:
    """While run A holds its model call until run B has started, B waits for A's turn: the
    events of the two runs do not interleave, and B's model sees A's answer."""
    service = NousSessionService(sessions)

    async def body() -> None:
        reached = {"B": asyncio.Event()}
        a_in_model = asyncio.Event()

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            last = request_texts(request)[-1]
            if last == "A":
                a_in_model.set()
                await asyncio.wait_for(reached["B"].wait(), BOUND)
            return model_text(f"answer to {last}")

        llm = ScriptedLlm(script=script)
        runner = make_runner(service, llm, SignallingPlugin(service, reached))
        await service.create_session(app_name="a", user_id="u", session_id="s")
        first = asyncio.ensure_future(collect(runner, "s", "A"))
        await asyncio.wait_for(a_in_model.wait(), BOUND)
        second = asyncio.ensure_future(collect(runner, "s", "B"))
        await asyncio.wait_for(asyncio.gather(first, second), BOUND)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        runs = [e.invocation_id for e in got.events]
        assert runs == sorted(runs, key=runs.index)  # each run's events are contiguous
        assert len(set(runs)) == 2
        texts = [e.content.parts[0].text for e in got.events]  # type: ignore[union-attr,index]
        assert texts == ["A", "answer to A", "B", "answer to B"]
        assert "answer to A" in request_texts(llm.seen[1])

    run(body())


def test_a_run_with_policy_reject_fails_while_another_holds_the_session(
    sessions: Sessions,
) -> None:
    """With policy reject, a run that starts while another run holds the session fails at
    once with TurnBusy (chained by ADK's plugin manager), and stores nothing."""
    service = NousSessionService(sessions)

    async def body() -> None:
        release = asyncio.Event()
        a_in_model = asyncio.Event()

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            if request_texts(request)[-1] == "A":
                a_in_model.set()
                await asyncio.wait_for(release.wait(), BOUND)
            return model_text("done")

        runner = make_runner(service, ScriptedLlm(script=script), service.plugin("reject"))
        await service.create_session(app_name="a", user_id="u", session_id="s")
        first = asyncio.ensure_future(collect(runner, "s", "A"))
        await asyncio.wait_for(a_in_model.wait(), BOUND)
        with pytest.raises(RuntimeError) as info:
            await collect(runner, "s", "B")
        assert isinstance(info.value.__cause__, TurnBusy)
        release.set()
        await asyncio.wait_for(first, BOUND)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [e.content.parts[0].text for e in got.events] == ["A", "done"]  # type: ignore[union-attr,index]

    run(body())


def test_queued_runs_start_from_every_event_committed_before_them(sessions: Sessions) -> None:
    """Ten runs queued behind a first one: each model request holds the whole conversation
    committed before it (the last one all eleven user messages and ten answers)."""
    service = NousSessionService(sessions)
    names = [f"m{i}" for i in range(1, 11)]

    async def body() -> None:
        reached = {n: asyncio.Event() for n in names}
        first_in_model = asyncio.Event()
        release = asyncio.Event()

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            last = request_texts(request)[-1]
            if last == "m0":
                first_in_model.set()
                await asyncio.wait_for(release.wait(), BOUND)
            return model_text(f"answer to {last}")

        llm = ScriptedLlm(script=script)
        runner = make_runner(service, llm, SignallingPlugin(service, reached))
        await service.create_session(app_name="a", user_id="u", session_id="s")
        first = asyncio.ensure_future(collect(runner, "s", "m0"))
        await asyncio.wait_for(first_in_model.wait(), BOUND)
        queued = [asyncio.ensure_future(collect(runner, "s", n)) for n in names]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in reached.values())), BOUND)
        release.set()
        await asyncio.wait_for(asyncio.gather(first, *queued), BOUND)
        assert len(llm.seen) == 11
        for i, request in enumerate(llm.seen):
            texts = request_texts(request)
            assert len(texts) == 2 * i + 1, (i, texts)
            asked = texts[0::2]
            assert texts[1::2] == [f"answer to {q}" for q in asked[:-1]]
        assert sorted(request_texts(llm.seen[-1])[0::2]) == sorted(["m0", *names])

    run(body())


@pytest.mark.parametrize("recent", [0, 1, 2, 5])
def test_a_queued_run_keeps_what_it_loaded_and_gains_what_was_committed_since(
    sessions: Sessions, recent: int
) -> None:
    """A run that read the latest ``recent`` events (its get_session_config) and then waited
    for another run's turn starts from those events plus every one committed since: never
    fewer, never the older ones it did not read."""
    service = NousSessionService(sessions)

    async def body() -> None:
        s = await service.create_session(app_name="a", user_id="u", session_id="s")
        for i, t in enumerate(["u1", "a1", "u2", "a2"], start=1):
            await service.append_event(s, Event(author="user", content=text(t), timestamp=i))
        reached = {"B": asyncio.Event()}
        a_in_model = asyncio.Event()

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            last = request_texts(request)[-1]
            if last == "A":
                a_in_model.set()
                await asyncio.wait_for(reached["B"].wait(), BOUND)
            return model_text(f"answer to {last}")

        llm = ScriptedLlm(script=script)
        runner = make_runner(service, llm, SignallingPlugin(service, reached))
        first = asyncio.ensure_future(collect(runner, "s", "A"))
        await asyncio.wait_for(a_in_model.wait(), BOUND)
        config = RunConfig(get_session_config=GetSessionConfig(num_recent_events=recent))
        second = [
            e
            async for e in runner.run_async(
                user_id="u", session_id="s", new_message=text("B"), run_config=config
            )
        ]
        await asyncio.wait_for(first, BOUND)
        assert second
        loaded = ["u1", "a1", "u2", "a2", "A"][5 - recent :] if recent else []
        assert request_texts(llm.seen[-1]) == [*loaded, "answer to A", "B"]

    run(body())


@pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\]:UserWarning")  # ADK's compaction config
def test_compaction_after_a_run_is_stored_while_a_queued_run_holds_the_session(
    store: Store,
) -> None:
    """ADK compacts after a run, outside its turn, while the run queued behind it already
    holds the session: the compaction is stored at once (not after the later run, nor
    refused at the bound), and both runs complete."""
    registry = Sessions(store, timeout=5)
    service = NousSessionService(registry)

    async def body() -> None:
        reached = {"B": asyncio.Event()}
        a_in_model = asyncio.Event()
        first: asyncio.Future[list[Event]] | None = None

        async def answer(request: LlmRequest, n: int) -> LlmResponse:
            last = request_texts(request)[-1]
            if last == "A":
                a_in_model.set()
                await asyncio.wait_for(reached["B"].wait(), BOUND)
            elif last == "B":  # hold B's turn until A (with its compaction) is done
                assert first is not None
                await asyncio.wait([first], timeout=BOUND)
            return model_text(f"answer to {last}")

        async def summarise(request: LlmRequest, n: int) -> LlmResponse:
            return model_text(f"SUMMARY {n}")

        agent = LlmAgent(name="helper", model=ScriptedLlm(script=answer))
        compaction = EventsCompactionConfig(
            summarizer=LlmEventSummarizer(llm=ScriptedLlm(script=summarise)),
            compaction_interval=1,
            overlap_size=0,
        )
        plugin = SignallingPlugin(service, reached)
        app = App(
            name="a", root_agent=agent, plugins=[plugin], events_compaction_config=compaction
        )
        runner = Runner(app=app, session_service=service)
        await service.create_session(app_name="a", user_id="u", session_id="s")
        first = asyncio.ensure_future(collect(runner, "s", "A"))
        await asyncio.wait_for(a_in_model.wait(), BOUND)
        second = asyncio.ensure_future(collect(runner, "s", "B"))
        done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), BOUND)
        assert not [r for r in done if isinstance(r, BaseException)], done
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [e.actions.compaction is not None for e in got.events].count(True) >= 1
        plain = [e.content.parts[0].text for e in got.events if e.content]  # type: ignore[index]
        assert plain == ["A", "answer to A", "B", "answer to B"]
        handle = await registry.aopen(session_key("a", "u", "s"))
        log = await handle.events()
        starts = [e.seq for e in log if e.type is EventType.TURN_START]
        ends = [e.seq for e in log if e.type is EventType.TURN_END]
        [a_summary] = [
            e for e in log if e.surface_op is not None and e.data["content"] == "SUMMARY 1"
        ]
        assert ends[0] < starts[1] < a_summary.seq < ends[1]  # after A's turn, in B's

    try:
        run(body())
    finally:
        registry.close()


def test_a_refused_run_is_told_apart_from_other_errors(sessions: Sessions) -> None:
    """refused_by_turn finds the TurnBusy inside the RuntimeError ADK's plugin manager raises
    for a refused run, and nothing in other errors."""
    service = NousSessionService(sessions)

    async def body() -> None:
        release = asyncio.Event()
        a_in_model = asyncio.Event()

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            if request_texts(request)[-1] == "A":
                a_in_model.set()
                await asyncio.wait_for(release.wait(), BOUND)
            return model_text("done")

        runner = make_runner(service, ScriptedLlm(script=script), service.plugin("reject"))
        await service.create_session(app_name="a", user_id="u", session_id="s")
        first = asyncio.ensure_future(collect(runner, "s", "A"))
        await asyncio.wait_for(a_in_model.wait(), BOUND)
        try:
            await collect(runner, "s", "B")
        except RuntimeError as exc:
            busy = refused_by_turn(exc)
            assert isinstance(busy, TurnBusy)
            assert busy is exc.__cause__
        else:
            raise AssertionError("the second run was not refused")
        release.set()
        await asyncio.wait_for(first, BOUND)

    run(body())
    assert refused_by_turn(RuntimeError("other")) is None
    assert refused_by_turn(ValueError("x")) is None
    busy = TurnBusy("the session is in a turn", holder="someone")
    assert refused_by_turn(busy) is busy
    wrapped = RuntimeError("twice")
    wrapped.__cause__ = RuntimeError("once")
    wrapped.__cause__.__cause__ = busy
    assert refused_by_turn(wrapped) is busy  # however deep ADK's wrapping
    unrelated = RuntimeError("a failure while handling one")
    unrelated.__context__ = busy  # a TurnBusy only as context: not what refused the run
    assert refused_by_turn(unrelated) is None
    with pytest.raises(TypeError, match="takes an exception"):
        refused_by_turn("TurnBusy")  # type: ignore[arg-type]


def test_a_crash_of_the_session_mid_run_recovers(sessions: Sessions) -> None:
    """The session crashes while the run waits for its model: it restarts from the store,
    the run's turn is opened again, and the run completes with every event stored."""
    service = NousSessionService(sessions)
    key = session_key("a", "u", "s")

    async def body() -> None:
        handle = await sessions.aopen(key)

        async def script(request: LlmRequest, n: int) -> LlmResponse:
            with pytest.raises(Exception, match="crash"):
                await crash(handle)
            return model_text("still here")

        runner = make_runner(service, ScriptedLlm(script=script), service.plugin())
        await service.create_session(app_name="a", user_id="u", session_id="s")
        await collect(runner, "s", "hello")
        assert sessions.restart_count(key) == 1
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        assert [e.content.parts[0].text for e in got.events] == [  # type: ignore[union-attr,index]
            "hello",
            "still here",
        ]
        ends = [e.data for e in await handle.events() if e.type is EventType.TURN_END]
        assert [(d["how"], d.get("reason")) for d in ends] == [
            ("interrupted", "restart"),
            ("closed", None),
        ]

    run(body())


@pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\]:UserWarning")  # ADK's compaction config
def test_adk_compaction_in_a_runner_keeps_history(sessions: Sessions) -> None:
    """ADK's own sliding-window compaction, run by the Runner after a run, lands as a replace:
    the surface shows the summary instead of the runs it covers, the log keeps them."""
    service = NousSessionService(sessions)

    async def answer(request: LlmRequest, n: int) -> LlmResponse:
        return model_text(f"answer to {request_texts(request)[-1]}")

    async def summarise(request: LlmRequest, n: int) -> LlmResponse:
        return model_text("SUMMARY")

    agent = LlmAgent(name="helper", model=ScriptedLlm(script=answer))
    compaction = EventsCompactionConfig(
        summarizer=LlmEventSummarizer(llm=ScriptedLlm(script=summarise)),
        compaction_interval=2,
        overlap_size=0,
    )
    app = App(
        name="a",
        root_agent=agent,
        plugins=[service.plugin()],
        events_compaction_config=compaction,
    )
    runner = Runner(app=app, session_service=service)

    async def body() -> None:
        await service.create_session(app_name="a", user_id="u", session_id="s")
        for q in ("q1", "q2", "q3"):
            await collect(runner, "s", q)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert got is not None
        compactions = [e for e in got.events if e.actions.compaction is not None]
        assert len(compactions) == 1
        plain = [e.content.parts[0].text for e in got.events if e.content]  # type: ignore[index]
        assert plain == ["q1", "answer to q1", "q2", "answer to q2", "q3", "answer to q3"]
        handle = await sessions.aopen(session_key("a", "u", "s"))
        surface = [m.content for m in await handle.derive_messages()]
        assert surface == ["SUMMARY", "q3", "answer to q3"]

    run(body())


# -- packaging --------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_does_not_import_the_adapter() -> None:
    """`import nous_actor` loads neither the adapter nor ADK (the extra stays optional)."""
    code = (
        "import sys, nous_actor; "
        "assert 'nous_actor.integrations.adk' not in sys.modules; "
        "assert not any(m == 'google.adk' or m.startswith('google.adk.') for m in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=BOUND
    )
    assert done.returncode == 0, done.stderr


def test_without_adk_the_import_says_what_to_install() -> None:
    """Importing the adapter without ADK raises an ImportError naming the extra."""
    code = (
        "import sys; sys.modules['google.adk'] = None\n"
        "try:\n    import nous_actor.integrations.adk\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=BOUND
    )
    assert "pip install 'nous-actor[adk]'" in done.stdout, done.stderr


def test_google_adk_is_imported_by_the_adapter_alone() -> None:
    """Of the package's modules, only nous_actor/integrations/adk/framework.py imports
    google.adk."""
    users = sorted(
        str(p.relative_to(ROOT / "nous_actor"))
        for p in (ROOT / "nous_actor").rglob("*.py")
        if "google.adk" in p.read_text(encoding="utf-8")
        and any(
            line.lstrip().startswith(("from google.adk", "import google.adk"))
            for line in p.read_text(encoding="utf-8").splitlines()
        )
    )
    assert users == ["integrations/adk/framework.py"]
