"""A SQLite store's file: its tables and marks, what makes a file a store, and
opening one (looking before writing).

`_Layout` reads what a file holds without writing anything; `_Opening` (held
by the store's connection, `connection._Connection`) opens a path, refuses a
file that is not a store before anything is written to it, writes the schema
and the file's marks in one transaction where a new store is made (or a store
of schema version 1 or 2 is migrated to version 3), and tells, at each write,
whether the file is still one this process may write.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from functools import cache
from pathlib import Path
from typing import Final, Protocol

from nous_actor.errors import StoreError
from nous_actor.runtime import forks

SCHEMA_VERSION: Final = 3
APPLICATION_ID: Final = 0x6E6F7573  # "nous": marks the file as a nous_actor store
_EVENTS_TABLE: Final = """CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID"""
"""The events table of versions 1 and 2: clustered on the session's id (text)."""
_SESSIONS: Final = """CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL UNIQUE
)"""
"""Version 3: each session id that was ever written, numbered in the order sessions were
first written. A number is never changed nor given to another id (a deleted session
keeps its row), so a process may remember the numbers it has seen."""
_VERSIONS: Final = (
    "SELECT user_version, schema_version FROM pragma_user_version, pragma_schema_version"
)
"""The file's schema version (ours) and its schema cookie (SQLite's), read together."""
STILL_OURS: Final = (
    "(SELECT user_version = ? AND schema_version = ? "
    "FROM pragma_user_version, pragma_schema_version)"
)
"""`_VERSIONS` as a condition, the version and cookie a write expects bound to it: a
write that holds it in its own statement (`_Opening.expected`) needs no statement of
its own to look first."""

