"""A run that has stopped, however it stopped, leaves its thread free at once: for
``update_state``, ``delete_thread``, ``get_state`` and the next run (one that refuses to
wait, ``reject``), as on LangGraph's SqliteSaver, which holds nothing. Each case runs
the same steps on a SqliteSaver and compares the thread's state. A run still going
keeps the thread (double texting: test_langgraph_runs.py), and what a caller is told
then names what a LangGraph user can do.

Without the saver hearing of the invocation's end these fail: the stopped run's turn
stays open for its lease (300 s here), so the rejecting run is refused at once and the
update waits out the registry's bound (3 s) and fails with TurnBusy."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from bounds import BOUND, run
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import EmptyInputError, GraphRecursionError
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from nous_actor import Sessions, Store, TurnBusy
from nous_actor.integrations.langgraph import NousCheckpointSaver

pytestmark = pytest.mark.timeout(120)

REGISTRY_BOUND = 4.0
"""The registry's call bound: a write through the plain handle waits for an open turn
for 3 s of it, then fails (a turn left open fails a test in seconds, not 300)."""


class S(TypedDict):
    log: Annotated[list[str], operator.add]
    x: int
    messages: Annotated[list[Any], add_messages]


def _a(state: S) -> dict[str, Any]:
    return {"log": ["a"], "x": state.get("x", 0) + 1}


def _b(state: S) -> dict[str, Any]:
    return {"log": ["b"], "x": state["x"] * 10}


def _c(state: S) -> dict[str, Any]:
    return {"log": ["c"], "messages": [AIMessage("done", id="m-done")]}


def linear(
    saver: BaseCheckpointSaver[Any], interrupt_before: list[str] | None = None
) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(S)
    g.add_node("a", _a)
    g.add_node("b", _b)
    g.add_node("c", _c)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=saver, interrupt_before=interrupt_before)


def failing(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    def boom(state: S) -> dict[str, Any]:
        raise RuntimeError("boom")

    g = StateGraph(S)
    g.add_node("a", _a)
    g.add_node("boom", boom)
    g.add_edge(START, "a")
    g.add_edge("a", "boom")
    return g.compile(checkpointer=saver)


def looping(saver: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(S)
    g.add_node("a", _a)
    g.add_edge(START, "a")
    g.add_edge("a", "a")
    return g.compile(checkpointer=saver)


def cfg(thread: str = "t", **conf: Any) -> Any:
    return {"configurable": {"thread_id": thread, **conf}}


START_INPUT: Any = {"log": [], "x": 1, "messages": []}


def bad_input(saver: BaseCheckpointSaver[Any]) -> None:
    """Input a reducer refuses: the run fails before it stores anything."""
    with pytest.raises(ValueError, match="nonsense"):
        linear(saver).invoke(
            {"log": [], "messages": [{"role": "nonsense", "content": "x"}]}, cfg()
        )


def none_on_finished(saver: BaseCheckpointSaver[Any]) -> None:
    """``invoke(None)`` on a finished thread: nothing to run, nothing stored."""
    linear(saver).invoke(START_INPUT, cfg())
    linear(saver).invoke(None, cfg())


def resume_finished(saver: BaseCheckpointSaver[Any]) -> None:
    """``Command(resume=...)`` on a finished thread: nothing to resume."""
    linear(saver).invoke(START_INPUT, cfg())
    linear(saver).invoke(Command(resume="x"), cfg())


def stream_none_finished(saver: BaseCheckpointSaver[Any]) -> None:
    linear(saver).invoke(START_INPUT, cfg())
    assert list(linear(saver).stream(None, cfg())) == []


def unknown_checkpoint(saver: BaseCheckpointSaver[Any]) -> None:
    """``invoke(None)`` at a checkpoint id the thread does not have."""
    linear(saver).invoke(START_INPUT, cfg())
    with pytest.raises(EmptyInputError):
        linear(saver).invoke(None, cfg(checkpoint_id="nope"))


def interrupt_before(saver: BaseCheckpointSaver[Any]) -> None:
    """A static breakpoint: the run pauses before ``b`` (no interrupt write)."""
    linear(saver, ["b"]).invoke(START_INPUT, cfg())
    assert linear(saver, ["b"]).get_state(cfg()).next == ("b",)


def stream_break(saver: BaseCheckpointSaver[Any]) -> None:
    """A stream whose caller stops reading after its first chunk."""
    for _chunk in linear(saver).stream(START_INPUT, cfg()):
        break


def recursion_limit(saver: BaseCheckpointSaver[Any]) -> None:
    with pytest.raises(GraphRecursionError):
        looping(saver).invoke(START_INPUT, {**cfg(), "recursion_limit": 3})


def node_error(saver: BaseCheckpointSaver[Any]) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        failing(saver).invoke(START_INPUT, cfg())


def async_cancelled(saver: BaseCheckpointSaver[Any]) -> None:
    """An ``ainvoke`` cancelled by a timeout while its node runs."""

    async def main() -> None:
        entered = asyncio.Event()  # (the node runs on this loop)

        async def slow(state: S) -> dict[str, Any]:
            entered.set()
            await asyncio.sleep(BOUND * 10)  # (a node still working: it is cancelled)
            return {"log": ["slow"]}

        g = StateGraph(S)
        g.add_node("slow", slow)
        g.add_edge(START, "slow")
        app = g.compile(checkpointer=saver)
        task = asyncio.ensure_future(app.ainvoke(START_INPUT, cfg()))
        await asyncio.wait_for(entered.wait(), BOUND)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, BOUND)

    run(main())


STOPS: dict[str, Callable[[BaseCheckpointSaver[Any]], None]] = {
    "bad_input": bad_input,
    "none_on_finished": none_on_finished,
    "resume_finished": resume_finished,
    "stream_none_finished": stream_none_finished,
    "unknown_checkpoint": unknown_checkpoint,
    "interrupt_before": interrupt_before,
    "stream_break": stream_break,
    "recursion_limit": recursion_limit,
    "node_error": node_error,
    "async_cancelled": async_cancelled,
}


@pytest.fixture
def sessions(store: Store) -> Iterator[Sessions]:
    registry = Sessions(store, timeout=REGISTRY_BOUND)
    yield registry
    registry.close()


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    """LangGraph's SqliteSaver (InMemorySaver for the async case: SqliteSaver has no
    async API)."""
    conn = sqlite3.connect(tmp_path / "ref.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


def after_the_stop(saver: BaseCheckpointSaver[Any], thread_free: bool) -> Any:
    """Update the thread, run it again (refusing to wait), update it, delete it: the
    thread's values after each step (the update and the run must not wait)."""
    app = linear(saver)
    seen = []
    app.update_state(cfg(), {"x": 5, "log": ["edited"]})
    seen.append(app.get_state(cfg()).values)
    app.invoke({"log": ["again"], "x": 2}, cfg(multitask_strategy="reject"))
    seen.append(app.get_state(cfg()).values)
    saver.delete_thread("t")
    seen.append(app.get_state(cfg()).values)
    return seen


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stopped_run_leaves_its_thread_free_at_once(
    stop: str, sessions: Sessions, reference: BaseCheckpointSaver[Any]
) -> None:
    """After each way a run stops, the thread is updated, run again with ``reject`` and
    deleted at once, with the states LangGraph's SqliteSaver gives."""
    if stop == "async_cancelled":
        reference = InMemorySaver()
    saver = NousCheckpointSaver(sessions, lease=300.0, wait=REGISTRY_BOUND / 2)
    STOPS[stop](reference)
    STOPS[stop](saver)
    expected = after_the_stop(reference, True)
    assert after_the_stop(saver, True) == expected


