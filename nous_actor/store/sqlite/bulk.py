"""Reading one session's rows in a few steps of SQLite, not one step a row.

Python's `sqlite3` lets go of the GIL around every step of a statement, that is
for every row a read answers, and takes it back afterwards. In a process where
another thread keeps the GIL busy (an asyncio web worker's loop under load, a
thread per session), taking it back waits for that thread's switch interval
(5 ms): reading a 1,000-event session took ~190 ms there, 1.7 ms alone.
`session_rows` reads a session's rows `CHUNK` at a time, each chunk one row of
one statement, in which SQLite joins each column of the chunk's rows into one
text (``group_concat``, without the GIL), split here: the GIL is let go and
taken back once a chunk. (Alone, a read costs about a third more CPU so; under
load it is 20 times faster.)

The rows it answers are the ones ``SELECT seq, type, time, data FROM events
WHERE session_id = ? AND seq >= ? ORDER BY seq`` answers, with the store's
types (an integer seq, text elsewhere). A chunk is split only when every column
comes out as that many values and the seqs as integers in increasing order: the
separator, ASCII's unit separator, is a control character, which stored JSON
escapes, so a value that holds one is no value the store wrote, and the rest of
the session is then read row by row, as before, for the decoder to say what is
wrong with it. (A value another program stored with another type than the
store's is read as SQLite renders it as text: a BLOB as the text of its bytes, a
seq stored as text that spells an integer as that integer.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = ["CHUNK", "Query", "session_rows"]

CHUNK: Final = 2048
"""Rows joined into one step: about 1 MB of text for events of 500 bytes."""

Query = Callable[[str, Sequence[Any]], list[Any]]
"""Runs one statement and answers its rows (``conn.execute(sql, params).fetchall()``)."""

_US: Final = "\x1f"

_BOUNDS: Final = (
    "SELECT (SELECT min(seq) FROM events WHERE session_id = ?1 AND seq >= ?2), "
    "(SELECT max(seq) FROM events WHERE session_id = ?1)"
)
"""The first stored seq from a seq on, and the last stored seq (each an index lookup)."""

_RANGE: Final = (
    "SELECT count(*), group_concat(seq, char(31)), group_concat(type, char(31)), "
    "group_concat(time, char(31)), group_concat(data, char(31)) "
    "FROM events WHERE session_id = ? AND seq BETWEEN ? AND ?"
)
"""The rows of a range of seqs: how many, and each column's values joined, in seq order
(the primary key's)."""

_NEXT: Final = "SELECT min(seq) FROM events WHERE session_id = ? AND seq > ?"
"""The first stored seq after a seq (past a gap that a snapshot left)."""

_ROWS: Final = (
    "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq LIMIT ?"
)
"""The same rows, one step each (a session whose rows cannot be joined)."""

_LAST_SEQ: Final = 2**63 - 1


def session_rows(
    query: Query, session_id: str, from_seq: int = 0, limit: int | None = None
) -> list[tuple[Any, ...]]:
    """The rows ``(seq, type, time, data)`` of ``session_id`` with ``seq >= from_seq``,
    in seq order (at most ``limit`` of them), read a range of `CHUNK` seqs a step (see
    the module): a step more for the session's bounds, and one after each gap.

    Raises whatever ``query`` raises (`sqlite3.Error`)."""
    left = -1 if limit is None else limit
    if not left:
        return []
    ((start, top),) = query(_BOUNDS, (session_id, min(from_seq, _LAST_SEQ)))
    if start is None:
        return []
    if type(start) is not int or type(top) is not int:  # not seqs the store wrote
        return query(_ROWS, (session_id, from_seq, left))
    out: list[tuple[Any, ...]] = []
    while True:
        end = min(top, start + (CHUNK if left < 0 else min(CHUNK, left)) - 1)
        ((count, *columns),) = query(_RANGE, (session_id, start, end))
        if count:
            rows = _split(columns, count)
            if rows is None:  # not rows the store wrote: the rest, row by row
                return out + query(_ROWS, (session_id, start, left))
            out += rows
            if left > 0:
                left -= count
                if not left:
                    return out
        if end >= top:
            return out
        start = end + 1
        if not count:  # a gap: on to the next stored seq
            ((start,),) = query(_NEXT, (session_id, end))
            if type(start) is not int:
                return out if start is None else out + query(_ROWS, (session_id, end + 1, left))


def _split(columns: list[Any], count: int) -> list[tuple[Any, ...]] | None:
    """The ``count`` rows whose columns are joined in ``columns``; ``None`` unless each
    splits into ``count`` values, the seqs integers in increasing order."""
    if any(type(c) is not str for c in columns):
        return None
    seqs_text, types, times, datas = (c.split(_US) for c in columns)
    if not len(seqs_text) == len(types) == len(times) == len(datas) == count:
        return None
    try:
        seqs = list(map(int, seqs_text))
    except ValueError:  # not an integer SQLite wrote
        return None
    if seqs != sorted(seqs):
        return None
    return list(zip(seqs, types, times, datas, strict=True))
