"""Whole-session reads of a SQLite store in a few steps (`store.sqlite.bulk`): the same
rows as the row-by-row read, whatever the rows hold, in a number of steps that does
not grow with the rows (each step lets go of the GIL and waits to take it back)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_actor import Session, SQLiteStore
from nous_actor.store.sqlite import bulk

_EXACT = (
    "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq LIMIT ?"
)

# Values as a store writes them, and as another program might have: the separator
# bulk joins with, its neighbour, other control characters, the empty text.
_text = st.text(alphabet=st.sampled_from(["a", "{", '"', "\x1e", "\x1f", "\x00", "é", " "]))
_row = st.tuples(
    st.integers(0, 60),
    st.sampled_from(["user_message", "assistant_message", "", "\x1f"]) | _text,
    st.sampled_from(["2026-01-01T00:00:00.000000+00:00"]) | _text,
    st.sampled_from(['{"content":"hi"}', "{}"]) | _text,
)


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = tmp_path / "bulk.db"
    SQLiteStore(path).close()  # the store's schema
    c = sqlite3.connect(path, isolation_level=None)
    try:
        yield c
    finally:
        c.close()


def _query(c: sqlite3.Connection, calls: list[int] | None = None) -> bulk.Query:
    def query(sql: str, params: Sequence[Any]) -> list[Any]:
        rows = c.execute(sql, params).fetchall()
        if calls is not None:
            calls.append(len(rows))
        return rows

    return query


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(_row, max_size=40, unique_by=lambda r: r[0]),
    from_seq=st.integers(0, 70),
    limit=st.none() | st.integers(0, 50),
    chunk=st.integers(1, 8),
    other=st.booleans(),
)
def test_the_rows_are_the_ones_a_row_by_row_read_answers(
    conn: sqlite3.Connection,
    monkeypatch: pytest.MonkeyPatch,
    rows: list[tuple[int, str, str, str]],
    from_seq: int,
    limit: int | None,
    chunk: int,
    other: bool,
) -> None:
    """Whatever the session's rows hold (a separator inside a value, gaps between seqs,
    another session's rows beside them), from any seq, up to any limit, in ranges of any
    size: the rows, their values and their types are those of the row-by-row read."""
    monkeypatch.setattr(bulk, "CHUNK", chunk)
    conn.execute("DELETE FROM event_rows")
    conn.executemany(
        "INSERT INTO events (session_id, seq, type, time, data) VALUES ('s', ?, ?, ?, ?)", rows
    )
    if other:
        conn.executemany(
            "INSERT INTO events (session_id, seq, type, time, data) VALUES ('t', ?, ?, ?, ?)",
            [(seq, "user_message", "x", "\x1f") for seq, *_ in rows],
        )
    exact = conn.execute(_EXACT, ("s", from_seq, -1 if limit is None else limit)).fetchall()
    got = bulk.session_rows(_query(conn), "s", from_seq, limit)
    assert got == exact
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in exact]


def test_a_session_is_read_in_a_step_a_chunk_each_answering_one_row(tmp_path: Path) -> None:
    """5,000 events in ranges of 2,048 seqs: three ranges, each one row (one step of
    SQLite); a gap a snapshot left costs a step more, never a step a seq."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        chat = Session.start("chat", store=store)
        try:
            for lo in range(0, 5_000, 500):
                chat.append_many(
                    [("user_message", {"content": f"m{n}"}) for n in range(lo, lo + 500)]
                ).get(timeout=30)
        finally:
            chat.stop()
    c = sqlite3.connect(path)
    try:
        calls: list[int] = []
        rows = bulk.session_rows(_query(c, calls), "chat")
        assert [r[0] for r in rows] == list(range(5_000))
        assert calls == [1, 1, 1]
        # A gap of 100,000 seqs (as a snapshot's drop leaves): one step to cross it.
        c.execute("UPDATE event_rows SET seq = seq + 100000 WHERE seq >= 4000")
        calls.clear()
        rows = bulk.session_rows(_query(c, calls), "chat")
        assert [r[0] for r in rows] == [*range(4_000), *range(104_000, 105_000)]
        assert len(calls) <= 5
        assert set(calls) == {1}
    finally:
        c.close()


@pytest.mark.parametrize(
    "change",
    [
        None,
        "UPDATE event_rows SET data = '{\"a\":\"x' || char(31) || 'y\"}' WHERE seq = 3",
        "UPDATE event_rows SET seq = 5.5 WHERE seq = 5",
        "UPDATE event_rows SET seq = 10 WHERE seq = 9",
        "UPDATE event_rows SET type = 'user' || char(30) || 'message' WHERE seq = 0",
    ],
)
def test_a_session_read_from_its_first_seq_is_read_exactly(
    conn: sqlite3.Connection, change: str | None
) -> None:
    """The first range of a session read whole is checked in one comparison when its
    seqs are 0, 1, 2 ...: rows that are not that (a gap, a seq that is not an integer)
    or that a separator breaks still read as the row-by-row read answers them."""
    conn.executemany(
        "INSERT INTO events (session_id, seq, type, time, data) VALUES ('s', ?, ?, ?, ?)",
        [(n, "user_message", "2026-01-01T00:00:00.000000+00:00", "{}") for n in range(10)],
    )
    if change is not None:
        conn.execute(change)
    exact = conn.execute(_EXACT, ("s", 0, -1)).fetchall()
    got = bulk.session_rows(_query(conn), "s")
    assert got == exact
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in exact]