def test_the_breakpoint_flow_updates_and_continues(
    sessions: Sessions, reference: BaseCheckpointSaver[Any]
) -> None:
    """LangGraph's breakpoint flow: ``interrupt_before`` pauses, ``update_state`` edits the
    paused state, ``invoke(None)`` continues from it; the same as on SqliteSaver."""

    def flow(saver: BaseCheckpointSaver[Any]) -> Any:
        app = linear(saver, ["b"])
        paused = app.invoke(START_INPUT, cfg())
        app.update_state(cfg(), {"x": 100})
        done = app.invoke(None, cfg(multitask_strategy="reject"))
        return paused, done, [s.next for s in app.get_state_history(cfg())]

    saver = NousCheckpointSaver(sessions, lease=300.0, wait=REGISTRY_BOUND / 2)
    assert flow(saver) == flow(reference)


def test_a_stopped_async_run_leaves_its_thread_free(sessions: Sessions) -> None:
    """``ainvoke`` paused at a breakpoint, then ``aupdate_state`` and a rejecting
    ``ainvoke`` at once (the end is heard through the async callback manager)."""
    saver = NousCheckpointSaver(sessions, lease=300.0, wait=REGISTRY_BOUND / 2)
    app = linear(saver, ["b"])

    async def main() -> Any:
        await app.ainvoke(START_INPUT, cfg())
        await app.aupdate_state(cfg(), {"x": 7})
        return await app.ainvoke(None, cfg(multitask_strategy="reject"))

    out = run(main())
    assert out["x"] == 70
    assert out["log"] == ["a", "b", "c"]


