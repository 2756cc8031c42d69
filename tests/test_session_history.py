"""Session.compact, Session.fork and Session.as_of, in memory and on a SQLite file."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bounds import BOUND

from nous_actor import (
    CompactionError,
    CompactionResult,
    Compactor,
    ConflictError,
    Event,
    MemoryStore,
    Message,
    Session,
    SQLiteStore,
    Store,
    StoreError,
)
from nous_actor.core.history import compactions

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 2, 2, tzinfo=UTC)

SEED = [
    ("system_message", "sys"),
    ("user_message", "Q1"),
    ("assistant_message", "A1"),
    ("user_message", "Q2"),
    ("assistant_message", "A2"),
    ("user_message", "Q3"),
    ("assistant_message", "A3"),
]


def summarise(messages: Sequence[Message]) -> str:
    return "S(" + ",".join(str(m.content) for m in messages) + ")"


COMPACT = Compactor(budget=1, keep_recent=2, summarise=summarise)


def fill(s: Session, steps: Sequence[tuple[str, str]] = SEED) -> None:
    for etype, text in steps:
        s.append(etype, {"content": text}, T0).get()


def contents(s: Session) -> list[object]:
    return [m.content for m in s.derive_messages().get()]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | None]:
    """No store (the log lives in memory only), or a SQLite file."""
    if request.param == "memory":
        yield None
        return
    st = SQLiteStore(tmp_path / "sessions.db")
    yield st
    st.close()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


def start(session_id: str, store: Store | None) -> Session:
    return Session.start(session_id, store=store, timeout=BOUND)


# -- compact -----------------------------------------------------------------------------


def test_compact_resolves_to_the_result_and_the_session_shows_it(store: Store | None) -> None:
    """Session.compact resolves to a CompactionResult whose log is the session's new log."""
    s = start("chat", store)
    fill(s)
    out = s.compact(COMPACT, time=T1).get()
    assert isinstance(out, CompactionResult)
    assert contents(s) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]
    assert s.log().get() == out.log
    assert s.count().get() == 9
    s.stop()


def test_compact_under_budget_appends_nothing(store: Store | None) -> None:
    """A compaction with nothing to do resolves unchanged and leaves the count alone."""
    s = start("chat", store)
    fill(s)
    out = s.compact(Compactor(budget=10**6, summarise=summarise)).get()
    assert not out.changed
    assert s.count().get() == 7
    s.stop()


def test_failed_compaction_leaves_the_session_unchanged_and_running(store: Store | None) -> None:
    """An empty summary fails the future with CompactionError; the session appends on as before."""
    s = start("chat", store)
    fill(s)
    before = s.events().get()
    with pytest.raises(CompactionError, match="empty summary"):
        s.compact(Compactor(budget=1, keep_recent=2, summarise=lambda ms: "")).get()
    assert s.events().get() == before
    assert s.append("user_message", {"content": "Q4"}, T0).get().seq == 7
    s.stop()


def test_an_append_made_while_the_summary_is_written_stays_after_it(
    store: Store | None,
) -> None:
    """An append sent while compact's summariser runs takes the next seq; the compaction's
    events follow it, and the append stays on the surface after the summary."""
    s = start("chat", store)
    fill(s)
    release = threading.Event()

    def slow(ms: Sequence[Message]) -> str:
        assert release.wait(10)
        return summarise(ms)

    fut = s.compact(Compactor(budget=1, keep_recent=2, summarise=slow))
    ev = s.append("user_message", {"content": "Q4"}, T0).get()
    assert ev.seq == 7  # answered while the summariser is still blocked
    assert not fut.done()
    release.set()
    out = fut.get()
    assert (out.summary_seq, out.record_seq) == (8, 9)
    assert contents(s)[-1] == "Q4"
    assert s.append("user_message", {"content": "Q5"}, T0).get().seq == 10
    s.stop()


def test_compact_with_snapshot_drops_the_shadowed_events(store: Store | None) -> None:
    """A snapshot=True compactor leaves only the unshadowed events, the surface unchanged."""
    s = start("chat", store)
    fill(s)
    c = Compactor(budget=1, keep_recent=2, summarise=summarise, snapshot=True)
    s.compact(c).get()
    assert [e.seq for e in s.events().get()] == [0, 5, 6, 7, 8]
    assert contents(s) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]
    s.stop()


