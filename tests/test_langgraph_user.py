"""A LangGraph user's view of the checkpointer, beside LangGraph's own savers on the
same graphs: walking the history of a long thread, reading its latest state in a new
process and starting a run on it cost what its records hold, not what each checkpoint
holds again and again; pruning keeps a ``DeltaChannel``'s value; a thread copied in
from LangGraph's savers (checkpoint by checkpoint, with its writes) goes on as it
would have there."""

from __future__ import annotations

import operator
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from nous_actor import MemoryStore, Sessions
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key

pytestmark = pytest.mark.timeout(120)


class CountingSerde(JsonPlusSerializer):
    """LangGraph's serializer, counting the values it reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loads += 1
        return super().loads_typed(data)


class Pairs(TypedDict):
    pairs: Annotated[list[Any], operator.add]


def cfg(thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread}}


def test_walking_a_long_history_reads_each_stored_value_a_bounded_number_of_times() -> None:
    """``get_state_history`` of a thread of n turns reads each stored value back a
    bounded number of times, in the saver that wrote the thread and in a new one: it
    read every checkpoint's state again from the thread's first, so the walk was
    quadratic (a 200-turn chat took 9 s, four times what LangGraph's SqliteSaver
    takes; a 500-turn one 40 s)."""
    g = StateGraph(Pairs)
    g.add_node("keep", lambda state: {})
    g.add_edge(START, "keep")
    turns = 60
    with Sessions(MemoryStore()) as sessions:
        writer_serde = CountingSerde()
        writer = g.compile(checkpointer=NousCheckpointSaver(sessions, serde=writer_serde))
        for turn in range(turns):  # a tuple is not plain JSON: it is kept by the serde
            writer.invoke({"pairs": [("turn", turn)]}, cfg())
        new_serde = CountingSerde()
        new = g.compile(checkpointer=NousCheckpointSaver(sessions, serde=new_serde))
        for graph, serde in ((writer, writer_serde), (new, new_serde)):
            serde.loads = 0
            history = list(graph.get_state_history(cfg()))
            assert len(history) == 3 * turns
            pairs = [list(p) for p in history[0].values["pairs"]]
            assert pairs == [["turn", t] for t in range(turns)]
            assert [list(p) for p in history[-2].values["pairs"]] == [["turn", 0]]
            assert serde.loads <= 4 * turns, f"{serde.loads} values read for {turns} stored"


class Counter(TypedDict):
    seen: Any


def test_a_new_reader_reads_a_long_threads_latest_state_without_its_old_values() -> None:
    """A saver with nothing memoised (a new process, say) reads the latest checkpoint of
    a thread whose channel was set n times without reading back the n - 1 values set
    over since (it read every one: on a 150-turn thread with a large such value, 0.8 s
    where LangGraph's SqliteSaver takes 0.01 s)."""
    g = StateGraph(Counter)
    g.add_node("count", lambda state: {"seen": (len(state["seen"]), *state["seen"])})
    g.add_edge(START, "count")
    turns = 40
    with Sessions(MemoryStore()) as sessions:
        graph = g.compile(checkpointer=NousCheckpointSaver(sessions))
        for _ in range(turns):  # a tuple is not plain JSON: it is kept by the serde
            graph.invoke({"seen": ()}, cfg())
        serde = CountingSerde()
        reader = g.compile(checkpointer=NousCheckpointSaver(sessions, serde=serde))
        latest = reader.get_state(cfg())
        assert list(latest.values["seen"]) == [0]
        assert serde.loads <= 3, f"{serde.loads} values read back for the latest state"
        older = reader.get_state(list(reader.get_state_history(cfg()))[4].config)
        assert older.values == graph.get_state(older.config).values


def concat(state: list[Any] | None, writes: Sequence[list[Any]]) -> list[Any]:
    out = list(state or [])
    for written in writes:
        out.extend(written)
    return out


class Delta(TypedDict):
    items: Annotated[list[Any], DeltaChannel(concat)]


def delta_graph(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A graph whose channel is a ``DeltaChannel``: a checkpoint keeps a snapshot of it
    every 100 updates only, and LangGraph rebuilds it from the writes of its ancestors."""
    g = StateGraph(Delta)
    g.add_node("a", lambda state: {"items": [f"a{len(state['items'])}"]})
    g.add_node("b", lambda state: {"items": [f"b{len(state['items'])}"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize("how", ["prune", "delete_for_runs"])
def test_hiding_old_checkpoints_keeps_a_delta_channels_value(how: str) -> None:
    """``prune(keep_latest)`` keeps the latest checkpoint as it was, ``DeltaChannel``
    values too (LangGraph rebuilds them from the writes of the pruned ancestors, which
    the thread's session keeps: the value read back empty, and the next run went on
    from nothing); so does deleting an older run's checkpoints."""
    with Sessions(MemoryStore()) as sessions:
        saver = NousCheckpointSaver(sessions)
        graph = delta_graph(saver)
        runs = [str(uuid.uuid4()) for _ in range(6)]
        run = {"configurable": {"thread_id": "t", "run_id": runs[0]}}
        first = graph.invoke({"items": ["in0"]}, run)
        for turn in range(1, 6):
            run = {"configurable": {"thread_id": "t", "run_id": runs[turn]}}
            graph.invoke({"items": [f"in{turn}"]}, run)
        before = graph.get_state(cfg()).values
        assert len(before["items"]) == 18
        if how == "prune":
            saver.prune(["t"], strategy="keep_latest")
        else:
            saver.delete_for_runs(runs[3:5])
            assert len(list(saver.list(cfg()))) == 4 * 4
        assert graph.get_state(cfg()).values == before
        after = graph.invoke({"items": ["in6"]}, cfg())
    assert after["items"][: len(before["items"])] == before["items"]
    assert len(after["items"]) == 21
    assert first["items"] == ["in0", "a1", "b2"]


class DeltaAndPairs(TypedDict):
    items: Annotated[list[Any], DeltaChannel(concat)]
    pairs: Annotated[list[Any], operator.add]


def test_a_run_on_a_long_thread_with_a_delta_channel_costs_what_a_short_ones_does() -> None:
    """LangGraph asks for the writes behind a ``DeltaChannel`` at the start of each run;
    answering reads back no more than a few values however long the thread is (it
    folded every checkpoint back to the last snapshot, each from the thread's first:
    a run on a 150-turn thread took ten times what it takes on LangGraph's SqliteSaver,
    and more with every turn)."""
    g = StateGraph(DeltaAndPairs)
    g.add_node("a", lambda state: {"items": ["a"], "pairs": [("a", len(state["items"]))]})
    g.add_edge(START, "a")
    serde = CountingSerde()
    with Sessions(MemoryStore()) as sessions:
        graph = g.compile(checkpointer=NousCheckpointSaver(sessions, serde=serde))
        costs = []
        for turn in range(40):
            serde.loads = 0
            out = graph.invoke({"items": [turn], "pairs": []}, cfg())
            costs.append(serde.loads)
        assert len(out["items"]) == 80
        assert out["pairs"][-1] == ("a", 79)
        assert max(costs[20:]) <= max(costs[:20]), costs


def approving(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """An echo, then an ``interrupt()`` that a ``Command(resume=...)`` answers."""

    def approve(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("send?")
        return {"messages": [AIMessage(f"sent ({answer})", id=f"sent-{len(state['messages'])}")]}

    g = StateGraph(MessagesState)
    g.add_node(
        "echo",
        lambda state: {"messages": [AIMessage("echo", id=f"echo-{len(state['messages'])}")]},
    )
    g.add_node("approve", approve)
    g.add_edge(START, "echo")
    g.add_edge("echo", "approve")
    g.add_edge("approve", END)
    return g.compile(checkpointer=saver)


def copy_every_checkpoint(
    source: BaseCheckpointSaver[Any], target: BaseCheckpointSaver[Any]
) -> None:
    """What a migration script does: every checkpoint of ``source``, oldest first, put in
    ``target`` with its pending writes."""
    for tup in reversed(list(source.list(None))):
        conf = tup.config["configurable"]
        where = tup.parent_config or {
            "configurable": {
                "thread_id": conf["thread_id"],
                "checkpoint_ns": conf["checkpoint_ns"],
            }
        }
        versions = tup.checkpoint["channel_versions"]
        stored = target.put(where, tup.checkpoint, tup.metadata, versions)
        for task, channel, value in tup.pending_writes or ():
            target.put_writes(stored, [(channel, value)], task)


@pytest.mark.parametrize("reference", ["memory", "sqlite"])
def test_a_thread_copied_in_from_langgraphs_savers_goes_on(reference: str, tmp_path: Path) -> None:
    """LangGraph's savers number channel versions with strings; a thread copied from one
    goes on here, as it does there (it failed with LangGraph's ``NotImplementedError``
    on its first step)."""
    conn = sqlite3.connect(tmp_path / "source.db", check_same_thread=False)
    source: BaseCheckpointSaver[Any] = (
        InMemorySaver() if reference == "memory" else SqliteSaver(conn)
    )
    graph = approving(source)
    for turn in ("one", "two"):
        graph.invoke({"messages": [HumanMessage(turn, id=turn)]}, cfg())
        graph.invoke(Command(resume=turn), cfg())
    graph.invoke({"messages": [HumanMessage("three", id="three")]}, cfg())  # paused
    with Sessions(MemoryStore()) as sessions:
        saver = NousCheckpointSaver(sessions)
        copy_every_checkpoint(source, saver)
        ours = approving(saver)
        assert ours.get_state(cfg()).next == ("approve",)
        done = ours.invoke(Command(resume="yes"), cfg())
        again = ours.invoke({"messages": [HumanMessage("four", id="four")]}, cfg())
        history = list(ours.get_state_history(cfg()))
    expected = graph.invoke(Command(resume="yes"), cfg())
    conn.close()
    assert done == expected
    assert [m.content for m in done["messages"]][-2:] == ["echo", "sent (yes)"]
    assert again["__interrupt__"][0].value == "send?"
    assert len(history) == 4 * 4 - 1


@given(st.one_of(st.none(), st.integers(0, 2**70), st.integers(0, 10**30)), st.booleans())
def test_the_next_channel_version_grows_and_keeps_its_type(
    start: int | None, as_str: bool
) -> None:
    """After an int, an int one more; after a str of LangGraph's savers, a greater str of
    the same form (strs compare as LangGraph compares them)."""
    with Sessions(MemoryStore()) as sessions:
        saver = NousCheckpointSaver(sessions)
        current: Any = start
        if as_str and start is not None:
            current = f"{start:032}.0.{start % 7}"
        nxt = saver.get_next_version(current, None)
        if current is None:
            assert nxt == 1
        elif isinstance(current, int):
            assert nxt == current + 1
        else:
            assert isinstance(nxt, str)
            assert nxt > current
            assert int(nxt.split(".")[0]) == current_number(current) + 1
            assert saver.get_next_version(nxt, None) > nxt


def current_number(version: str) -> int:
    return int(version.split(".")[0])


def test_a_channel_version_of_another_kind_is_refused() -> None:
    with Sessions(MemoryStore()) as sessions:
        saver = NousCheckpointSaver(sessions)
        with pytest.raises(ValueError, match="does not start with an integer"):
            saver.get_next_version("v1", None)
        with pytest.raises(TypeError, match="must be an int or a str, got float"):
            saver.get_next_version(1.5, None)


def stored_size(sessions: Sessions, thread: str, since: int = 0) -> int:
    """The size (of its text) of what thread ``thread``'s session keeps from seq
    ``since`` on."""
    events = sessions.open(thread_key(thread)).since(since).get()
    return sum(len(repr(e.data)) for e in events)


def test_copying_a_thread_onto_a_used_one_stores_what_the_source_does() -> None:
    """``copy_thread`` onto a thread that has events (one deleted earlier, say) stores
    about what the source stores, and the copy reads back and goes on as the source
    does (it stored every copied checkpoint whole: a 300-turn chat took 15 s and
    quadratic space)."""
    with Sessions(MemoryStore()) as sessions:
        saver = NousCheckpointSaver(sessions)
        graph = approving(saver)
        for turn in range(30):
            graph.invoke({"messages": [HumanMessage(f"m{turn}", id=f"m{turn}")]}, cfg("src"))
            graph.invoke(Command(resume=f"r{turn}"), cfg("src"))
        graph.invoke({"messages": [HumanMessage("paused", id="paused")]}, cfg("src"))
        graph.invoke({"messages": [HumanMessage("old", id="old")]}, cfg("dst"))
        saver.delete_thread("dst")
        before = sessions.open(thread_key("dst")).count().get()
        saver.copy_thread("src", "dst")
        copied = stored_size(sessions, "dst", before)
        assert copied <= 2 * stored_size(sessions, "src"), copied
        fresh = approving(NousCheckpointSaver(sessions))
        for reader in (graph, fresh):
            src = [
                (s.values, s.next, s.tasks, s.metadata, s.created_at)
                for s in reader.get_state_history(cfg("src"))
            ]
            dst = [
                (s.values, s.next, s.tasks, s.metadata, s.created_at)
                for s in reader.get_state_history(cfg("dst"))
            ]
            assert dst == src
        done = graph.invoke(Command(resume="yes"), cfg("dst"))
    assert [m.content for m in done["messages"]][-3:] == ["paused", "echo", "sent (yes)"]
