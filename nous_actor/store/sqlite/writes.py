"""How a SQLite store's write puts its rows in: many rows a statement, and, only
when a seq is already stored, session by session under savepoints.

Durability is the write transaction's (`SQLiteStore._transaction`); these
run inside it.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from nous_actor.errors import ConflictError, StoreError

_INSERT = "INSERT INTO events (session_id, seq, type, time, data) VALUES (?, ?, ?, ?, ?)"

_ROWS_PER_INSERT: Final = 200
"""Rows per multi-row INSERT (5 parameters each, far below SQLite's limit)."""

_inserts: dict[int, str] = {}


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert ``rows`` with one statement per chunk rather than one per row.

    The sqlite3 module hands the GIL back at every step of a statement; with
    many session threads waiting for it, a group commit of n rows by
    ``executemany`` pays n hand-offs, this about n / 200.
    """
    for i in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[i : i + _ROWS_PER_INSERT]
        sql = _inserts.get(len(chunk))
        if sql is None:
            sql = _inserts[len(chunk)] = (
                "INSERT INTO events (session_id, seq, type, time, data) VALUES "
                + ",".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            )
        conn.execute(sql, [v for row in chunk for v in row])


def _write_each(
    conn: sqlite3.Connection,
    batches: list[tuple[str, list[tuple[Any, ...]]]],
    refused: dict[str, StoreError],
) -> None:
    """Store each session's rows under a savepoint of its own, refusing the
    sessions whose seqs are already stored."""
    for sid, rows in batches:
        conn.execute("SAVEPOINT session_write")
        try:
            conn.executemany(_INSERT, rows)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO session_write")
            refused[sid] = ConflictError(
                "a seq in this write is already stored (a second writer?); "
                "reopen the session to continue from the store",
                session_id=sid,
            )
        conn.execute("RELEASE session_write")
