"""Double texting: concurrent runs of one LangGraph thread take turns of its session, per
their ``multitask_strategy`` (reject, enqueue, interrupt, rollback), and an explicit
``saver.run(...)`` holds a thread for a block. The first test runs the same race on
LangGraph's InMemorySaver, which loses an update: the tests here fail without turns."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from bounds import BOUND, run
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from nous_actor import Sessions, TurnBusy, TurnInterrupted
from nous_actor.core.event import EventType
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key
from nous_actor.integrations.langgraph.runs import has_next

pytestmark = pytest.mark.timeout(120)


class Gate:
    """Holds the first run inside its node until the test lets it go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.held = True


def graph(
    saver: BaseCheckpointSaver[Any], gate: Gate | None = None
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A chat graph whose node answers the last user message (an async node waiting at
    ``gate`` once, or a plain one without a gate)."""

    async def answer(state: MessagesState) -> dict[str, Any]:
        said = str(state["messages"][-1].content)
        if gate is not None and gate.held:
            gate.held = False
            gate.entered.set()
            await asyncio.wait_for(gate.release.wait(), BOUND)
        return {"messages": [AIMessage(f"re: {said}")]}

    def answer_now(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"re: {state['messages'][-1].content}")]}

    g = StateGraph(MessagesState)
    g.add_node("answer", answer if gate is not None else answer_now)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=saver)


class SeesReads:
    """Wraps a saver's ``aget_tuple`` to announce each read as it begins."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        self.started = 0
        self.second_read = asyncio.Event()
        original = saver.aget_tuple

        async def aget_tuple(config: Any) -> Any:
            self.started += 1
            if self.started == 2:
                self.second_read.set()
            return await original(config)

        saver.aget_tuple = aget_tuple  # type: ignore[method-assign]


def cfg(strategy: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": "chat"}
    if strategy is not None:
        conf["multitask_strategy"] = strategy
    return {"configurable": conf}


async def two_runs(
    saver: BaseCheckpointSaver[Any], strategy: str | None
) -> tuple[Any, Any, CompiledStateGraph[Any, Any, Any, Any]]:
    """Run A, held in its node; start run B with ``strategy`` once A is in its node, let
    A go once B has begun reading; the outcomes of both (a result or an exception) and
    the graph."""
    gate = Gate()
    app = graph(saver, gate)
    reads = SeesReads(saver)
    # durability="sync": each checkpoint is stored before the next step runs, so the
    # state run B finds is the one A had reached in its node.
    first = asyncio.ensure_future(
        app.ainvoke({"messages": [HumanMessage("one")]}, cfg(), durability="sync")
    )
    await asyncio.wait_for(gate.entered.wait(), BOUND)
    second = asyncio.ensure_future(app.ainvoke({"messages": [HumanMessage("two")]}, cfg(strategy)))
    await asyncio.wait_for(reads.second_read.wait(), BOUND)
    if strategy in ("reject",):
        with pytest.raises(TurnBusy):
            await asyncio.wait_for(second, BOUND)
    gate.release.set()
    outcomes = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), BOUND)
    return outcomes[0], outcomes[1], app


def texts(state: Any) -> list[str]:
    return [str(m.content) for m in state.values["messages"]]


def test_without_turns_a_concurrent_run_loses_an_update() -> None:
    """The race, on LangGraph's InMemorySaver: both runs read the same state and the last
    write wins; the other run's messages are only in an orphan branch."""

    async def main() -> list[str]:
        saver = InMemorySaver()
        await two_runs(saver, None)
        return texts(await graph(saver).aget_state(cfg()))

    messages = run(main())
    assert len(messages) == 2  # one run's message and answer are lost


def test_enqueue_runs_the_second_run_after_the_first_from_its_state(sessions: Sessions) -> None:
    """Two concurrent ainvoke on one thread (default strategy): the second waits for the
    first and starts from the state it left; no update is lost, the thread never forks."""

    async def main() -> tuple[list[str], int]:
        saver = NousCheckpointSaver(sessions)
        a, b, app = await two_runs(saver, None)
        assert not isinstance(a, BaseException)
        assert not isinstance(b, BaseException)
        state = await app.aget_state(cfg())
        history = [s async for s in app.aget_state_history(cfg())]
        return texts(state), len(history)

    messages, checkpoints = run(main())
    assert messages == ["one", "re: one", "two", "re: two"]
    assert checkpoints == 6  # one line of 3 checkpoints per run: no branch
    turns = [
        e for e in sessions.open(thread_key("chat")).events().get() if e.type is EventType.TURN_END
    ]
    assert [e.data["how"] for e in turns] == ["closed", "closed"]


