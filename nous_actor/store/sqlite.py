"""The embedded default `nous_actor.store.Store`: SQLite (stdlib ``sqlite3``), WAL.

Durability (``durability=``):

* ``"full"`` (default): ``synchronous=FULL``. Each commit is fsynced before
  it is acknowledged, so an acknowledged append survives a process crash
  (SIGKILL) *and* a power loss or OS crash.
* ``"normal"``: ``synchronous=NORMAL``. The WAL is fsynced only at
  checkpoints: an acknowledged append survives a process crash, but a power
  loss may lose the last commits (the file stays consistent).

Either way a transaction is atomic: an append that was not acknowledged is
wholly stored or wholly absent. The table's ``PRIMARY KEY (session_id, seq)``
makes the database itself refuse a second writer's seq.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

from nous_actor.core.args import check_flag, check_seconds
from nous_actor.core.codec import CodecError, encode_data, event_from_row, format_time
from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import shared
from nous_actor.store.base import (
    ClosingStore,
    SessionInfo,
    valid_store_id,
)
from nous_actor.store.subscription import Subscription

__all__ = ["SQLiteStore"]

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


# Claim tokens held by live writers of this process, whatever store object made them.
_live_tokens: set[str] = set()
_live_lock = threading.Lock()


@cache
def _our_objects() -> frozenset[tuple[str, str, str | None]]:
    """The `sqlite_master` rows our schema makes, as SQLite itself normalises their SQL."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in _SCHEMA:
            conn.execute(statement)
        return frozenset(conn.execute("SELECT type, name, sql FROM sqlite_master"))
    finally:
        conn.close()


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


_BUSY_FIRST_S: Final = 0.0002
_BUSY_STEP_S: Final = 0.002
"""How long a write transaction waits, at first and at most, before it looks again
for another process's write lock (see `SQLiteStore._begin`)."""

_MAX_TIMEOUT_S: Final = 2_147_483
"""The longest `timeout`: SQLite's busy timeout is a 32-bit count of milliseconds."""