class RecordingStore(MemoryStore):
    """A MemoryStore that remembers the seqs of each write, per call."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[int]] = []

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.writes.extend([ev.seq for ev in evs] for evs in appends.values())
        return super().write(appends)


def test_compaction_events_commit_in_one_write() -> None:
    """The prunes, the summary and the record of one compaction reach the store in one write."""
    st = RecordingStore()
    s = start("chat", st)
    s.append("user_message", {"content": "find"}, T0).get()
    s.append(
        "assistant_message", {"tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}, T0
    ).get()
    s.append("tool_result", {"content": "x" * 4000, "tool_call_id": "c1"}, T0).get()
    fill(s, SEED[1:])
    out = s.compact(Compactor(budget=1, keep_recent=2, prune_over=10, summarise=summarise)).get()
    assert out.pruned == (2,)
    assert [9, 10, 11] in st.writes
    s.stop()


class RefuseCompactions(MemoryStore):
    """A MemoryStore whose backend fails any write that carries a compaction record."""

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        for evs in appends.values():
            if any(ev.data.get("step") == "compaction" for ev in evs):
                raise StoreError("disk on fire")
        return super().write(appends)


def test_a_compaction_the_store_refuses_is_stored_not_at_all() -> None:
    """If the commit fails, no event of the compaction is stored or shown, prunes included."""
    st = RefuseCompactions()
    s = start("chat", st)
    s.append("user_message", {"content": "find"}, T0).get()
    s.append(
        "assistant_message", {"tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}, T0
    ).get()
    s.append("tool_result", {"content": "x" * 4000, "tool_call_id": "c1"}, T0).get()
    fill(s, SEED[1:])
    before = s.events().get()
    with pytest.raises(StoreError, match="disk on fire"):
        s.compact(Compactor(budget=1, keep_recent=2, prune_over=10, summarise=summarise)).get()
    assert [e.seq for e in st.load("chat")] == list(range(9))
    assert s.events().get() == before
    s.stop()
    again = start("chat", st)
    assert again.events().get() == before
    again.stop()


def test_compaction_survives_a_restart(sqlite_path: Path) -> None:
    """After compact, stop and reopen from the SQLite file, the log and its record are the same."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        s.compact(COMPACT, time=T1).get()
        log = s.log().get()
        s.stop()
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        assert s.log().get() == log
        assert contents(s) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]
        assert compactions(s.log().get()) == compactions(log)
        s.stop()


def test_compaction_with_snapshot_survives_a_restart(sqlite_path: Path) -> None:
    """A snapshotting compaction also drops the shadowed rows from the file."""
    c = Compactor(budget=1, keep_recent=2, summarise=summarise, snapshot=True)
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        s.compact(c).get()
        s.count().get()  # after the snapshot queued behind the compaction
        s.stop()
    with SQLiteStore(sqlite_path) as st:
        assert [e.seq for e in st.load("chat")] == [0, 5, 6, 7, 8]
        s = start("chat", st)
        assert contents(s) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]
        assert s.append("user_message", {"content": "Q4"}, T0).get().seq == 9
        s.stop()


def test_failed_snapshotting_compaction_drops_nothing() -> None:
    """A snapshot=True compaction that fails leaves every event, earlier shadowed ones included."""
    s = start("chat", None)
    fill(s)
    s.compact(COMPACT).get()
    s.append("user_message", {"content": "Q4"}, T0).get()
    before = s.events().get()
    bad = Compactor(budget=1, keep_recent=1, summarise=lambda ms: "", snapshot=True)
    with pytest.raises(CompactionError):
        s.compact(bad).get()
    assert s.events().get() == before
    s.stop()


# -- as_of -------------------------------------------------------------------------------


def test_session_as_of_is_the_log_as_of(store: Store | None) -> None:
    """Session.as_of(seq) resolves to log().as_of(seq): the messages before the compaction."""
    s = start("chat", store)
    fill(s)
    s.compact(COMPACT).get()
    past = s.as_of(6).get()
    assert past == s.log().get().as_of(6)
    assert [m.content for m in past.derive_messages()] == [text for _, text in SEED]
    s.stop()


def test_session_as_of_past_the_head_fails_the_future(store: Store | None) -> None:
    """A bad boundary fails that call with ValueError; the session keeps answering."""
    s = start("chat", store)
    fill(s)
    with pytest.raises(ValueError, match="past the head"):
        s.as_of(7).get()
    assert s.count().get() == 7
    s.stop()


# -- fork --------------------------------------------------------------------------------


def test_fork_without_a_new_id_returns_the_prefix(store: Store | None) -> None:
    """fork(n) resolves to the prefix through n (seqs preserved) and writes nothing."""
    s = start("chat", store)
    fill(s)
    prefix = s.fork(3).get()
    assert prefix == s.log().get().as_of(3)
    if store is not None:
        assert store.sessions() == ["chat"]
    s.stop()