_EVENT_ROWS: Final = """CREATE TABLE IF NOT EXISTS event_rows (
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID"""
"""Version 3: the stored events, clustered on (session number, seq): a session's rows
lie together (a whole-session read reads a few pages), a new session's rows go at the
end of the tree (not into the middle of a big file), and a row is shorter by its id."""
_EVENTS_VIEW: Final = """CREATE VIEW IF NOT EXISTS events (session_id, seq, type, time, data) AS
SELECT s.session_id, e.seq, e.type, e.time, e.data
FROM event_rows AS e JOIN sessions AS s ON s.id = e.session"""
"""Version 3: the events by session id, as versions 1 and 2 stored them: every read
(of this release or of a plain SQL client) reads either version's file alike."""
_EVENTS_WRITES: Final = (
    # Plain SQL that writes `events` (a tool, a repair by hand) writes the rows behind it:
    # an insert numbers a new session, and an insert of a stored seq fails in SQLite.
    """CREATE TRIGGER IF NOT EXISTS events_insert INSTEAD OF INSERT ON events BEGIN
    INSERT OR IGNORE INTO sessions (session_id) VALUES (new.session_id);
    INSERT INTO event_rows (session, seq, type, time, data) VALUES (
        (SELECT id FROM sessions WHERE session_id = new.session_id),
        new.seq, new.type, new.time, new.data);
END""",
    """CREATE TRIGGER IF NOT EXISTS events_update INSTEAD OF UPDATE ON events BEGIN
    INSERT OR IGNORE INTO sessions (session_id) VALUES (new.session_id);
    UPDATE event_rows SET
        session = (SELECT id FROM sessions WHERE session_id = new.session_id),
        seq = new.seq, type = new.type, time = new.time, data = new.data
    WHERE session = (SELECT id FROM sessions WHERE session_id = old.session_id)
        AND seq = old.seq;
END""",
    """CREATE TRIGGER IF NOT EXISTS events_delete INSTEAD OF DELETE ON events BEGIN
    DELETE FROM event_rows
    WHERE session = (SELECT id FROM sessions WHERE session_id = old.session_id)
        AND seq = old.seq;
END""",
)
_WRITERS: Final = """CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    since TEXT NOT NULL,
    address TEXT
)"""
_KEYS: Final = """CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
)"""
"""The store's secrets, by name: ``'forwarding'``, the key every process on the store
shares (`SQLiteStore.forwarding_key`), made by the first process that asks."""
_SCHEMA: Final = (_SESSIONS, _EVENT_ROWS, _EVENTS_VIEW, *_EVENTS_WRITES, _WRITERS, _KEYS)
"""A new store's tables (schema version 3)."""
_SCHEMA_V2: Final = (_EVENTS_TABLE, _WRITERS, _KEYS)
"""The tables of schema version 2, as the releases of version 2 made them."""
_SCHEMA_V1: Final = (
    _EVENTS_TABLE,
    """CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    since TEXT NOT NULL
)""",
)
"""The tables of schema version 1, as the releases before version 2 made them: a file
holding them is ours, and is migrated (`_MIGRATION_V1`, `_MIGRATION_V2`) when opened
for writing."""
_MIGRATION_V1: Final = (
    # Version 1 to 2: the address where a claim's holder answers (NULL in the rows of
    # version 1: none advertised), and the table of the store's secrets. Neither
    # rewrites a row.
    "ALTER TABLE writers ADD COLUMN address TEXT",
    _KEYS,
)
_MIGRATION_V2: Final = (
    # Version 2 to 3: the sessions numbered in the order of their ids, every row copied
    # under its session's number (read in key order, so written in key order: appended),
    # the old table dropped and the view made in its place. In the one write transaction
    # of `_Opening._create`: killed anywhere in it, the file is as it was.
    _SESSIONS,
    _EVENT_ROWS,
    "INSERT INTO sessions (session_id) SELECT DISTINCT session_id FROM events ORDER BY session_id",
    "INSERT INTO event_rows (session, seq, type, time, data) "
    "SELECT s.id, e.seq, e.type, e.time, e.data "
    "FROM sessions AS s JOIN events AS e ON e.session_id = s.session_id ORDER BY s.id, e.seq",
    "DROP TABLE events",
    _EVENTS_VIEW,
    *_EVENTS_WRITES,
)
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
CALLS_TABLE: Final = """CREATE TABLE IF NOT EXISTS calls (
    at INTEGER NOT NULL,
    session INTEGER NOT NULL,
    call TEXT NOT NULL,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    PRIMARY KEY (at, session, call),
    UNIQUE (session, call)
) WITHOUT ROWID"""
"""The calls other processes forwarded to this store's holders, each with the seqs of what
it appended (`SQLiteStore.applied_call`), written in the transaction of those events and
kept `CALL_RECORD_SECONDS` at least (``at``: the write's Unix time, in whole seconds,
the key that forgetting them walks). Made on the first forwarded call's write: a table
releases without forwarding ignore."""
CALL_EVENTS: Final = (
    """CREATE VIEW IF NOT EXISTS call_events
    (session, seq, type, time, data, at, call, first, last)
AS SELECT session, seq, type, time, data, NULL, NULL, NULL, NULL FROM event_rows WHERE 0""",
    """CREATE TRIGGER IF NOT EXISTS call_events_insert INSTEAD OF INSERT ON call_events BEGIN
    INSERT INTO event_rows (session, seq, type, time, data)
        VALUES (new.session, new.seq, new.type, new.time, new.data);
    INSERT OR REPLACE INTO calls (at, session, call, first, last)
        SELECT new.at, new.session, new.call, new.first, new.last WHERE new.call IS NOT NULL;
END""",
)
"""Where a write of forwarded calls' events puts its rows when it is one statement (see
`nous_actor.store.sqlite.writes.rows_at_once`): each row an event, the first of each
call's events carrying the call's record too, which the trigger puts into ``calls``:
the events and their records in one statement that is its own transaction, as a write of
this process's own calls is, instead of a transaction of four. Made with ``calls``
(`CALLS`); nothing reads the view."""
CALLS: Final = (CALLS_TABLE, *CALL_EVENTS)
"""What the first forwarded call's write makes (and a later one makes again if missing)."""
_MADE_LATER: Final = (
    CALLS,
    # The hand-off requests (`SQLiteStore.ask_handoff`), made on the first request; and
    # their first layout, of development builds before requests stood per asker.
    (
        """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)""",
    ),
    (
        """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    asked_at TEXT NOT NULL,
    until TEXT NOT NULL
)""",
    ),
)
_DEMO_MARK: Final = (
    # The mark `nous-actor demo` leaves in a store it made (cli.agents_demo: DEMO_TABLE).
    "CREATE TABLE IF NOT EXISTS nous_actor_demo "
    "(made TEXT NOT NULL, agents INTEGER, turns INTEGER, seed INTEGER)"
)
_held: dict[tuple[int, int], int] = {}
_held_lock = forks.lock()
"""The files (``st_dev``, ``st_ino``) the stores of this process hold open, with how many
hold each: module state, one for the process. Their header is never read with plain file
I/O (`_Opening._probe`): closing any descriptor of a file drops every POSIX lock the
process holds on it, SQLite's among them, and another process that then opens and
closes the file takes it for unused and deletes its WAL under a connection still
writing it (its later commits would be lost). An opening holds the lock from its look
at the header to its connection's entry here, so that no look of another thread falls
between the two."""

_STATISTICS: Final = frozenset({"sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4"})
"""The tables SQLite's ``ANALYZE`` makes: statistics for the query planner, which
change no row; a file holding them is still ours."""


