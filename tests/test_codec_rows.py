"""Stored rows read in one pass mean what they mean read one by one.

`events_from_rows` decodes a whole read in one loop, and `surface_from_rows` goes from
a reader's rows straight to the visible messages without building an event per row.
Both are fast paths of the plain ones: every row is checked as `event_from_row` checks
it, and these tests hold them to the plain paths' events, messages and errors, on
well-formed rows and on rows with one column broken.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from frozen_alike import frozen_alike
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import (
    Event,
    InvalidEvent,
    Log,
    Message,
    SessionReader,
    SQLiteStore,
    StoreError,
)
from nous_actor.core import codec
from nous_actor.core.codec import CodecError
from nous_actor.testing.strategies import logs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_TIME = codec.format_time(T0)

Row = tuple[Any, Any, Any, Any]


def _rows(log: Log) -> list[Row]:
    """The log's events as a store keeps them: ``(seq, type, time, data)`` columns."""
    return [
        (ev.seq, ev.type.value, codec.format_time(ev.time), codec.encode_data(ev))
        for ev in log.events()
    ]


_BROKEN: dict[str, list[Any]] = {
    "seq": [-1, True, "3", 3.0, None, "same as the row before"],
    "type": ["nope", None, 5, "User_message"],
    "time": [
        "yesterday",
        "2026-01-01T00:00:00",
        "2026-01-01T02:00:00.000000+02:00",
        17,
        None,
    ],
    "data": [
        "[1]",
        "{",
        "",
        '{"a": 1} x',
        '{"a": 1e999}',
        '{"a": NaN}',
        '{"a": ' + "9" * 30 + "}",
        '{"a": "\\ud800"}',
        '{"content": "a", "content": ["b", {"c": []}]}',
        '{"content": "a", "source": {"x": [1, {}]}, "name": "n"}',
        '{"content": "a", "x": 1e999}',
        '{"content": "a", "x": ' + "9" * 30 + "}",
        '{"content": ' + "9" * 5000 + "}",
        '{"content": 5, "tool_calls": "x", "metadata": [1], "name": 2.5}',
        '{"content": null, "tool_calls": [], "metadata": {}, "reasoning_content": "r"}',
        b'{"content": "bytes"}',
        '{"surface_op": "append"}',
        '{"surface_op": null, "content": "x"}',
        '{"surface_op": ["replace", 2, 1]}',
        '{"surface_op": ["replace", 0, 3], "content": "s"}',
        '{"surface_op": ["replace", -1, 3]}',
        '{"surface_op": ["replace", 0, "3"]}',
        '{"surface_op": 5}',
        '{"surface_op": ["append"]}',
        7,
        None,
    ],
}
_COLUMN = {"seq": 0, "type": 1, "time": 2, "data": 3}


@st.composite
def _broken_rows(draw: st.DrawFn) -> list[Row]:
    """A log's rows with one column of one row replaced by something odd: malformed
    (a refusal), or well-formed in a less common spelling (an offset, bytes, a big int,
    ``"append"``)."""
    rows = _rows(draw(logs(max_ops=12, max_pos=12)))
    if not rows:
        rows = [(0, "user_message", _TIME, '{"content": "a"}')]
    i = draw(st.integers(0, len(rows) - 1))
    column = draw(st.sampled_from(sorted(_BROKEN)))
    value = draw(st.sampled_from(_BROKEN[column]))
    if value == "same as the row before":
        value = rows[i - 1][0] if i else 0
    row = list(rows[i])
    row[_COLUMN[column]] = value
    rows[i] = (row[0], row[1], row[2], row[3])
    return rows


def _outcome(read: Callable[[], Any]) -> Any:
    """What ``read`` gives, or the error it raises, as comparable values."""
    try:
        return "read", read()
    except (CodecError, InvalidEvent) as exc:
        return type(exc), str(exc), getattr(exc, "field", None), getattr(exc, "reason", None)


def _messages_alike(got: list[Message], want: list[Message]) -> bool:
    fields = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")
    return len(got) == len(want) and all(
        frozen_alike(getattr(g, f), getattr(w, f))
        for g, w in zip(got, want, strict=True)
        for f in (*fields, "metadata", "created_at")
    )


