"""Giving a SQLite store's file back its dropped space: a snapshot's drop counts the
bytes it deletes, and once they reach a share of the file the store rewrites it
(``VACUUM``), so that the file stays within about `_SHARE` of a packed copy.

Deleting rows leaves free pages and half-empty pages in the file; SQLite reuses
them but never shrinks the file by itself (``auto_vacuum`` is off in stores
made so far, and an incremental vacuum would only hand back wholly free pages,
not pack the half-empty ones a snapshot of interleaved events leaves). A
``VACUUM`` packs every page. It is one transaction (a crash or a full disk
during it leaves the file as it was) and holds the write lock while it copies
the file (measured on 2 CPUs: 0.7 s for a 115 MB file when idle, up to 1.5 s
for 96 MB when shared with other work); it runs on the store's writer thread,
so this process's appends wait for it too. So it is bounded twice:

* it runs only once the bytes dropped by this store since its last vacuum
  reach `_SHARE` of the file, so the copying costs at most about
  ``1 / _SHARE`` bytes per byte dropped, however many snapshots there are;
* it runs by itself only on files of at most `_AUTO_MAX_BYTES`; a larger
  file is left as it is (logged once, ``store.vacuum_deferred``) until the user
  calls `SQLiteStore.vacuum` at a quiet time.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Final

from nous_actor._log import get_logger
from nous_actor.store.sqlite.connection import _IN_CHUNK, _Connection

logger = get_logger("nous_actor.store.sqlite")

_SHARE: Final = 0.1
"""The share of the file the dropped bytes must reach before a snapshot vacuums it."""

_AUTO_MIN_BYTES: Final = 64 * 1024
"""Dropped bytes below which no vacuum is worth its transaction (small files)."""

_AUTO_MAX_BYTES: Final = 128 * 1024 * 1024
"""The largest file a snapshot vacuums by itself (a few seconds of write lock at most
on a slow disk; other processes wait for it up to their ``timeout``)."""

_CELL_OVERHEAD: Final = 12
"""Bytes a stored row costs beyond its record's values: the record header, the payload
length, the cell pointer, an overflow pointer."""


def _row_bytes(payload: int, usable: int) -> int:
    """The bytes of the file one row of ``payload`` bytes takes, overflow pages included
    (SQLite's rule for the cells of a ``WITHOUT ROWID`` table, whose rows are stored as
    an index's: what does not fit in the page spills to pages of ``usable - 4``)."""
    most = (usable - 12) * 64 // 255 - 23
    if payload <= most:
        return payload + _CELL_OVERHEAD
    least = (usable - 12) * 32 // 255 - 23
    local = least + (payload - least) % (usable - 4)
    if local > most:
        local = least
    pages = -(-(payload - local) // (usable - 4))
    return local + _CELL_OVERHEAD + pages * usable


def dropped_bytes(conn: sqlite3.Connection, session_id: str, seqs: Sequence[int]) -> int:
    """Inside the drop's transaction, before its delete: about how many bytes of the
    file the rows of ``seqs`` take (their values, a row's overhead, and the overflow
    pages of a row too large for one page)."""
    usable = int(conn.execute("PRAGMA page_size").fetchone()[0])
    total = 0
    wanted = [s for s in seqs if isinstance(s, int) and 0 <= s < 2**63]
    for lo in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[lo : lo + _IN_CHUNK]
        rows = conn.execute(
            "SELECT length(CAST(session_id AS BLOB)) + length(type) + length(time) + "
            "length(CAST(data AS BLOB)) + 8 FROM events WHERE session_id = ? "
            f"AND seq IN ({','.join('?' * len(chunk))})",
            [session_id, *chunk],
        ).fetchall()
        total += sum(_row_bytes(int(r[0]), usable) for r in rows)
    return total


def file_bytes(conn: sqlite3.Connection) -> int:
    """The size of the database (its pages), as the file will be once checkpointed."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


def due(connection: _Connection, size: int) -> bool:
    """Whether the bytes dropped since the last vacuum call for one now (see the module);
    logs once when only the file's size keeps it from running."""
    dropped = connection.dropped
    if dropped < _AUTO_MIN_BYTES or dropped < _SHARE * size:
        return False
    if size > _AUTO_MAX_BYTES:
        if not connection.vacuum_skipped:
            connection.vacuum_skipped = True
            logger.warning(
                "store.vacuum_deferred",
                store=connection.path,
                file_bytes=size,
                dropped_bytes=dropped,
                limit=_AUTO_MAX_BYTES,
                error="snapshots dropped a share of the file, but it is too large to "
                "rewrite by itself while other writers wait; call SQLiteStore.vacuum() "
                "at a quiet time to give the space back",
            )
        return False
    return True


def vacuum(connection: _Connection, conn: sqlite3.Connection) -> None:
    """Under the connection's lock, outside any transaction: pack the file (``VACUUM``),
    then empty the WAL it went through, and forget the bytes dropped so far.

    Raises:
        sqlite3.Error: the vacuum failed (the file is as it was: it is one transaction).
    """
    with connection.queued() as deadline:  # every write of ours takes its turn
        # A write of its own: only into a file this process may still write.
        connection.begin(conn, deadline)
        try:
            connection.check_writable(conn)
            connection.check_file()
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        before = file_bytes(conn)
        conn.execute("VACUUM")
        connection.dropped = 0
        connection.vacuum_skipped = False
        # The vacuum went through the WAL (as big as the file); give that space back
        # too, without waiting long for readers (a later checkpoint finishes it).
        conn.execute("PRAGMA busy_timeout = 100")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.execute(f"PRAGMA busy_timeout = {connection.busy_ms}")
    logger.info(
        "store.vacuumed",
        store=connection.path,
        before_bytes=before,
        after_bytes=file_bytes(conn),
        pid=os.getpid(),
    )
