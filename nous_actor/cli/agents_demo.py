"""The main job of ``make demo``: supervised agent sessions on an embedded SQLite file
(or, with `run_demo_postgres`, on a PostgreSQL server).

N agents talk concurrently, each in its own session under one
`nous_actor.Sessions` registry: user and assistant turns with tool
calls and tool results from a deterministic fake model (no network), some
tool results oversized. A `nous_actor.Compactor` with a deterministic
summariser keeps every surface under budget. Crashes are injected at random
(a ``BaseException`` inside the session's actor), some between an agent's
appends and some amid a pipeline of appends still queued or committing; the
registry restarts the session from the store and the agent carries on
through the same handle, sending again what the crash refused.

At the end it prints a summary table and checks, against the SQLite file,
that every acknowledged event is there, intact (also those acknowledged
after their session had crashed).

The database is marked as the demo's (a table ``nous_actor_demo``), so that
a later run replaces it and nothing else (`check_demo_paths`). On PostgreSQL
the demo's sessions live in a schema of their own, marked the same way; a
later run replaces only a schema so marked (`check_demo_schema`).

Here: the databases the demo may use, marked as its own, and running it on
each; the agents at work, the check of every acknowledgement and the report
are in ``nous_actor.cli._agents``.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal, TextIO

from nous_actor.cli._agents import DemoReport as DemoReport
from nous_actor.cli._agents import _check_counts, _run
from nous_actor.cli._agents import format_report as format_report
from nous_actor.cli._agents import summarise as summarise
from nous_actor.store.sqlite import APPLICATION_ID, SQLiteStore

__all__ = [
    "DEMO_SCHEMA",
    "DEMO_TABLE",
    "DemoReport",
    "check_demo_log",
    "check_demo_paths",
    "check_demo_schema",
    "run_demo",
    "run_demo_postgres",
]

DEMO_TABLE: Final = "nous_actor_demo"  # present in a database the demo made
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_LOG_LINE: Final = re.compile(r"(\w+:[\w.]+:)?timestamp=")  # the first line of a demo log


DbKind = Literal["missing", "empty", "demo", "store", "foreign"]


def _db_kind(path: Path) -> DbKind:
    """What the file at ``path`` is, found without changing it.

    ``demo``: a nous_actor store this demo made; ``store``: another nous_actor
    store; ``foreign``: anything else (another application's SQLite database,
    a text file, ...). Only a file that starts as a nous_actor store (or one
    whose header is still in its write-ahead log) is opened, read-only.
    """
    if not path.exists():
        return "missing"
    if path.stat().st_size == 0:
        return "empty"
    with path.open("rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        return "foreign"
    header_id = int.from_bytes(head[68:72], "big")
    if header_id != APPLICATION_ID and not (header_id == 0 and Path(f"{path}-wal").exists()):
        return "foreign"
    try:
        uri = path.resolve().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            marked = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (DEMO_TABLE,)
            ).fetchone()
    except sqlite3.Error:
        return "foreign"
    if app_id != APPLICATION_ID:
        return "foreign"
    return "demo" if marked else "store"


def check_demo_paths(db: str | Path, *, keep: bool = False, agents: int = 0) -> str | None:
    """Why the demo must not use ``db`` (and its log ``DB.log``), or None if it may.

    Without ``keep`` the demo replaces ``db``: allowed for a missing or empty
    file and for a database an earlier demo made, nothing else. With
    ``keep`` it adds to ``db``: any nous_actor store will do, as long as none
    of the sessions its ``agents`` agents write (``agent-0`` ...) holds events
    already (a store the demo did not make: they would be someone else's). The
    log is overwritten: allowed if missing, empty, or a log an earlier demo
    wrote. Nothing is changed by the check.
    """
    path = Path(db)
    kind = _db_kind(path)
    if kind == "store" and keep and agents:
        taken = _taken_sessions(path, [f"agent-{i}" for i in range(agents)])
        if taken:
            return (
                f"{db} already holds session {taken[0]!r}, which the demo would write its "
                "turns into; it was left unchanged: pass a new file with --db"
            )
    if kind == "foreign":
        return (
            f"{db} is not a nous_actor store (another application's file?); it was left "
            "unchanged: pass a new file with --db"
        )
    if kind == "store" and not keep:
        return (
            f"{db} is a nous_actor store the demo did not make; it was left unchanged: "
            "pass a new file with --db, or add --keep to add the demo's sessions to it"
        )
    return check_demo_log(Path(f"{db}.log"), "pass another file with --db")


def _taken_sessions(path: Path, session_ids: list[str]) -> list[str]:
    """Which of ``session_ids`` have events in the store at ``path`` (read-only)."""
    uri = path.resolve().as_uri() + "?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
        return [
            sid
            for sid in session_ids
            if conn.execute("SELECT 1 FROM events WHERE session_id = ? LIMIT 1", (sid,)).fetchone()
        ]


def check_demo_log(log: Path, instead: str) -> str | None:
    """Why the demo must not overwrite ``log``, or None if it may (missing, empty, a demo's).

    ``instead`` ends the refusal: what to do instead (e.g. "pass another file with --db").
    """
    if log.exists():
        first = b""
        if log.is_file():
            with log.open("rb") as f:
                first = f.readline(4096)
        if not log.is_file() or (first and not _LOG_LINE.match(first.decode("utf-8", "replace"))):
            return (
                f"{log} (where the demo logs) is not a log of the demo; it was left "
                f"unchanged: move it away or {instead}"
            )
    return None


def _mark_as_demo(db: str | Path, agents: int, turns: int, seed: int) -> None:
    """Record in ``db`` that the demo made it (so that the next run may replace it)."""
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn, conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {DEMO_TABLE} "
            "(made TEXT NOT NULL, agents INTEGER, turns INTEGER, seed INTEGER)"
        )
        conn.execute(
            f"INSERT INTO {DEMO_TABLE} VALUES (?, ?, ?, ?)",
            (datetime.now(UTC).isoformat(), agents, turns, seed),
        )


def run_demo(
    db: str | Path,
    *,
    agents: int = 4,
    turns: int = 12,
    crash_rate: float = 0.02,
    seed: int = 7,
    progress: TextIO | None = sys.stderr,
) -> DemoReport:
    """Run the supervised multi-agent demo on the SQLite file ``db`` and verify it.

    Raises:
        ValueError: a bad count or rate.
    """
    _check_counts(agents, turns, crash_rate)
    fresh = _db_kind(Path(db)) in ("missing", "empty")
    store = SQLiteStore(db)
    if fresh:  # a store someone already had stays theirs, even with demo sessions in it
        _mark_as_demo(db, agents, turns, seed)
    try:
        return _run(store, agents, turns, crash_rate, seed, progress)
    finally:
        store.close()


DEMO_SCHEMA: Final = "nous_actor_demo"


def check_demo_schema(dsn: str, schema: str = DEMO_SCHEMA, *, keep: bool = False) -> str | None:
    """Why the demo must not use ``schema`` on the server ``dsn``, or None if it may.

    Without ``keep`` the demo replaces ``schema``: allowed if it is missing or
    an earlier demo made it (it holds the ``nous_actor_demo`` table), nothing
    else. With ``keep`` any nous_actor store will do (another application's
    schema is refused when the store opens). Nothing is changed by the check.

    Raises:
        StoreError: the server cannot be reached.
    """
    kind = _schema_kind(dsn, schema)
    if kind == "store" and not keep:
        return (
            f"schema {schema!r} on the server holds something the demo did not make; it was "
            "left unchanged: pass another --schema, or add --keep to add the demo's sessions "
            "to a nous_actor store there"
        )
    return None


def _schema_kind(dsn: str, schema: str) -> Literal["missing", "demo", "store"]:
    import psycopg

    from nous_actor.errors import StoreError

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c "
                "ON c.relnamespace = n.oid AND c.relname = %s AND c.relkind = 'r' "
                "WHERE n.nspname = %s",
                (DEMO_TABLE, schema),
            ).fetchall()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"could not reach the PostgreSQL server: {first}") from exc
    if not found:
        return "missing"
    return "demo" if found[0][1] else "store"


def _mark_schema_as_demo(dsn: str, schema: str, agents: int, turns: int, seed: int) -> None:
    """Record in ``schema`` that the demo made it (so that the next run may replace it)."""
    import psycopg
    from psycopg import sql

    table = sql.Identifier(schema, DEMO_TABLE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (made timestamptz NOT NULL, agents int, turns int, seed int)"
            ).format(table)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (now(), %s, %s, %s)").format(table),
            (agents, turns, seed),
        )


def run_demo_postgres(
    dsn: str,
    *,
    schema: str = DEMO_SCHEMA,
    keep: bool = False,
    agents: int = 4,
    turns: int = 12,
    crash_rate: float = 0.02,
    seed: int = 7,
    progress: TextIO | None = sys.stderr,
) -> DemoReport:
    """Run the demo on a PostgreSQL server (a `PostgresStore` in ``schema``) and verify it.

    Replaces ``schema`` only if an earlier demo made it (see
    `check_demo_schema`); with ``keep`` it adds to it. Needs the ``postgres``
    extra (psycopg 3).

    Raises:
        ValueError: a bad count or rate, or a schema the demo may not replace
            (left unchanged).
        StoreError: the server cannot be reached, or the schema is not a store.
    """
    import psycopg
    from psycopg import sql

    from nous_actor.store.postgres import PostgresStore

    _check_counts(agents, turns, crash_rate)
    refusal = check_demo_schema(dsn, schema, keep=keep)
    if refusal is not None:
        raise ValueError(refusal)
    kind = _schema_kind(dsn, schema)
    if kind == "demo" and not keep:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    store = PostgresStore(dsn, schema=schema)
    try:
        if kind == "missing" or (kind == "demo" and not keep):
            _mark_schema_as_demo(dsn, schema, agents, turns, seed)
        return _run(store, agents, turns, crash_rate, seed, progress)
    finally:
        store.close()