def _plain_surface(rows: list[Row]) -> tuple[list[int], list[Message]]:
    """The plain path: an event per row, restored into a `Log`, derived."""
    pairs = Log.restore([codec.passing_event_from_row(*r) for r in rows]).derive_indexed()
    return [s for s, _ in pairs], [m for _, m in pairs]


def _events_alike(got: list[Event], want: list[Event], passing: bool) -> None:
    """The same events, holding their data the same way, read to be dropped alike (what
    a passing event decodes is left to the collector); no event is ever tracked."""
    assert [type(e._data) for e in got] == [type(e._data) for e in want]
    assert all(e._passing is passing and not gc.is_tracked(e) for e in got)
    assert got == want
    assert all(frozen_alike(g.data, w.data) for g, w in zip(got, want, strict=True))
    assert [e.surface_op for e in got] == [e.surface_op for e in want]


# -- events_from_rows -------------------------------------------------------------------------


@settings(max_examples=150)
@given(logs(max_ops=30))
def test_rows_read_in_one_pass_are_the_events_read_one_by_one(log: Log) -> None:
    """events_from_rows (and its passing twin) give event_from_row's events for each row."""
    rows = _rows(log)
    _events_alike(codec.events_from_rows(rows), [codec.event_from_row(*r) for r in rows], False)
    _events_alike(
        codec.passing_events_from_rows(rows),
        [codec.passing_event_from_row(*r) for r in rows],
        True,
    )
    assert codec.events_from_rows(iter(rows)) == log.events()  # any iterable of rows


@settings(max_examples=300)
@given(_broken_rows())
def test_a_broken_row_read_in_one_pass_fails_or_reads_as_it_does_alone(rows: list[Row]) -> None:
    """With one odd column, events_from_rows reads what event_from_row reads, or raises
    the same CodecError (same message, same field) for the same row."""
    got = _outcome(lambda: codec.events_from_rows(rows))
    want = _outcome(lambda: [codec.event_from_row(*r) for r in rows])
    assert got[0] == want[0]
    if got[0] == "read":
        _events_alike(got[1], want[1], False)
    else:
        assert got == want


# -- surface_from_rows ------------------------------------------------------------------------


@settings(max_examples=200)
@given(logs(max_ops=40))
def test_the_surface_read_from_rows_is_the_folded_logs(log: Log) -> None:
    """Straight from well-formed rows (replaces, gaps and all), with no event built:
    the seqs and messages of the log's derive_indexed, frozen alike."""
    rows = _rows(log)
    fast = codec._fast_surface(rows)
    assert fast is not None  # well-formed rows all take the fast path
    seqs, messages = fast
    want = log.derive_indexed()
    assert seqs == [s for s, _ in want]
    assert _messages_alike(messages, [m for _, m in want])
    assert all(gc.is_tracked(m) for m in messages)  # read to be dropped, as a passing event's
    assert codec.surface_from_rows(rows) == (seqs, messages)


@settings(max_examples=300)
@given(_broken_rows())
def test_a_broken_row_gives_the_surface_or_the_error_of_the_plain_read(rows: list[Row]) -> None:
    """With one odd column, the surface read from rows is the plain path's (events,
    restore, derive), or the same error: a malformed row is never handed out as data."""
    got = _outcome(lambda: codec.surface_from_rows(rows))
    want = _outcome(lambda: _plain_surface(rows))
    assert got[0] == want[0]
    if got[0] == "read":
        assert got[1][0] == want[1][0]
        assert _messages_alike(got[1][1], want[1][1])
    else:
        assert got == want


