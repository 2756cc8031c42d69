"""A LangGraph thread in the viewer: the decoder of the checkpointer's records (hand-built
events, random trees of checkpoints, and threads the real saver wrote), and the JSON API
over them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette", reason="the viewer needs the serve extra")
pytest.importorskip("langgraph", reason="the thread is written by the LangGraph saver")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from starlette.testclient import TestClient

from nous_actor import Sessions, SQLiteStore
from nous_actor.core.event import Event
from nous_actor.integrations.langgraph import NousCheckpointSaver, thread_key
from nous_actor.viewer import create_app, read_only_sqlite
from nous_actor.viewer.langgraph import (
    NoCheckpoint,
    Thread,
    has_records,
    read_thread,
    session_of,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Events:
    """Hand-built events of one session, seqs in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, data: dict[str, Any], etype: str = "request_header") -> int:
        seq = len(self.events)
        self.events.append(Event(seq, etype, T0, data))
        return seq

    def cp(self, cid: str, parent: str | None, vals: dict[str, Any], **more: Any) -> int:
        rec = {"lg": "cp", "ns": more.pop("ns", ""), "id": cid, "parent": parent}
        rec["meta"] = ["j", {"source": "loop", "step": more.pop("step", 0)}]
        return self.add({**rec, "vals": vals, "vers": {}, "seen": {}, **more})


def contents(thread: Thread, cid: str | None, ns: str = "") -> list[str]:
    return [m["content"] for m in thread.messages(ns, cid)["messages"]]


# -- the decoder, on hand-built records ------------------------------------------------------


def test_a_chain_of_deltas_folds_back_to_its_messages() -> None:
    """Whole, tail (JSON and LangChain messages) and pending-write references fold back;
    each message names the checkpoint that added it; tool calls are shown."""
    ev = Events()
    ev.cp("1", None, {"messages": ["w", ["j", ["hello"]]]}, full=True)
    ev.add(
        {
            "lg": "w",
            "ns": "",
            "cp": "1",
            "task": "t1",
            "path": "p",
            "w": [
                [
                    0,
                    "messages",
                    [
                        "m",
                        [
                            [
                                "ai",
                                {
                                    "content": "",
                                    "tool_calls": [
                                        {
                                            "name": "add",
                                            "args": {"a": 2},
                                            "id": "c1",
                                            "type": "tool_call",
                                        }
                                    ],
                                },
                            ]
                        ],
                    ],
                ]
            ],
        }
    )
    ev.cp("2", "1", {"messages": ["r", [["t1", 0]]]})
    ev.cp("3", "2", {"messages": ["t", ["m", [["tool", {"content": "5", "tool_call_id": "c1"}]]]]})
    th = read_thread("langgraph/chat", ev.events)
    got = th.messages("", None)
    assert got["checkpoint"]["id"] == "3"
    assert got["checkpoint"]["head"]
    rows = got["messages"]
    assert [(r["type"], r["content"]) for r in rows] == [
        ("value", "hello"),
        ("ai", ""),
        ("tool", "5"),
    ]
    assert rows[1]["tool_calls"] == [{"name": "add", "args": {"a": 2}, "id": "c1"}]
    assert rows[2]["tool_call_id"] == "c1"
    assert [r["added_by"] for r in rows] == ["1", "2", "3"]
    assert [r["messages"] for r in th.tree()] == [1, 2, 3]
    assert contents(th, "1") == ["hello"]
    assert th.summary()["thread_id"] == "chat"


def test_a_serialized_value_is_shown_as_its_type_and_size() -> None:
    """A value the serializer kept is never decoded: its type and size are shown, and the
    tails folded on it still are."""
    ev = Events()
    ev.cp("1", None, {"messages": ["w", ["msgpack", "AAAAAAAA"]]}, full=True)
    ev.cp("2", "1", {"messages": ["t", ["j", ["next"]]]})
    ev.cp("3", "2", {"messages": ["t", ["pickle", "c" * 40, "z"]]})
    th = read_thread("s", ev.events)
    rows = th.messages("", None)["messages"]
    assert [r["type"] for r in rows] == ["opaque", "value", "opaque"]
    assert rows[0]["opaque"] == {"opaque": "msgpack", "bytes": 6, "compressed": False}
    assert rows[0]["content"] == "<msgpack value, 6 bytes: not decoded>"
    assert rows[2]["opaque"]["compressed"] is True
    assert [r["messages"] for r in th.tree()] == [None, None, None]  # not known