def test_reject_refuses_the_second_run_and_leaves_the_first_untouched(sessions: Sessions) -> None:
    """With ``reject`` the second run fails at once with TurnBusy; the first completes."""

    async def main() -> list[str]:
        saver = NousCheckpointSaver(sessions)
        a, b, app = await two_runs(saver, "reject")
        assert isinstance(b, TurnBusy)
        assert not isinstance(a, BaseException)
        return texts(await app.aget_state(cfg()))

    assert run(main()) == ["one", "re: one"]


def test_interrupt_stops_the_first_run_and_continues_from_its_partial_state(
    sessions: Sessions,
) -> None:
    """With ``interrupt`` the running run's next write fails with TurnInterrupted, its
    checkpoints stay, and the new run continues from them."""

    async def main() -> list[str]:
        saver = NousCheckpointSaver(sessions)
        a, b, app = await two_runs(saver, "interrupt")
        assert isinstance(a, TurnInterrupted)
        assert not isinstance(b, BaseException)
        return texts(await app.aget_state(cfg()))

    assert run(main()) == ["one", "two", "re: two"]
    ends = [
        e.data
        for e in sessions.open(thread_key("chat")).events().get()
        if e.type is EventType.TURN_END
    ]
    assert ends[0]["how"] == "interrupted"


def test_rollback_stops_the_first_run_and_reverts_the_thread(sessions: Sessions) -> None:
    """With ``rollback`` the running run stops and its checkpoints are hidden: the new run
    starts from the state before it; the log keeps the stopped run's checkpoints."""

    async def main() -> tuple[list[str], int]:
        saver = NousCheckpointSaver(sessions)
        a, b, app = await two_runs(saver, "rollback")
        assert isinstance(a, TurnInterrupted)
        assert not isinstance(b, BaseException)
        history = [s async for s in app.aget_state_history(cfg())]
        return texts(await app.aget_state(cfg())), len(history)

    messages, checkpoints = run(main())
    assert messages == ["two", "re: two"]
    assert checkpoints == 3
    events = sessions.open(thread_key("chat")).events().get()
    assert next(e.data["how"] for e in events if e.type is EventType.TURN_END) == "rolled_back"
    assert len([e for e in events if e.data.get("lg") == "cp"]) == 5  # A's 2 kept, hidden


def test_a_finished_run_frees_the_thread_for_a_rejecting_one(sessions: Sessions) -> None:
    """A run's turn ends with the run (its last checkpoint has nothing left to run), and
    an interrupt() pause ends it too: the next run, even a rejecting one, goes at once."""
    saver = NousCheckpointSaver(sessions)
    app = graph(saver)
    for text in ("a", "b", "c"):
        app.invoke({"messages": [HumanMessage(text)]}, cfg("reject"))
    assert texts(app.get_state(cfg())) == ["a", "re: a", "b", "re: b", "c", "re: c"]


def test_a_run_held_explicitly_keeps_other_runs_out(sessions: Sessions) -> None:
    """saver.run(config) holds the thread for a block: runs inside it write through its
    turn, a rejecting run from another thread is refused meanwhile."""
    saver = NousCheckpointSaver(sessions)
    app = graph(saver)
    refused: list[BaseException] = []

    def intruder() -> None:
        try:
            app.invoke({"messages": [HumanMessage("intruder")]}, cfg("reject"))
        except TurnBusy as exc:
            refused.append(exc)

    with saver.run(cfg()):
        app.invoke({"messages": [HumanMessage("a")]}, cfg())
        other = threading.Thread(target=intruder)
        other.start()
        other.join(BOUND)
        app.invoke({"messages": [HumanMessage("b")]}, cfg())
    assert len(refused) == 1
    assert texts(app.get_state(cfg())) == ["a", "re: a", "b", "re: b"]
    ends = [
        e
        for e in sessions.open(thread_key("chat")).events().get()
        if e.type is EventType.TURN_START
    ]
    assert len(ends) == 1  # one turn for the whole block


def test_a_run_held_explicitly_from_asyncio(sessions: Sessions) -> None:
    """``async with saver.run(config)``: two ainvoke in one turn."""

    async def main() -> list[str]:
        saver = NousCheckpointSaver(sessions)
        app = graph(saver)
        async with saver.run(cfg(), "reject"):
            await app.ainvoke({"messages": [HumanMessage("a")]}, cfg())
            await app.ainvoke({"messages": [HumanMessage("b")]}, cfg())
        return texts(await app.aget_state(cfg()))

    assert run(main()) == ["a", "re: a", "b", "re: b"]