@pytest.mark.parametrize("etype", ["assistant_message", "turn_end"])
@pytest.mark.parametrize(
    ("column", "value"), [(c, v) for c, vs in sorted(_BROKEN.items()) for v in vs]
)
def test_each_odd_column_gives_what_the_plain_read_gives(
    etype: str, column: str, value: Any
) -> None:
    """Every odd value of every column, in the second of three rows of a surface or a
    bookkeeping type: the same surface, or the same error, as the plain path."""
    rows: list[Row] = [
        (0, "user_message", _TIME, '{"content": "a"}'),
        (1, etype, _TIME, '{"content": "b", "metadata": {"k": [1]}}'),
        (2, "user_message", _TIME, '{"content": "c"}'),
    ]
    row = list(rows[1])
    row[_COLUMN[column]] = 0 if value == "same as the row before" else value
    rows[1] = (row[0], row[1], row[2], row[3])
    surface, plain_surface = (
        _outcome(lambda: codec.surface_from_rows(rows)),
        _outcome(lambda: _plain_surface(rows)),
    )
    assert surface[0] == plain_surface[0]
    if surface[0] == "read":
        assert surface[1][0] == plain_surface[1][0]
        assert _messages_alike(surface[1][1], plain_surface[1][1])
    else:
        assert surface == plain_surface
    events = _outcome(lambda: codec.events_from_rows(rows))
    plain_events = _outcome(lambda: [codec.event_from_row(*r) for r in rows])
    assert events[0] == plain_events[0]
    if events[0] == "read":
        _events_alike(events[1], plain_events[1], False)
    else:
        assert events == plain_events


def test_rows_with_keys_beyond_a_messages_take_the_fast_path_too() -> None:
    """Data with other keys than a message's (read whole, then its fields taken), and
    bookkeeping rows of any keys, are read without building an event."""
    rows: list[Row] = [
        (0, "turn_start", _TIME, '{"turn": 1, "model": {"name": "m"}}'),
        (1, "user_message", _TIME, '{"content": "a", "source": "web", "metadata": {"k": 1}}'),
        (2, "assistant_message", _TIME, '{"content": "b"}'),
    ]
    fast = codec._fast_surface(rows)
    assert fast is not None
    assert fast == _plain_surface(rows)
    assert fast[1][0].metadata == {"k": 1}


def test_seqs_that_do_not_increase_are_refused_as_a_restore_refuses_them() -> None:
    """Rows out of seq order are seq_behind_head, as Log.restore says."""
    rows = [(1, "user_message", _TIME, "{}"), (1, "user_message", _TIME, "{}")]
    with pytest.raises(InvalidEvent) as info:
        codec.surface_from_rows(rows)
    assert info.value.reason == "seq_behind_head"


def test_only_the_visible_rows_become_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary that shadows 500 rows: 2 messages' fields are frozen, no event is built."""
    made: list[int] = []
    frozen_fields = codec._frozen_fields

    def counted(*args: Any) -> Any:
        made.append(1)
        return frozen_fields(*args)

    def no_events(rows: Any) -> Any:
        raise AssertionError("the fast path built events")

    monkeypatch.setattr(codec, "_frozen_fields", counted)
    monkeypatch.setattr(codec, "passing_events_from_rows", no_events)
    log = Log()
    for i in range(500):
        log = log.append("user_message", {"content": f"m{i}", "metadata": {"i": i}}, T0)
    log = log.append("system_message", {"content": "sum", "surface_op": ["replace", 0, 499]}, T0)
    log = log.append("user_message", {"content": "next", "name": "ann"}, T0)
    seqs, messages = codec.surface_from_rows(_rows(log))
    assert seqs == [500, 501]
    assert [m.content for m in messages] == ["sum", "next"]
    assert len(made) == 1  # "sum" is text alone: nothing to freeze


# -- the store and the reader -----------------------------------------------------------------


def test_a_reader_on_sqlite_reads_the_surface_of_the_rows(tmp_path: Path) -> None:
    """SessionReader's derive on SQLite (rows straight to messages) equals the log's."""
    store = SQLiteStore(tmp_path / "r.db")
    log = Log.seed([Message.user("a"), Message.assistant("b", tool_calls=[{"id": "1"}])])
    log = log.append("tool_result", {"content": [{"type": "text"}], "tool_call_id": "1"}, T0)
    log = log.append("system_message", {"content": "s", "surface_op": ["replace", 0, 1]}, T0)
    store.write({"chat": log.events()})
    reader = SessionReader("chat", store)
    assert reader.derive_messages().get() == log.derive_messages()
    assert reader.derive_indexed().get() == log.derive_indexed()
    store.close()