def test_forks_heads_and_every_hidden_checkpoint_are_listed() -> None:
    """A checkpoint with two children is a fork; the branch to the head is the main line;
    deletes, prunes, deleted runs and rollbacks mark checkpoints, never drop them."""
    ev = Events()
    ev.cp("1", None, {"messages": ["w", ["j", ["a"]]]}, full=True)
    ev.cp("2", "1", {"messages": ["t", ["j", ["b"]]]}, run="r1")
    ev.cp("3", "2", {"messages": ["t", ["j", ["c"]]]}, run="r1")
    ev.cp("4", "1", {"messages": ["t", ["j", ["B"]]]}, run="r2")  # a branch from 1
    ev.add({"lg": "runs", "runs": ["r1"]})
    ev.add({"lg": "run", "run": "r2", "how": "done"})
    th = read_thread("s", ev.events)
    tree = th.tree()
    assert [(r["id"], r["depth"]) for r in tree] == [("1", 0), ("2", 1), ("3", 1), ("4", 0)]
    assert [r["id"] for r in tree if r["fork"]] == ["1"]
    assert [r["id"] for r in tree if r["head"]] == ["4"]
    assert {r["id"]: r["gone"] for r in tree} == {
        "1": None,
        "2": "run deleted",
        "3": "run deleted",
        "4": None,
    }
    assert contents(th, "3") == ["a", "b", "c"]  # hidden, and still readable
    summary = th.summary()
    assert (summary["forks"], summary["hidden"], summary["head"]) == (1, 2, "4")
    assert summary["ended"] == [{"seq": 5, "run": "r2", "how": "done"}]
    # A rollback: a replace over a run's turn hides the checkpoints inside it.
    start = ev.add(
        {"turn_id": "t", "owner": "o", "policy": "rollback", "lease": 1.0}, "turn_start"
    )
    ev.cp("5", "4", {"messages": ["t", ["j", ["x"]]]})
    ev.add(
        {"content": "rolled back", "surface_op": ["replace", start, start + 1]}, "system_message"
    )
    th.extend(ev.events)
    assert th.find("", "5").gone == "rolled back"
    assert th.head().id == "4"
    ev.add({"lg": "prune", "keep": [["", "4"]]})
    ev.add({"lg": "del"})
    th.extend(ev.events)
    gone = {r["id"]: r["gone"] for r in th.tree()}
    assert gone == {
        "1": "pruned",
        "2": "run deleted",
        "3": "run deleted",
        "4": "deleted",
        "5": "rolled back",
    }
    assert th.head() is None
    assert [h["kind"] for h in th.summary()["hides"]] == [
        "run deleted",
        "rolled back",
        "pruned",
        "deleted",
    ]


