"""How a SQLite store's write puts its rows in: each session's rows made apart (a
value that cannot be stored refuses its own session, never the others), many
rows a statement, and, only when a row is refused, session by session under
savepoints.

Durability is the write transaction's (`SQLiteStore._transaction`); these
run inside it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from nous_actor.core._frozen import describe_error
from nous_actor.core.codec import encode_data, format_time
from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import CallRecords
from nous_actor.store.sqlite.connection import UNBINDABLE as _UNBINDABLE
from nous_actor.store.sqlite.schema import CALL_EVENTS, CALLS, STILL_OURS

_INSERT = "INSERT INTO event_rows (session, seq, type, time, data) VALUES (?, ?, ?, ?, ?)"

_ROWS_PER_INSERT: Final = 200
"""Rows per multi-row INSERT (5 parameters each, far below SQLite's limit): event rows
and call records alike."""

_IDS_PER_STATEMENT: Final = 500
"""Session ids per statement that numbers them (one parameter each)."""

_made: dict[tuple[str, int], str] = {}
"""`insert_rows`'s statements, by head and number of rows (each made once)."""

_SEQ_END: Final = 2**63
"""Seqs are below this: SQLite's integers are 64-bit."""


def _unstorable(sid: str, exc: BaseException) -> StoreError:
    return StoreError(
        f"an event of this session cannot be stored ({describe_error(exc)}), so none of "
        "this write's events of it were; the other sessions' events were: refuse such "
        "a value before appending it, and restart the session (it reloads from the store)",
        session_id=sid,
    )


_iso: Final = datetime.isoformat
_MICRO: Final = "microseconds"  # format_time's form, called without its frame


def _session_rows(
    sid: str, events: Sequence[Event], refused: dict[str, StoreError]
) -> list[tuple[Any, ...]] | None:
    """The rows of one session's events, or ``None`` with the session put into
    ``refused`` when one of them cannot be made (a seq past 64 bits, data the
    codec cannot encode, a time without a text form)."""
    try:
        # The type as it is: an EventType is a str, bound as its text.
        rows = [
            (sid, ev.seq, ev.type, _iso(ev.time, timespec=_MICRO), encode_data(ev))
            for ev in events
        ]
        for row in rows:
            seq = row[1]
            if not 0 <= seq < _SEQ_END:
                raise OverflowError(f"seq {seq} is not below 2**63, the largest a store keeps")
            if type(row[3]) is not str or type(row[4]) is not str:
                raise TypeError("an event's time or data did not encode to text")
        for ev in events:
            if type(ev.time) is not datetime:  # a subclass's text is checked, not trusted
                back = datetime.fromisoformat(format_time(ev.time))
                if back.tzinfo is None or back != ev.time:
                    raise ValueError(f"the time's text form {format_time(ev.time)!r} is not it")
    except Exception as exc:
        refused[sid] = _unstorable(sid, exc)
        return None
    return rows


def session_numbers(
    conn: sqlite3.Connection, session_ids: Sequence[str], known: Mapping[str, int]
) -> dict[str, int]:
    """Each of ``session_ids``'s number (the ``sessions`` table), inside a write
    transaction: from ``known`` (numbers this store has seen committed: a number never
    changes), else read, the sessions never written before numbered first (in this
    transaction: remember the numbers only once it has committed)."""
    numbers: dict[str, int] = {}
    missing: list[str] = []
    for sid in session_ids:
        number = known.get(sid)
        if number is None:
            missing.append(sid)
        else:
            numbers[sid] = number
    for i in range(0, len(missing), _IDS_PER_STATEMENT):
        chunk = missing[i : i + _IDS_PER_STATEMENT]
        conn.execute(
            "INSERT OR IGNORE INTO sessions (session_id) VALUES " + ",".join(["(?)"] * len(chunk)),
            chunk,
        )
        numbers.update(
            conn.execute(
                "SELECT session_id, id FROM sessions WHERE session_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
        )
    return numbers


def insert_batches(
    conn: sqlite3.Connection,
    batches: list[tuple[str, list[tuple[Any, ...]]]],
    refused: dict[str, StoreError],
    numbers: Mapping[str, int],
) -> None:
    """Store every session's rows, in one statement per `_ROWS_PER_INSERT` rows; only
    when a row is refused (a conflict, a value SQLite cannot bind), session by session
    (`_write_each`), so that it refuses its own session alone.

    Rows that fit one statement need no savepoint: SQLite undoes a statement that fails
    as a whole, and a value that cannot be bound fails before it runs. (Each statement
    hands the GIL back and waits to take it again, all of it while this process holds
    the file's write lock.)"""
    rows = [  # each row under its session's number (looked up once a session)
        (number, *row[1:])
        for sid, session_rows in batches
        for number in (numbers[sid],)
        for row in session_rows
    ]
    one = len(rows) <= _ROWS_PER_INSERT
    if not one:
        conn.execute("SAVEPOINT batch_write")
    try:
        insert_rows(conn, _EVENT_ROWS, rows)
    except (sqlite3.IntegrityError, *_UNBINDABLE):
        if not one:
            conn.execute("ROLLBACK TO batch_write")
        _write_each(conn, batches, refused, numbers)
    if not one:
        conn.execute("RELEASE batch_write")


_EVENT_ROWS: Final = "INSERT INTO event_rows (session, seq, type, time, data)"
_CALL_EVENTS: Final = (
    "INSERT INTO call_events (session, seq, type, time, data, at, call, first, last)"
)
_NO_RECORD: Final = (None, None, None, None)

_checked: dict[tuple[int, bool], str] = {}


def rows_at_once(
    batches: list[tuple[str, list[tuple[Any, ...]]]],
    numbers: Mapping[str, int],
    calls: CallRecords | None = None,
    now: int = 0,
) -> tuple[str, list[Any], int] | None:
    """The one statement that writes every row of ``batches`` when it can be its own
    transaction (`_Connection.write_at_once`): ``(sql, params, changes)``, ``changes``
    being the rows it makes (events, and records of forwarded ``calls`` made at Unix time
    ``now``); ``None`` when a transaction must write them (a session not yet numbered,
    more rows than one statement takes). The statement inserts them only if the file is
    still ours (`STILL_OURS`).

    With ``calls``, the rows go into the ``call_events`` view (`CALL_EVENTS`), the first
    event of each call carrying its record, which the view's trigger puts into ``calls``.
    """
    calls = calls or None  # (no records: the plain statement)
    rows = sum(len(session_rows) for _, session_rows in batches)
    if rows > _ROWS_PER_INSERT or any(sid not in numbers for sid, _ in batches):
        return None  # (decided before any row is copied)
    params: list[Any] = []
    changes = rows
    for sid, session_rows in batches:
        number = numbers[sid]
        if calls is None:
            for row in session_rows:
                params += (number, *row[1:])
            continue
        # Each call's record, by its first seq (a session's calls append apart: no two
        # begin at one seq).
        records = {first: (now, call, first, last) for call, first, last in calls.get(sid, ())}
        changes += len(records)
        for row in session_rows:
            record = records.pop(row[1], _NO_RECORD)
            params += (number, *row[1:], *record)
        if records:
            return None  # a record of no event here: the transaction's way records it
    key = rows, calls is not None
    sql = _checked.get(key)
    if sql is None:
        head, width = (_EVENT_ROWS, 5) if calls is None else (_CALL_EVENTS, 9)
        sql = _checked[key] = f"{head} SELECT * FROM ({_values(rows, width)}) WHERE {STILL_OURS}"
    return sql, params, changes


def _values(rows: int, width: int = 5) -> str:
    """``VALUES`` with ``rows`` rows of ``width`` parameters each."""
    row = "(" + ", ".join(["?"] * width) + ")"
    return "VALUES " + ",".join([row] * rows)


def insert_rows(conn: sqlite3.Connection, head: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``head`` with ``rows`` (of 5 values each) as its values: one statement per
    `_ROWS_PER_INSERT` rows, its text made once per head and number of rows.

    The sqlite3 module hands the GIL back at every step of a statement; with many
    session threads waiting for it, n rows by ``executemany`` pay n hand-offs, this
    about n / 200."""
    for i in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[i : i + _ROWS_PER_INSERT]
        key = head, len(chunk)
        sql = _made.get(key)
        if sql is None:
            sql = _made[key] = f"{head} {_values(len(chunk))}"
        conn.execute(sql, [v for row in chunk for v in row])


def _write_each(
    conn: sqlite3.Connection,
    batches: list[tuple[str, list[tuple[Any, ...]]]],
    refused: dict[str, StoreError],
    numbers: Mapping[str, int],
) -> None:
    """Store each session's rows under a savepoint of its own, refusing the
    sessions whose seqs are already stored (`ConflictError`) or whose rows
    SQLite cannot take (`StoreError`)."""
    for sid, rows in batches:
        conn.execute("SAVEPOINT session_write")
        try:
            number = numbers[sid]
            conn.executemany(_INSERT, [(number, *row[1:]) for row in rows])
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO session_write")
            refused[sid] = ConflictError(
                "a seq in this write is already stored (a second writer?); "
                "reopen the session to continue from the store",
                session_id=sid,
            )
        except _UNBINDABLE as exc:
            conn.execute("ROLLBACK TO session_write")
            refused[sid] = _unstorable(sid, exc)
        conn.execute("RELEASE session_write")


def record_calls(
    conn: sqlite3.Connection,
    calls: CallRecords,
    numbers: Mapping[str, int],
    refused: Mapping[str, StoreError],
    now: int,
    forget_before: int | None,
) -> None:
    """Record the forwarded ``calls`` of the sessions written (not ``refused``), at Unix
    time ``now``, in the write's transaction (the table made first, on the first
    record); with ``forget_before``, forget the records older than it (a range of the
    table's key: what expired, and nothing else, is read)."""
    rows = [
        (now, numbers[sid], call, first, last)
        for sid, made in calls.items()
        if sid in numbers and sid not in refused
        for call, first, last in made
    ]
    if not rows:
        return
    try:
        _insert_calls(conn, rows)
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        for statement in CALLS:  # the file's first forwarded call (see CALLS_TABLE)
            conn.execute(statement)
        _insert_calls(conn, rows)
    if forget_before is not None:
        conn.execute("DELETE FROM calls WHERE at < ?", (forget_before,))
        # (and the view of one-statement writes, made if a file's calls table came first)
        for statement in CALL_EVENTS:
            conn.execute(statement)


def _insert_calls(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert (or replace) call records, many a statement."""
    insert_rows(conn, "INSERT OR REPLACE INTO calls (at, session, call, first, last)", rows)
