"""A SQLite store's connection: `_Connection`, the object that owns it.

It holds the store's ``sqlite3`` connections (one that reads, and for a file one
that writes, made at the first write), the lock every call takes, whether the
store is closed or has failed (and why), the identity of the file it opened and
the bytes snapshots dropped since the last vacuum; it is the one place sqlite3's
errors are translated, and it runs writes (with how long one waits for another
process's write lock, and how many ids one statement binds). Its `_Opening`
(`schema`) opens the file and, at each write, says whether the file is still one
this process may write.

Why two connections: SQLite's busy handler must be on for reads (a reader may meet
a lock for a moment, e.g. while another process checkpoints) and off for writes
(the processes of this release queue for the file's turn first, `WriteLock`; a
write then polls in short steps for a writer that does not queue, where SQLite's
handler sleeps up to 100 ms a time). One connection switched between the two
paid two statements a write, each handing the GIL back and waiting to take it
again, which in a process with many busy threads took longer than the write.

``connect`` is the one method that opens a connection (the store's own and its
follower's), so a subclass may override it (the viewer's read-only store does).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

from nous_actor.core.codec import CodecError
from nous_actor.errors import StoreError
from nous_actor.runtime import forks
from nous_actor.store.sqlite.schema import _Opening
from nous_actor.store.sqlite.writelock import NO_QUEUE as _NO_QUEUE
from nous_actor.store.sqlite.writelock import WriteLock

UNBINDABLE: Final = (
    sqlite3.InterfaceError,  # a value of a type sqlite3 cannot bind
    sqlite3.DataError,  # a string or blob over SQLite's length limit
    OverflowError,  # an int past 64 bits
    UnicodeEncodeError,  # a str holding a lone surrogate
    ValueError,
    TypeError,
)
"""What binding a row can raise without the store itself being at fault."""

_IN_CHUNK: Final = 500
"""Ids bound in one ``IN (...)`` (far below SQLite's bound on parameters)."""

_BUSY_FIRST_S: Final = 0.0002
_BUSY_STEP_S: Final = 0.002
"""How long a write transaction waits, at first and at most, before it looks again
for another process's write lock (see `_Connection.begin`)."""


def malformed(path: object, session_id: str | None, exc: CodecError) -> StoreError:
    """The error of a stored row the codec refused (``exc`` names its column)."""
    return StoreError(f"stored event is malformed in {path}: {exc}", session_id=session_id)


_KEPT: list[sqlite3.Connection] = []
"""The connections of stores a forked child dropped: its parent's, never closed here."""


def _forget_connections(made: list[sqlite3.Connection], born: int) -> None:
    """A store collected without being closed: its connections are closed (one freed
    open warns, `ResourceWarning`, since Python 3.13). A forked child keeps its parent's
    as they are (closing one may checkpoint the parent's file)."""
    if forks.forked_since(born):
        _KEPT.extend(made)
    else:
        for conn in made:
            with contextlib.suppress(Exception):
                conn.close()
    made.clear()


class _Connection:
    """The connection of a `SQLiteStore` and the calls made on it (see the module).

    Opening it opens the file (``path``, checked by the store), or raises
    `StoreError` holding nothing.

    Attributes:
        path: the database file, or ``":memory:"``.
        durability: ``"full"`` or ``"normal"`` (see `nous_actor.store.sqlite`).
        busy_ms: how long SQLite itself waits for another process's lock on a read, in ms.
        lock: held by every call on either connection.
        conn: the ``sqlite3`` connection that reads (use it under ``lock``, through
            `locked`); for ``":memory:"`` it writes too (no other connection sees
            that database).
        closed: the store was closed.
        lost: why nothing more is written (the store failed closed), or ``None``.
        dropped: bytes dropped by snapshots since the last vacuum (`vacuum`).
        vacuum_skipped: the log was told that the file is too large to vacuum.
    """

    def __init__(
        self, path: str, durability: Literal["full", "normal"], timeout: float, create: bool
    ) -> None:
        self.path = path
        self.durability = durability
        self._busy_wait = timeout
        self.busy_ms = int(timeout * 1000)
        # Re-entrant: the committer holds it through a `turn`, then writes in it.
        self.lock = threading.RLock()
        self._born = forks.born()  # a forked child refuses it (`locked`)
        # Every connection made for the store (its follower's too): closed if the store is
        # collected without being closed (never at exit: appends may still be in flight).
        self._made: list[sqlite3.Connection] = []
        weakref.finalize(self, _forget_connections, self._made, self._born).atexit = False
        # The turn taken ahead of a write (`turn`, under ``lock``): ``True`` it came,
        # ``False`` it did not come in time, ``None`` none is taken ahead.
        self._ahead: bool | None = None
        # The connection that writes a file, its busy handler off (made at the first
        # write: `writer`); ``conn`` itself for ``":memory:"``.
        self._wconn: sqlite3.Connection | None = None
        self.closed = False
        self.lost: str | None = None
        self.dropped = 0
        self.vacuum_skipped = False
        self._opening = _Opening(path, self.connect)
        with self.translate(None, "open the store"):
            self.conn = self._opening.open(timeout, create)
        self._file = self._opening.file  # (absolute path, st_dev, st_ino), or None
        self._queue = _NO_QUEUE if self._file is None else WriteLock(self._file[0])
        if self._file is None:
            self._wconn = self.conn

    def connect(self, target: str, timeout: float, uri: bool) -> sqlite3.Connection:
        """A new connection to ``target`` with the store's settings."""
        conn = sqlite3.connect(
            target, timeout=timeout, isolation_level=None, check_same_thread=False, uri=uri
        )
        self._made.append(conn)
        try:  # connection settings only: nothing here writes to the file (a timeout of 0:
            # no busy handler, as the connection that writes has it)
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self.durability.upper()}")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the connections (once; later calls raise `StoreError`). In a process
        forked from the one that opened them they are only forgotten: they are that
        process's (closing a SQLite connection may checkpoint the file)."""
        if forks.forked_since(self._born):
            self.closed = True
            return
        with self.lock:
            if not self.closed:
                self.closed = True
                wconn, self._wconn = self._wconn, None
                if wconn is not None and wconn is not self.conn:
                    wconn.close()
                self.conn.close()
                self._queue.close()

    def writer(self) -> sqlite3.Connection:
        """(Under ``lock``.) The connection that writes: for a file, a connection of its
        own whose busy handler is off (made now if this is the first write), which never
        creates the file; for ``":memory:"``, `conn`.

        Raises:
            StoreError: the file was removed or replaced before the first write (the
                store fails closed, as a write finds it at any other time).
            sqlite3.Error: SQLite could not open it (the caller translates it).
        """
        wconn = self._wconn
        if wconn is None:
            wconn = self._wconn = self.open_again(0.0)
        return wconn

    def open_again(self, timeout: float) -> sqlite3.Connection:
        """Another connection to the file the store opened (not ``":memory:"``), by its
        absolute path with ``mode=rw``: one that never makes a new file at the path
        (SQLite's default, ``rwc``, would make an empty one where the store's was
        removed, which every later read then finds without the store's tables, and
        which outlives the store).

        Raises:
            StoreError: the path no longer names the file the store opened (removed or
                replaced): the store fails closed, as a write finds it at any other time,
                and says so rather than "cannot open".
            sqlite3.Error: SQLite could not open it (the caller translates it).
        """
        assert self._file is not None
        self.check_file()
        return self.connect(f"{Path(self._file[0]).as_uri()}?mode=rw", timeout, uri=True)

    def release_file(self) -> None:
        """Every connection to the file is closed (the store's and its follower's): an
        opening in this process may read the file's header again (`schema._held`)."""
        self._opening.release()

    # -- one place to translate sqlite3 errors -----------------------------------------

    @contextlib.contextmanager
    def translate(self, session_id: str | None, doing: str) -> Iterator[None]:
        """Raise what sqlite3 (or the codec) raises inside as `StoreError`, saying what to do."""
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
            elif "unable to open" in text:
                hint = "; its folder must exist and be writable by this user" + (
                    "; '~' is not expanded: pass Path(path).expanduser()"
                    if "~" in self.path
                    else ""
                )
            raise StoreError(
                f"could not {doing} in {self.path}: {kind}: {text}{hint}", session_id=session_id
            ) from exc
        except CodecError as exc:
            raise malformed(self.path, session_id, exc) from exc
        except (UnicodeEncodeError, OverflowError) as exc:  # what sqlite3 cannot bind
            raise StoreError(
                f"could not {doing} in {self.path}: {type(exc).__name__}: {exc}; session ids "
                "must be valid Unicode text and seqs below 2**63",
                session_id=session_id,
            ) from exc

    def here(self, session_id: str | None = None) -> None:
        """`StoreError` if this process forked from the one that opened the store."""
        if forks.forked_since(self._born):
            refused = forks.refusal(f"the store {self.path}", self._born)
            raise StoreError(refused, session_id=session_id)

    @contextlib.contextmanager
    def locked(self, session_id: str | None, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with its errors translated; `StoreError` if
        the store is closed or has failed (or this process forked from the one that
        opened it: see `nous_actor.runtime.forks`)."""
        self.here(session_id)  # (before its lock: a parent's thread may hold it)
        with self.lock, self.translate(session_id, doing):
            if self.closed:
                raise StoreError(f"the store {self.path} is closed; open a new one")
            if self.lost is not None:
                raise StoreError(self.lost)
            yield self.conn

    @contextlib.contextmanager
    def transaction(
        self, session_id: str | None, doing: str, *, synced: bool = True
    ) -> Iterator[sqlite3.Connection]:
        """A write transaction; ``synced=False`` commits it without an fsync of its own
        even under ``durability="full"`` (for claims and releases: a claim lost with
        the machine's power is lost with its holder too; the next transaction that
        is fsynced carries it to disk, since the WAL is written in order)."""
        with self.locked(session_id, doing):
            conn = self.writer()
            relax = not synced and self.durability == "full"
            # The connection's settings change before the turn is taken and change back
            # after it is given up: other processes wait for the turn, not for them.
            if relax:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self.queued() as deadline:
                    self.begin(conn, deadline)
                    try:
                        self.check_writable(conn)  # before anything is written
                        yield conn
                        self.check_file()  # under the write lock, before anything is committed
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
            finally:
                if relax:
                    conn.execute("PRAGMA synchronous = FULL")

    def write_at_once(
        self, session_id: str | None, doing: str, sql: str, params: list[Any], rows: int
    ) -> bool:
        """Make ``rows`` rows in one statement that is its own transaction (SQLite
        commits it as it ends: no ``BEGIN``, no ``COMMIT``, no statement that looks at
        the file's schema first), in this store's turn, on the connection that writes;
        ``sql`` ends with `STILL_OURS`, bound here after ``params``. Whether it wrote
        them: ``False`` if it wrote nothing, and a write transaction must (and says
        why): another writer's lock, a row refused, a value not bound, the file's schema
        changed or not yet looked at.

        The common write of a busy process is this one statement, where a transaction
        is four (``BEGIN``, the schema's check, the insert, ``COMMIT``): each hands the
        GIL back and waits to take it again, which with many threads busy takes longer
        than the write, the file's turn held meanwhile.

        Raises:
            StoreError: the store is closed or failed; its file was removed or replaced;
                SQLite failed otherwise.
        """
        with self.locked(session_id, doing):
            expected = self._opening.expected()
            if expected is None:
                return False
            conn = self.writer()
            with self.queued():
                self.check_file()  # the file still the one opened, before anything is written
                # Counted as the connection's changes, the rows its triggers make too (a
                # view's trigger makes every row of a statement into it: `CALL_EVENTS`).
                before = conn.total_changes
                try:
                    conn.execute(sql, [*params, *expected])
                except (sqlite3.IntegrityError, sqlite3.OperationalError, *UNBINDABLE):
                    return False  # (a statement that fails writes nothing)
                done = conn.total_changes - before
            if done and done != rows:  # (a statement is all or nothing: never seen)
                raise StoreError(f"{doing}: one statement made {done} rows of {rows}")
            return done == rows

    @contextlib.contextmanager
    def turn(self) -> Iterator[bool]:
        """This store's turn at writing the file, taken ahead of a write: whether it came
        (``False`` if the store is closed or failed: the write says why; or if the turn
        did not come within the store's timeout: a write in the block then fails at once,
        as a write that waited for it itself does, instead of waiting that long again).
        The connection's lock is held throughout, and a write transaction made in the
        block (by this thread) takes no other turn.

        For the committer: it fills its transaction once the turn came, so what its
        sessions sent while other processes wrote the file goes in the same commit, not
        in the next one, which would wait for them again."""
        with self.lock:
            if self.closed or self.lost is not None or self._ahead is not None:
                yield False
                return
            came = self._ahead = self._queue.acquire(self._busy_wait)
            try:
                yield came
            finally:
                self._ahead = None
                if came:
                    self._queue.release()

    @contextlib.contextmanager
    def queued(self) -> Iterator[float]:
        """This store's turn at writing the file among the processes that write it (see
        `WriteLock`), held until the block ends (or the `turn` taken ahead, under the
        connection's lock, as every caller of this is); it yields the deadline
        (``time.monotonic``) that the wait for SQLite's own lock keeps to.

        Raises:
            sqlite3.OperationalError: the turn did not come within the store's timeout.
        """
        deadline = time.monotonic() + self._busy_wait
        if self._ahead:
            yield deadline
            return
        if self._ahead is False or not self._queue.acquire(self._busy_wait):
            raise sqlite3.OperationalError(
                "database is locked: another process kept its turn to write past the "
                f"timeout (the lock file {self._queue.path})"
            )
        try:
            yield deadline
        finally:
            self._queue.release()

    def begin(self, conn: sqlite3.Connection, deadline: float) -> None:
        """``BEGIN IMMEDIATE`` on the connection that writes (`writer`), waiting until
        ``deadline`` (``time.monotonic``) for another process's write lock in steps of at
        most `_BUSY_STEP_S`: SQLite's own busy handler (off on that connection) sleeps up
        to 100 ms a time, long after the lock is free.

        Called inside `queued`: the processes of this release queue for the file's
        `WriteLock` first, so this finds the lock taken only by a writer that does not
        queue (another tool, an older release)."""
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

    # -- every write transaction: is the file still one this process may write? ----------

    def check_writable(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction, before anything is written: the file's schema is
        still ours (see `_Opening.still_ours`).

        Raises:
            StoreError: not so; the store fails closed (every later call raises it).
        """
        lost = self._opening.still_ours(conn)
        if lost is not None:
            self.lost = lost
            raise StoreError(lost)

    def check_file(self) -> None:
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
            self.lost = (
                f"the database file {self.path} was removed or replaced while the store had "
                "it open (was its folder deleted?), so nothing more is acknowledged: what was "
                "written since is not in any file at that path; restore the file or open a "
                "new store, then restart the sessions"
            )
            raise StoreError(self.lost)