def test_namespaces_and_bad_names_are_clear() -> None:
    """A subgraph's namespace has its own tree and head; an unknown checkpoint says where
    to look; a malformed record is counted, not raised."""
    ev = Events()
    ev.cp("1", None, {"messages": ["w", ["j", ["a"]]]}, full=True)
    ev.cp("9", None, {"messages": ["w", ["j", ["sub"]]]}, full=True, ns="sub:x")
    ev.add({"lg": "cp", "ns": ""})  # no id
    th = read_thread("s", ev.events)
    assert th.namespaces() == ["", "sub:x"]
    assert [r["ns"] for r in th.tree()] == ["", "sub:x"]
    assert contents(th, None, "sub:x") == ["sub"]
    assert th.summary()["unreadable"] == [2]
    with pytest.raises(NoCheckpoint, match="it is in namespace 'sub:x'"):
        th.messages("", "9")
    with pytest.raises(NoCheckpoint, match="no checkpoint 'nope'"):
        th.messages("", "nope")
    assert th.messages("", "1", channel="other")["present"] is False
    assert not has_records(Events().events)
    assert session_of("a/b c") == "langgraph/a%2Fb%20c"
    with pytest.raises(ValueError, match="empty"):
        session_of("")
    with pytest.raises(TypeError, match="pass store"):
        read_thread("s", [{"lg": "cp"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="the checkpoint id must be a str"):
        th.messages("", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="the thread id must be a str"):
        session_of(7)  # type: ignore[arg-type]


# -- random trees -----------------------------------------------------------------------------


@st.composite
def trees(
    draw: st.DrawFn,
) -> tuple[list[Event], dict[str, list[str]], dict[str, str | None], dict[str, str]]:
    """Random checkpoints, each on a random earlier one, each record a random delta of
    the messages channel, with prunes and deletes between them; the messages each must
    fold back to, each one's parent, and what hid those hidden."""
    ev = Events()
    expected: dict[str, list[str]] = {}
    parents: dict[str, str | None] = {}
    hidden: dict[str, str] = {}  # what hid each hidden one first
    count = draw(st.integers(1, 12))
    word = st.text("abc", min_size=1, max_size=3)
    for n in range(count):
        cid = f"{n:03d}"
        parent = draw(st.sampled_from([None, *expected])) if expected else None
        before = [] if parent is None else expected[parent]
        how = draw(st.sampled_from(["whole", "tail", "tail-m", "written", "drop", "same"]))
        if parent is None:
            how = "whole"
        new = draw(st.lists(word, max_size=3))
        if how == "whole":
            value = draw(st.lists(word, max_size=4))
            ev.cp(cid, parent, {"messages": ["w", ["j", value]]}, full=parent is None)
            expected[cid] = value
        elif how == "tail":
            ev.cp(cid, parent, {"messages": ["t", ["j", new]]})
            expected[cid] = before + new
        elif how == "tail-m":
            kept = [["human", {"content": w}] for w in new]
            ev.cp(cid, parent, {"messages": ["t", ["m", kept]]} if kept else {})
            expected[cid] = before + new
        elif how == "written":
            refs = []
            for i, w in enumerate(new):
                task = f"task-{cid}-{i}"
                value: Any = ["j", w] if i % 2 else ["j", [w]]  # one value, or a list
                ev.add(
                    {
                        "lg": "w",
                        "ns": "",
                        "cp": parent,
                        "task": task,
                        "path": "",
                        "w": [[0, "messages", value]],
                    }
                )
                refs.append([task, 0])
            ev.cp(cid, parent, {"messages": ["r", refs]})
            expected[cid] = before + new
        elif how == "drop":
            ev.cp(cid, parent, {}, drop=["messages"])
            expected[cid] = []
        else:
            ev.cp(cid, parent, {})
            expected[cid] = before
        parents[cid] = parent
        hide = draw(st.sampled_from(["", "", "", "prune", "del"]))
        if hide == "prune":
            keep = draw(st.lists(st.sampled_from(sorted(expected)), max_size=3))
            ev.add({"lg": "prune", "keep": [["", k] for k in keep]})
            for c in expected:
                if c not in keep:
                    hidden.setdefault(c, "pruned")
        elif hide == "del":
            ev.add({"lg": "del"})
            for c in expected:
                hidden.setdefault(c, "deleted")
    return ev.events, expected, parents, hidden


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_random_trees_fold_back_to_their_messages(
    tree: tuple[list[Event], dict[str, list[str]], dict[str, str | None], dict[str, str]],
) -> None:
    """Every checkpoint of a random tree of deltas reads back as the messages it was given,
    hidden or not; its count, forks, what hid it, the head (the largest id still seen) and
    the tree (each listed once, after its parent) agree."""
    events, expected, parents, hidden = tree
    whole = read_thread("s", events)
    # Read in two parts (the rest committed later): the same thread.
    half = read_thread("s", events[: len(events) // 2])
    half.extend(events)
    for th in (whole, half):
        for cid, messages in expected.items():
            assert contents(th, cid) == messages
        rows = th.tree()
        assert sorted(r["id"] for r in rows) == sorted(expected)
        place = {r["id"]: i for i, r in enumerate(rows)}
        for cid, parent in parents.items():
            if parent is not None:
                assert place[parent] < place[cid]
        kids: dict[str, int] = {}
        for parent in parents.values():
            if parent is not None:
                kids[parent] = kids.get(parent, 0) + 1
        assert {r["id"] for r in rows if r["fork"]} == {c for c, k in kids.items() if k > 1}
        assert {r["id"]: r["messages"] for r in rows} == {c: len(m) for c, m in expected.items()}
        assert {r["id"]: r["gone"] for r in rows if r["gone"]} == hidden
        seen = [c for c in expected if c not in hidden]
        assert [r["id"] for r in rows if r["head"]] == ([max(seen)] if seen else [])


# -- threads the real saver wrote ------------------------------------------------------------


def scripted(state: MessagesState) -> dict[str, Any]:
    """A model without a network: a tool call for the first question, an echo after."""
    last = state["messages"][-1]
    if len(state["messages"]) == 1:
        call = {"id": "call-1", "name": "add", "args": {"a": 2, "b": 3}}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    return {"messages": [AIMessage(f"echo: {last.content}")]}


def agent(saver: NousCheckpointSaver) -> Any:
    """A one-node graph of the scripted model on ``saver``."""
    graph = StateGraph(MessagesState)
    graph.add_node("agent", scripted)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", END)
    return graph.compile(checkpointer=saver)


def add_turn(db: Path, text: str, thread: str = "chat") -> None:
    """One more run of the thread on the SQLite file, from its head."""
    store = SQLiteStore(db)
    sessions = Sessions(store, timeout=20)
    try:
        app = agent(NousCheckpointSaver(sessions))
        app.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}})
    finally:
        sessions.close()
        store.close()


def write_thread(db: Path, thread: str = "chat") -> list[tuple[str, list[str]]]:
    """A thread of three runs on a SQLite file, the third from an earlier checkpoint (a
    fork); every checkpoint's id and message contents as the saver reads them back."""
    store = SQLiteStore(db)
    sessions = Sessions(store, timeout=20)
    try:
        saver = NousCheckpointSaver(sessions)
        app = agent(saver)
        config: Any = {"configurable": {"thread_id": thread}}
        app.invoke({"messages": [HumanMessage("add 2 and 3")]}, config)
        app.invoke({"messages": [HumanMessage("and again")]}, config)
        history = list(app.get_state_history(config))
        app.invoke({"messages": [HumanMessage("a branch")]}, history[3].config)
        return [
            (
                t.config["configurable"]["checkpoint_id"],
                [str(m.content) for m in t.checkpoint["channel_values"].get("messages", [])],
            )
            for t in saver.list(config)
        ]
    finally:
        sessions.close()
        store.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, list[str]]]]:
    db = tmp_path_factory.mktemp("lg") / "thread.db"
    return db, write_thread(db)