def test_a_few_sessions_opened_together_are_each_read_in_a_few_steps(tmp_path: Path) -> None:
    """A batch of a few sessions (opens made together in a busy web worker) reads each
    session a range at a time: three sessions of 3,000 events, six statements that answer
    a row each, where one statement answered 9,000 rows, a step each."""
    from datetime import UTC, datetime

    from nous_actor import Event

    t = datetime(2026, 1, 1, tzinfo=UTC)
    with SQLiteStore(tmp_path / "few.db") as store:
        store.write(
            {
                sid: [Event(n, "user_message", t, {"content": f"{sid}{n}"}) for n in range(3_000)]
                for sid in ("a", "b", "c")
            }
        )
        statements: list[str] = []
        conn = store._connection.conn
        conn.set_trace_callback(statements.append)
        try:
            loaded = store.load_many(["a", "b", "c"])
        finally:
            conn.set_trace_callback(None)
    assert {sid: [e.seq for e in evs] for sid, evs in loaded.items()} == {
        sid: list(range(3_000)) for sid in ("a", "b", "c")
    }
    assert loaded["b"][1].data == {"content": "b1"}
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 6
    assert all("group_concat" in s for s in reads)


def test_claims_are_taken_and_given_up_many_a_statement(tmp_path: Path) -> None:
    """A batch of 300 claims writes its rows in two statements, and giving them up takes
    two more, where each row was a statement's step; a claim another process took since
    (another token under the same id) is not given up by the release of the old one."""
    ids = [f"s{n}" for n in range(300)]
    with SQLiteStore(tmp_path / "claims.db") as store:
        with store._connection.lock:
            conn = store._connection.writer()  # (the connection that writes, made now)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            tokens = store.claim_many(ids)
            assert all(isinstance(t, str) for t in tokens)
            claims = [(sid, str(t)) for sid, t in zip(ids, tokens, strict=True)]
            inserts = [s for s in statements if "INSERT" in s.upper() and "writers" in s]
            assert len(inserts) == 2
            # s0's claim passes to another holder (its row now holds another token).
            conn.set_trace_callback(None)
            conn.execute("UPDATE writers SET token = 'theirs', pid = 1 WHERE session_id = 's0'")
            conn.set_trace_callback(statements.append)
            statements.clear()
            store.release_many(claims)
            deletes = [s for s in statements if s.lstrip().upper().startswith("DELETE")]
            assert len(deletes) == 2
        finally:
            conn.set_trace_callback(None)
        left = conn.execute("SELECT session_id, token FROM writers").fetchall()
    assert left == [("s0", "theirs")]


@pytest.mark.parametrize("when", ["after its first range", "after its snapshot began"])
@pytest.mark.parametrize("change", ["a snapshot's drop", "a delete, then new events"])
def test_a_reader_reads_a_session_as_it_was_at_one_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, when: str
) -> None:
    """A process that does not hold a session reads it a range at a time; its holder's
    drop of shadowed rows (or a delete and new events) committed between two of the
    reader's statements never leaves the reader with rows from before it beside rows
    from after it: the read answers the rows as they were at one moment (after the
    change if it came before the read's snapshot began, before it otherwise)."""
    from datetime import UTC, datetime

    from nous_actor import Event
    from nous_actor.store.sqlite import follower

    monkeypatch.setattr(bulk, "CHUNK", 4)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    path = tmp_path / "moment.db"
    with SQLiteStore(path) as reader, SQLiteStore(path) as holder:
        holder.write(
            {"s": [Event(n, "user_message", t, {"content": f"old {n}"}) for n in range(12)]}
        )

        def apply() -> None:
            if change == "a snapshot's drop":
                holder.drop("s", list(range(6)))
            else:
                holder.delete("s")
                new = [Event(n, "user_message", t, {"content": f"new {n}"}) for n in range(10)]
                holder.write({"s": new})

        before = [(e.seq, e.data["content"]) for e in holder.load("s")]
        ranges = 0
        real = follower.query_on

        def query_on(conn: sqlite3.Connection) -> bulk.Query:
            query = real(conn)

            def counted(sql: str, params: Sequence[Any]) -> list[Any]:
                nonlocal ranges
                rows = query(sql, params)
                if sql.startswith("SELECT count(*)"):
                    ranges += 1
                    if ranges == (1 if when == "after its first range" else 2):
                        apply()  # by the holder, on its own connection, committed
                return rows

            return counted

        monkeypatch.setattr(follower, "query_on", query_on)
        got = [(e.seq, e.data["content"]) for e in reader.load_since("s", 0)]
        after = [(e.seq, e.data["content"]) for e in holder.load("s")]
    assert before != after
    assert got == (after if when == "after its first range" else before)