def test_a_subclass_that_changes_load_since_alone_is_read_through_it(tmp_path: Path) -> None:
    """The rows-to-messages read stands in for ``load_since`` only where the store's class
    defines it as far down as ``load_since``: a subclass that changes ``load_since``
    alone (here: it hides the last event) has its readers read through that."""

    class Hiding(SQLiteStore):
        def load_since(self, session_id: str, from_seq: int) -> list[Event]:
            return super().load_since(session_id, from_seq)[:-1]

    class HidingToo(Hiding):
        def load_surface(self, session_id: str) -> tuple[list[int], list[Message]]:
            seqs, messages = SQLiteStore.load_surface(self, session_id)
            return seqs[:-1], messages[:-1]

    log = Log.seed([Message.user("a"), Message.assistant("b"), Message.user("c")])
    for cls in (Hiding, HidingToo):
        store = cls(tmp_path / f"{cls.__name__}.db")
        store.write({"chat": log.events()})
        got = SessionReader("chat", store).derive_messages().get()
        assert [m.content for m in got] == ["a", "b"]
        store.close()
    plain = SQLiteStore(tmp_path / "Hiding.db")
    assert [m.content for m in SessionReader("chat", plain).derive_messages().get()] == [
        "a",
        "b",
        "c",
    ]
    plain.close()


def test_a_reader_on_sqlite_is_refused_a_malformed_row(tmp_path: Path) -> None:
    """A malformed stored row fails the read (StoreError naming it), never returns data."""
    store = SQLiteStore(tmp_path / "r.db")
    store.write({"chat": Log().append("user_message", {"content": "a"}, T0).events()})
    with store._connection.locked(None, "break a row") as conn:
        conn.execute("UPDATE events SET data = '{\"a\": 1e999}' WHERE session_id = 'chat'")
    with pytest.raises(StoreError, match=r"stored event is malformed.*overflows"):
        SessionReader("chat", store).derive_messages().get()
    store.close()


def test_a_reader_on_postgres_reads_the_surface_of_the_rows(pg_stores: Any) -> None:
    """On PostgreSQL too (times come back as UTC text, on the fast path): the reader's
    derive equals the log's, and a malformed row is a StoreError."""
    pytest.importorskip("psycopg")
    store = pg_stores()
    log = Log.seed([Message.user("a"), Message.assistant("b", tool_calls=[{"id": "1"}])])
    log = log.append("system_message", {"content": "s", "surface_op": ["replace", 0, 0]}, T0)
    store.write({"chat": log.events(), "bad": [Event(0, "user_message", T0, {"content": "x"})]})
    reader = SessionReader("chat", store)
    with pytest.MonkeyPatch.context() as patch:  # the fast path builds no event
        patch.setattr(codec, "passing_events_from_rows", None)
        assert reader.derive_messages().get() == log.derive_messages()
        assert reader.derive_indexed().get() == log.derive_indexed()
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".events SET data = '[1]' WHERE session_id = 'bad'"
    )
    with pytest.raises(StoreError, match="stored event is malformed"):
        SessionReader("bad", store).derive_messages().get()


def test_loading_one_session_or_several_reads_the_same_events(tmp_path: Path) -> None:
    """load_many of one id (its rows alone) and of several (one read, a run each) give
    load's events; a malformed row fails its own session, as a StoreError, alone."""
    store = SQLiteStore(tmp_path / "r.db")
    a = Log().append("user_message", {"content": "a"}, T0).append("turn_start", {"n": 1}, T0)
    b = Log().append("user_message", {"content": "b"}, T0)
    store.write({"a": a.events(), "b": b.events(), "c": b.events()})
    assert store.load_many(["a"]) == {"a": a.events()}
    assert store.load_many(["b", "a", "none"]) == {"a": a.events(), "b": b.events(), "none": []}
    with store._connection.locked(None, "break a row") as conn:
        conn.execute("UPDATE events SET data = '{' WHERE session_id = 'c'")
    (alone,) = store.load_many(["c"]).values()
    assert isinstance(alone, StoreError)
    assert "malformed" in str(alone)
    many = store.load_many(["a", "c"])
    assert isinstance(many["c"], StoreError)
    assert many["a"] == a.events()
    store.close()