_LAYOUTS: Final = {
    1: (_SCHEMA_V1,),
    # Made new, or migrated from version 1 (ALTER TABLE rewrites the table's SQL text).
    2: (_SCHEMA_V2, (*_SCHEMA_V1, *_MIGRATION_V1, *_SCHEMA_V2)),
    # Made new, migrated from version 2, or from version 1 (as `_Opening._create` does).
    3: (
        _SCHEMA,
        (*_SCHEMA_V2, *_MIGRATION_V2, *_SCHEMA),
        (*_SCHEMA_V1, *_MIGRATION_V1, *_MIGRATION_V2, *_SCHEMA),
    ),
}
"""The statements that make each schema version's tables, one tuple per way it is made."""


@cache
def _our_objects(version: int) -> frozenset[tuple[str, str, str | None]]:
    """The `sqlite_master` rows a store of schema ``version`` (and what a store makes
    later) can hold, as SQLite itself normalises their SQL; for a version no release
    wrote (0: a store an older release left half-made), those of every version."""
    layouts = _LAYOUTS.get(version) or tuple(way for ways in _LAYOUTS.values() for way in ways)
    found: set[tuple[str, str, str | None]] = set()
    for layout in layouts:
        for later in _MADE_LATER:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            try:
                for statement in (*layout, *later, _DEMO_MARK):
                    conn.execute(statement)
                found.update(conn.execute("SELECT type, name, sql FROM sqlite_master"))
            finally:
                conn.close()
    return frozenset(found)


def _theirs(
    objects: frozenset[tuple[str, str, str | None]], version: int
) -> set[tuple[str, str, str | None]]:
    """The schema objects (tables, indexes, views, triggers) of a file of schema
    ``version`` that no store of ours of that version makes: a trigger could rewrite
    what we store, a view or index is someone else's."""
    ours = _our_objects(version)
    return {o for o in objects - ours if not (o[0] == "table" and o[1] in _STATISTICS)}


def _read_only(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a write because the connection or the file is read-only."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_READONLY


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
    theirs = sorted(_theirs(layout.objects, layout.version), key=lambda o: (o[0], o[1]))
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
        self.views = {name for kind, name, _ in self.objects if kind == "view"}

    @property
    def foreign(self) -> bool:
        """Another application's database: marked as theirs, or holding a schema object
        we never make (a table, index, view or trigger of theirs: marked as ours or made
        before the mark, a file that holds one is not ours any more)."""
        if self.app_id not in (0, APPLICATION_ID):
            return True
        return bool(_theirs(self.objects, self.version))

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
            and {"sessions", "event_rows", "writers", "keys"} <= self.tables
            and "events" in self.views
        )

    @property
    def readable(self) -> bool:
        """A whole store of schema version 1 or 2, which reads as it is (only a write
        needs version 3): what a read-only opening that cannot migrate it reads."""
        return self.version in (1, 2) and {"events", "writers"} <= self.tables

    @property
    def newer(self) -> bool:
        """A store of ours made by a newer release (a schema version past ours)."""
        return self.version > SCHEMA_VERSION


class Connect(Protocol):
    """How a connection is opened (`_Connection.connect`)."""

    def __call__(self, target: str, timeout: float, uri: bool) -> sqlite3.Connection: ...


