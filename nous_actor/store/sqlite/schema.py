"""A SQLite store's file: its tables and marks, what makes a file a store, and
opening one (looking before writing).

`_Layout` reads what a file holds without writing anything; `_Opening` (held
by the store's connection, `connection._Connection`) opens a path, refuses a
file that is not a store before anything is written to it, writes the schema
and the file's marks in one transaction where a new store is made, and tells,
at each write, whether the file is still one this process may write.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from functools import cache
from pathlib import Path
from typing import Final, Protocol

from nous_actor.errors import StoreError

SCHEMA_VERSION: Final = 1
APPLICATION_ID: Final = 0x6E6F7573  # "nous": marks the file as a nous_actor store
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    since TEXT NOT NULL
)""",
)
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_MADE_LATER: Final = (
    # The hand-off requests (`SQLiteStore.ask_handoff`), made on the first request; and
    # their first layout, of development builds before requests stood per asker.
    """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)""",
    """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    asked_at TEXT NOT NULL,
    until TEXT NOT NULL
)""",
)
_DEMO_MARK: Final = (
    # The mark `nous-actor demo` leaves in a store it made (cli.agents_demo: DEMO_TABLE).
    "CREATE TABLE IF NOT EXISTS nous_actor_demo "
    "(made TEXT NOT NULL, agents INTEGER, turns INTEGER, seed INTEGER)"
)
_STATISTICS: Final = frozenset({"sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4"})
"""The tables SQLite's ``ANALYZE`` makes: statistics for the query planner, which
change no row; a file holding them is still ours."""


@cache
def _our_objects() -> frozenset[tuple[str, str, str | None]]:
    """The `sqlite_master` rows our schema (and what a store makes later) can hold, as
    SQLite itself normalises their SQL."""
    found: set[tuple[str, str, str | None]] = set()
    for later in _MADE_LATER:
        conn = sqlite3.connect(":memory:")
        try:
            for statement in (*_SCHEMA, later, _DEMO_MARK):
                conn.execute(statement)
            found.update(conn.execute("SELECT type, name, sql FROM sqlite_master"))
        finally:
            conn.close()
    return frozenset(found)


def _theirs(objects: frozenset[tuple[str, str, str | None]]) -> set[tuple[str, str, str | None]]:
    """The schema objects (tables, indexes, views, triggers) of a file that no store of
    ours makes: a trigger could rewrite what we store, a view or index is someone else's."""
    return {o for o in objects - _our_objects() if not (o[0] == "table" and o[1] in _STATISTICS)}


def _non_empty(path: str) -> bool:
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


def _ours_or_blank(header: bytes) -> bool:
    """Whether page 1, as read from the file, is marked as ours or holds nothing at all."""
    if len(header) < 108:
        return False
    if int.from_bytes(header[68:72], "big") == APPLICATION_ID:
        return True
    user_version = int.from_bytes(header[60:64], "big")
    app_id = int.from_bytes(header[68:72], "big")
    schema_cells = int.from_bytes(header[103:105], "big")
    return user_version == 0 and app_id == 0 and header[100] == 0x0D and schema_cells == 0


def _named(layout: _Layout) -> str:
    theirs = sorted(_theirs(layout.objects), key=lambda o: (o[0], o[1]))
    shown = ", ".join(f"{kind} {name!r}" for kind, name, _ in theirs[:5])
    return shown + (f" and {len(theirs) - 5} more" if len(theirs) > 5 else "")


class _Layout:
    """What a SQLite file holds, read in one read transaction without writing anything."""

    def __init__(self, conn: sqlite3.Connection, *, in_transaction: bool = False) -> None:
        if not in_transaction:
            conn.execute("BEGIN")
        try:
            self.objects = frozenset(conn.execute("SELECT type, name, sql FROM sqlite_master"))
            self.version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            self.app_id: int = conn.execute("PRAGMA application_id").fetchone()[0]
        finally:
            if not in_transaction and conn.in_transaction:
                conn.execute("COMMIT")
        self.tables = {name for kind, name, _ in self.objects if kind == "table"}

    @property
    def foreign(self) -> bool:
        """Another application's database: marked as theirs, or holding a schema object
        we never make (a table, index, view or trigger of theirs: marked as ours or made
        before the mark, a file that holds one is not ours any more)."""
        if self.app_id not in (0, APPLICATION_ID):
            return True
        return bool(_theirs(self.objects))

    @property
    def blank(self) -> bool:
        """Nothing in it at all: no table, no version, no application id."""
        return not self.objects and self.version == 0 and self.app_id == 0

    @property
    def complete(self) -> bool:
        """A finished store of this schema version (nothing to write before using it)."""
        return (
            self.app_id == APPLICATION_ID
            and self.version == SCHEMA_VERSION
            and {"events", "writers"} <= self.tables
        )


class Connect(Protocol):
    """How a connection is opened (`_Connection.connect`)."""

    def __call__(self, target: str, timeout: float, uri: bool) -> sqlite3.Connection: ...