def test_a_bad_strategy_says_which_there_are(sessions: Sessions) -> None:
    """An unknown multitask_strategy is refused, naming the four."""
    with pytest.raises(ValueError, match="'reject', 'enqueue', 'interrupt', 'rollback'"):
        NousCheckpointSaver(sessions, multitask_strategy="queue")  # type: ignore[arg-type]
    saver = NousCheckpointSaver(sessions)
    with pytest.raises(ValueError, match="multitask_strategy must be one of"):
        graph(saver).invoke({"messages": [HumanMessage("a")]}, cfg("later"))


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [
        (
            {
                "channel_values": {"__start__": {}},
                "channel_versions": {"__start__": 1},
                "versions_seen": {},
            },
            True,
        ),
        (
            {
                "channel_values": {"branch:to:a": None},
                "channel_versions": {"branch:to:a": 2},
                "versions_seen": {"a": {"branch:to:a": 1}},
            },
            True,
        ),
        (
            {
                "channel_values": {"branch:to:a": None},
                "channel_versions": {"branch:to:a": 2},
                "versions_seen": {"a": {"branch:to:a": 2}},
            },
            False,
        ),
        (
            {
                "channel_values": {"messages": []},
                "channel_versions": {"messages": 3},
                "versions_seen": {},
            },
            False,
        ),
        (
            {
                "channel_values": {"join:a+b:c": ["a"]},
                "channel_versions": {"join:a+b:c": 1},
                "versions_seen": {},
            },
            False,
        ),
        (
            {
                "channel_values": {"join:a+b:c": ["a", "b"]},
                "channel_versions": {"join:a+b:c": 1},
                "versions_seen": {},
            },
            True,
        ),
        (
            {
                "channel_values": {"__pregel_tasks": ["send"]},
                "channel_versions": {},
                "versions_seen": {},
            },
            True,
        ),
    ],
)
def test_has_next_reads_what_a_checkpoint_leaves_to_run(
    checkpoint: dict[str, Any], expected: bool
) -> None:
    """A checkpoint leaves a task when a trigger channel holds a value no node has seen."""
    assert has_next(checkpoint) is expected


def test_a_run_goes_on_when_its_session_restarts(sessions: Sessions) -> None:
    """A crash of the thread's session ends the running run's turn; the registry restarts
    the session, the run's turn is opened again and the run finishes, nothing lost."""
    from nous_actor import SessionCrashed
    from nous_actor.sessions.faults import crash

    async def main() -> list[str]:
        saver = NousCheckpointSaver(sessions)
        gate = Gate()
        app = graph(saver, gate)
        first = asyncio.ensure_future(
            app.ainvoke({"messages": [HumanMessage("one")]}, cfg(), durability="sync")
        )
        await asyncio.wait_for(gate.entered.wait(), BOUND)
        with pytest.raises(SessionCrashed):
            await crash(await sessions.aopen(thread_key("chat")))
        gate.release.set()
        await asyncio.wait_for(first, BOUND)
        return texts(await app.aget_state(cfg()))

    assert run(main()) == ["one", "re: one"]
    ends = [
        e.data
        for e in sessions.open(thread_key("chat")).events().get()
        if e.type is EventType.TURN_END
    ]
    assert [e.get("reason") for e in ends] == ["restart", None]


def test_the_saver_remembers_a_bounded_number_of_runs() -> None:
    """Runs that came and went are let go of past RUNS_KEPT (a long-lived saver's memory
    stays flat), a run with a call in flight never."""
    from types import SimpleNamespace

    from nous_actor.integrations.langgraph.runs import RUNS_KEPT, Runs

    def config() -> dict[str, Any]:
        return {"configurable": {"__pregel_runtime": SimpleNamespace(control=object())}}

    runs = Runs("enqueue", 300.0, 300.0)
    busy = runs.enter("t", config())
    for _ in range(RUNS_KEPT * 2):
        runs.leave(runs.enter("t", config()))
    assert len(runs._runs) <= RUNS_KEPT
    assert busy is not None
    assert any(r is busy for r in runs._runs.values())


def test_concurrent_runs_take_turns_on_postgres(pg_stores: Any) -> None:
    """The same race on PostgreSQL: the second run waits for the first, both are kept."""

    async def main() -> list[str]:
        store = pg_stores()
        async with Sessions(store, timeout=20) as sessions:
            a, b, app = await two_runs(NousCheckpointSaver(sessions), None)
            assert not isinstance(a, BaseException)
            assert not isinstance(b, BaseException)
            return texts(await app.aget_state(cfg()))

    assert run(main()) == ["one", "re: one", "two", "re: two"]