def test_a_thread_the_saver_wrote_reads_as_the_saver_reads_it(
    written: tuple[Path, list[tuple[str, list[str]]]],
) -> None:
    """Every checkpoint's messages are what the saver itself reads back; the fork is seen;
    the head is the saver's latest."""
    db, listed = written
    store = SQLiteStore(db, create=False)
    try:
        th = read_thread(thread_key("chat"), store.load(thread_key("chat")))
    finally:
        store.close()
    for cid, messages in listed:
        assert contents(th, cid) == messages
    assert th.summary()["head"] == listed[0][0]
    assert th.summary()["forks"] == 1
    assert contents(th, None)[-2:] == ["a branch", "echo: a branch"]
    calls = [m["tool_calls"] for m in th.messages("", None)["messages"] if m["tool_calls"]]
    assert calls == [[{"name": "add", "args": {"a": 2, "b": 3}, "id": "call-1"}]]


# -- the API ----------------------------------------------------------------------------------


@pytest.fixture
def client(written: tuple[Path, list[tuple[str, list[str]]]]) -> Iterator[TestClient]:
    store = read_only_sqlite(written[0])
    try:
        with TestClient(create_app(store)) as c:
            yield c
    finally:
        store.close()


def test_the_api_lists_the_checkpoints_and_a_checkpoint_s_messages(
    client: TestClient, written: tuple[Path, list[tuple[str, list[str]]]]
) -> None:
    """``/api/langgraph`` gives the tree, ``/api/langgraph/messages`` a checkpoint's
    messages (the head's by default); the session's summary says it is a thread."""
    _, listed = written
    sid = thread_key("chat")
    meta = client.get("/api/session", params={"id": sid}).json()
    assert meta["langgraph"] > 0
    body = client.get("/api/langgraph", params={"id": sid}).json()
    assert body["thread_id"] == "chat"
    assert body["head"] == listed[0][0]
    assert {r["id"] for r in body["rows"]} == {cid for cid, _ in listed}
    assert sum(r["fork"] for r in body["rows"]) == 1
    head = client.get("/api/langgraph/messages", params={"id": sid}).json()
    assert [m["content"] for m in head["messages"]] == listed[0][1]
    assert head["checkpoint"]["head"] is True
    for cid, messages in listed:
        got = client.get("/api/langgraph/messages", params={"id": sid, "checkpoint": cid})
        assert [m["content"] for m in got.json()["messages"]] == messages


