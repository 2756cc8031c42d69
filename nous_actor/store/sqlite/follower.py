"""Following a SQLite file: `SQLiteFollower`, one per `SQLiteStore`, which reads on
a connection of its own and notices every commit of any process, for the
store's watches and its waits (``wait_changed``).

A follower belongs to the store's connection (`connection._Connection`), which it
opens its own connection through and holds weakly: `follower_of` gives the
connection's follower (made on first use); `close_follower` ends it when the
store closes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Final

from nous_actor.core.codec import CodecError, events_from_rows
from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.runtime import forks, scheduling
from nous_actor.store.feed import FollowedWatch, _fill, prune_freed
from nous_actor.store.sqlite.bulk import query_on, session_rows
from nous_actor.store.sqlite.connection import _Connection, malformed
from nous_actor.store.subscription import Subscription

FOLLOW_INTERVAL: Final = 0.004
"""How often a SQLite file is looked at (``PRAGMA data_version``) while someone
watches it or waits for it to change: a commit of another process is seen within
this, plus the time to read it."""


class SQLiteFollower:
    """One SQLite store's look at its file: a connection of its own, read only, and a
    thread that notices every commit (``PRAGMA data_version``, every `FOLLOW_INTERVAL`
    while anyone watches or waits) and feeds the store's watches.

    It holds the store's connection weakly: a store nobody uses is collected, and the
    thread ends.
    """

    def __init__(self, connection: _Connection) -> None:
        self._store = weakref.ref(connection)
        self.path = connection.path
        self._cond = threading.Condition()
        self._conn_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.version = 0
        self._waiting = 0
        # Each session's watches, held weakly: a watch its reader dropped without closing
        # it is freed, and its entry goes at the thread's next look (``_gone``: the ids
        # of those the collector freed, appended without the lock). The thread would
        # otherwise feed it, and look at the file every `FOLLOW_INTERVAL` for it, for the
        # rest of the process.
        self._watches: dict[str, list[weakref.ref[FollowedWatch]]] = {}
        self._gone: list[str] = []
        self._poked = False
        self._ended: StoreError | None = None
        self._thread: threading.Thread | None = None

    # -- the connection --------------------------------------------------------------------

    def _store_or_fail(self) -> _Connection:
        store = self._store()
        if store is None or store.closed:
            raise StoreError(f"the store {self.path} is closed; open a new one")
        store.here()
        return store

    @contextlib.contextmanager
    def _held(self, session_id: str | None, doing: str) -> Iterator[sqlite3.Connection]:
        """The follower's own connection (made on first use), no other thread's while the
        block runs, its errors translated; the store's own for ``":memory:"``, which no
        other connection can see."""
        store = self._store_or_fail()
        if self.path == ":memory:":
            with store.locked(session_id, doing) as conn:
                yield conn
            return
        with self._conn_lock, store.translate(session_id, doing):
            if self._conn is None:  # (never made again at the path if it was removed)
                self._conn = store.open_again(5.0)
            yield self._conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read, on the follower's own connection."""
        with self._held(None, "read the store") as conn:
            return conn.execute(sql, params).fetchall()

    def rows(
        self, session_id: str, from_seq: int = 0, limit: int | None = None
    ) -> list[tuple[Any, ...]]:
        """A session's rows as `session_rows` reads them for a process that does not hold
        the session (``isolated``: as they were at one moment), on the follower's own
        connection, held for the whole read."""
        with self._held(session_id, "read the session") as conn:
            return session_rows(query_on(conn), session_id, from_seq, limit, isolated=True)

    def _mark(self) -> int:
        """What changes whenever anything is committed to the file."""
        store = self._store_or_fail()
        if self.path == ":memory:":
            with store.locked(None, "follow the store") as conn:
                return conn.total_changes
        return int(self.query("PRAGMA data_version")[0][0])

    def close(self) -> None:
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._end(StoreError(f"the store {self.path} was closed; the watch has ended"))
        with self._cond:
            self._cond.notify_all()

    # -- interest ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="nous-sqlite-follow", daemon=True
            )
            self._thread.start()

    def add(self, session_id: str, from_seq: int, buffer: int, timeout: float) -> FollowedWatch:
        self._store_or_fail()
        w = FollowedWatch(session_id, from_seq, buffer, timeout, self._remove, self.poke)
        with self._cond:
            if self._ended is not None:
                raise self._ended
            self._watches.setdefault(session_id, []).append(
                weakref.ref(w, partial(_freed, self._gone, session_id))
            )
            self._poked = True
            self._start()
            self._cond.notify_all()
        return w

    def _remove(self, sub: Subscription) -> None:
        with self._cond:
            ws = self._watches.get(sub.session_id, [])
            for ref in ws:
                if ref() is sub:
                    ws.remove(ref)
                    break
            if not ws:
                self._watches.pop(sub.session_id, None)

    def _prune(self) -> None:
        """Under ``_cond``: drop the entries of the watches the collector freed."""
        if prune_freed(self._gone, self._watches):
            self._cond.notify_all()  # (one waiting for nothing to be watched)

    def _live_watches(self) -> list[FollowedWatch]:
        """Under ``_cond``: the watches still held by someone."""
        self._prune()
        return [w for ws in self._watches.values() for ref in ws if (w := ref()) is not None]

    def poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def wait_changed(self, after: int, timeout: float) -> int:
        self._store_or_fail()
        with self._cond:
            self._start()
            if not (self._waiting or self._watches or self._poked):
                self._cond.notify_all()  # the thread may sleep with nothing to follow
            self._waiting += 1

        def changed() -> bool:
            return self.version > after or self._ended is not None

        def block(bound: float | None) -> bool:
            with self._cond:
                return self._cond.wait_for(changed, bound)

        try:
            # Through the host: a simulation's clock bounds it too (the file's changes
            # come from this follower's thread, in real time, which it does not run).
            scheduling.current().wait(changed, max(timeout, 0.0), block)
        finally:
            with self._cond:
                self._waiting -= 1
        if self._ended is not None:
            raise self._ended
        return self.version

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        last: int | None = None
        while True:
            with self._cond:
                self._prune()
                while not (self._watches or self._waiting or self._poked):
                    store = self._store()
                    if self._ended is not None or store is None or store.closed:
                        return
                    del store
                    self._cond.wait(1.0)
                if self._ended is not None:
                    return
                poked, self._poked = self._poked, False
            try:
                mark = self._mark()
                changed = mark != last
                last = mark
                if changed:
                    with self._cond:
                        self.version += 1
                        self._cond.notify_all()
                more = self._feed(everyone=changed or poked) if (changed or poked) else False
            except StoreError as exc:
                self._end(exc)
                return
            if not more:
                with self._cond:
                    if not self._poked:
                        self._cond.wait(FOLLOW_INTERVAL)

    def _feed(self, everyone: bool) -> bool:
        with self._cond:
            watches = self._live_watches()
        more = False
        for w in watches:
            if everyone or w.starved:
                more |= _fill(w, self._read)
        return more

    def _read(self, session_id: str, from_seq: int, limit: int) -> list[Event]:
        rows = self.rows(session_id, from_seq, limit)
        try:
            return events_from_rows(rows)
        except CodecError as exc:
            raise malformed(self.path, session_id, exc) from exc

    def _end(self, err: StoreError) -> None:
        with self._cond:
            if self._ended is None:
                self._ended = err
            watches = self._live_watches()
            self._watches.clear()
            self._cond.notify_all()
        for w in watches:
            w._finish(err)


def _freed(gone: list[str], session_id: str, ref: weakref.ref[FollowedWatch]) -> None:
    """(The collector's, as it frees a watch of ``session_id``.) Note it for the follower,
    which drops its entry under its lock (this takes none: it may run in any thread)."""
    gone.append(session_id)


_followers: weakref.WeakKeyDictionary[_Connection, SQLiteFollower] = weakref.WeakKeyDictionary()
_followers_lock = forks.lock()


def follower_of(connection: _Connection) -> SQLiteFollower:
    """The one `SQLiteFollower` of a store's ``connection`` (made on first use)."""
    with _followers_lock:
        f = _followers.get(connection)
        if f is None:
            f = _followers[connection] = SQLiteFollower(connection)
        return f


def close_follower(connection: _Connection) -> None:
    """End the follower of a store's ``connection``, if it has one (the store is closing)."""
    with _followers_lock:
        f = _followers.pop(connection, None)
    if f is not None:
        f.close()
