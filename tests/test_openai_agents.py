"""NousSession: the OpenAI Agents SDK's Session over a nous_actor session.

Runs against MemoryStore and SQLiteStore. The SDK's own SQLiteSession tests
(ordering, limit, pop, clear, isolation, unicode, concurrency) are ported
here; real `Runner.run` loops use a scripted model (no network). Crashes are
real (`nous_actor.sessions.faults.crash`); a session's actor is held still, where a
test needs calls queued behind each other, by a call that waits on a
`threading.Event`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agents import (
    Agent,
    ModelResponse,
    RunConfig,
    Runner,
    TResponseInputItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import Session as AgentsSession
from agents.memory import SessionSettings, SQLiteSession
from agents.models.interface import Model
from bounds import RUN_BOUND as BOUND
from bounds import run
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from nous_actor import (
    CallTimeout,
    Compactor,
    InvalidEvent,
    Log,
    MemoryStore,
    Message,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    SQLiteStore,
    Store,
)
from nous_actor.integrations.openai_agents import (
    CLEARED_KEY,
    ITEM_KEY,
    OP_KEY,
    NousSession,
    NousSessionClosed,
    _Mutex,
    event_for_item,
    items_from_messages,
)
from nous_actor.sessions.faults import crash

set_tracing_disabled(True)  # no trace is ever sent anywhere

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def make_store(kind: str, path: Path) -> Store:
    return MemoryStore() if kind == "memory" else SQLiteStore(path / "agents.db")


@pytest.fixture(params=["memory", "sqlite"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sessions]:
    store = make_store(request.param, tmp_path)
    registry = Sessions(store, timeout=20)
    yield registry
    registry.close()
    store.close()


def hold(handle: Session) -> threading.Event:
    """Hold the session's actor still until the returned event is set (bounded)."""
    gate = threading.Event()
    handle._call(lambda actor: gate.wait(BOUND))
    return gate


async def until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Give the event loop turns until `condition()` holds (no timed sleep)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def inbox_size(handle: Session) -> int:
    ref = handle._actor()
    assert ref is not None
    return ref.actor_inbox.qsize()  # type: ignore[attr-defined,no-any-return]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# Items of every kind the SDK sends or may send (Responses input items).
EVERY_KIND: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": [{"type": "input_text", "text": "use tools"}]},
    {"content": "what is 2 + 3?", "role": "user"},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "and this picture?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-1"},
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "add them"}],
        "encrypted_content": "gAAAA...",
    },
    {
        "arguments": '{"a": 2, "b": 3}',
        "call_id": "call_1",
        "name": "add",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
    },
    {"call_id": "call_1", "output": "5", "type": "function_call_output"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "a list output"}],
    },
    {
        "id": "msg_1",
        "content": [
            {"annotations": [], "text": "It is 5.", "type": "output_text", "logprobs": []}
        ],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    },
    {
        "id": "msg_2",
        "content": [{"type": "refusal", "refusal": "I cannot look at that."}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    },
    {"role": "assistant", "content": "an easy assistant message"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
    {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "call_3",
        "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "call_3",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"},
    },
    {"type": "custom_tool_call", "call_id": "call_4", "name": "grep", "input": "-r foo"},
    {"type": "custom_tool_call_output", "call_id": "call_4", "output": "foo.py:1"},
    {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "fs", "tools": []},
    {"type": "item_reference", "id": "msg_0"},
    {"type": "a_future_item", "nested": {"deep": [1, 2.5, None, True, {"k": "v"}]}},
]


# -- the protocol ---------------------------------------------------------------------------


def test_nous_session_is_an_agents_session(sessions: Sessions) -> None:
    """A NousSession is a Session of the SDK (its runtime protocol check), with settings."""
    nous = NousSession("user-1", sessions)
    assert isinstance(nous, AgentsSession)
    assert nous.session_id == "user-1"
    assert nous.session_settings == SessionSettings()


def test_items_of_every_kind_round_trip_exactly(sessions: Sessions) -> None:
    """get_items gives back exactly the items added, of every kind, in order."""

    async def main() -> None:
        nous = NousSession("every-kind", sessions)
        await nous.add_items(copy.deepcopy(EVERY_KIND))
        got = await nous.get_items()
        assert got == EVERY_KIND
        assert all(type(it) is dict for it in got)  # plain dicts, the caller's
        got[0]["content"] = "changed"
        assert (await nous.get_items()) == EVERY_KIND

    run(main())


def test_each_item_is_one_event_of_the_type_that_fits(sessions: Sessions) -> None:
    """Messages, calls, outputs and reasoning map to the event types that fit, item kept."""

    async def main() -> None:
        nous = NousSession("types", sessions)
        await nous.add_items(copy.deepcopy(EVERY_KIND))
        events = await (await nous.open()).events()
        assert [ev.type.value for ev in events] == [
            "system_message",
            "system_message",
            "user_message",
            "user_message",
            "assistant_message",  # reasoning
            "assistant_message",  # function_call
            "tool_result",
            "tool_result",
            "assistant_message",
            "assistant_message",
            "assistant_message",
            "assistant_message",  # web_search_call
            "assistant_message",  # computer_call
            "tool_result",  # computer_call_output
            "assistant_message",  # custom_tool_call
            "tool_result",  # custom_tool_call_output
            "assistant_message",
            "assistant_message",
            "assistant_message",
        ]
        assert [ev.data["metadata"][ITEM_KEY] for ev in events] == EVERY_KIND
        call, output = events[5].data, events[6].data
        assert call["tool_calls"] == [
            {"id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 3}'}
        ]
        assert output["tool_call_id"] == "call_1"
        assert events[4].data["reasoning_content"] == "add them"

    run(main())


def test_surface_is_the_chat_view_of_the_items(sessions: Sessions) -> None:
    """derive_messages, sent as chat completions, says what the items say."""

    async def main() -> None:
        nous = NousSession("chat-view", sessions)
        await nous.add_items(copy.deepcopy(EVERY_KIND[:10]))
        messages = await (await nous.open()).derive_messages()
        payload = Message.to_openai_list(messages)
        assert payload == [
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "use tools"},
            {"role": "user", "content": "what is 2 + 3?"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and this picture?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/a.png", "detail": "low"},
                    },
                    {"type": "input_file", "file_id": "file-1"},
                ],
            },
            {"role": "assistant", "content": None, "reasoning_content": "add them"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    }
                ],
            },
            {"role": "tool", "content": "5", "tool_call_id": "call_1"},
            {"role": "tool", "content": "a list output", "tool_call_id": "call_2"},
            {"role": "assistant", "content": "It is 5."},
            {"role": "assistant", "content": "I cannot look at that."},
        ]

    run(main())


