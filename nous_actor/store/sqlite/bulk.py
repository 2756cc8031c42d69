"""Reading one session's rows in a few steps of SQLite, not one step a row.

Python's `sqlite3` lets go of the GIL around every step of a statement, that is
for every row a read answers, and takes it back afterwards. In a process where
another thread keeps the GIL busy (an asyncio web worker's loop under load, a
thread per session), taking it back waits for that thread's switch interval
(5 ms): reading a 1,000-event session took ~190 ms there, 1.7 ms alone.
`session_rows` reads a session's rows a range of `CHUNK` seqs at a time, each
range one row of one statement, in which SQLite joins each column of the range's
rows into one text (``group_concat``, without the GIL), split here: the GIL is
let go and taken back once a range. (Alone, a read of 1,000 rows costs about a
sixth more so, 0.70 ms against 0.61; beside a busy thread it is more than ten
times faster.)

The rows it answers are the ones ``SELECT seq, type, time, data FROM events
WHERE session_id = ? AND seq >= ? ORDER BY seq`` answers, with the store's
types (an integer seq, text elsewhere). A chunk is split only when every column
comes out as that many values and the seqs as integers in increasing order: the
separator, ASCII's unit separator, is a control character, which stored JSON
escapes, so a value that holds one is no value the store wrote, and the rest of
the session is then read row by row, as before, for the decoder to say what is
wrong with it. (A value another program stored with another type than the
store's is read as SQLite renders it as text: a BLOB as the text of its bytes, a
seq stored as text that spells an integer as that integer; a text value that is
not UTF-8, which ``sqlite3`` cannot fetch, as its bytes: see `query_on`.)
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, Final

__all__ = ["CHUNK", "Query", "query_on", "session_rows"]

CHUNK: Final = 2048
"""Seqs a step reads (at most as many rows): about 1 MB of text for events of 500 bytes."""

Query = Callable[[str, Sequence[Any]], list[Any]]
"""Runs one statement and answers its rows (``conn.execute(sql, params).fetchall()``)."""


def query_on(conn: sqlite3.Connection) -> Query:
    """``conn``'s reads as `session_rows` makes them (and the store's other reads of
    stored rows): a read that meets a text value that is not UTF-8 (stored by another
    program: ``sqlite3`` fails the whole statement as it fetches the row) is made again
    with that value answered as its bytes, for the codec to refuse as a malformed row
    of its session alone (see `_lenient`). A read that meets none costs nothing more."""

    def query(sql: str, params: Sequence[Any]) -> list[Any]:
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if _UNDECODABLE not in str(exc):
                raise
        return _lenient(conn, sql, params)

    return query


_UNDECODABLE: Final = "Could not decode to UTF-8"
"""How ``sqlite3`` says a text value it fetched is not UTF-8 (an `OperationalError`)."""


def _lenient(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of one read on ``conn``, each text value that is not UTF-8 answered as
    its bytes (as a BLOB is), the others as text. Made only once a plain read failed
    so: a text factory of Python's is one call a value, where ``sqlite3`` decodes in C.
    ``conn`` must be one nobody else uses meanwhile (its factory is set for the read)."""
    factory = conn.text_factory
    conn.text_factory = _text_or_bytes
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.text_factory = factory