def test_fork_inside_an_open_turn_fails_the_future(store: Store | None) -> None:
    """A boundary inside an open turn fails with ValueError naming the turn; nothing changes."""
    s = start("chat", store)
    fill(s, SEED[:2])
    s.append("turn_start", {}, T0).get()
    s.append("assistant_message", {"content": "A1"}, T0).get()
    with pytest.raises(
        ValueError, match=r"fork\(through_seq=3\) is inside the turn opened at seq 2"
    ):
        s.fork(3, "child").get()
    assert s.count().get() == 4
    if store is not None:
        assert store.load("child") == []
    s.stop()


def test_fork_writes_the_new_session_with_seqs_preserved(sqlite_path: Path) -> None:
    """With a store, the new id gets the retained prefix (snapshot gaps kept) and a
    request_header recording the parent's id and the boundary."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        s.compact(Compactor(budget=1, keep_recent=2, summarise=summarise, snapshot=True)).get()
        fill(s, [("user_message", "Q4"), ("assistant_message", "A4")])
        forked = s.fork(9, "chat-b").get()
        rows = st.load("chat-b")
        assert [e.seq for e in rows] == [0, 5, 6, 7, 8, 9, 10]
        assert rows[:-1] == s.log().get().as_of(9).events()
        header = rows[-1]
        assert header.type.value == "request_header"
        assert header.data == {"forked_from": {"session_id": "chat", "through_seq": 9}}
        assert forked.events() == rows
        s.stop()


def test_forked_session_opens_from_the_store_and_continues(sqlite_path: Path) -> None:
    """The fork opens like any session, after a restart too, and appends after its header."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        s.fork(4, "chat-b").get()
        s.stop()
    with SQLiteStore(sqlite_path) as st:
        b = start("chat-b", st)
        assert contents(b) == ["sys", "Q1", "A1", "Q2", "A2"]
        assert b.append("user_message", {"content": "other Q3"}, T0).get().seq == 6
        b.stop()


def test_appending_to_the_fork_never_changes_the_parent(sqlite_path: Path) -> None:
    """The parent's rows and log stay as they were while the fork grows."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        parent_rows = st.load("chat")
        s.fork(2, "chat-b").get()
        b = start("chat-b", st)
        b.append("user_message", {"content": "fork only"}, T0).get()
        b.compact(Compactor(budget=1, keep_recent=1, summarise=summarise)).get()
        assert st.load("chat") == parent_rows
        assert s.events().get() == parent_rows
        assert contents(s) == [text for _, text in SEED]
        b.stop()
        s.stop()


def test_fork_into_an_id_that_has_events_is_a_conflict(store: Store | None) -> None:
    """fork(n, existing_id) raises ConflictError and writes nothing."""
    st = MemoryStore() if store is None else store
    s = start("chat", st)
    fill(s)
    other = start("taken", st)
    other.append("user_message", {"content": "mine"}, T0).get()
    other.stop()
    with pytest.raises(ConflictError, match="already has events; fork into a new session id"):
        s.fork(3, "taken").get()
    assert [e.data["content"] for e in st.load("taken")] == ["mine"]
    s.stop()


def test_fork_into_its_own_id_is_refused(sqlite_path: Path) -> None:
    """fork(n, own_id) fails with ValueError saying to use a new id."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        with pytest.raises(ValueError, match="new session id"):
            s.fork(3, "chat").get()
        assert s.count().get() == 7
        s.stop()


def test_fork_into_a_live_empty_session_is_a_conflict() -> None:
    """Forking into an id that another live session holds raises ConflictError."""
    st = MemoryStore()
    s = start("chat", st)
    fill(s)
    live = start("taken", st)
    try:
        with pytest.raises(ConflictError):
            s.fork(3, "taken").get()
        assert live.append("user_message", {"content": "mine"}, T0).get().seq == 0
    finally:
        live.stop()
        s.stop()


def test_fork_and_as_of_see_every_acknowledged_append(sqlite_path: Path) -> None:
    """Right after the last of many pipelined appends is acknowledged, fork and as_of hold it."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        futures = [s.append("user_message", {"content": f"m{i}"}, T0) for i in range(200)]
        assert futures[-1].get().seq == 199
        fork = s.fork(199, "chat-b")
        past = s.as_of(199)
        assert fork.get().count() == 201
        assert past.get().count() == 200
        s.stop()


def test_fork_into_an_empty_id_is_refused(sqlite_path: Path) -> None:
    """fork(n, "") raises ValueError, as Session.start does, and writes nothing."""
    with SQLiteStore(sqlite_path) as st:
        s = start("chat", st)
        fill(s)
        try:
            with pytest.raises(
                ValueError, match=r"new_id .* is not a valid session id: it is empty"
            ):
                s.fork(3, "").get()
            assert st.sessions() == ["chat"]
        finally:
            s.stop()