def _check_path(path: object) -> str:
    """``path`` as a str, if it names a file (or is ``":memory:"``).

    Raises:
        TypeError: not a str or an `os.PathLike` of str (bytes paths are refused).
        ValueError: empty, or holding a NUL character.
    """
    if isinstance(path, os.PathLike):
        text = os.fspath(path)
        if not isinstance(text, str):
            raise TypeError(
                "path must be a str or an os.PathLike of str, not bytes: decode it "
                "(os.fsdecode) or give a pathlib.Path"
            )
    elif isinstance(path, str):
        text = path
    else:
        raise TypeError(
            "path must be a str or an os.PathLike (e.g. a pathlib.Path) naming the database "
            f"file, or ':memory:', got {type(path).__name__}"
        )
    if not text:
        raise ValueError("path must not be empty: give a database file path, or ':memory:'")
    if "\x00" in text:
        raise ValueError(f"path must not hold a NUL character, got {text!r}")
    return text


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie (dead, not yet reaped) does not.

    Where `/proc` exists the process state is read from `/proc/<pid>/stat`;
    elsewhere a zombie still counts as alive (see docs/persistence.md).
    """
    if not 0 < pid < 2**31:  # kill(0 or -n) would signal a group; no real pid is this big
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except FileNotFoundError:  # gone meanwhile, or no /proc here (then trust kill)
        return not os.path.exists("/proc/self")
    except OSError:
        return True
    # The state follows the command name, which is in parentheses and may hold any byte.
    fields = text.rpartition(b")")[2].split()
    return not (fields and fields[0] in (b"Z", b"X", b"x"))


def _holder_alive(holder_pid: int, holder_token: str, pid: int) -> bool:
    """Whether the claim row (``holder_pid``, ``holder_token``) still has a live writer:
    a token of this process that was not released, or another process that has not ended.
    Call it under ``_live_lock``."""
    return holder_token in _live_tokens if holder_pid == pid else _pid_alive(holder_pid)


_IN_CHUNK: Final = 500
"""Ids bound in one ``IN (...)`` (far below SQLite's bound on parameters)."""


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
        """Another application's database: marked as theirs, or holding what we never make."""
        if self.app_id == APPLICATION_ID:
            return False
        if self.app_id != 0:
            return True
        made_before_application_id = (
            self.version == SCHEMA_VERSION and {"events", "writers"} <= self.tables
        )
        return not (made_before_application_id or self.objects <= _our_objects())

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


def _holder_name(pid: object, token: object, me: int) -> str | None:
    """Who a ``writers`` row names, if it is live (call under ``_live_lock``)."""
    if not isinstance(pid, int) or not isinstance(token, str):
        return None
    if not _holder_alive(pid, token, me):
        return None
    return "this process" if pid == me else f"process {pid}"


def _info(session_id: str, count: int, top: object, last: object) -> SessionInfo:
    """One row of `SQLiteStore.index`, with what cannot be read put into `error`."""
    if not isinstance(top, int) or top < 0:
        return SessionInfo(session_id, count, 0, None, f"a stored seq is malformed: {top!r}")
    try:
        when = datetime.fromisoformat(str(last))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        return SessionInfo(
            session_id, count, top + 1, None, f"a stored time is malformed: {last!r}"
        )
    return SessionInfo(session_id, count, top + 1, when.astimezone(UTC), None)


class SQLiteStore(ClosingStore):
    """Sessions' events in one SQLite file (or `":memory:"`).

    Safe to share between threads: calls are serialised on one connection.
    Open the same file from several processes freely; each session still
    has one live writer (`claim`), enforced in the database.

    Which files become a store:

    * a missing path, a 0-byte file, or a SQLite database with nothing in it
      (no table, `user_version` and `application_id` 0) becomes a new store
      (unless `create=False`). The schema, `application_id` and
      `user_version` are written in one transaction, so a process killed
      while creating the store leaves either no store or a whole one;
    * a nous_actor store opens as it is (a store of an older release without
      `application_id`, or one left half-made by an older release, is
      completed);
    * anything else (another application's SQLite database, a file that is
      not SQLite, a store of a newer schema version, a directory) is refused
      with `StoreError` **before anything is written to it**: the file is
      left byte for byte as it was, and an unfinished transaction of the
      other application is not recovered. The journal is switched to WAL
      only once the file is known to be a store.

    While open, every write transaction checks (one `stat` per transaction) that
    the path still names the file that was opened; if the file or its folder
    was removed or replaced, the write fails with `StoreError` and so does
    every later call: nothing is acknowledged into a file that is gone.

    Args:
        path: the database file, or `":memory:"`.
        durability: `"full"` (default) or `"normal"`; see the module docs.
        timeout: seconds to wait for another process's write lock (0.001 to 2147483).
        create: make a new store where there is none (the default). With
            `create=False` a missing path, a 0-byte file or an empty SQLite
            database raises `StoreError` and is left as it is (no file is
            made): use it to open stores that must already exist.

    Every argument is checked before anything is opened: a refused argument
    makes no file and holds nothing.

    Raises:
        TypeError: `path` is not a str or an `os.PathLike` of str; `durability`
            is not a str; `timeout` is not an int or a float; `create` is not a bool.
        ValueError: `path` is empty or holds a NUL character; `durability` is
            not `"full"` or `"normal"`; `timeout` is not from 0.001 (SQLite waits in
            whole milliseconds) to 2147483 seconds (its wait is a 32-bit count
            of milliseconds).
        StoreError: the file cannot be opened, is not a nous_actor store, or
            (with `create=False`) holds no store yet.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["full", "normal"] = "full",
        timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        path = _check_path(path)
        if not isinstance(durability, str):
            raise TypeError(
                f"durability must be 'full' or 'normal' (a str), got {type(durability).__name__}"
            )
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', got {durability!r}")
        timeout = check_seconds(timeout, "timeout", 0.001, _MAX_TIMEOUT_S, low_open=False)
        check_flag(create, "create")
        self.path = path if path == ":memory:" else str(Path(path))
        self.durability = durability
        self._busy_wait = timeout
        self._asked: set[str] = set()  # sessions this store asked for (store.shared)
        self._busy_ms = int(timeout * 1000)
        self._lock = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._file: tuple[str, int, int] | None = None  # (absolute path, st_dev, st_ino)
        with self._translate(None, "open the store"):
            self._conn = self._open(timeout, create)

    # -- opening: look before writing ------------------------------------------------------

    def _connect(self, target: str, timeout: float, uri: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=uri
        )
        try:  # connection settings only: nothing here writes to the file
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self.durability.upper()}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open(self, timeout: float, create: bool) -> sqlite3.Connection:
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
            self._file = (full, st.st_dev, st.st_ino)
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

    def _foreign_message(self) -> str:
        return (
            f"{self.path} is another application's SQLite database, not a nous_actor "
            "store; it was left unchanged: use a new file"
        )

    def _check_ours(self, layout: _Layout) -> None:
        if layout.foreign:
            raise StoreError(self._foreign_message())
        if layout.version not in (0, SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} has schema version {layout.version}; this nous_actor reads "
                f"version {SCHEMA_VERSION}: upgrade nous_actor"
            )

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

    # -- one place to translate sqlite3 errors -----------------------------------------

    @contextlib.contextmanager
    def _translate(self, session_id: str | None, doing: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except sqlite3.Error as exc:
            kind = type(exc).__name__
            hint = ""
            text = str(exc)
            if "locked" in text or "busy" in text:
                hint = "; another process holds the write lock: retry, or raise timeout="
            elif "readonly" in text or "read-only" in text:
                hint = "; the file or its folder is read-only: fix permissions"
            elif "full" in text:
                hint = "; the disk is full: free space, then restart the session"
            elif "not a database" in text or "malformed" in text:
                hint = "; the file is not a (healthy) SQLite database"
            raise StoreError(
                f"could not {doing} in {self.path}: {kind}: {text}{hint}", session_id=session_id
            ) from exc
        except CodecError as exc:
            raise StoreError(
                f"stored event is malformed in {self.path}: {exc}", session_id=session_id
            ) from exc
        except (UnicodeEncodeError, OverflowError) as exc:  # what sqlite3 cannot bind
            raise StoreError(
                f"could not {doing} in {self.path}: {type(exc).__name__}: {exc}; session ids "
                "must be valid Unicode text and seqs below 2**63",
                session_id=session_id,
            ) from exc

    @contextlib.contextmanager
    def _locked(self, session_id: str | None, doing: str) -> Iterator[sqlite3.Connection]:
        with self._lock, self._translate(session_id, doing):
            if self._closed:
                raise StoreError(f"the store {self.path} is closed; open a new one")
            if self._lost is not None:
                raise StoreError(self._lost)
            yield self._conn

    @contextlib.contextmanager
    def _transaction(
        self, session_id: str | None, doing: str, *, synced: bool = True
    ) -> Iterator[sqlite3.Connection]:
        """A write transaction; ``synced=False`` commits it without an fsync of its own
        even under ``durability="full"`` (for claims and releases: a claim lost with
        the machine's power is lost with its holder too; the next transaction that
        is fsynced carries it to disk, since the WAL is written in order)."""
        with self._locked(session_id, doing) as conn:
            relax = not synced and self.durability == "full"
            if relax:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                self._begin(conn)
                try:
                    yield conn
                    self._check_file()  # under the write lock, before anything is committed
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                if relax:
                    conn.execute("PRAGMA synchronous = FULL")

    def _begin(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting at most ``timeout`` for another process's write lock
        in steps of at most `_BUSY_STEP_S`: SQLite's own busy handler sleeps up to 100 ms
        a time, long after the lock is free, which several processes writing one file
        (web workers) pay on almost every transaction."""
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            deadline = time.monotonic() + self._busy_wait
            step = _BUSY_FIRST_S
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    locked = "locked" in str(exc) or "busy" in str(exc)
                    if not locked or time.monotonic() >= deadline:
                        raise
                time.sleep(step)
                step = min(step * 2, _BUSY_STEP_S)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    def _check_file(self) -> None:
        """Fail closed if the path no longer names the file opened (one `stat` a transaction)."""
        if self._file is None:
            return
        full, dev, ino = self._file
        try:
            st = os.stat(full)
        except OSError:
            same = False
        else:
            same = (st.st_dev, st.st_ino) == (dev, ino)
        if not same:
            self._lost = (
                f"the database file {self.path} was removed or replaced while the store had "
                "it open (was its folder deleted?), so nothing more is acknowledged: what was "
                "written since is not in any file at that path; restore the file or open a "
                "new store, then restart the sessions"
            )
            raise StoreError(self._lost)

    _valid_id = staticmethod(valid_store_id)

    # -- the Store protocol --------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        with self._locked(session_id, "load the session") as conn:
            rows = conn.execute(
                "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
            return [event_from_row(*row) for row in rows]

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        """Store each session's events in one transaction (see `Store.write`).

        Raises:
            StoreError: nothing was stored: a session id is not valid (see
                `nous_actor.core.ids`), the file was removed or replaced, or SQLite failed.
        """
        batches = [
            (
                self._valid_id(sid),
                [
                    (sid, ev.seq, ev.type.value, format_time(ev.time), encode_data(ev))
                    for ev in evs
                ],
            )
            for sid, evs in appends.items()
            if evs
        ]
        refused: dict[str, StoreError] = {}
        if not batches:
            return refused
        only = batches[0][0] if len(batches) == 1 else None
        with self._transaction(only, "append events") as conn:
            # Every session's rows in one statement (each statement hands the GIL
            # back and forth); only when one of them conflicts, session by session.
            conn.execute("SAVEPOINT batch_write")
            try:
                _insert_rows(conn, [row for _, rows in batches for row in rows])
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK TO batch_write")
                self._write_each(conn, batches, refused)
            conn.execute("RELEASE batch_write")
        return refused

    @staticmethod
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

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        with self._transaction(session_id, "drop snapshotted events") as conn:
            conn.executemany(
                "DELETE FROM events WHERE session_id = ? AND seq = ?",
                [(session_id, s) for s in seqs],
            )

    def sessions(self) -> list[str]:
        with self._locked(None, "list sessions") as conn:
            rows = conn.execute("SELECT DISTINCT session_id FROM events ORDER BY session_id")
            return [r[0] for r in rows]

    def delete(self, session_id: str) -> None:
        with self._transaction(session_id, "delete the session") as conn:
            conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM writers WHERE session_id = ?", (session_id,))

    def claim(self, session_id: str) -> str:
        """Become the one writer of `session_id` (see `Store.claim`).

        A claim left by a process that has ended (exited, killed, or dead but
        not yet reaped by its parent) is taken over.

        Raises:
            ConflictError: a live writer holds the session, in this process or another.
            StoreError: `session_id` is not valid (see `nous_actor.core.ids`), or the store failed.
        """
        (got,) = self.claim_many([session_id])
        if isinstance(got, ConflictError):
            raise got
        return got

    # -- batches (optional methods: the sessions layer uses them when a store has them) ---

    def claim_many(self, session_ids: Sequence[str]) -> list[str | ConflictError]:
        """`claim` each of `session_ids` in one transaction: for each id, in order, its
        token or the `ConflictError` that refused it (an id given twice is refused the
        second time: its first claim holds it).

        Raises:
            StoreError: nothing was claimed: an id is not valid (see `nous_actor.core.ids`),
                or the store failed.
        """
        ids = [self._valid_id(sid) for sid in session_ids]
        out: list[str | ConflictError] = []
        if not ids:
            return out
        pid = os.getpid()
        since = datetime.now(UTC).isoformat()
        taken: list[str] = []
        only = ids[0] if len(ids) == 1 else None
        try:
            with self._transaction(only, "claim the session", synced=False) as conn, _live_lock:
                held: dict[str, tuple[int, str]] = {}
                for lo in range(0, len(ids), _IN_CHUNK):
                    chunk = ids[lo : lo + _IN_CHUNK]
                    held.update(
                        (sid, (holder_pid, holder_token))
                        for sid, holder_pid, holder_token in conn.execute(
                            "SELECT session_id, pid, token FROM writers WHERE session_id IN "
                            f"({','.join('?' * len(chunk))})",
                            chunk,
                        )
                    )
                rows: list[tuple[str, int, str, str]] = []
                for sid in ids:
                    holder = held.get(sid)
                    if holder is not None and _holder_alive(*holder, pid):
                        where = "this process" if holder[0] == pid else f"process {holder[0]}"
                        out.append(
                            ConflictError(
                                f"already has a live writer in {where}; use that session's "
                                "handle, or stop it first",
                                session_id=sid,
                            )
                        )
                        continue
                    token = uuid.uuid4().hex
                    # Under _live_lock and before COMMIT: another store object of this
                    # process that reads the row next also finds the token live.
                    _live_tokens.add(token)
                    taken.append(token)
                    held[sid] = (pid, token)
                    rows.append((sid, pid, token, since))
                    out.append(token)
                conn.executemany(
                    "INSERT OR REPLACE INTO writers (session_id, pid, token, since) "
                    "VALUES (?, ?, ?, ?)",
                    rows,
                )
                asked = self._asked & {row[0] for row in rows}
                if asked:  # a claim withdraws this process's own hand-off requests
                    conn.executemany(
                        "DELETE FROM handoffs WHERE session_id = ? AND pid = ?",
                        [(sid, pid) for sid in asked],
                    )
                    self._asked -= asked
        except BaseException:
            with _live_lock:
                _live_tokens.difference_update(taken)
            raise
        return out

    def load_many(self, session_ids: Sequence[str]) -> dict[str, list[Event] | StoreError]:
        """`load` each of `session_ids` in one read: each id maps to its events in seq
        order, or to the `StoreError` that says why that session alone could not be
        read (a malformed row fails its own session, never the others).

        Raises:
            StoreError: nothing was read: an id is not valid, or the store failed.
        """
        ids = list(dict.fromkeys(self._valid_id(sid) for sid in session_ids))
        rows: list[tuple[str, int, str, str, str | bytes]] = []
        with self._locked(None, "load the sessions") as conn:
            for lo in range(0, len(ids), _IN_CHUNK):
                chunk = ids[lo : lo + _IN_CHUNK]
                rows += conn.execute(
                    "SELECT session_id, seq, type, time, data FROM events WHERE session_id IN "
                    f"({','.join('?' * len(chunk))}) ORDER BY session_id, seq",
                    chunk,
                ).fetchall()
        out: dict[str, list[Event] | StoreError] = {sid: [] for sid in ids}
        events: list[Event] = []
        current: str | None = None
        for sid, seq, type_, time_, data in rows:
            if sid != current:
                current, events = sid, []
                out[sid] = events
            elif not isinstance(out[sid], list):
                continue  # a row of this session was malformed already
            try:
                events.append(event_from_row(seq, type_, time_, data))
            except CodecError as exc:
                out[sid] = StoreError(
                    f"stored event is malformed in {self.path}: {exc}", session_id=sid
                )
        return out

    def release(self, session_id: str, token: str) -> None:
        with _live_lock:
            _live_tokens.discard(token)
        if self._closed or self._lost is not None:
            return
        with self._transaction(session_id, "release the session", synced=False) as conn:
            conn.execute(
                "DELETE FROM writers WHERE session_id = ? AND token = ?", (session_id, token)
            )

    # -- extras --------------------------------------------------------------------------

    def index(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Every stored session's size, next seq, latest time and holder, sorted by id, in
        one query; only ids starting with ``prefix``, after ``after``, at most ``limit``.

        No event is decoded, so a session with a damaged row is still listed
        (a damaged time or seq is reported in its `error`). Used by
        `nous_actor.store.list_sessions` (which checks the arguments).

        Raises:
            StoreError: the store failed as a whole (closed, file gone, SQLite error).
        """
        where, params = [], []
        if prefix:
            where.append("substr(session_id, 1, ?) = ?")
            params += [len(prefix), prefix]
        if after is not None:
            where.append("session_id > ?")
            params.append(after)
        params.append(-1 if limit is None else limit)
        with self._locked(None, "list sessions") as conn:
            rows = conn.execute(
                "SELECT g.session_id, g.n, g.top, g.last, w.pid, w.token FROM "
                "(SELECT session_id, COUNT(*) AS n, MAX(seq) AS top, MAX(time) AS last "
                f"FROM events {'WHERE ' + ' AND '.join(where) if where else ''} "
                "GROUP BY session_id ORDER BY session_id LIMIT ?) AS g "
                "LEFT JOIN writers AS w ON w.session_id = g.session_id ORDER BY g.session_id",
                params,
            ).fetchall()
        me = os.getpid()
        with _live_lock:
            return [
                dataclasses.replace(
                    _info(str(sid), count, top, last), holder=_holder_name(pid, token, me)
                )
                for sid, count, top, last, pid, token in rows
            ]

    # -- sharing with other processes (see nous_actor.store.shared) -------------------------

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        """The stored events of `session_id` with ``seq >= from_seq``, in seq order, read
        without a claim, on a connection of their own (never behind this store's writes).

        Raises:
            StoreError: the id is not valid, the store is closed or failed.
        """
        return shared.sqlite_load_since(self, session_id, from_seq)

    def watch(
        self, session_id: str, from_seq: int = 0, *, buffer: int = 1000, timeout: float = 30.0
    ) -> Subscription:
        """Every committed event of `session_id` with ``seq >= from_seq``, exactly once, in
        seq order, from any process: the file is followed (``PRAGMA data_version``, every
        few milliseconds while anything watches it), so a commit is seen within ms.

        Raises:
            StoreError: the id is not valid, or the store is closed.
            TypeError, ValueError: `from_seq` or `buffer` is not valid.
        """
        return shared.sqlite_watch(self, session_id, from_seq, buffer=buffer, timeout=timeout)

    def next_seq(self, session_id: str) -> int:
        """The next seq of `session_id`'s stored history (0 if it has none), from any
        process, without a claim: one indexed read, nothing decoded.

        Raises:
            StoreError: the id is not valid, or the store is closed.
        """
        return shared.sqlite_next_seq(self, session_id)

    def held_by(self, session_id: str) -> str | None:
        """``"this process"`` or ``"process <pid>"`` holding a live claim on
        `session_id`, or `None`."""
        return shared.sqlite_held_by(self, session_id)

    def ask_handoff(self, session_id: str, seconds: float) -> None:
        """Ask whoever holds `session_id` to hand it over: a request of this process, in
        the file, standing for `seconds` (or until this process claims the session, or
        withdraws it)."""
        shared.sqlite_ask_handoff(self, session_id, seconds)

    def withdraw_handoff(self, session_id: str) -> None:
        """Take this process's request for `session_id` back."""
        shared.sqlite_withdraw_handoff(self, session_id)

    def handoff_requests(self) -> list[str]:
        """The sessions this process holds that a live process asks for."""
        return shared.sqlite_handoff_requests(self)

    def wait_changed(self, after: int, timeout: float) -> int:
        """Wait at most `timeout` s for a commit to the file (by any process) after the
        change counter `after`; returns the counter now."""
        return shared.sqlite_wait_changed(self, after, timeout)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
        shared.close_follower(self)

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result (``"ok"`` when healthy)."""
        with self._locked(None, "check integrity") as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} durability={self.durability}>"
