"""What a thread reads back, in the process that wrote it and in any other, beside
LangGraph's SqliteSaver on the same graph: an update to an equal value that is stored
differently is kept; a value reads back as its stored form says (a tuple as a list) in
the writing process too; a message removed or replaced in a long conversation, and a
value larger than an event, are stored (as an edit of the parent's list, and in parts);
``list(None, limit=n)`` gives the newest checkpoints of all threads.

"Another process" is a new saver on a new registry over the same store: it has no memo
and folds the thread from its events."""

from __future__ import annotations

import datetime
import decimal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from nous_actor import MemoryStore, Sessions, Store
from nous_actor.core.limits import set_max_event_bytes
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key

pytestmark = pytest.mark.timeout(120)


class Any_(TypedDict, total=False):
    value: Any
    items: list[Any]


def keeper(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A graph that keeps what it is given (one node that changes nothing)."""
    g = StateGraph(Any_)
    g.add_node("keep", lambda state: {})
    g.add_edge(START, "keep")
    return g.compile(checkpointer=saver)


def chat(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(MessagesState)
    g.add_node("echo", lambda state: {"messages": [AIMessage("ok")]})
    g.add_edge(START, "echo")
    return g.compile(checkpointer=saver)


def cfg(thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread}}


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(tmp_path / "ref.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


def fresh(store: Store) -> tuple[Sessions, NousCheckpointSaver]:
    """A saver on a registry of its own over ``store`` (as another process would be)."""
    sessions = Sessions(store, timeout=20)
    return sessions, NousCheckpointSaver(sessions)


def in_another_process(store: Store, read: Any) -> Any:
    sessions, saver = fresh(store)
    try:
        return read(saver)
    finally:
        sessions.close()


@pytest.fixture
def small_events() -> Iterator[int]:
    """Events of at most 64 KiB for the test (the default 16 MiB, scaled down)."""
    limit = 64 * 1024
    old = set_max_event_bytes(limit)
    yield limit
    set_max_event_bytes(old)


UTC_NOON = datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.UTC)
PARIS = datetime.timezone(datetime.timedelta(hours=1))

EQUAL_BUT_STORED_DIFFERENTLY = [
    (UTC_NOON, UTC_NOON.astimezone(PARIS)),
    (decimal.Decimal("1.10"), decimal.Decimal("1.1")),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    (-0.0, 0.0),
    (0.0, -0.0),
    ({"k": 1}, {"k": True}),
    ([1, 2.0], [1.0, 2]),
]


def typed(value: Any) -> str:
    """A value's repr with its key order and types (equal values may differ here)."""
    return repr(value) + repr(type(value))


@pytest.mark.parametrize(("before", "after"), EQUAL_BUT_STORED_DIFFERENTLY)
def test_an_update_to_an_equal_value_stored_differently_is_kept(
    before: Any, after: Any, store: Store, reference: SqliteSaver
) -> None:
    """``update_state`` to a value equal to the old one but stored differently: every
    process reads the new one, as on SqliteSaver."""

    def write(saver: BaseCheckpointSaver[Any]) -> str:
        app = keeper(saver)
        app.invoke({"value": before}, cfg())
        app.update_state(cfg(), {"value": after})
        return typed(app.get_state(cfg()).values["value"])

    expected = write(reference)
    sessions, saver = fresh(store)
    try:
        assert write(saver) == expected
    finally:
        sessions.close()
    got = in_another_process(store, lambda s: typed(keeper(s).get_state(cfg()).values["value"]))
    assert got == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(st.text(min_size=1, max_size=3), min_size=2, max_size=5, unique=True),
    floats=st.lists(st.sampled_from([0.0, -0.0, 1.0, 1]), min_size=1, max_size=4),
    perm=st.randoms(use_true_random=False),
)
def test_a_value_reads_back_in_a_new_process_as_last_put(
    keys: list[str], floats: list[Any], perm: Any
) -> None:
    """Property: after putting a value then an equal one (keys reordered, zeros' signs or
    int/float swapped), a new process reads the second, key order and types included."""
    first = dict(zip(keys, floats * len(keys), strict=False))
    shuffled = list(first)
    perm.shuffle(shuffled)
    second = {k: (float(v) if type(v) is int else v) for k, v in ((k, first[k]) for k in shuffled)}
    store = MemoryStore()
    try:
        sessions, saver = fresh(store)
        try:
            app = keeper(saver)
            app.invoke({"value": first}, cfg())
            app.update_state(cfg(), {"value": second})
        finally:
            sessions.close()
        got = in_another_process(store, lambda s: keeper(s).get_state(cfg()).values["value"])
        assert list(got) == list(second)
        assert [typed(v) for v in got.values()] == [typed(v) for v in second.values()]
    finally:
        store.close()


