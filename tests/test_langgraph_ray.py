"""The LangGraph checkpointer over `RaySessions`: LangGraph's conformance suite, the sync
API, a whole graph through ``ainvoke``, two concurrent runs of one thread and a run
whose shard is killed, each thread's session hosted in a shard of a real local Ray
cluster and journaled in PostgreSQL; and the checks of what the saver takes as a
registry (no Ray needed).

Ray and the server come from tests/ray_cluster.py and tests/postgres_server.py:
without either these tests skip, saying why (they fail under CI). One `RaySessions`
of two shards serves the module; each test has threads of its own.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from bounds import BOUND, SLOW_BOUND, run, wait_until
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from test_langgraph_graph import FINAL, build

from nous_actor import MemoryStore, TurnBusy
from nous_actor.core.event import EventType
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key

if TYPE_CHECKING:
    from postgres_server import Server

    from nous_actor.cluster.ray import RaySessions

pytestmark = pytest.mark.timeout(120)

CHECKS = 81
"""The checks of langgraph-checkpoint-conformance 0.0.2: 58 base, 23 extended."""

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "langgraph.md"
MARKER = (
    "<!-- runs against Ray and PostgreSQL: "
    "tests/test_langgraph_ray.py::test_the_ray_example_runs -->"
)


@pytest.fixture(scope="module")
def module_schema(pg_server: Server) -> Iterator[str]:
    """One schema for the module's cluster, dropped at the end."""
    name = pg_server.fresh_schema()
    yield name
    pg_server.drop_schema(name)


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, pg_server: Server, module_schema: str) -> Iterator[RaySessions]:
    """Two shards on the test cluster, journaled in one schema of the test server."""
    from nous_actor.cluster.ray import RaySessions
    from nous_actor.store.postgres import PostgresStore

    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=module_schema), shards=2, timeout=20
    )
    try:
        yield sessions
    finally:
        sessions.shutdown()


@pytest.fixture
def saver(cluster: RaySessions) -> Iterator[NousCheckpointSaver]:
    with NousCheckpointSaver(cluster) as made:
        yield made


def _thread(label: str = "t") -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


def cfg(thread: str, checkpoint_id: str | None = None, **more: Any) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": "", **more}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def texts(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages]


# -- LangGraph's conformance suite ----------------------------------------------------------


def test_conformance_over_ray(cluster: RaySessions) -> None:
    """Every check of the suite passes over RaySessions on PostgreSQL, every capability
    detected (a saver per check, all over the module's shards)."""

    async def factory() -> AsyncGenerator[BaseCheckpointSaver[Any], None]:
        async with NousCheckpointSaver(cluster) as made:
            yield made

    calls = cluster.stats()["sent"]
    report: CapabilityReport = run(
        validate(checkpointer_test(name="nous-ray")(factory)), bound=100
    )
    results = report.results.values()
    assert [f for r in results for f in r.failures] == []
    for cap in BASE_CAPABILITIES | EXTENDED_CAPABILITIES:
        assert report.results[cap.value].detected, f"{cap.value} not detected"
    counts = (
        sum(r.tests_passed for r in results),
        sum(r.tests_failed for r in results),
        sum(r.tests_skipped for r in results),
    )
    assert counts == (CHECKS, 0, 0)
    assert cluster.stats()["sent"] - calls > CHECKS  # the checks went to the shards


# -- the sync API ---------------------------------------------------------------------------


def checkpoint(values: dict[str, Any], step: int) -> Checkpoint:
    cp = empty_checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = dict.fromkeys(values, step)
    return cp


def test_the_sync_api_over_ray(saver: NousCheckpointSaver, cluster: RaySessions) -> None:
    """put, put_writes, get_tuple, list, copy_thread, prune and delete_thread from a
    plain thread: each thread is a session of its shard, what the shard wrote the saver
    reads back, and a delete keeps the events."""
    thread, copy = _thread(), _thread("copy")
    first = saver.put(cfg(thread), checkpoint({"n": [1]}, 1), {"step": 0, "run_id": "r1"}, {})
    second = saver.put(
        cfg(thread, first["configurable"]["checkpoint_id"]),
        checkpoint({"n": [1, 2]}, 2),
        {"step": 1, "run_id": "r1"},
        {},
    )
    saver.put_writes(second, [("n", 3)], "task-1")
    tup = saver.get_tuple(cfg(thread))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"n": [1, 2]}
    assert tup.pending_writes == [("task-1", "n", 3)]
    assert [t.metadata["step"] for t in saver.list(cfg(thread))] == [1, 0]
    assert [t.metadata["step"] for t in saver.list(cfg(thread), filter={"step": 0})] == [0]
    saver.copy_thread(thread, copy)
    assert [t.metadata["step"] for t in saver.list(cfg(copy))] == [1, 0]
    saver.prune([copy])
    assert [t.metadata["step"] for t in saver.list(cfg(copy))] == [1]
    saver.delete_thread(thread)
    assert saver.get_tuple(cfg(thread)) is None
    assert saver.get_tuple(cfg(_thread("nobody"))) is None
    assert {thread_key(thread), thread_key(copy)} <= set(cluster.live())
    kept = cluster.open(thread_key(thread)).events().get()
    assert sum(1 for e in kept if e.data.get("lg") == "cp") == 2