class _Opening:
    """Opening a `SQLiteStore`'s file (see there for which files become a store), and
    at each write whether it is still one this process may write.

    Versions: a new store is made at `SCHEMA_VERSION`; a store of version 1 or 2 (or
    one an older release left half-made) is brought to it in the one write transaction
    of `_create`, so a process killed in it leaves the file wholly as it was. Only a
    connection that cannot write (``mode=ro``, a read-only file) opens a store of
    version 1 or 2 as it is, writing nothing (``opened_at`` is then its version): its
    reads read every layout (version 3's ``events`` view reads as the older table), and
    a write is refused until the file has been migrated by a process that can write it
    (`still_ours`), after which it writes version 3.

    Attributes:
        path: the database file, or ``":memory:"``.
        file: the file opened (absolute path, ``st_dev``, ``st_ino``); ``None`` until
            `open` returns, and for ``":memory:"``.
        opened_at: the schema version the file had once opened: `SCHEMA_VERSION`, or
            1 or 2 where a read-only connection could not migrate it.
    """

    def __init__(self, path: str, connect: Connect) -> None:
        self.path = path
        self._connect = connect
        self.file: tuple[str, int, int] | None = None
        self.opened_at = SCHEMA_VERSION
        self._holding: tuple[int, int] | None = None  # its key in `_held`, until `release`
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
        if (st is None or st.st_size == 0) and not create:
            what = "does not exist" if st is None else "is an empty file"
            raise StoreError(
                f"there is no nous_actor store at {self.path}: it {what}; check the path, "
                "or open it with create=True to make a new store there"
            )
        mode = "rwc" if st is None else "rw"  # never create a file that was not asked for
        with _held_lock:
            if st is not None and st.st_size > 0 and (st.st_dev, st.st_ino) not in _held:
                self._probe(full, timeout)  # refuses what is not ours, writing nothing
            conn = self._connect(f"{Path(full).as_uri()}?mode={mode}", timeout, uri=True)
            try:
                held = os.stat(full)
            except BaseException:
                conn.close()
                raise
            self._holding = (held.st_dev, held.st_ino)  # (a file held is a store of ours)
            _held[self._holding] = _held.get(self._holding, 0) + 1
        try:
            layout = _Layout(conn)
            self._check_ours(layout)  # again: the file may have changed since the probe
            if not layout.complete:
                if layout.blank and not create:
                    raise StoreError(
                        f"there is no nous_actor store at {self.path}: it is an empty SQLite "
                        "database; open it with create=True to make a new store there"
                    )
                try:
                    self._create(conn)
                except sqlite3.OperationalError as exc:
                    if not (layout.readable and _read_only(exc)):
                        raise
                    self.opened_at = layout.version  # read as it is: nothing was written
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
            self.release()
            raise
        return conn

    def release(self) -> None:
        """The store has closed every connection to its file (once; later calls do
        nothing): an opening in this process may read its header again (`_held`)."""
        key, self._holding = self._holding, None
        if key is None:
            return
        with _held_lock:
            left = _held.pop(key, 1) - 1
            if left > 0:
                _held[key] = left

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
        newer = StoreError(
            f"{self.path} has schema version {layout.version}; this nous_actor reads "
            f"versions 1 to {SCHEMA_VERSION}: upgrade nous_actor"
        )
        if layout.app_id == APPLICATION_ID and layout.newer:
            raise newer  # marked as ours: a newer release's tables are no stranger's
        if layout.foreign:
            raise StoreError(self._foreign_message(layout))
        if layout.version not in (0, 1, 2, SCHEMA_VERSION):
            raise newer

    # -- every write transaction: is the file still one this process may write? ----------

    def still_ours(self, conn: sqlite3.Connection) -> str | None:
        """Inside a write transaction, before anything is written: ``None`` if the file's
        schema version is still ours and, if its schema changed since the last look (the
        schema cookie, which SQLite changes with any schema change, moved), it holds
        nothing we did not make and is still marked as ours; else why nothing more may
        be written to it. Two pragmas read from the header in one statement; the schema
        table is read only when the cookie moved.

        A store opened read-only at version 1 or 2 (``opened_at``) that is still at that
        version raises `StoreError` here instead (the store stays open for reading); once
        another process has migrated the file, its schema is read again and it writes
        version 3.

        Raises:
            StoreError: the store was opened at version 1 or 2 without migrating it, and
                the file is still at that version.
        """
        # One statement (each hands the GIL back and takes it again, under the write lock).
        version, cookie = conn.execute(_VERSIONS).fetchone()
        if version == SCHEMA_VERSION and cookie == self._cookie:
            return None
        if version == self.opened_at < SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version} and this store opened it "
                f"read-only, without migrating it to version {SCHEMA_VERSION}, so it writes "
                "nothing to it: open the store once from a process that can write the file "
                "(it migrates it), then write"
            )
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

    def expected(self) -> tuple[int, int] | None:
        """What `STILL_OURS` is bound to in a write that looks no other way: this
        release's version and the schema cookie the last `still_ours` saw, while nothing
        has changed since; ``None`` before the first look, or for a file opened read-only
        at an older version (a write then looks with `still_ours`, which says why)."""
        if self._cookie < 0 or self.opened_at != SCHEMA_VERSION:
            return None
        return SCHEMA_VERSION, self._cookie

    def _create(self, conn: sqlite3.Connection) -> None:
        """Make the store, or bring one of version 1 or 2 (or one an older release left
        half-made) to `SCHEMA_VERSION` (`_MIGRATION_V1`, then `_MIGRATION_V2`): the
        tables, the migration and the file's marks in one write transaction, all of it
        or nothing (DDL is transactional in SQLite: a process killed in it leaves the
        file as it was). Version 2 to 3 copies every event row once (about a second per
        million rows on 2 CPUs); the space of the old table stays in the file as free
        pages, which SQLite fills again before it grows the file."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            layout = _Layout(conn, in_transaction=True)
            if self.path != ":memory:":  # another process may have made it meanwhile
                self._check_ours(layout)
            if layout.complete:  # made, or migrated, by another process meanwhile
                conn.execute("ROLLBACK")
                return
            if "writers" in layout.tables and not _has_address(conn):
                for statement in _MIGRATION_V1:
                    conn.execute(statement)
            if "events" in layout.tables:  # the table of versions 1 and 2, not the view
                for statement in _MIGRATION_V2:
                    conn.execute(statement)
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


def _has_address(conn: sqlite3.Connection) -> bool:
    """Whether the ``writers`` table has version 2's ``address`` column."""
    found = conn.execute("SELECT 1 FROM pragma_table_info('writers') WHERE name = 'address'")
    return found.fetchone() is not None