@pytest.mark.parametrize(
    "item",
    [
        {"role": 5, "content": "role is not a str"},
        {"role": "user", "content": {"not": "a list"}},
        {"type": "function_call", "call_id": 7, "name": None, "arguments": {"a": 1}},
        {"type": "function_call_output", "call_id": None, "output": {"x": 1}},
        {"type": "reasoning", "summary": "not a list", "content": [{"text": 3}]},
        {"type": "x_call", "call_id": "c"},
        {"type": "x_output", "call_id": "c", "output": 12},
        {},
    ],
    ids=lambda item: json.dumps(item)[:40],
)
def test_odd_item_fields_never_break_the_surface(sessions: Sessions, item: dict[str, Any]) -> None:
    """An item with fields of unexpected types round-trips, and the surface still derives."""

    async def main() -> None:
        nous = NousSession("odd", sessions)
        await nous.add_items([copy.deepcopy(item), user("after")])
        assert await nous.get_items() == [item, user("after")]
        messages = await (await nous.open()).derive_messages()
        assert len(messages) == 2

    run(main())


# -- the rule: get_items is the items view of the surface ------------------------------------

texts = st.text(max_size=6)
ITEMS = st.one_of(
    st.builds(user, texts),
    st.builds(lambda t: {"role": "system", "content": t}, texts),
    st.builds(
        lambda t: {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": t, "annotations": []}],
        },
        texts,
    ),
    st.builds(
        lambda c, a: {"type": "function_call", "call_id": c, "name": "f", "arguments": a},
        texts,
        texts,
    ),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": o}, texts, texts
    ),
    st.builds(
        lambda t: {
            "id": "rs",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": t}],
        },
        texts,
    ),
    st.builds(lambda i: {"type": "web_search_call", "id": i, "status": "completed"}, texts),
)


class ItemsMachine(RuleBasedStateMachine):
    """NousSession against a plain list; the surface and the history checked at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = Sessions(MemoryStore(), timeout=20)
        self.nous = NousSession("machine", self.registry)
        self.model: list[dict[str, Any]] = []
        self.seen_events = 0

    @rule(batch=st.lists(ITEMS, max_size=4))
    def add_items(self, batch: list[dict[str, Any]]) -> None:
        run(self.nous.add_items(copy.deepcopy(batch)))
        self.model.extend(batch)

    @rule()
    def pop_item(self) -> None:
        expected = self.model.pop() if self.model else None
        assert run(self.nous.pop_item()) == expected

    @rule()
    def clear_session(self) -> None:
        run(self.nous.clear_session())
        self.model.clear()

    @rule(limit=st.none() | st.integers(-2, 6))
    def get_items(self, limit: int | None) -> None:
        got = run(self.nous.get_items(limit))
        if limit is None or limit < 0:
            assert got == self.model
        else:
            assert got == (self.model[-limit:] if limit else [])

    @invariant()
    def items_are_the_items_of_the_surface(self) -> None:
        async def both() -> tuple[list[TResponseInputItem], list[Message], int]:
            handle = await self.nous.open()
            return (
                await self.nous.get_items(),
                await handle.derive_messages(),
                await handle.count(),
            )

        items, messages, n = run(both())
        assert items == self.model
        assert items_from_messages(messages) == items
        assert n >= self.seen_events  # nothing is ever deleted
        self.seen_events = n
        placeholders = [m for m in messages if CLEARED_KEY in m.metadata]
        assert len(placeholders) == (1 if not self.model and messages else 0)

    def teardown(self) -> None:
        self.registry.close()


TestItemsMachine = ItemsMachine.TestCase
TestItemsMachine.settings = settings(max_examples=30, stateful_step_count=15, deadline=None)


# -- limit, pop, clear (ported from the SDK's SQLiteSession tests) -------------------------


def test_limit_gives_the_latest_items_in_order(sessions: Sessions) -> None:
    """limit=n gives the latest n items oldest first; 0 none; more than there are, all."""

    async def main() -> None:
        nous = NousSession("limit", sessions)
        items = [
            user("Message 1"),
            {"role": "assistant", "content": "Response 1"},
            user("Message 2"),
            {"role": "assistant", "content": "Response 2"},
            user("Message 3"),
            {"role": "assistant", "content": "Response 3"},
        ]
        await nous.add_items(copy.deepcopy(items))
        assert await nous.get_items() == items
        assert await nous.get_items(limit=2) == items[-2:]
        assert await nous.get_items(limit=4) == items[-4:]
        assert await nous.get_items(limit=10) == items
        assert await nous.get_items(limit=0) == []
        assert await nous.get_items(limit=-1) == items  # as SQLiteSession: no limit

    run(main())


def test_limit_counts_items_not_messages(sessions: Sessions) -> None:
    """With messages of other code that stand for several items, limit still counts items."""

    async def main() -> None:
        nous = NousSession("limit-items", sessions)
        handle = await nous.open()
        calls = [{"id": f"c{i}", "name": "f", "arguments": "{}"} for i in range(3)]
        await handle.append("assistant_message", {"content": "x", "tool_calls": calls})
        await nous.add_items([user("u")])
        assert len(await nous.get_items()) == 5
        assert await nous.get_items(limit=2) == [
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            user("u"),
        ]

    run(main())


def test_session_settings_limit_is_the_default(sessions: Sessions) -> None:
    """session_settings.limit applies when get_items gets no limit; an explicit one wins."""

    async def main() -> None:
        nous = NousSession("settings", sessions, session_settings={"limit": 2})
        await nous.add_items([user(str(i)) for i in range(5)])
        assert await nous.get_items() == [user("3"), user("4")]
        assert await nous.get_items(limit=3) == [user("2"), user("3"), user("4")]
        with pytest.raises(TypeError, match="limit must be an int"):
            await nous.get_items(limit="2")  # type: ignore[arg-type]

    run(main())


def test_session_settings_limit_zero_means_no_items(sessions: Sessions, tmp_path: Path) -> None:
    """session_settings={"limit": 0} is taken, as the SDK's sessions take it (its own
    test_session_settings_constructor_normalizes_dictionary): get_items() then gives no
    item, an explicit limit still wins, and a RunConfig's settings resolve over it."""
    sdk = SQLiteSession("x", session_settings={"limit": 0})
    assert sdk.session_settings is not None
    assert sdk.session_settings.limit == 0
    sdk.close()

    async def main() -> None:
        nous = NousSession("limit-zero", sessions, session_settings={"limit": 0})
        assert isinstance(nous.session_settings, SessionSettings)
        assert nous.session_settings.limit == 0
        assert nous.session_settings.resolve({"limit": 4}).limit == 4
        await nous.add_items([user(str(i)) for i in range(3)])
        assert await nous.get_items() == []
        assert await nous.get_items(limit=2) == [user("1"), user("2")]
        also = NousSession("limit-zero", sessions, session_settings=SessionSettings(limit=0))
        assert await also.get_items() == []
        on_file = NousSession.sqlite("x", tmp_path / "chat.db", session_settings={"limit": 0})
        try:
            assert on_file.session_settings is not None
            assert on_file.session_settings.limit == 0
        finally:
            on_file.close()

    run(main())