def test_delete_for_runs_reads_the_threads_from_the_journal(saver: NousCheckpointSaver) -> None:
    """delete_for_runs finds a run's checkpoints in every thread the shards wrote (listed
    from the journal, which this process reads), and hides only those."""
    ours, other = _thread("runs"), _thread("runs")
    run_id = uuid.uuid4().hex
    saver.put(cfg(ours), checkpoint({"a": 1}, 1), {"run_id": run_id}, {})
    saver.put(cfg(other), checkpoint({"a": 2}, 1), {"run_id": "someone-else"}, {})
    assert any(t.config["configurable"]["thread_id"] == ours for t in saver.list(None))
    saver.delete_for_runs([run_id])
    assert saver.get_tuple(cfg(ours)) is None
    assert saver.get_tuple(cfg(other)) is not None


# -- whole graphs ---------------------------------------------------------------------------


async def drive(saver: BaseCheckpointSaver[Any]) -> tuple[list[str], tuple[str, ...], int]:
    """Run the graph to its interrupt, resume it with a rejecting run; the final messages,
    what was next at the interrupt, and how many checkpoints the history has."""
    config = cfg(_thread("graph"))
    app = build(saver)
    first = await app.ainvoke({"messages": [HumanMessage("add 2 and 3")]}, config)
    assert first["__interrupt__"][0].value == "approve the answer?"
    waiting = (await app.aget_state(config)).next
    rejecting = cfg(config["configurable"]["thread_id"], multitask_strategy="reject")
    done = await app.ainvoke(Command(resume="yes"), rejecting)
    history = [s async for s in app.aget_state_history(config)]
    return texts(done["messages"]), waiting, len(history)


def test_a_graph_runs_through_ainvoke_over_ray(saver: NousCheckpointSaver) -> None:
    """Tool call, interrupt, a rejecting resume and a subgraph through ainvoke: the same
    messages, pending node and history as on LangGraph's InMemorySaver."""
    got = run(drive(saver))
    assert got == run(drive(InMemorySaver()))
    assert got[0] == FINAL
    assert got[1] == ("approve",)


def test_two_concurrent_runs_of_one_thread_take_turns_over_ray(
    saver: NousCheckpointSaver, cluster: RaySessions
) -> None:
    """Two concurrent ainvoke on one thread (enqueue): the second, begun while the first
    is held in its node, waits for it and starts from its state; no update is lost, the
    thread does not fork, and a rejecting run meanwhile is refused."""
    thread = _thread("race")
    entered, release = asyncio.Event(), asyncio.Event()
    held = [True]

    async def answer(state: MessagesState) -> dict[str, Any]:
        said = str(state["messages"][-1].content)
        if held[0]:
            held[0] = False
            entered.set()
            await asyncio.wait_for(release.wait(), BOUND)
        return {"messages": [AIMessage(f"re: {said}")]}

    g = StateGraph(MessagesState)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    app = g.compile(checkpointer=saver)

    async def main() -> tuple[list[str], int]:
        first = asyncio.ensure_future(
            app.ainvoke({"messages": [HumanMessage("one")]}, cfg(thread), durability="sync")
        )
        await asyncio.wait_for(entered.wait(), BOUND)
        second = asyncio.ensure_future(
            app.ainvoke({"messages": [HumanMessage("two")]}, cfg(thread))
        )
        with pytest.raises(TurnBusy):
            await asyncio.wait_for(
                app.ainvoke(
                    {"messages": [HumanMessage("no")]},
                    cfg(thread, multitask_strategy="reject"),
                ),
                BOUND,
            )
        release.set()
        await asyncio.wait_for(asyncio.gather(first, second), BOUND)
        state = await app.aget_state(cfg(thread))
        history = [s async for s in app.aget_state_history(cfg(thread))]
        return texts(state.values["messages"]), len(history)

    messages, checkpoints = run(main())
    assert messages == ["one", "re: one", "two", "re: two"]
    assert checkpoints == 6  # one line of three checkpoints per run: no branch
    events = cluster.open(thread_key(thread)).events().get()
    ends = [e.data["how"] for e in events if e.type is EventType.TURN_END]
    assert ends.count("closed") == 2


