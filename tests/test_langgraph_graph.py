"""Whole LangGraph graphs on the checkpointer: a MessagesState agent with a tool node, an
``interrupt()`` resumed with ``Command(resume=...)`` and a subgraph, run with a scripted
model (no network) through ``invoke`` and ``ainvoke``, beside LangGraph's own
`InMemorySaver` as the reference; and time travel (history, resuming and updating
from an earlier checkpoint)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from bounds import run
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

from nous_actor import Sessions, Store
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key

pytestmark = pytest.mark.timeout(120)

FINAL = ["add 2 and 3", "", "5", "the sum is 5", "approved: yes", "checked by the subgraph"]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(state: MessagesState) -> dict[str, Any]:
    """The scripted model: a tool call for a question, an answer for a tool's result."""
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"id": f"call-{len(state['messages'])}", "name": "add", "args": {"a": 2, "b": 3}}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    return {"messages": [AIMessage(f"the sum is {last.content}")]}


def approve(state: MessagesState) -> dict[str, Any]:
    """Asks a human (an interrupt), then says what they answered."""
    answer = interrupt("approve the answer?")
    return {"messages": [AIMessage(f"approved: {answer}")]}


def checker(state: MessagesState) -> dict[str, Any]:
    return {"messages": [AIMessage("checked by the subgraph")]}


def build(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    sub = StateGraph(MessagesState)
    sub.add_node("check", checker)
    sub.add_edge(START, "check")
    sub.add_edge("check", END)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_node("approve", approve)
    graph.add_node("sub", sub.compile())
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: "approve"})
    graph.add_edge("tools", "agent")
    graph.add_edge("approve", "sub")
    graph.add_edge("sub", END)
    return graph.compile(checkpointer=saver)