def test_pop_on_an_empty_session_returns_none_and_appends_nothing(sessions: Sessions) -> None:
    """pop_item on a session with no item returns None and leaves the log as it was."""

    async def main() -> None:
        nous = NousSession("empty-pop", sessions)
        assert await nous.pop_item() is None
        assert await (await nous.open()).count() == 0

    run(main())


def test_pop_returns_items_newest_first_then_none(sessions: Sessions) -> None:
    """Each pop returns the newest item exactly as added; then None once empty."""

    async def main() -> None:
        nous = NousSession("pop", sessions)
        items = [
            user("Hello"),
            {"role": "assistant", "content": "Hi there!"},
            user("How are you?"),
        ]
        await nous.add_items(copy.deepcopy(items))
        assert await nous.pop_item() == items[2]
        assert await nous.get_items() == items[:2]
        assert await nous.pop_item() == items[1]
        assert await nous.pop_item() == items[0]
        assert await nous.pop_item() is None
        assert await nous.get_items() == []

    run(main())


def test_pop_keeps_history_and_hides_exactly_the_popped_item(sessions: Sessions) -> None:
    """A pop appends one replace; the surface loses just the popped message; audit shows it."""

    async def main() -> None:
        nous = NousSession("pop-history", sessions)
        await nous.add_items([user("a"), user("b"), user("c")])
        handle = await nous.open()
        before = await handle.derive_messages()
        assert await nous.pop_item() == user("c")
        after = await handle.derive_messages()
        assert after == before[:-1]  # the same messages, times included
        events = await handle.events()
        assert len(events) == 4  # nothing deleted
        assert events[2].data["metadata"][ITEM_KEY] == user("c")
        pop = events[3]
        assert pop.data[OP_KEY] == {"op": "pop_item", "popped_seq": 2}
        assert (pop.surface_op.start, pop.surface_op.stop) == (1, 2)  # type: ignore[union-attr]

    run(main())


def test_pop_of_the_only_item_leaves_a_marker_the_next_add_replaces(sessions: Sessions) -> None:
    """Popping the last item leaves one cleared marker; the next add_items replaces it."""

    async def main() -> None:
        nous = NousSession("only", sessions)
        await nous.add_items([user("only")])
        assert await nous.pop_item() == user("only")
        handle = await nous.open()
        (marker,) = await handle.derive_messages()
        assert marker.role == "system"
        assert marker.content is None
        assert marker.metadata[CLEARED_KEY] == "pop_item"
        await nous.add_items([user("next"), user("then")])
        assert [m.content for m in await handle.derive_messages()] == ["next", "then"]
        assert await nous.get_items() == [user("next"), user("then")]

    run(main())