def test_a_run_goes_on_when_its_shard_is_killed(
    ray_cluster: Any, pg_server: Server, schema: str
) -> None:
    """The worker of the shard that hosts a running run's thread is killed: Ray restarts
    it, the session recovers from the journal, the run's turn is opened again and the
    run finishes, nothing lost."""
    import ray

    from nous_actor.cluster.ray import RaySessions
    from nous_actor.store.postgres import PostgresStore

    thread = _thread("killed")
    entered, release = asyncio.Event(), asyncio.Event()

    async def answer(state: MessagesState) -> dict[str, Any]:
        entered.set()
        await asyncio.wait_for(release.wait(), BOUND)
        return {"messages": [AIMessage(f"re: {state['messages'][-1].content}")]}

    g = StateGraph(MessagesState)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=schema), shards=1, timeout=20
    )
    try:

        async def main() -> list[str]:
            async with NousCheckpointSaver(sessions) as saver:
                app = g.compile(checkpointer=saver)
                first = asyncio.ensure_future(
                    app.ainvoke({"messages": [HumanMessage("one")]}, cfg(thread))
                )
                await asyncio.wait_for(entered.wait(), BOUND)
                pid = sessions.shard_info()[0]["pid"]
                ray.kill(sessions.shard_actor(0), no_restart=False)
                await asyncio.to_thread(
                    wait_until, lambda: _pid(sessions) not in (None, pid), SLOW_BOUND, "a restart"
                )
                release.set()
                await asyncio.wait_for(first, BOUND)
                return texts((await app.aget_state(cfg(thread))).values["messages"])

        assert run(main()) == ["one", "re: one"]
        events = sessions.open(thread_key(thread)).events().get()
        ends = [e.data for e in events if e.type is EventType.TURN_END]
        assert [(e["how"], e.get("reason")) for e in ends] == [
            ("interrupted", "restart"),  # the run's turn, ended by the shard's restart
            ("closed", None),  # the turn it opened again, closed when it finished
        ]
    finally:
        sessions.shutdown()


def _pid(sessions: RaySessions) -> int | None:
    """The pid of shard 0's worker (None while it does not answer)."""
    from nous_actor import CallTimeout, SessionStopped

    try:
        return int(sessions.shard_info()[0]["pid"])
    except (SessionStopped, CallTimeout):
        return None


# -- the docs' example ----------------------------------------------------------------------


def _example() -> str:
    """The example's source: the ```text block right after the marker."""
    text = PAGE.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1
    after = text.split(MARKER, 1)[1]
    assert after.startswith("\n```text\n")
    return after.split("\n```text\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def test_the_ray_example_runs(
    ray_cluster: Any, pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's Ray example runs, its asserts holding, in a schema of its own."""
    code = _example()
    schema = pg_server.fresh_schema()
    assert '"langgraph_ray"' in code
    code = code.replace('"langgraph_ray"', repr(schema))
    monkeypatch.setenv("NOUS_ACTOR_DSN", pg_server.dsn)
    monkeypatch.setenv("NOUS_ACTOR_RAY_ADDRESS", ray_cluster.address)
    try:
        exec(compile(code, str(PAGE), "exec"), {"__name__": "docs_langgraph_ray"})
    finally:
        pg_server.drop_schema(schema)


# -- what the saver takes as a registry (no Ray needed) ------------------------------------


class _Registry:
    """A registry of the shape the saver checks for (never called here), with a
    ``store_factory`` when given one."""

    timeout = 5.0

    def __init__(self, store_factory: Callable[[], Any] | None = None) -> None:
        if store_factory is not None:
            self.store_factory = store_factory

    def open(self, session_id: str) -> Any:
        raise AssertionError("not called")

    async def aopen(self, session_id: str) -> Any:
        raise AssertionError("not called")


def test_a_registry_without_open_or_aopen_is_refused_naming_them() -> None:
    """An object lacking the registry's calls is refused, naming what it lacks and what
    to pass instead."""

    class OnlyOpen:
        def open(self, session_id: str) -> Any:
            raise AssertionError("not called")

    with pytest.raises(TypeError, match=r"got MemoryStore, which has no open or aopen.*Sessions"):
        NousCheckpointSaver(MemoryStore())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got OnlyOpen, which has no aopen"):
        NousCheckpointSaver(OnlyOpen())  # type: ignore[arg-type]


def test_a_registry_without_a_store_is_refused() -> None:
    """A registry with neither a store nor a store_factory is refused, naming both."""
    with pytest.raises(TypeError, match=r"neither a store .* nor a store_factory"):
        NousCheckpointSaver(_Registry())


@pytest.mark.parametrize(
    ("factory", "error", "match"),
    [
        (MemoryStore, ValueError, re.escape("makes a MemoryStore: each shard keeps its own")),
        (dict, TypeError, "store_factory made a dict, not a nous_actor store"),
    ],
)
def test_a_store_factory_the_saver_cannot_read_through_is_refused(
    factory: Callable[[], Any], error: type[Exception], match: str
) -> None:
    """A store_factory of a store other processes cannot read (a MemoryStore), or of no
    store at all, is refused when the saver is made."""
    with pytest.raises(error, match=match):
        NousCheckpointSaver(_Registry(factory))
