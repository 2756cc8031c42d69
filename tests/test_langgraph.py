"""The LangGraph checkpointer: its sync API, what it stores, what a delete keeps, and the
checks at its entry points (the async API runs LangGraph's conformance suite in
test_langgraph_conformance.py; whole graphs run in test_langgraph_graph.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from nous_actor import Sessions
from nous_actor.core.event import Event
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key, thread_of

pytestmark = pytest.mark.timeout(120)

_CALL = {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}}


@pytest.fixture
def saver(sessions: Sessions) -> NousCheckpointSaver:
    return NousCheckpointSaver(sessions)


def cfg(thread: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def checkpoint(values: dict[str, Any], versions: dict[str, Any] | None = None) -> Checkpoint:
    cp = empty_checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = versions if versions is not None else dict.fromkeys(values, 1)
    return cp


def chain(
    saver: NousCheckpointSaver, thread: str, values: list[dict[str, Any]], ns: str = ""
) -> list[dict[str, Any]]:
    """Put one checkpoint per item of ``values``, each the child of the one before."""
    configs: list[dict[str, Any]] = []
    parent = cfg(thread, ns)
    for step, vals in enumerate(values):
        stored = saver.put(
            parent,
            checkpoint(vals, {k: step + 1 for k in vals}),
            {"source": "loop", "step": step},
            {},
        )
        configs.append(dict(stored))
        parent = cfg(thread, ns, stored["configurable"]["checkpoint_id"])
    return configs


def records(sessions: Sessions, thread: str) -> list[Event]:
    """The saver's records in the thread's session."""
    events = sessions.open(thread_key(thread)).events().get()
    return [e for e in events if "lg" in e.data]


# -- the sync API --------------------------------------------------------------------------


def test_put_then_get_tuple_round_trips_the_checkpoint(saver: NousCheckpointSaver) -> None:
    """A checkpoint read back holds the values, versions, metadata and parent it was put with."""
    first, second = chain(saver, "t", [{"a": 1, "b": [1, 2]}, {"a": 2, "b": [1, 2, 3]}])
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": 2, "b": [1, 2, 3]}
    assert tup.checkpoint["channel_versions"] == {"a": 2, "b": 2}
    assert tup.metadata["step"] == 1
    assert tup.config["configurable"]["checkpoint_id"] == second["configurable"]["checkpoint_id"]
    assert tup.parent_config is not None
    assert (
        tup.parent_config["configurable"]["checkpoint_id"]
        == first["configurable"]["checkpoint_id"]
    )
    older = saver.get_tuple(first)
    assert older is not None
    assert older.checkpoint["channel_values"] == {"a": 1, "b": [1, 2]}


def test_get_tuple_of_an_unknown_thread_is_none_and_opens_no_session(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """Looking up a thread that has nothing returns None and starts no session."""
    assert saver.get_tuple(cfg("nobody")) is None
    assert thread_key("nobody") not in sessions.live()


def test_put_writes_are_pending_writes_in_langgraph_order(saver: NousCheckpointSaver) -> None:
    """Writes come back ordered by task path, task id and index; a task's write at an index
    is stored once, and an error write replaces the one before."""
    [stored] = chain(saver, "t", [{"a": 1}])
    saver.put_writes(stored, [("x", 1), ("y", 2)], "task-b", "b")
    saver.put_writes(stored, [("x", 9)], "task-b", "b")
    saver.put_writes(stored, [("z", 3), (ERROR, "boom")], "task-a", "a")
    saver.put_writes(stored, [(ERROR, "boom again")], "task-a", "a")
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert tup.pending_writes == [
        ("task-a", ERROR, "boom again"),
        ("task-a", "z", 3),
        ("task-b", "x", 1),
        ("task-b", "y", 2),
    ]


def test_list_filters_pages_and_orders_newest_first(saver: NousCheckpointSaver) -> None:
    """list() takes a namespace, a metadata filter, a before cursor and a limit."""
    configs = chain(saver, "t", [{"a": i} for i in range(4)])
    chain(saver, "t", [{"a": 0}], ns="child:1")
    ids = [c["configurable"]["checkpoint_id"] for c in configs]
    assert [t.checkpoint["id"] for t in saver.list(cfg("t"))] == ids[::-1]
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 5  # every namespace
    assert [t.metadata["step"] for t in saver.list(cfg("t"), filter={"step": 2})] == [2]
    before = saver.list(cfg("t"), before=configs[2], limit=1)
    assert [t.checkpoint["id"] for t in before] == [ids[1]]
    assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"t"}


def test_delete_thread_hides_the_thread_and_keeps_its_history(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """After delete_thread the thread is empty for LangGraph; its session keeps every
    checkpoint, followed by the deletion record."""
    chain(saver, "t", [{"a": 1}, {"a": 2}])
    saver.delete_thread("t")
    assert saver.get_tuple(cfg("t")) is None
    assert list(saver.list(cfg("t"))) == []
    assert [e.data["lg"] for e in records(sessions, "t")] == ["cp", "cp", "del"]
    chain(saver, "t", [{"a": 3}])  # the thread can be used again
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": 3}


def test_prune_keeps_the_latest_per_namespace_and_the_log_keeps_all(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """prune(keep_latest) leaves one checkpoint per namespace; the log keeps the others."""
    configs = chain(saver, "t", [{"a": i} for i in range(3)])
    chain(saver, "t", [{"b": i} for i in range(2)], ns="sub:1")
    saver.prune(["t"])
    listed = list(saver.list({"configurable": {"thread_id": "t"}}))
    assert len(listed) == 2
    latest = saver.get_tuple(cfg("t"))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"a": 2}
    assert saver.get_tuple(configs[0]) is None
    assert len([e for e in records(sessions, "t") if e.data["lg"] == "cp"]) == 5
    saver.prune(["t"], strategy="delete")
    assert list(saver.list({"configurable": {"thread_id": "t"}})) == []


def test_delete_for_runs_hides_those_runs_in_every_thread(saver: NousCheckpointSaver) -> None:
    """delete_for_runs finds the runs' checkpoints in every thread and hides only those."""
    for thread in ("t1", "t2"):
        for run in ("r1", "r2"):
            saver.put(cfg(thread), checkpoint({}), {"run_id": run, "step": 0}, {})
    saver.delete_for_runs(["r1"])
    for thread in ("t1", "t2"):
        runs = {t.metadata.get("run_id") for t in saver.list(cfg(thread))}
        assert runs == {"r2"}


