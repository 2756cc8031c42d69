"""A SQLite store's connection: opening one, the one place sqlite3's errors are
translated, calls made under the store's lock, and write transactions (with
how long one waits for another process's write lock, and how many ids one
statement binds).

`_Connection` is the bottom of `SQLiteStore`: what every call of the store
goes through. ``_connect`` is the one method that opens a connection (the
store's own and its follower's), so a subclass may override it (the viewer's
read-only store does).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Final, Literal

from nous_actor.core.codec import CodecError
from nous_actor.errors import StoreError
from nous_actor.store.base import ClosingStore, valid_store_id

_IN_CHUNK: Final = 500
"""Ids bound in one ``IN (...)`` (far below SQLite's bound on parameters)."""

_BUSY_FIRST_S: Final = 0.0002
_BUSY_STEP_S: Final = 0.002
"""How long a write transaction waits, at first and at most, before it looks again
for another process's write lock (see `SQLiteStore._begin`)."""


class _Connection(ClosingStore):
    """The connection of a `SQLiteStore` and the calls made on it (see there)."""

    path: str
    durability: Literal["full", "normal"]
    _busy_wait: float
    _busy_ms: int
    _asked: set[str]  # sessions this store asked for (store.shared)
    _dropped: int  # bytes dropped by snapshots since the last vacuum (`vacuum`)
    _vacuum_skipped: bool  # told the log that the file is too large to vacuum
    _lock: threading.Lock
    _closed: bool
    _lost: str | None
    _file: tuple[str, int, int] | None  # (absolute path, st_dev, st_ino)
    _conn: sqlite3.Connection
    _cookie: int = -1  # the schema cookie last checked (`_check_schema`); -1: not yet

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
                    self._check_schema(conn)  # before anything is written
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

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Refuse to write a file whose schema is not ours any more (`_Opening` checks)."""
        raise NotImplementedError

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