def _text_or_bytes(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


_US: Final = "\x1f"

_RANGE: Final = (
    "SELECT count(*), group_concat(seq, char(31)), group_concat(type, char(31)), "
    "group_concat(time, char(31)), group_concat(data, char(31)), "
    "(SELECT max(seq) FROM events WHERE session_id = ?) "
    "FROM events WHERE session_id = ? AND seq BETWEEN ? AND ?"
)
"""The rows of a range of seqs: how many, and each column's values joined, in seq order
(the primary key's); and the session's last stored seq (an index lookup). Its parameters
are plain ``?`` (the session's id given twice): Python 3.12.1's `sqlite3` takes a
numbered ``?1`` for a named one, warns when it is given a sequence (an error under
``-W error``), and says 3.14 will refuse it."""

_NEXT: Final = "SELECT min(seq) FROM events WHERE session_id = ? AND seq > ?"
"""The first stored seq after a seq (past a gap that a snapshot left)."""

_ROWS: Final = (
    "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq LIMIT ?"
)
"""The same rows, one step each (a session whose rows cannot be joined)."""

_LAST_SEQ: Final = 2**63 - 1

_FROM_ZERO: Final = 2048
_ZERO: Final = _US.join(map(str, range(_FROM_ZERO)))
"""The seqs ``0 .. _FROM_ZERO - 1`` joined: the first range of a session read whole is
checked against it in one comparison, where parsing its seqs took 0.1 ms a thousand."""
_ZERO_ENDS: Final = (0, *accumulate(len(str(n)) + (n > 0) for n in range(_FROM_ZERO)))
"""``len(_US.join(map(str, range(k))))`` for each ``k``."""


def session_rows(
    query: Query,
    session_id: str,
    from_seq: int = 0,
    limit: int | None = None,
    *,
    isolated: bool = False,
) -> list[tuple[Any, ...]]:
    """The rows ``(seq, type, time, data)`` of ``session_id`` with ``seq >= from_seq``,
    in seq order (at most ``limit`` of them), read a range of `CHUNK` seqs a step (see
    the module), and a step more after each gap a snapshot left.

    The ranges end at the last seq stored when the first was read: a read made while
    the session's holder appends answers the rows up to then. Rows are never changed in
    place, but a snapshot drops rows (those a replace shadows) and a delete drops a
    session: a read by a process that does not hold the session (``isolated``) that
    needs more than one range reads them all again inside one read transaction (a
    savepoint: SQLite's snapshot of the file at its first read), so that it answers the
    rows as they were at one moment, never a range from before such a drop beside one
    from after it. (A read of one range is one statement: one moment already. The
    holder's own reads need none: nobody else drops its rows while it holds them.)
    ``query`` must run on one connection that nobody else uses meanwhile.

    Raises whatever ``query`` raises (`sqlite3.Error`)."""
    first = _rows(query, session_id, from_seq, limit, whole=not isolated)
    if first is not None:
        return first
    # More than one range, isolated: all of them again, from one snapshot of the file.
    query(f"SAVEPOINT {_SNAPSHOT}", ())
    try:
        rows = _rows(query, session_id, from_seq, limit, whole=True)
    except BaseException:
        with contextlib.suppress(Exception):
            query(f"ROLLBACK TO {_SNAPSHOT}", ())
            query(f"RELEASE {_SNAPSHOT}", ())
        raise
    query(f"RELEASE {_SNAPSHOT}", ())
    assert rows is not None  # (whole: never stops after a range)
    return rows


_SNAPSHOT: Final = "nous_actor_read"
"""The savepoint an isolated read of several ranges is made in."""


def _rows(
    query: Query, session_id: str, from_seq: int, limit: int | None, *, whole: bool
) -> list[tuple[Any, ...]] | None:
    """`session_rows`' ranges; ``None`` (unless ``whole``) where rows of a second
    statement would join those of a first: the read is to be made again from one
    snapshot."""
    left = -1 if limit is None else limit
    out: list[tuple[Any, ...]] = []
    start = min(from_seq, _LAST_SEQ)
    top: int | None = None
    while left:
        if out and not whole:  # (so every read below adds to rows of its own statement)
            return None
        end = min(_LAST_SEQ, start + (CHUNK if left < 0 else min(CHUNK, left)) - 1)
        if top is not None:
            end = min(end, top)
        ((count, seqs, types, times, datas, last),) = query(
            _RANGE, (session_id, session_id, start, end)
        )
        if top is None:
            if last is None:  # no rows
                return out
            if type(last) is not int:  # not a seq the store wrote
                return query(_ROWS, (session_id, start, left))
            top = last
        if count:
            rows = _split(seqs, types, times, datas, count, start)
            if rows is None:  # not rows the store wrote: the rest, row by row
                return out + query(_ROWS, (session_id, start, left))
            out += rows
            if left > 0:
                left -= count
        if end >= top:
            break
        start = end + 1
        if not count:  # a gap: on to the next stored seq
            ((start,),) = query(_NEXT, (session_id, end))
            if type(start) is not int:
                return out if start is None else out + query(_ROWS, (session_id, end + 1, left))
    return out


def _split(
    seqs: Any, types: Any, times: Any, datas: Any, count: int, start: int
) -> list[tuple[Any, ...]] | None:
    """The ``count`` rows whose columns are joined (from seq ``start`` on); ``None``
    unless each column splits into ``count`` values, the seqs integers in increasing
    order."""
    if not (type(seqs) is type(types) is type(times) is type(datas) is str):
        return None
    kinds, stamps, values = types.split(_US), times.split(_US), datas.split(_US)
    if not len(kinds) == len(stamps) == len(values) == count:
        return None
    numbers: list[int]
    if (
        start == 0
        and count <= _FROM_ZERO
        and len(seqs) == _ZERO_ENDS[count]
        and _ZERO.startswith(seqs)
    ):  # the seqs 0 .. count - 1, exactly
        numbers = list(range(count))
    else:
        seq_texts = seqs.split(_US)
        if len(seq_texts) != count:
            return None
        try:
            numbers = list(map(int, seq_texts))
        except ValueError:  # not an integer SQLite wrote
            return None
        if numbers != sorted(numbers):
            return None
    return list(zip(numbers, kinds, stamps, values, strict=True))