def test_copy_thread_forks_the_session(saver: NousCheckpointSaver, sessions: Sessions) -> None:
    """copy_thread makes the target a fork of the source: the same checkpoints and writes,
    and the source unchanged."""
    configs = chain(saver, "src", [{"m": [1]}, {"m": [1, 2]}])
    saver.put_writes(configs[-1], [("m", 3)], "task")
    saver.copy_thread("src", "dst")
    src = [(t.checkpoint["channel_values"], t.pending_writes) for t in saver.list(cfg("src"))]
    dst = [(t.checkpoint["channel_values"], t.pending_writes) for t in saver.list(cfg("dst"))]
    assert src == dst == [({"m": [1, 2]}, [("task", "m", 3)]), ({"m": [1]}, [])]
    forked = sessions.open(thread_key("dst")).events().get()
    assert forked[-1].data["forked_from"]["session_id"] == thread_key("src")


def test_copy_thread_onto_a_used_thread_appends_the_visible_checkpoints(
    saver: NousCheckpointSaver,
) -> None:
    """A target with a history of its own gets the source's visible checkpoints appended."""
    chain(saver, "src", [{"m": [1]}, {"m": [1, 2]}])
    chain(saver, "dst", [{"other": True}])
    saver.delete_thread("dst")
    saver.copy_thread("src", "dst")
    assert [t.checkpoint["channel_values"] for t in saver.list(cfg("dst"))] == [
        {"m": [1, 2]},
        {"m": [1]},
    ]


def test_a_second_saver_reads_what_the_first_wrote(sessions: Sessions) -> None:
    """A saver with nothing memoised folds a thread from its log to the same checkpoints."""
    first = NousCheckpointSaver(sessions)
    chain(first, "t", [{"m": list(range(n))} for n in range(1, 30)])
    second = NousCheckpointSaver(sessions)
    warm = [t.checkpoint for t in first.list(cfg("t"))]
    cold = [t.checkpoint for t in second.list(cfg("t"))]
    assert cold == warm
    assert len(cold) == 29