def test_a_run_still_going_holds_the_thread_and_says_what_to_do(sessions: Sessions) -> None:
    """While a run is inside its node, ``update_state`` from elsewhere waits for it and,
    past its bound, fails with a TurnBusy that tells a LangGraph user what to do (not
    to write through a session's turn); once the run ends the update goes through."""
    saver = NousCheckpointSaver(sessions, lease=300.0, wait=REGISTRY_BOUND / 2)
    entered, release = threading.Event(), threading.Event()

    def held(state: S) -> dict[str, Any]:
        entered.set()
        assert release.wait(BOUND * 3)
        return {"log": ["held"]}

    g = StateGraph(S)
    g.add_node("held", held)
    g.add_edge(START, "held")
    app = g.compile(checkpointer=saver)
    runner = threading.Thread(target=app.invoke, args=(START_INPUT, cfg()))
    runner.start()
    try:
        assert entered.wait(BOUND)
        with pytest.raises(TurnBusy) as caught:
            app.update_state(cfg(), {"x": 5})
        message = str(caught.value)
        assert "saver.run(config)" in message
        assert "multitask_strategy" in message
        assert "session.turn" not in message
        assert caught.value.holder is not None
        with pytest.raises(TurnBusy, match=r"saver\.run"):
            app.invoke(START_INPUT, cfg(multitask_strategy="reject"))
    finally:
        release.set()
        runner.join(BOUND)
    assert not runner.is_alive()
    app.update_state(cfg(), {"x": 5})
    assert app.get_state(cfg()).values["log"] == ["held"]


def test_a_run_block_still_holds_the_thread_across_runs(sessions: Sessions) -> None:
    """``saver.run(config)`` holds the thread across the runs inside it, stopped ones
    too: a rejecting run elsewhere is refused until the block ends."""
    saver = NousCheckpointSaver(sessions, lease=300.0, wait=REGISTRY_BOUND / 2)
    app = linear(saver, ["b"])
    refused: list[BaseException] = []

    def other() -> None:
        try:
            linear(saver).invoke(START_INPUT, cfg(multitask_strategy="reject"))
        except TurnBusy as exc:
            refused.append(exc)

    with saver.run(cfg()):
        app.invoke(START_INPUT, cfg())  # paused at the breakpoint
        t = threading.Thread(target=other)
        t.start()
        t.join(BOUND)
        app.update_state(cfg(), {"x": 3})
        app.invoke(None, cfg())
    assert len(refused) == 1
    assert app.get_state(cfg()).values["x"] == 30