def texts(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


def drive(saver: BaseCheckpointSaver[Any]) -> tuple[list[str], tuple[str, ...], int]:
    """Run the graph to its interrupt, resume it; the final messages, what was next at the
    interrupt, and how many checkpoints the history has."""
    app = build(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    first = app.invoke({"messages": [HumanMessage("add 2 and 3")]}, config)
    assert first["__interrupt__"][0].value == "approve the answer?"
    waiting = app.get_state(config).next
    # The interrupt ended the first run's turn: a rejecting resume goes at once.
    rejecting: Any = {"configurable": {"thread_id": "chat", "multitask_strategy": "reject"}}
    done = app.invoke(Command(resume="yes"), rejecting)
    return texts(done["messages"]), waiting, len(list(app.get_state_history(config)))


async def adrive(saver: BaseCheckpointSaver[Any]) -> tuple[list[str], tuple[str, ...], int]:
    app = build(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    first = await app.ainvoke({"messages": [HumanMessage("add 2 and 3")]}, config)
    assert first["__interrupt__"][0].value == "approve the answer?"
    waiting = (await app.aget_state(config)).next
    rejecting: Any = {"configurable": {"thread_id": "chat", "multitask_strategy": "reject"}}
    done = await app.ainvoke(Command(resume="yes"), rejecting)
    history = [s async for s in app.aget_state_history(config)]
    return texts(done["messages"]), waiting, len(history)


def test_a_graph_runs_through_invoke_as_on_the_reference(sessions: Sessions) -> None:
    """Tool call, interrupt, resume and subgraph through invoke: the same messages, the
    same pending node and the same history as on InMemorySaver."""
    got = drive(NousCheckpointSaver(sessions))
    assert got == drive(InMemorySaver())
    assert got[0] == FINAL
    assert got[1] == ("approve",)


def test_a_graph_runs_through_ainvoke_as_on_the_reference(sessions: Sessions) -> None:
    """The same graph through ainvoke, on one event loop."""
    got = run(adrive(NousCheckpointSaver(sessions)))
    assert got == run(adrive(InMemorySaver()))
    assert got[0] == FINAL


def test_a_thread_survives_the_registry(store: Store) -> None:
    """A thread interrupted under one registry is resumed under another on the same store."""
    config: Any = {"configurable": {"thread_id": "chat"}}
    with Sessions(store, timeout=20) as first:
        build(NousCheckpointSaver(first)).invoke(
            {"messages": [HumanMessage("add 2 and 3")]}, config
        )
    with Sessions(store, timeout=20) as second:
        done = build(NousCheckpointSaver(second)).invoke(Command(resume="yes"), config)
    assert texts(done["messages"]) == FINAL


def test_resuming_from_an_earlier_checkpoint_branches_in_the_same_session(
    sessions: Sessions,
) -> None:
    """Replaying from an earlier checkpoint and updating its state make branches that the
    history shows, kept in the thread's one session; the latest branch is the head."""
    saver = NousCheckpointSaver(sessions)
    app = build(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    app.invoke({"messages": [HumanMessage("add 2 and 3")]}, config)
    app.invoke(Command(resume="yes"), config)
    history = list(app.get_state_history(config))
    before_answer = next(
        s for s in history if s.next == ("agent",) and len(s.values["messages"]) == 3
    )
    forked = app.update_state(before_answer.config, {"messages": [AIMessage("a human's answer")]})
    state = app.get_state(config)
    assert state.config["configurable"]["checkpoint_id"] == forked["configurable"]["checkpoint_id"]
    assert texts(state.values["messages"]) == ["add 2 and 3", "", "5", "a human's answer"]
    assert len(list(app.get_state_history(config))) == len(history) + 1
    replayed = app.invoke(None, before_answer.config)
    assert texts(replayed["messages"])[:4] == ["add 2 and 3", "", "5", "the sum is 5"]
    events = sessions.open(thread_key("chat")).events().get()
    assert {e.data.get("ns") for e in events if e.data.get("lg") == "cp"} >= {""}


def test_a_long_conversation_stores_each_message_once_per_checkpoint(sessions: Sessions) -> None:
    """Turn after turn, a checkpoint's messages channel is stored as the messages it adds."""
    graph = StateGraph(MessagesState)
    graph.add_node(
        "echo", lambda s: {"messages": [AIMessage(str(s["messages"][-1].content).upper())]}
    )
    graph.add_edge(START, "echo")
    graph.add_edge("echo", END)
    app = graph.compile(checkpointer=NousCheckpointSaver(sessions))
    config: Any = {"configurable": {"thread_id": "long"}}
    for i in range(30):
        out = app.invoke({"messages": [HumanMessage(f"turn {i}")]}, config)
    assert len(out["messages"]) == 60
    records = [
        e.data
        for e in sessions.open(thread_key("long")).events().get()
        if e.data.get("lg") == "cp"
    ]
    kinds = [r["vals"]["messages"][0] for r in records if "messages" in r["vals"]]
    assert kinds[0] == "w"  # the first time the channel has a value
    assert set(kinds[1:]) <= {"t", "r"}  # then the new messages, or a reference to the writes
    assert len(kinds) == 60


def extend(state: list[str], writes: Any) -> list[str]:
    """The DeltaChannel's reducer: every write's items appended."""
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaState(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]


def _delta_graph(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A graph whose ``log`` channel is a LangGraph DeltaChannel (only writes stored)."""

    def note(state: DeltaState) -> dict[str, Any]:
        return {"log": [f"noted {len(state['log'])}"]}

    graph = StateGraph(DeltaState)
    graph.add_node("note", note)
    graph.add_edge(START, "note")
    graph.add_edge("note", END)
    return graph.compile(checkpointer=saver)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_delta_channel_graph_rebuilds_its_state_as_on_the_reference(
    sessions: Sessions, api: str
) -> None:
    """A graph with a DeltaChannel (its values rebuilt from the writes of earlier
    checkpoints through get_delta_channel_history) ends in the same state as on
    InMemorySaver, and the saver's history equals LangGraph's own walk over get_tuple."""
    saver = NousCheckpointSaver(sessions)
    config: Any = {"configurable": {"thread_id": "delta"}}

    def drive(s: BaseCheckpointSaver[Any]) -> list[str]:
        app = _delta_graph(s)
        for i in range(7):
            if api == "sync":
                app.invoke({"log": [f"in {i}"]}, config)
            else:
                run(app.ainvoke({"log": [f"in {i}"]}, config))
        return list(app.get_state(config).values["log"])

    assert drive(saver) == drive(InMemorySaver())
    latest = saver.get_tuple(config)
    assert latest is not None
    for channels in (["log"], ["log", "missing"]):
        mine = saver.get_delta_channel_history(config=latest.config, channels=channels)
        walked = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=latest.config, channels=channels
        )
        assert mine == walked
        assert (
            run(saver.aget_delta_channel_history(config=latest.config, channels=channels))
            == walked
        )