def test_the_api_says_what_is_wrong(client: TestClient) -> None:
    """A session that is no thread, an unknown checkpoint or session: 404 with what to do;
    a missing id: 400; a write: 405; every answer carries the security headers."""
    sid = thread_key("chat")
    cases = [
        ("/api/langgraph", {}, 400, "'id'"),
        ("/api/langgraph", {"id": "nobody"}, 404, "no session 'nobody'"),
        ("/api/langgraph/messages", {"id": sid, "checkpoint": "x"}, 404, "no checkpoint 'x'"),
        ("/api/langgraph/messages", {"id": sid, "ns": "sub"}, 404, "namespace 'sub'"),
        ("/api/langgraph", {"id": "bad id\n"}, 404, "id"),
    ]
    for path, params, status, words in cases:
        r = client.get(path, params=params)
        assert r.status_code == status, (path, params, r.text)
        assert words in r.json()["error"]
        assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert client.post("/api/langgraph", params={"id": sid}).status_code == 405


def test_a_session_without_records_is_not_a_thread(tmp_path: Path) -> None:
    """A plain session's page is as before; its LangGraph API says it holds none."""
    from viewer_sessions import sqlite_file

    db = tmp_path / "plain.db"
    sqlite_file(db)
    store = read_only_sqlite(db)
    try:
        with TestClient(create_app(store)) as c:
            assert c.get("/api/session", params={"id": "chat"}).json()["langgraph"] == 0
            r = c.get("/api/langgraph", params={"id": "chat"})
            assert r.status_code == 404
            assert "holds no LangGraph checkpoint" in r.json()["error"]
            assert "/session?id=chat" in r.json()["error"]
    finally:
        store.close()


def test_tools_an_interrupt_and_a_subgraph_read_as_the_saver_reads_them(tmp_path: Path) -> None:
    """A graph with a tool node, an ``interrupt()`` resumed, and a subgraph (a namespace of
    its own): every checkpoint of every namespace reads as the saver reads it; after
    ``delete_thread`` every one is still listed, marked deleted, and none is the head."""
    from langgraph.types import Command
    from test_langgraph_graph import build

    store = SQLiteStore(tmp_path / "graph.db")
    sessions = Sessions(store, timeout=20)
    try:
        saver = NousCheckpointSaver(sessions)
        app = build(saver)
        config: Any = {"configurable": {"thread_id": "t"}}
        app.invoke({"messages": [HumanMessage("add 2 and 3")]}, config)
        app.invoke(Command(resume="yes"), config)
        listed = {
            (
                t.config["configurable"]["checkpoint_ns"],
                t.config["configurable"]["checkpoint_id"],
            ): [str(m.content) for m in t.checkpoint["channel_values"].get("messages", [])]
            for ns in ("", *_subgraph_namespaces(saver))
            for t in saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ns}})
        }
        th = read_thread(thread_key("t"), store.load(thread_key("t")))
        assert len(th.namespaces()) > 1
        assert {(r["ns"], r["id"]) for r in th.tree()} == set(listed)
        for (ns, cid), messages in listed.items():
            assert contents(th, cid, ns) == messages
        tool = [m for m in th.messages("", None)["messages"] if m["type"] == "tool"]
        assert [(m["content"], m["name"]) for m in tool] == [("5", "add")]
        saver.delete_thread("t")
        th.extend(store.load(thread_key("t")))
        assert {r["gone"] for r in th.tree()} == {"deleted"}
        assert th.head() is None
        with pytest.raises(NoCheckpoint, match="no checkpoint LangGraph still sees"):
            th.messages("", None)
    finally:
        sessions.close()
        store.close()


def _subgraph_namespaces(saver: NousCheckpointSaver) -> set[str]:
    return {
        t.config["configurable"]["checkpoint_ns"]
        for t in saver.list({"configurable": {"thread_id": "t"}})
    } - {""}