def test_clear_hides_every_item_and_keeps_history(sessions: Sessions) -> None:
    """clear_session empties get_items with one appended marker; every event stays."""

    async def main() -> None:
        nous = NousSession("clear", sessions)
        await nous.add_items(copy.deepcopy(EVERY_KIND))
        await nous.clear_session()
        assert await nous.get_items() == []
        handle = await nous.open()
        events = await handle.events()
        assert len(events) == len(EVERY_KIND) + 1
        assert events[-1].data[OP_KEY] == {"op": "clear_session", "items": len(EVERY_KIND)}
        (marker,) = await handle.derive_messages()
        assert marker.metadata[CLEARED_KEY] == "clear_session"
        await nous.add_items([user("fresh start")])
        assert await nous.get_items() == [user("fresh start")]
        assert [m.content for m in await handle.derive_messages()] == ["fresh start"]

    run(main())


def test_clear_of_an_empty_session_appends_nothing(sessions: Sessions) -> None:
    """clear_session with no item (never added, or cleared already) appends nothing."""

    async def main() -> None:
        nous = NousSession("clear-empty", sessions)
        await nous.clear_session()
        handle = await nous.open()
        assert await handle.count() == 0
        await nous.add_items([user("x")])
        await nous.clear_session()
        await nous.clear_session()
        assert await handle.count() == 2

    run(main())


def test_sessions_are_isolated(sessions: Sessions) -> None:
    """Adding, popping and clearing one session leaves another untouched."""

    async def main() -> None:
        one, two = NousSession("session_1", sessions), NousSession("session_2", sessions)
        await one.add_items([user("Session 1 message")])
        await two.add_items([user("Session 2 message 1"), user("Session 2 message 2")])
        assert await two.pop_item() == user("Session 2 message 2")
        assert await one.get_items() == [user("Session 1 message")]
        assert await two.get_items() == [user("Session 2 message 1")]
        await two.clear_session()
        assert await one.get_items() == [user("Session 1 message")]

    run(main())


def test_unicode_and_special_characters_round_trip(sessions: Sessions) -> None:
    """Non-ASCII text, emoji, quotes and SQL keywords come back unchanged."""

    async def main() -> None:
        nous = NousSession("ünïcødé-日本", sessions)
        items = [
            user("こんにちは"),
            {"role": "assistant", "content": "😊👍"},
            user("Привет"),
            user("O'Reilly"),
            {"role": "assistant", "content": "DROP TABLE sessions;"},
            user('"SELECT * FROM users WHERE name = "admin";"'),
            {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
            user("tab\tnew\nline \u2028 \x00 nul"),
        ]
        await nous.add_items(copy.deepcopy(items))
        assert await nous.get_items() == items

    run(main())


def test_large_items_and_batches_round_trip(sessions: Sessions) -> None:
    """A 1 MB tool output and a batch of 2,000 items come back whole and in order."""

    async def main() -> None:
        nous = NousSession("large", sessions)
        big = {"type": "function_call_output", "call_id": "c", "output": "x" * 1_000_000}
        batch = [user(f"m{i}") for i in range(2000)]
        await nous.add_items([copy.deepcopy(big)])
        await nous.add_items(copy.deepcopy(batch))
        assert await nous.get_items() == [big, *batch]
        assert await nous.get_items(limit=1) == [batch[-1]]

    run(main())


# -- bad input ---------------------------------------------------------------------------


def test_a_non_dict_item_is_refused_and_nothing_is_stored(sessions: Sessions) -> None:
    """An item that is not a dict is a TypeError naming its index; no item is stored."""

    async def main() -> None:
        nous = NousSession("bad-type", sessions)
        with pytest.raises(TypeError, match=r"item 1 is a str, not a dict.*nothing was stored"):
            await nous.add_items([user("fine"), "not a dict"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="takes a list of items"):
            await nous.add_items("hello")  # type: ignore[arg-type]
        assert await nous.get_items() == []
        assert await (await nous.open()).count() == 0

    run(main())


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({1, 2}, "items[1]['content']"),
        (b"bytes", "items[1]['content']"),
        (float("nan"), "items[1]['content']"),
        ({1: "int key"}, "items[1]['content'][1]"),
        (object(), "items[1]['content']"),
        ("lone \ud800 surrogate", "items[1]['content']"),
    ],
    ids=["set", "bytes", "nan", "int-key", "object", "surrogate"],
)
def test_a_value_json_cannot_carry_is_refused_and_nothing_is_stored(
    sessions: Sessions, value: object, where: str
) -> None:
    """A non-JSON value is InvalidEvent(unserializable_event_data) naming the item and path."""

    async def main() -> None:
        nous = NousSession("bad-json", sessions)
        with pytest.raises(InvalidEvent, match=r"add_items: item 1: .*nothing was stored") as info:
            await nous.add_items([user("fine"), {"role": "user", "content": value}])  # type: ignore[list-item]
        assert info.value.reason == "unserializable_event_data"
        assert where in str(info.value)
        assert await nous.get_items() == []

    run(main())


def test_calls_after_close_raise_session_stopped(sessions: Sessions) -> None:
    """Every call on a closed NousSession raises NousSessionClosed (a SessionStopped); the
    registry stays open."""

    async def main() -> None:
        nous = NousSession("closed", sessions)
        await nous.add_items([user("x")])
        nous.close()
        for call in (
            nous.get_items(),
            nous.add_items([user("y")]),
            nous.pop_item(),
            nous.clear_session(),
        ):
            with pytest.raises(NousSessionClosed, match="this NousSession is closed"):
                await call
        assert await NousSession("closed", sessions).get_items() == [user("x")]

    run(main())


def test_a_call_on_a_closed_session_is_a_runtime_error_as_in_the_sdk(sessions: Sessions) -> None:
    """The SDK's own sessions raise RuntimeError once closed: so does NousSession, with an
    error that is also a SessionStopped (NousSessionClosed)."""

    async def main() -> None:
        nous = NousSession("closed-sdk", sessions)
        nous.close()
        for call in (
            nous.get_items(),
            nous.add_items([user("y")]),
            nous.pop_item(),
            nous.clear_session(),
            nous.open(),
        ):
            with pytest.raises(RuntimeError, match="closed") as info:
                await call
            assert isinstance(info.value, NousSessionClosed)
            assert isinstance(info.value, SessionStopped)
            assert info.value.session_id == "closed-sdk"

    run(main())