def test_from_conn_string_keeps_threads_in_a_sqlite_file(tmp_path: Path) -> None:
    """A saver built from a path alone writes a SQLite file another saver reads back."""
    path = tmp_path / "checkpoints.db"
    with NousCheckpointSaver.from_conn_string(path) as saver:
        chain(saver, "t", [{"a": 1}])
    with NousCheckpointSaver.from_conn_string(str(path)) as again:
        tup = again.get_tuple(cfg("t"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": 1}


# -- what is stored ------------------------------------------------------------------------


def test_a_list_that_extends_its_parent_stores_only_its_tail(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """An extended list is stored as its new tail, an unchanged value not at all, and a
    list that does not extend its parent whole."""
    chain(saver, "t", [{"m": [1, 2], "s": "x"}, {"m": [1, 2, 3], "s": "x"}, {"m": [9], "s": "y"}])
    vals = [e.data["vals"] for e in records(sessions, "t")]
    assert vals[0] == {"m": ["w", ["j", [1, 2]]], "s": ["w", ["j", "x"]]}
    assert vals[1] == {"m": ["t", ["j", [3]]]}
    assert vals[2] == {"m": ["w", ["j", [9]]], "s": ["w", ["j", "y"]]}


def test_a_checkpoint_costs_what_changed_not_the_whole_history(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """The stored size of a long chain of growing lists grows linearly: the last record is
    as small as the second."""
    chain(saver, "t", [{"m": [f"message {i}" for i in range(n)]} for n in range(1, 200)])
    sizes = [len(json.dumps(e.data)) for e in records(sessions, "t")]
    assert max(sizes[1:]) <= sizes[1] + 16


def test_values_that_are_not_json_go_through_the_serializer(saver: NousCheckpointSaver) -> None:
    """Bytes, tuples and int-keyed dicts round-trip as LangGraph's serializer gives them."""
    chain(
        saver,
        "t",
        [
            {"b": b"\x00\xff", "d": {1: "one"}, "m": [b"a"]},
            {"b": b"\x00", "d": {1: "one"}, "m": [b"a", b"b"]},
        ],
    )
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"b": b"\x00", "d": {1: "one"}, "m": [b"a", b"b"]}


def test_a_reducer_that_changes_its_input_in_place_cannot_change_what_is_stored(
    saver: NousCheckpointSaver,
) -> None:
    """The saver keeps copies of lists: appending to a returned or put list in place
    changes neither the memo nor the next checkpoint's delta."""
    [first] = chain(saver, "t", [{"m": [1]}])
    got = saver.get_tuple(first)
    assert got is not None
    value = got.checkpoint["channel_values"]["m"]
    value.append(2)  # a reducer that appends in place
    saver.put(first, checkpoint({"m": value}, {"m": 2}), {"step": 1}, {})
    fresh = NousCheckpointSaver(saver.sessions)
    assert fresh.get_tuple(cfg("t")).checkpoint["channel_values"] == {"m": [1, 2]}
    assert fresh.get_tuple(first).checkpoint["channel_values"] == {"m": [1]}


# A step of a channel's history: extend the list, replace it, drop an element, or keep it.
_element = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.binary(max_size=2))
_step = st.one_of(
    st.tuples(st.just("extend"), st.lists(_element, max_size=3)),
    st.tuples(st.just("replace"), st.lists(_element, max_size=4)),
    st.tuples(st.just("drop"), st.integers(0, 10)),
    st.tuples(st.just("keep"), st.none()),
    st.tuples(st.just("remove"), st.none()),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(_step, min_size=1, max_size=12))
def test_the_tail_delta_folds_back_to_every_stored_value(
    sessions: Sessions, steps: list[tuple[str, Any]]
) -> None:
    """For any history of a list channel (extended, replaced, shortened, kept, removed),
    every checkpoint reads back exactly the value it was put with, warm and cold."""
    saver = NousCheckpointSaver(sessions)
    thread = uuid.uuid4().hex
    value: list[Any] | None = []
    history: list[dict[str, Any]] = []
    for how, arg in steps:
        if how == "extend":
            value = [*(value or []), *arg]
        elif how == "replace":
            value = list(arg)
        elif how == "drop" and value:
            value = [v for i, v in enumerate(value) if i != arg % len(value)]
        elif how == "remove":
            value = None
        history.append({} if value is None else {"m": value})
    configs = chain(saver, thread, history)
    cold = NousCheckpointSaver(sessions)
    for reader in (saver, cold):
        got = [reader.get_tuple(c).checkpoint["channel_values"] for c in configs]
        assert got == history


# -- checks at the entry points -----------------------------------------------------------


def test_a_config_without_a_thread_id_says_what_to_pass(saver: NousCheckpointSaver) -> None:
    """A config with no thread id is refused, saying where the id goes."""
    with pytest.raises(ValueError, match=r"no 'thread_id'.*'configurable': \{'thread_id'"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="no 'configurable' mapping"):
        saver.get_tuple({})
    with pytest.raises(TypeError, match="must be a RunnableConfig"):
        saver.get_tuple("t")


def test_put_writes_without_a_checkpoint_id_says_to_pass_puts_config(
    saver: NousCheckpointSaver,
) -> None:
    """Writes need the checkpoint they belong to."""
    with pytest.raises(ValueError, match="pass the config put returned"):
        saver.put_writes(cfg("t"), [("a", 1)], "task")


def test_prune_refuses_an_unknown_strategy_and_a_bare_id(saver: NousCheckpointSaver) -> None:
    """prune names its two strategies, and a thread id not in a list is refused."""
    with pytest.raises(ValueError, match=r"'keep_latest'.*or 'delete'"):
        saver.prune(["t"], strategy="oldest")
    with pytest.raises(TypeError, match=r"wrap a single id: \['t'\]"):
        saver.prune("t")


def test_the_saver_takes_a_registry() -> None:
    """Anything but a Sessions registry is refused, naming the other way to build one."""
    with pytest.raises(TypeError, match="from_conn_string"):
        NousCheckpointSaver("x.db")
    with pytest.raises(ValueError, match="path is empty"):
        NousCheckpointSaver.from_conn_string("")


@pytest.mark.parametrize("thread", ["plain", "with space", "a/b%c", "ü\n", "x" * 200])
def test_any_thread_id_maps_to_a_session_and_back(thread: str) -> None:
    """thread_key encodes any thread id into a valid session id that thread_of reverses."""
    assert thread_of(thread_key(thread)) == thread


def test_a_thread_id_too_long_for_a_session_id_is_refused() -> None:
    """A thread id longer than a session id may be says to shorten it."""
    with pytest.raises(ValueError, match="use a shorter thread id"):
        thread_key("/" * 100)
    with pytest.raises(TypeError, match="thread_id must be a str"):
        thread_key(None)


def test_interrupt_and_error_writes_are_kept(saver: NousCheckpointSaver) -> None:
    """Special writes (error, interrupt) come back with their values."""
    [stored] = chain(saver, "t", [{}])
    saver.put_writes(stored, [(INTERRUPT, {"why": "ask"})], "task")
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert tup.pending_writes == [("task", INTERRUPT, {"why": "ask"})]


def test_a_tail_that_the_parents_write_holds_is_stored_as_a_reference(
    saver: NousCheckpointSaver, sessions: Sessions
) -> None:
    """When a checkpoint's new messages are exactly what its parent's one pending write to
    the channel holds, the record refers to that write instead of keeping them twice; warm
    and cold reads give the list back."""
    [first] = chain(saver, "t", [{"m": ["a"]}])
    saver.put_writes(first, [("m", ["b", "c"]), ("other", 1)], "task", "p")
    second = saver.put(first, checkpoint({"m": ["a", "b", "c"]}, {"m": 2}), {"step": 1}, {})
    [_, record] = records(sessions, "t")[::2]
    assert record.data["vals"]["m"] == ["r", [["task", 0]]]
    for reader in (saver, NousCheckpointSaver(sessions)):
        got = reader.get_tuple(second)
        assert got is not None
        assert got.checkpoint["channel_values"] == {"m": ["a", "b", "c"]}


class _MyMessage(AIMessage):
    """A message class of an application's own (LangChain's reader does not know it)."""


@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ([HumanMessage("hi", id="h1"), AIMessage("", id="a1", tool_calls=[_CALL])], "m"),
        (ToolMessage("5", tool_call_id="c1", id="t1"), "m"),
        ([AIMessage("x", id="a2", additional_kwargs={"raw": b"\x00"})], "msgpack"),
        ([_MyMessage("mine", id="a3")], "msgpack"),
    ],
)
def test_langchain_messages_are_kept_as_json_when_that_reads_back_equal(
    saver: NousCheckpointSaver, sessions: Sessions, value: Any, tag: str
) -> None:
    """Messages are kept as readable JSON (their fields that are not defaults), unless that
    would not read back equal (fields JSON cannot carry, a class of the application's own):
    then through the serializer. Either way a fresh saver reads them back equal."""
    [stored] = chain(saver, "t", [{"m": value}])
    [record] = records(sessions, "t")
    assert record.data["vals"]["m"][1][0] == tag
    got = NousCheckpointSaver(sessions).get_tuple(stored)
    assert got is not None
    assert got.checkpoint["channel_values"]["m"] == value
    assert type(got.checkpoint["channel_values"]["m"]) is type(value)