def test_the_writing_process_reads_what_any_other_reads(
    store: Store, reference: SqliteSaver
) -> None:
    """A value whose stored form reads back as another type (a tuple as a list): the
    process that put it reads what a new process reads, as SqliteSaver returns it."""

    def build(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
        g = StateGraph(Any_)
        g.add_node("n", lambda state: {"value": (1, 2), "items": [("x", 1)]})
        g.add_edge(START, "n")
        return g.compile(checkpointer=saver)

    def write(saver: BaseCheckpointSaver[Any]) -> str:
        app = build(saver)
        app.invoke({"value": None}, cfg())
        return typed(app.get_state(cfg()).values)

    def stored_values(sessions: Sessions) -> int:
        events = sessions.open(thread_key("t")).events().get()
        return sum(1 for e in events if "value" in (e.data.get("vals") or {}))

    expected = write(reference)
    sessions, saver = fresh(store)
    try:
        assert write(saver) == expected
        # A further run writes the same tuple again: what is stored is the same, so
        # it is not stored again (the value put is remembered beside the one read).
        before = stored_values(sessions)
        build(saver).invoke({"items": []}, cfg())
        assert stored_values(sessions) == before
    finally:
        sessions.close()
    got = in_another_process(store, lambda s: typed(build(s).get_state(cfg()).values))
    assert got == expected


def said(messages: list[Any]) -> list[Any]:
    """Who said what (the ids of the user's messages; the echo's are random)."""
    return [(m.type, m.id if m.type == "human" else None, m.content) for m in messages]


def long_chat(saver: BaseCheckpointSaver[Any], turns: int, size: int) -> None:
    app = chat(saver)
    for i in range(turns):
        app.invoke({"messages": [HumanMessage("x" * size, id=f"h{i}")]}, cfg())


def test_removing_or_replacing_a_message_in_a_long_conversation_is_stored(
    store: Store, reference: SqliteSaver, small_events: int
) -> None:
    """A conversation several times the event limit: a message removed by id, and one
    replaced by id, are stored (as edits of the parent's list, each event within the
    limit), and every process reads what SqliteSaver reads."""
    size = small_events // 8

    def edit(saver: BaseCheckpointSaver[Any]) -> list[Any]:
        long_chat(saver, 24, size)
        app = chat(saver)
        app.update_state(cfg(), {"messages": [RemoveMessage(id="h0")]})
        app.update_state(cfg(), {"messages": [HumanMessage("short", id="h5")]})
        return said(app.get_state(cfg()).values["messages"])

    expected = edit(reference)
    sessions, saver = fresh(store)
    try:
        assert edit(saver) == expected
        events = sessions.open(thread_key("t")).events().get()
    finally:
        sessions.close()
    edits = [
        e.data["vals"]["messages"]
        for e in events
        if e.data.get("lg") == "cp" and e.data["vals"].get("messages", [None])[0] == "e"
    ]
    assert len(edits) == 2
    got = in_another_process(
        store,
        lambda s: said(chat(s).get_state(cfg()).values["messages"]),
    )
    assert got == expected
    assert len(got) == 47


def test_a_value_larger_than_an_event_is_stored_in_parts(
    store: Store, reference: SqliteSaver, small_events: int
) -> None:
    """A channel value over the event limit is stored (in parts, in one batch) and read
    back whole, here and in a new process; the thread stays usable."""
    blob = "b" * (small_events * 3)

    def build(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
        g = StateGraph(Any_)
        g.add_node("n", lambda state: {"value": blob})
        g.add_edge(START, "n")
        return g.compile(checkpointer=saver)

    def write(saver: BaseCheckpointSaver[Any]) -> Any:
        app = build(saver)
        app.invoke({"value": "small"}, cfg())
        app.update_state(cfg(), {"items": [1]})
        return app.get_state(cfg()).values

    expected = write(reference)
    sessions, saver = fresh(store)
    try:
        assert write(saver) == expected
        events = sessions.open(thread_key("t")).events().get()
    finally:
        sessions.close()
    assert any(e.data.get("lg") == "part" for e in events)
    assert in_another_process(store, lambda s: build(s).get_state(cfg()).values) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["remove", "replace", "add"]), st.integers(0, 20), st.integers(-99, 99)
        ),
        max_size=6,
    ),
)
def test_a_list_edit_folds_back_to_the_list_put(start: list[int], ops: list[Any]) -> None:
    """Property: a list channel changed by removals, replacements and additions anywhere
    (not an extension of its parent) reads back, in a new process, as it was put."""

    class L(TypedDict, total=False):
        items: list[Any]

    g = StateGraph(L)
    g.add_node("n", lambda state: {})
    g.add_edge(START, "n")
    current = [{"v": v} for v in start]
    value = list(current)
    for op, at, v in ops:
        if op == "remove" and value:
            del value[at % len(value)]
        elif op == "replace" and value:
            value[at % len(value)] = {"v": v}
        else:
            value.insert(at % (len(value) + 1), {"v": v})
    store = MemoryStore()
    try:
        sessions, saver = fresh(store)
        try:
            app = g.compile(checkpointer=saver)
            app.invoke({"items": current}, cfg())
            app.update_state(cfg(), {"items": value})
            assert app.get_state(cfg()).values["items"] == value
            events = sessions.open(thread_key("t")).events().get()
        finally:
            sessions.close()
        entry = [e.data["vals"].get("items") for e in events if e.data.get("lg") == "cp"][-1]
        if entry is not None and any(x is y for x in value for y in current):
            assert entry[0] in ("t", "e")  # what the parent holds is not stored again
        got = in_another_process(
            store, lambda s: g.compile(checkpointer=s).get_state(cfg()).values["items"]
        )
        assert got == value
    finally:
        store.close()


def test_list_of_every_thread_is_newest_first(store: Store, reference: SqliteSaver) -> None:
    """``list(None, limit=n)``: the newest checkpoints across threads, as SqliteSaver lists
    them (not thread by thread)."""

    def listed(saver: BaseCheckpointSaver[Any]) -> list[Any]:
        app = keeper(saver)
        for thread in ("t-b", "t-a", "t-c", "t-a"):
            app.invoke({"value": thread}, cfg(thread))
        return [
            (t.config["configurable"]["thread_id"], t.metadata["step"])
            for t in saver.list(None, limit=4)
        ]

    expected = listed(reference)
    assert expected[0][0] == "t-a"
    sessions, saver = fresh(store)
    try:
        assert listed(saver) == expected
    finally:
        sessions.close()