def test_an_unknown_session_setting_is_a_type_error_as_in_the_sdk(tmp_path: Path) -> None:
    """session_settings={"limitt": 1} is refused with the SDK's own TypeError wording, by the
    constructor and by NousSession.sqlite (which then opens no file)."""
    with pytest.raises(TypeError, match="Unknown session settings: limitt") as sdk:
        SQLiteSession("x", session_settings={"limitt": 1})
    with (
        Sessions() as registry,
        pytest.raises(TypeError, match="Unknown session settings: limitt") as ours,
    ):
        NousSession("x", registry, session_settings={"limitt": 1})
    assert str(ours.value).startswith(str(sdk.value))
    assert "SessionSettings takes limit" in str(ours.value)
    path = tmp_path / "chat.db"
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        NousSession.sqlite("x", path, session_settings={"limitt": 1})
    assert not path.exists()


BAD_ARGUMENTS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("id_not_a_str", {"session_id": 7}, TypeError, "session_id must be a str, got int"),
    ("id_padded", {"session_id": " padded "}, ValueError, "leading or trailing whitespace"),
    ("id_empty", {"session_id": ""}, ValueError, "it is empty"),
    (
        "registry_a_path",
        {"sessions": "chat.db"},
        TypeError,
        r"NousSession takes a nous_actor\.Sessions registry, got str; or use "
        r"NousSession\.sqlite\(session_id, path\)",
    ),
    (
        "registry_a_store",
        {"sessions": MemoryStore()},
        TypeError,
        r"NousSession takes a nous_actor\.Sessions registry, got MemoryStore",
    ),
    (
        "settings_an_int",
        {"session_settings": 5},
        TypeError,
        "session_settings must be an agents SessionSettings, a dict or None, got int",
    ),
    (
        "limit_negative",
        {"session_settings": SessionSettings(limit=-1)},
        ValueError,
        "limit must be 0 or more, got -1; give None for every item",
    ),
    (
        "limit_a_str",
        {"session_settings": {"limit": "2"}},
        TypeError,
        "limit must be an int .* or None .*, got str",
    ),
    (
        "limit_a_bool",
        {"session_settings": {"limit": True}},
        TypeError,
        "limit must be an int .*, got bool",
    ),
]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [b[1:] for b in BAD_ARGUMENTS],
    ids=[b[0] for b in BAD_ARGUMENTS],
)
def test_constructor_checks_every_argument(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each argument of NousSession(...) is checked when it is made, with a typed error that
    says what to pass."""
    with Sessions() as registry:
        args: dict[str, Any] = {"session_id": "x", "sessions": registry, **change}
        with pytest.raises(error, match=match):
            NousSession(args.pop("session_id"), args.pop("sessions"), **args)


SQLITE_BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("id_not_a_str", {"session_id": None}, TypeError, "session_id must be a str, got NoneType"),
    ("id_padded", {"session_id": "x\n"}, ValueError, "leading or trailing whitespace"),
    (
        "path_an_int",
        {"path": 3},
        TypeError,
        r"takes the SQLite file as a str or a pathlib\.Path \(or ':memory:'\), got int",
    ),
    ("path_empty", {"path": ""}, ValueError, "got an empty path; give the SQLite file"),
    (
        "settings_unknown",
        {"session_settings": {"limit": 1, "order": "desc"}},
        TypeError,
        "Unknown session settings: order",
    ),
    ("limit_negative", {"session_settings": {"limit": -2}}, ValueError, "0 or more, got -2"),
]


@pytest.mark.parametrize(
    ("change", "error", "match"), [b[1:] for b in SQLITE_BAD], ids=[b[0] for b in SQLITE_BAD]
)
def test_sqlite_factory_checks_every_argument_before_opening_the_file(
    tmp_path: Path, change: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each argument of NousSession.sqlite(...) is checked with a typed error that says what
    to pass, and a refused call opens no file."""
    path = tmp_path / "chat.db"
    args: dict[str, Any] = {"session_id": "x", "path": path, **change}
    with pytest.raises(error, match=match):
        NousSession.sqlite(args.pop("session_id"), args.pop("path"), **args)
    assert list(tmp_path.iterdir()) == []


# -- durability and crashes --------------------------------------------------------------------


def test_acknowledged_items_survive_a_registry_restart(tmp_path: Path) -> None:
    """After the registry and store are closed and reopened, every acknowledged item is there."""
    path = tmp_path / "durable.db"

    async def write() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        try:
            nous = NousSession("durable", registry)
            await nous.add_items(copy.deepcopy(EVERY_KIND))
            assert await nous.pop_item() == EVERY_KIND[-1]
            await nous.add_items([user("last")])
        finally:
            registry.close()
            store.close()

    async def read() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        try:
            nous = NousSession("durable", registry)
            assert await nous.get_items() == [*EVERY_KIND[:-1], user("last")]
            await nous.clear_session()
            await nous.add_items([user("after restart")])
            assert await nous.get_items() == [user("after restart")]
        finally:
            registry.close()
            store.close()

    run(write())
    run(read())


def test_a_session_crash_is_survived(sessions: Sessions) -> None:
    """After a crash the registry restarts the session and the next calls just work."""

    async def main() -> None:
        nous = NousSession("crashy", sessions)
        await nous.add_items([user("before")])
        handle = await nous.open()
        with pytest.raises(SessionCrashed):
            await crash(handle)
        await nous.add_items([user("after")])
        assert await nous.get_items() == [user("before"), user("after")]
        assert sessions.restart_count("crashy") >= 1
        with pytest.raises(SessionCrashed):
            await crash(handle)
        assert await nous.pop_item() == user("after")
        assert await nous.get_items() == [user("before")]

    run(main())


def test_appends_a_crash_refused_are_sent_again_in_order(sessions: Sessions) -> None:
    """Items queued behind a crash are refused, then sent again to the restarted session."""

    async def main() -> None:
        nous = NousSession("resend", sessions)
        await nous.add_items([user("first")])
        handle = await nous.open()
        gate = hold(handle)
        await until(lambda: inbox_size(handle) == 0)  # the actor is held
        crashed = crash(handle)  # lands before the appends below
        batch = [user(f"b{i}") for i in range(5)]
        task = asyncio.ensure_future(nous.add_items(copy.deepcopy(batch)))
        await until(lambda: inbox_size(handle) == 2)  # the crash, then the batch, queued
        gate.set()
        with pytest.raises(SessionCrashed):
            await crashed
        await task
        assert await nous.get_items() == [user("first"), *batch]
        assert await (await nous.open()).count() == 1 + len(batch)  # each stored once
        assert sessions.restart_count("resend") == 1

    run(main())


def test_a_passivated_session_is_reopened_from_the_store(tmp_path: Path) -> None:
    """add_items keeps the session in use for the registry; once idle and stopped, get_items
    reads the store without taking the session, and the next add_items reopens it."""
    now = [0.0]
    store = SQLiteStore(tmp_path / "idle.db")
    registry = Sessions(store, idle_timeout=60, clock=lambda: now[0], timeout=20)
    try:
        nous = NousSession("idle", registry)
        run(nous.add_items([user("a")]))
        now[0] = 30.0
        run(nous.add_items([user("b")]))  # in use at 30
        assert registry.passivate_idle(now=80.0) == []
        assert registry.passivate_idle(now=100.0) == ["idle"]
        assert registry.live() == []
        assert run(nous.get_items()) == [user("a"), user("b")]
        assert registry.live() == []  # read without taking it
        run(nous.add_items([user("c")]))
        assert registry.live() == ["idle"]
        assert run(nous.get_items()) == [user("a"), user("b"), user("c")]
    finally:
        registry.close()
        store.close()


# -- concurrency -----------------------------------------------------------------------------


def assert_contiguous(items: Sequence[Any], batches: Sequence[Sequence[Any]]) -> None:
    """Each batch appears in `items` as one contiguous run, and `items` is all of them."""
    assert len(items) == sum(len(b) for b in batches)
    for batch in batches:
        start = items.index(batch[0])
        assert list(items[start : start + len(batch)]) == list(batch)


def test_concurrent_add_items_calls_stay_contiguous(sessions: Sessions) -> None:
    """Coroutines adding batches through two NousSession objects never interleave items."""

    async def main() -> None:
        a, b = NousSession("shared", sessions), NousSession("shared", sessions)
        batches = [[user(f"w{w}-{i}") for i in range(5)] for w in range(20)]
        await asyncio.gather(
            *(
                (a if w % 2 else b).add_items(copy.deepcopy(batch))
                for w, batch in enumerate(batches)
            )
        )
        assert_contiguous(await a.get_items(), batches)

    run(main())


def test_add_items_from_threads_with_their_own_loops(sessions: Sessions) -> None:
    """Threads, each on its own event loop, add to one session; all land, each call contiguous."""
    nous = NousSession("threads", sessions)
    batches = [[user(f"Message {t}-{i}") for i in range(3)] for t in range(10)]
    errors: list[BaseException] = []

    def add(batch: list[dict[str, Any]]) -> None:
        try:
            run(nous.add_items(copy.deepcopy(batch)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert_contiguous(run(nous.get_items()), batches)


def test_concurrent_pops_pop_distinct_items(sessions: Sessions) -> None:
    """Concurrent pops each take a different item; together they empty the session."""

    async def main() -> None:
        nous = NousSession("pops", sessions)
        items = [user(str(i)) for i in range(10)]
        await nous.add_items(copy.deepcopy(items))
        others = [NousSession("pops", sessions) for _ in range(3)]
        popped = await asyncio.gather(*(others[i % 3].pop_item() for i in range(12)))
        assert (
            sorted((p for p in popped if p is not None), key=lambda p: int(p["content"])) == items
        )
        assert popped.count(None) == 2
        assert await nous.get_items() == []

    run(main())


def test_a_cancelled_add_items_finishes_before_raising(sessions: Sessions) -> None:
    """add_items cancelled once its batch is sent stores it all, then raises."""

    async def main() -> None:
        nous = NousSession("cancel-add", sessions)
        await nous.add_items([user("first")])
        handle = await nous.open()
        gate = hold(handle)
        await until(lambda: inbox_size(handle) == 0)  # the actor is held
        batch = [user(f"c{i}") for i in range(3)]
        task = asyncio.ensure_future(nous.add_items(copy.deepcopy(batch)))
        await until(lambda: inbox_size(handle) == 1)  # the batch, sent as one call
        task.cancel()
        await until(lambda: task.cancelling() > 0 or task.done())
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await nous.get_items() == [user("first"), *batch]

    run(main())


def test_a_call_cancelled_while_waiting_for_its_turn_does_nothing(sessions: Sessions) -> None:
    """A call cancelled while another holds the session changes nothing and frees its place."""

    async def main() -> None:
        nous = NousSession("cancel-wait", sessions)
        await nous.add_items([user("first")])
        handle = await nous.open()
        gate = hold(handle)
        holder = asyncio.ensure_future(nous.add_items([user("held")]))
        await until(lambda: inbox_size(handle) == 1)
        waiter = asyncio.ensure_future(nous.add_items([user("never")]))
        await until(lambda: len(nous._calls.shared.lock._waiters) == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set()
        await holder
        assert await nous.get_items() == [user("first"), user("held")]

    run(main())


def test_mutex_hand_off_to_a_cancelled_waiter_passes_it_on() -> None:
    """A waiter cancelled after the lock was handed to it passes the lock on."""

    async def main() -> None:
        lock = _Mutex()
        await lock.acquire(5, "x")
        waiter = asyncio.ensure_future(lock.acquire(5, "x"))
        await until(lambda: len(lock._waiters) == 1)
        lock.release()  # handed to the waiter...
        waiter.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.wait_for(lock.acquire(5, "x"), 5)  # free again
        lock.release()

    run(main())


def test_mutex_wait_is_bounded() -> None:
    """Waiting longer than the bound for the lock is a CallTimeout; the holder keeps it."""

    async def main() -> None:
        lock = _Mutex()
        await lock.acquire(5, "x")
        with pytest.raises(CallTimeout, match="held it for more than"):
            await lock.acquire(0.05, "x")
        assert lock._held
        assert not lock._waiters
        lock.release()
        await lock.acquire(5, "x")
        lock.release()

    run(main())


# -- the Agents SDK's Runner, with a scripted model --------------------------------------------


class ScriptedModel(Model):
    """Answers "add A B": a reasoning item and a call of the `add` tool, then the sum."""

    def __init__(self) -> None:
        self.inputs: list[list[TResponseInputItem]] = []
        self.ids = count(1)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items: list[TResponseInputItem] = [user(input)] if isinstance(input, str) else input  # type: ignore[list-item]
        self.inputs.append(copy.deepcopy(items))
        last: Any = items[-1]
        n = next(self.ids)
        if last.get("type") == "function_call_output":
            text = f"The sum is {last['output']}."
            output: list[Any] = [
                ResponseOutputMessage(
                    id=f"msg_{n}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            ]
        else:
            _, a, b = str(last["content"]).split()
            output = [
                ResponseReasoningItem(
                    id=f"rs_{n}",
                    type="reasoning",
                    summary=[Summary(type="summary_text", text="add")],
                ),
                ResponseFunctionToolCall(
                    id=f"fc_{n}",
                    call_id=f"call_{n}",
                    name="add",
                    arguments=json.dumps({"a": int(a), "b": int(b)}),
                    type="function_call",
                    status="completed",
                ),
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("this scripted model does not stream")


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class RecordingSession(NousSession):
    """A NousSession that records what the SDK asked it to add."""

    batches: list[list[TResponseInputItem]]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        self.batches = getattr(self, "batches", [])
        self.batches.append(copy.deepcopy(items))
        await super().add_items(items)


def test_runner_runs_a_tool_loop_on_the_session(sessions: Sessions) -> None:
    """A Runner turn with a tool call is stored item for item; the next run sees it all."""

    async def main() -> None:
        model = ScriptedModel()
        agent = Agent(name="adder", model=model, tools=[add], instructions="Add.")
        nous = RecordingSession("runner", sessions)
        result = await Runner.run(agent, "add 2 3", session=nous)
        assert result.final_output == "The sum is 5."
        items = await nous.get_items()
        assert [it.get("type", "message") for it in items] == [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
        ]
        assert items == [it for batch in nous.batches for it in batch]
        assert items[3] == {"call_id": "call_1", "output": "5", "type": "function_call_output"}
        result = await Runner.run(agent, "add 10 20", session=nous)
        assert result.final_output == "The sum is 30."
        assert model.inputs[-2][: len(items)] == items  # the second run got the history
        assert len(await nous.get_items()) == 10

    run(main())


def test_concurrent_runner_runs_share_one_session(sessions: Sessions) -> None:
    """Runs on one loop and Runner.run_sync in threads share a session; each batch contiguous."""

    async def main() -> None:
        model = ScriptedModel()
        agent = Agent(name="adder", model=model, tools=[add])
        nous = RecordingSession("many-runs", sessions)

        def in_thread(i: int) -> str:
            loop = asyncio.new_event_loop()  # run_sync leaves the thread's loop open: ours
            asyncio.set_event_loop(loop)
            try:
                return str(Runner.run_sync(agent, f"add {i} 100", session=nous).final_output)
            finally:
                asyncio.set_event_loop(None)
                loop.close()

        results = await asyncio.gather(
            *(Runner.run(agent, f"add {i} {i}", session=nous) for i in range(6)),
            *(asyncio.to_thread(in_thread, i) for i in range(2)),
        )
        assert [r.final_output for r in results[:6]] == [f"The sum is {2 * i}." for i in range(6)]
        assert list(results[6:]) == [f"The sum is {i + 100}." for i in range(2)]
        items = await nous.get_items()
        assert len(items) == 8 * 5
        assert_contiguous(items, nous.batches)
        for i in range(6):  # each run's items in its own order
            asked = items.index(user(f"add {i} {i}"))
            answer = next(
                k
                for k, it in enumerate(items)
                if it.get("role") == "assistant"
                and it["content"][0]["text"] == f"The sum is {2 * i}."
            )
            assert asked < answer

    run(main())


def test_session_input_callback_sees_plain_items(sessions: Sessions) -> None:
    """A session_input_callback filters the stored history like any list of dicts."""

    async def main() -> None:
        model = ScriptedModel()
        agent = Agent(name="adder", model=model, tools=[add])
        nous = NousSession("callback", sessions)
        history = [user("add 1 1"), {"role": "assistant", "content": "Hi, I add numbers."}]
        await nous.add_items(copy.deepcopy(history))

        def only_users(old: list[Any], new: list[Any]) -> list[Any]:
            return [it for it in old if it.get("role") == "user"] + new

        await Runner.run(
            agent,
            [user("add 4 4")],
            session=nous,
            run_config=RunConfig(session_input_callback=only_users),
        )
        assert model.inputs[0] == [history[0], user("add 4 4")]

    run(main())


# -- what the registry adds: compaction, fork, other writers -------------------------------


def test_compaction_summary_reaches_the_next_run(sessions: Sessions) -> None:
    """A compaction's summary is a system item the next Runner turn sees; the rule holds."""

    async def main() -> None:
        model = ScriptedModel()
        agent = Agent(name="adder", model=model, tools=[add])
        nous = NousSession("compacted", sessions)
        for i in range(3):
            await Runner.run(agent, f"add {i} 1", session=nous)
        handle = await nous.open()
        compactor = Compactor(budget=1, keep_recent=5, summarise=lambda ms: "they added numbers")
        await handle.compact(compactor)
        items = await nous.get_items()
        assert items[0] == {"role": "system", "content": "they added numbers"}
        assert [it.get("type", "message") for it in items[1:]] == [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
        ]
        assert items == items_from_messages(await handle.derive_messages())
        await Runner.run(agent, "add 7 7", session=nous)
        assert model.inputs[-2][0] == {"role": "system", "content": "they added numbers"}
        assert len(await handle.events()) > 15  # the summarised turns are still in the log

    run(main())


def test_a_fork_is_a_session_with_the_items_so_far(tmp_path: Path) -> None:
    """Forking the session's log into a new id gives a NousSession with the items so far."""
    store = SQLiteStore(tmp_path / "fork.db")
    registry = Sessions(store, timeout=20)

    async def main() -> None:
        nous = NousSession("parent", registry)
        await nous.add_items([user("a"), user("b")])
        handle = await nous.open()
        through = await handle.count() - 1
        await nous.add_items([user("c")])
        await handle.fork(through, "child")
        child = NousSession("child", registry)
        assert await child.get_items() == [user("a"), user("b")]
        await child.add_items([user("b2")])
        assert await nous.get_items() == [user("a"), user("b"), user("c")]

    try:
        run(main())
    finally:
        registry.close()
        store.close()


def test_messages_other_code_wrote_are_items_too(sessions: Sessions) -> None:
    """A seeded transcript gives chat items; popping a multi-call message drops its last call."""

    async def main() -> None:
        nous = NousSession("seeded", sessions)
        handle = await nous.open()
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        transcript = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "list files"}]},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "ls", "arguments": "{}"},
                    },
                    {"id": "c2", "name": "cat", "arguments": {"path": "a"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        ]
        for ev in Log.seed([Message.from_openai(d, created_at=t0) for d in transcript]).events():
            await handle.append(ev.type, ev.data, ev.time)
        call_1 = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
        call_2 = {
            "type": "function_call",
            "call_id": "c2",
            "name": "cat",
            "arguments": '{"path": "a"}',
        }
        output = {"type": "function_call_output", "call_id": "c1", "output": "a b"}
        expected = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "Looking."},
            call_1,
            call_2,
            output,
        ]
        assert await nous.get_items() == expected
        assert await nous.pop_item() == output
        assert await nous.pop_item() == call_2
        assert await nous.get_items() == expected[:4]
        messages = await handle.derive_messages()
        assert [len(m.tool_calls) for m in messages] == [0, 0, 1]
        assert items_from_messages(messages) == expected[:4]

    run(main())


def test_event_for_item_keeps_the_item_verbatim() -> None:
    """event_for_item puts the item itself under metadata['openai_item']."""
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    etype, data = event_for_item(item)
    assert etype.value == "assistant_message"
    assert data["metadata"] == {ITEM_KEY: item}
    assert data["tool_calls"] == [{"id": "c", "name": "f", "arguments": "{}"}]


# -- the convenience constructor and the optional import -----------------------------------


def test_sqlite_constructor_shares_one_registry_per_file(tmp_path: Path) -> None:
    """NousSession.sqlite on one file shares a registry; the last close closes it."""
    path = tmp_path / "chat.db"

    async def main() -> None:
        a = NousSession.sqlite("user-1", path)
        b = NousSession.sqlite("user-1", str(path))
        c = NousSession.sqlite("user-2", path)
        assert a.sessions is b.sessions is c.sessions
        await a.add_items([user("from a")])
        await b.add_items([user("from b")])
        await c.add_items([user("other user")])
        assert await a.get_items() == [user("from a"), user("from b")]
        a.close()
        b.close()
        assert await c.get_items() == [user("other user")]
        c.close()
        again = NousSession.sqlite("user-1", path)
        assert again.sessions is not a.sessions
        assert await again.get_items() == [user("from a"), user("from b")]
        again.close()
        memory = NousSession.sqlite("m", ":memory:")
        await memory.add_items([user("in memory")])
        assert await memory.get_items() == [user("in memory")]
        memory.close()

    run(main())


def test_the_package_imports_without_the_sdk() -> None:
    """nous_actor never imports agents; the adapter without it names the extra to install."""
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "import nous_actor, nous_actor.integrations\n"
        "assert 'agents' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
        "try:\n"
        "    import nous_actor.integrations.openai_agents\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=True,
        cwd=ROOT,
    )
    assert "pip install 'nous-actor[openai-agents]'" in out.stdout