class _Opening:
    """Opening a `SQLiteStore`'s file (see there for which files become a store), and
    at each write whether it is still one this process may write.

    Attributes:
        path: the database file, or ``":memory:"``.
        file: the file opened (absolute path, ``st_dev``, ``st_ino``); ``None`` until
            `open` returns, and for ``":memory:"``.
    """

    def __init__(self, path: str, connect: Connect) -> None:
        self.path = path
        self._connect = connect
        self.file: tuple[str, int, int] | None = None
        self._cookie = -1  # the schema cookie last checked (`still_ours`); -1: not yet

    # -- opening: look before writing ------------------------------------------------------

    def open(self, timeout: float, create: bool) -> sqlite3.Connection:
        """A connection to the store at ``path``, made if asked (see `SQLiteStore`).

        Raises:
            StoreError: the file is not a store (it was left unchanged), or there is
                none and ``create`` is false.
            sqlite3.Error: SQLite failed (the caller translates it).
        """
        if self.path == ":memory:":
            conn = self._connect(":memory:", timeout, uri=False)
            self._create(conn)
            return conn
        full = os.path.abspath(self.path)
        try:
            st: os.stat_result | None = os.stat(full)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise StoreError(f"could not open the store in {self.path}: {exc}") from exc
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise StoreError(f"{self.path} is a directory, not a database file; give a file path")
        if st is None or st.st_size == 0:
            if not create:
                what = "does not exist" if st is None else "is an empty file"
                raise StoreError(
                    f"there is no nous_actor store at {self.path}: it {what}; check the path, "
                    "or open it with create=True to make a new store there"
                )
        else:
            self._probe(full, timeout)  # refuses what is not ours, writing nothing
        mode = "rwc" if st is None else "rw"  # never create a file that was not asked for
        conn = self._connect(f"{Path(full).as_uri()}?mode={mode}", timeout, uri=True)
        try:
            layout = _Layout(conn)
            self._check_ours(layout)  # again: the file may have changed since the probe
            if not layout.complete:
                if layout.blank and not create:
                    raise StoreError(
                        f"there is no nous_actor store at {self.path}: it is an empty SQLite "
                        "database; open it with create=True to make a new store there"
                    )
                self._create(conn)
            # Only now that the file is ours: WAL (a header write) and its identity.
            mode_now = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode_now).lower() != "wal":
                mode_now = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode_now).lower() != "wal":
                    raise StoreError(
                        f"could not switch {self.path} to the WAL journal (it stayed in "
                        f"{mode_now!r} mode); check that its folder is writable"
                    )
            st = os.stat(full)
            self.file = (full, st.st_dev, st.st_ino)
        except BaseException:
            conn.close()
            raise
        return conn

    def _probe(self, full: str, timeout: float) -> None:
        """Refuse a non-empty file that is not ours, without writing to it.

        Reads the header with plain file I/O, then the table list and marks
        through a connection chosen so that SQLite writes nothing either: a
        read-only one where a WAL holds frames (closing a read-write one would
        checkpoint them into the file), and never one that would roll back
        another application's unfinished transaction.
        """
        try:
            with open(full, "rb") as f:
                header = f.read(108)  # the file header and page 1's b-tree header
        except OSError as exc:
            raise StoreError(f"could not read {self.path}: {exc}; check its permissions") from exc
        if not header.startswith(_SQLITE_MAGIC):
            raise StoreError(
                f"{self.path} is not a SQLite database, so not a nous_actor store; it was left "
                "unchanged: give the path of a store, or of a new file"
            )
        in_wal = len(header) > 18 and header[18] == 2
        if not in_wal and _non_empty(full + "-journal") and not _ours_or_blank(header):
            # A rollback journal next to it: reading would roll their transaction back.
            # (Page 1 is written first, so a creation of ours killed mid-commit has left
            # page 1 marked as ours, or, in a database that was empty, still empty.)
            raise StoreError(self._foreign_message())
        read_only = in_wal and _non_empty(full + "-wal")
        mode = "ro" if read_only else "rw"
        conn = self._connect(f"{Path(full).as_uri()}?mode={mode}", timeout, uri=True)
        try:
            layout = _Layout(conn)
        finally:
            conn.close()
        self._check_ours(layout)

    def _foreign_message(self, layout: _Layout | None = None) -> str:
        extra = _named(layout) if layout is not None else ""
        holding = f" (it holds schema objects nous_actor does not make: {extra})" if extra else ""
        return (
            f"{self.path} is another application's SQLite database, not a nous_actor "
            f"store{holding}; it was left unchanged: use a new file"
        )

    def _check_ours(self, layout: _Layout) -> None:
        if layout.foreign:
            raise StoreError(self._foreign_message(layout))
        if layout.version not in (0, SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} has schema version {layout.version}; this nous_actor reads "
                f"version {SCHEMA_VERSION}: upgrade nous_actor"
            )

    # -- every write transaction: is the file still one this process may write? ----------

    def still_ours(self, conn: sqlite3.Connection) -> str | None:
        """Inside a write transaction, before anything is written: ``None`` if the file's
        schema version is still ours and, if its schema changed since the last look (the
        schema cookie, which SQLite changes with any schema change, moved), it holds
        nothing we did not make and is still marked as ours; else why nothing more may
        be written to it. Two pragmas read from the header (about 2 us); the schema
        table is read only when the cookie moved."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        if version == SCHEMA_VERSION and cookie == self._cookie:
            return None
        if version != SCHEMA_VERSION:
            return (
                f"{self.path} now has schema version {version} (another process changed it, "
                f"an upgrade?); this nous_actor writes version {SCHEMA_VERSION} only, so "
                "nothing more is written to it: upgrade nous_actor in every process that "
                "uses the file, then reopen the store"
            )
        layout = _Layout(conn, in_transaction=True)
        if layout.foreign or layout.app_id != APPLICATION_ID:
            return (
                f"{self.path} is now another application's SQLite database (it holds schema "
                f"objects nous_actor does not make: {_named(layout)}, or another "
                "application id), so nothing more is written to it; it was left unchanged "
                "by this write: remove what was added, or use a new file"
            )
        self._cookie = cookie
        return None

    def _create(self, conn: sqlite3.Connection) -> None:
        """Write the schema and the file's marks in one transaction: all of it, or nothing."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self.path != ":memory:":  # another process may have made it meanwhile
                self._check_ours(_Layout(conn, in_transaction=True))
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
