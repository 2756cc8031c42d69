"""One store, many processes: reads without a claim, watches, and hand-off requests.

Any process may read any session from a store without holding it, and may ask
the process that holds a session to hand it over. These functions work on any
`Store`: each uses the store's own optional method of the same name when it
has one (`SQLiteStore`, `PostgresStore` and `MemoryStore` have all of them)
and a fallback built on the protocol's ``load`` otherwise, like
`nous_actor.store.list_sessions` with ``index``.

The optional methods a store of your own may offer (the shipped contract suite,
`nous_actor.testing.store_contract`, checks them when present):

* ``load_since(session_id, from_seq) -> list[Event]``: the stored events with
  ``seq >= from_seq``, in seq order, read without a claim (a committed prefix).
* ``watch(session_id, from_seq=0, *, buffer=1000, timeout=30.0) -> Subscription``:
  every committed event with ``seq >= from_seq``, exactly once, in seq order,
  from any process (this one need not write the session).
* ``held_by(session_id) -> str | None``: who holds a live claim on the session
  (``"process 4242"``, ``"host-a pid 4242"``), or ``None``.
* ``ask_handoff(session_id, seconds) -> None``: ask whoever holds the session
  (now, or in the next ``seconds``) to hand it over; the request stands for
  ``seconds`` unless withdrawn, and is this store object's own (on `SQLiteStore`
  this process's): a new request of it replaces its last one.
* ``withdraw_handoff(session_id) -> None``: take this store object's request back
  (it got the session, or gave up).
* ``handoff_requests() -> list[str]``: the sessions this store object (this
  process, for `SQLiteStore`) holds that another one asked for (a request that
  stands, of an asker still alive where the store can tell).
* ``wait_changed(after, timeout) -> int``: wait at most ``timeout`` seconds for
  anything to change in the store (a commit, a claim, a release, a request)
  after the change counter ``after``; returns the counter now.

Neither reading nor watching takes a claim, so neither ever blocks a writer.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from nous_actor.core.args import check_seconds as _check_seconds
from nous_actor.core.codec import CodecError, event_from_row, passing_event_from_row
from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.store.base import Store, valid_store_id
from nous_actor.store.subscription import Subscription

if TYPE_CHECKING:
    from nous_actor.store.sqlite import SQLiteStore

__all__ = [
    "FOLLOW_INTERVAL",
    "FollowedWatch",
    "ask_handoff",
    "handoff_requests",
    "held_by",
    "load_since",
    "next_seq",
    "supports_handoff",
    "wait_changed",
    "watch",
    "withdraw_handoff",
]

FOLLOW_INTERVAL: Final = 0.004
"""How often a SQLite file is looked at (``PRAGMA data_version``) while someone
watches it or waits for it to change: a commit of another process is seen within
this, plus the time to read it."""

FALLBACK_INTERVAL: Final = 0.05
"""How often a store without ``watch`` or ``wait_changed`` is read again by the
fallbacks here."""

DEFAULT_WATCH_BUFFER: Final = 1000


def _check_from_seq(from_seq: object) -> int:
    if not isinstance(from_seq, int) or isinstance(from_seq, bool):
        raise TypeError(f"from_seq must be an int >= 0, got {type(from_seq).__name__}")
    if from_seq < 0:
        raise ValueError(f"from_seq must be an int >= 0, got {from_seq}")
    return from_seq


# -- the functions users and the sessions layer call ------------------------------------------


def _own(store: Store, name: str) -> Any:
    """The store's own optional method ``name``, or ``None``."""
    method = getattr(store, name, None)
    return method if callable(method) else None


def load_since(store: Store, session_id: str, from_seq: int = 0) -> list[Event]:
    """The stored events of ``session_id`` with ``seq >= from_seq``, in seq order,
    read without claiming the session (``[]`` if it has none).

    Raises:
        TypeError, ValueError: ``from_seq`` is not an int >= 0.
        StoreError: the session id is not valid, or the store failed.
    """
    from_seq = _check_from_seq(from_seq)
    own: Callable[[str, int], list[Event]] | None = _own(store, "load_since")
    if own is not None:
        return list(own(session_id, from_seq))
    valid_store_id(session_id)
    return [ev for ev in store.load(session_id) if ev.seq >= from_seq]


def next_seq(store: Store, session_id: str) -> int:
    """The next seq of ``session_id``'s stored history (its last event's seq + 1, 0 if
    it has none), read without claiming the session and without decoding it when the
    store can tell by itself (SQLite: one indexed ``max``).

    Raises:
        StoreError: the session id is not valid, or the store failed.
    """
    own: Callable[[str], int] | None = _own(store, "next_seq")
    if own is not None:
        return int(own(session_id))
    events = load_since(store, session_id)
    return events[-1].seq + 1 if events else 0


def watch(
    store: Store,
    session_id: str,
    from_seq: int = 0,
    *,
    buffer: int = DEFAULT_WATCH_BUFFER,
    timeout: float = 30.0,
) -> Subscription:
    """A live feed of ``session_id``'s committed events with ``seq >= from_seq``, from
    any process: every one exactly once, in seq order, first those stored already,
    then each as it commits. Close it when done (``with`` works).

    A store without a ``watch`` of its own is read again every `FALLBACK_INTERVAL`
    seconds by a thread of the feed's own.

    Raises:
        TypeError, ValueError: ``from_seq`` or ``buffer`` is not valid.
        StoreError: the session id is not valid, or the store is closed.
    """
    from_seq = _check_from_seq(from_seq)
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"buffer must be an int >= 1, got {buffer!r}")
    own: Callable[..., Subscription] | None = _own(store, "watch")
    if own is not None:
        return own(session_id, from_seq, buffer=buffer, timeout=timeout)
    session_id = valid_store_id(session_id)
    store.load(session_id)  # a closed store says so now, not in the feed's thread
    return _PollingWatch(store, session_id, from_seq, buffer, timeout)


def held_by(store: Store, session_id: str) -> str | None:
    """Who holds a live claim on ``session_id`` (e.g. ``"process 4242"``), or ``None``
    if nobody does or the store cannot tell.

    Raises:
        StoreError: the session id is not valid, or the store failed.
    """
    own: Callable[[str], str | None] | None = _own(store, "held_by")
    if own is not None:
        return own(session_id)
    valid_store_id(session_id)
    return None


def supports_handoff(store: Store) -> bool:
    """Whether ``store`` carries hand-off requests (``ask_handoff`` and ``handoff_requests``)."""
    return _own(store, "ask_handoff") is not None and _own(store, "handoff_requests") is not None


def ask_handoff(store: Store, session_id: str, seconds: float) -> bool:
    """Ask the live holder of ``session_id`` to hand it over; the request stands for
    ``seconds``. ``False`` if the store carries no requests (then only waiting for
    the holder to let go by itself helps).

    Raises:
        TypeError, ValueError: ``seconds`` is not a finite number > 0.
        StoreError: the session id is not valid, or the store failed.
    """
    seconds = _check_seconds(seconds, "seconds")
    if not supports_handoff(store):
        valid_store_id(session_id)
        return False
    _own(store, "ask_handoff")(session_id, seconds)
    return True


def withdraw_handoff(store: Store, session_id: str) -> None:
    """Take back this store object's request for ``session_id`` (no-op if none, or if the
    store carries no requests).

    Raises:
        StoreError: the session id is not valid, or the store failed.
    """
    own: Callable[[str], None] | None = _own(store, "withdraw_handoff")
    if own is not None:
        own(session_id)


def handoff_requests(store: Store) -> list[str]:
    """The sessions this store object holds that another process asked for since it
    claimed them (``[]`` for a store that carries no requests).

    Raises:
        StoreError: the store failed.
    """
    own: Callable[[], Sequence[str]] | None = _own(store, "handoff_requests")
    return sorted(own()) if own is not None else []


def wait_changed(store: Store, after: int, timeout: float) -> int:
    """Wait at most ``timeout`` seconds until something changed in ``store`` after the
    change counter ``after`` (a commit, claim, release or hand-off request, by any
    process); returns the counter now (pass it as ``after`` next time; ``-1`` the
    first time returns at once).

    A store without a ``wait_changed`` of its own is taken to change every
    `FALLBACK_INTERVAL` seconds.

    Raises:
        StoreError: the store is closed or failed.
    """
    own: Callable[[int, float], int] | None = _own(store, "wait_changed")
    if own is not None:
        return own(after, timeout)
    if after >= 0:
        threading.Event().wait(min(max(timeout, 0.0), FALLBACK_INTERVAL))
    return after + 1


# -- a feed that a reading thread fills ------------------------------------------------------


class FollowedWatch(Subscription):
    """A feed of one session's committed events, filled by a thread that reads the store.

    A `nous_actor.Subscription` (``get(timeout)``, ``get_nowait()``, ``for ev in
    watch``, ``async for``, ``close()``). At most ``buffer`` events are held in
    memory; the rest wait in the store, so the feed is never cut off as
    lagging. It ends when closed, or when its store closes (then with
    `StoreError`).
    """

    def __init__(
        self,
        session_id: str,
        from_seq: int,
        buffer: int,
        timeout: float,
        on_close: Callable[[Subscription], None] | None,
        poke: Callable[[], None],
    ) -> None:
        super().__init__(
            session_id, from_seq=from_seq, buffer=buffer, timeout=timeout, on_close=on_close
        )
        self._poke = poke
        self.next_fetch = from_seq  # the reader's: the next seq to read from the store
        self.starved = False  # the buffer was full while rows were waiting

    def deliver(self, events: Sequence[Event]) -> bool:
        """Reader thread: add read events; ``False`` once the feed has ended."""
        with self._cond:
            if self._ended:
                return False
            self._items.extend(events)
            self._cond.notify_all()
            self._wake_async()
        return True

    def room(self) -> int:
        """Reader thread: how many events may be read ahead now (0: full, marked starved)."""
        with self._cond:
            if self._ended:
                return 0
            room = self.buffer - len(self._items)
            if room <= 0:
                self.starved = True
            return room

    @property
    def ended(self) -> bool:
        return self._ended

    def _pop_locked(self) -> Event:
        ev = super()._pop_locked()
        if self.starved and len(self._items) <= self.buffer // 2:
            self.starved = False
            self._poke()
        return ev

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return (
            f"<{type(self).__name__} session={self.session_id!r} {state} "
            f"next={self.next_fetch} pending={len(self._items)}>"
        )


def _fill(w: FollowedWatch, read: Callable[[str, int, int], list[Event]]) -> bool:
    """Read what ``w`` may take now; ``True`` if more may be waiting."""
    room = w.room()
    if room <= 0:
        return False
    events = read(w.session_id, w.next_fetch, room)
    if events:
        w.next_fetch = events[-1].seq + 1
        w.deliver(events)
    return len(events) >= room


class _PollingWatch(FollowedWatch):
    """The fallback feed: reads the store again every `FALLBACK_INTERVAL` on a thread."""

    def __init__(
        self, store: Store, session_id: str, from_seq: int, buffer: int, timeout: float
    ) -> None:
        self._wake = threading.Event()
        super().__init__(session_id, from_seq, buffer, timeout, None, self._wake.set)
        self._store = store
        threading.Thread(target=self._run, name="nous-watch", daemon=True).start()

    def _read(self, session_id: str, from_seq: int, limit: int) -> list[Event]:
        return load_since(self._store, session_id, from_seq)[:limit]

    def _run(self) -> None:
        while not self.ended:
            try:
                more = _fill(self, self._read)
            except StoreError as exc:
                self._finish(exc)
                return
            if not more:
                self._wake.wait(FALLBACK_INTERVAL)
                self._wake.clear()

    def close(self) -> None:
        super().close()
        self._wake.set()


# -- SQLite: following the file -----------------------------------------------------------------

_HANDOFFS_TABLE: Final = """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)"""

_ROWS: Final = (
    "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq LIMIT ?"
)


def _now_text(delta: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta)).isoformat()


class SQLiteFollower:
    """One SQLite store's look at its file: a connection of its own, read only, and a
    thread that notices every commit (``PRAGMA data_version``, every `FOLLOW_INTERVAL`
    while anyone watches or waits) and feeds the store's watches.

    It holds the store weakly: a store nobody uses is collected, and the thread ends.
    """

    def __init__(self, store: SQLiteStore) -> None:
        self._store = weakref.ref(store)
        self.path = store.path
        self._cond = threading.Condition()
        self._conn_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.version = 0
        self._waiting = 0
        self._watches: dict[str, list[FollowedWatch]] = {}
        self._poked = False
        self._ended: StoreError | None = None
        self._thread: threading.Thread | None = None

    # -- the connection --------------------------------------------------------------------

    def _store_or_fail(self) -> SQLiteStore:
        store = self._store()
        if store is None or store._closed:
            raise StoreError(f"the store {self.path} is closed; open a new one")
        return store

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read, on the follower's own connection (the store's own for
        ``":memory:"``, which no other connection can see)."""
        store = self._store_or_fail()
        if self.path == ":memory:":
            with store._locked(None, "read the store") as conn:
                return conn.execute(sql, params).fetchall()
        with self._conn_lock, store._translate(None, "read the store"):
            if self._conn is None:
                self._conn = store._connect(self.path, 5.0, uri=False)
            return self._conn.execute(sql, params).fetchall()

    def _mark(self) -> int:
        """What changes whenever anything is committed to the file."""
        store = self._store_or_fail()
        if self.path == ":memory:":
            with store._locked(None, "follow the store") as conn:
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
            self._watches.setdefault(session_id, []).append(w)
            self._poked = True
            self._start()
            self._cond.notify_all()
        return w

    def _remove(self, sub: Subscription) -> None:
        with self._cond:
            ws = self._watches.get(sub.session_id, [])
            if sub in ws:
                ws.remove(sub)
            if not ws:
                self._watches.pop(sub.session_id, None)

    def poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def wait_changed(self, after: int, timeout: float) -> int:
        self._store_or_fail()
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            self._start()
            if not (self._waiting or self._watches or self._poked):
                self._cond.notify_all()  # the thread may sleep with nothing to follow
            self._waiting += 1
            try:
                while self.version <= after and self._ended is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._ended is not None:
                    raise self._ended
                return self.version
            finally:
                self._waiting -= 1

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        last: int | None = None
        while True:
            with self._cond:
                while not (self._watches or self._waiting or self._poked):
                    store = self._store()
                    if self._ended is not None or store is None or store._closed:
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
            watches = [w for ws in self._watches.values() for w in ws]
        more = False
        for w in watches:
            if everyone or w.starved:
                more |= _fill(w, self._read)
        return more

    def _read(self, session_id: str, from_seq: int, limit: int) -> list[Event]:
        rows = self.query(_ROWS, (session_id, from_seq, limit))
        try:
            return [event_from_row(*r) for r in rows]
        except CodecError as exc:
            raise StoreError(
                f"stored event is malformed in {self.path}: {exc}", session_id=session_id
            ) from exc

    def _end(self, err: StoreError) -> None:
        with self._cond:
            if self._ended is None:
                self._ended = err
            watches = [w for ws in self._watches.values() for w in ws]
            self._watches.clear()
            self._cond.notify_all()
        for w in watches:
            w._finish(err)


# -- SQLite: the optional methods, for SQLiteStore to delegate to ------------------------------


def sqlite_load_since(store: SQLiteStore, session_id: str, from_seq: int) -> list[Event]:
    session_id = valid_store_id(session_id)
    from_seq = _check_from_seq(from_seq)
    # On the follower's connection: a read never waits behind this process's writes
    # (which may be waiting for another process's write lock).
    rows = follower_of(store).query(
        "SELECT seq, type, time, data FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq",
        (session_id, min(from_seq, 2**63 - 1)),
    )
    with store._translate(session_id, "load the session"):  # read to be looked at
        return [passing_event_from_row(*row) for row in rows]


def sqlite_next_seq(store: SQLiteStore, session_id: str) -> int:
    session_id = valid_store_id(session_id)
    rows = follower_of(store).query(
        "SELECT max(seq) FROM events WHERE session_id = ?", (session_id,)
    )
    last = rows[0][0] if rows else None
    return 0 if last is None else int(last) + 1


def sqlite_held_by(store: SQLiteStore, session_id: str) -> str | None:
    from nous_actor.store import sqlite

    session_id = valid_store_id(session_id)
    rows = follower_of(store).query(
        "SELECT pid, token FROM writers WHERE session_id = ?", (session_id,)
    )
    if not rows:
        return None
    pid, token = rows[0]
    me = os.getpid()
    with sqlite._live_lock:
        alive = token in sqlite._live_tokens if pid == me else sqlite._pid_alive(pid)
    if not alive:
        return None
    return "this process" if pid == me else f"process {pid}"


def sqlite_ask_handoff(store: SQLiteStore, session_id: str, seconds: float) -> None:
    session_id = valid_store_id(session_id)
    seconds = _check_seconds(seconds, "seconds")
    with store._transaction(session_id, "ask for the session", synced=False) as conn:
        conn.execute(_HANDOFFS_TABLE)
        conn.execute(
            "INSERT OR REPLACE INTO handoffs (session_id, pid, until) VALUES (?, ?, ?)",
            (session_id, os.getpid(), _now_text(seconds)),
        )
        store._asked.add(session_id)  # (under the store's lock, as a claim reads it)


def sqlite_withdraw_handoff(store: SQLiteStore, session_id: str) -> None:
    session_id = valid_store_id(session_id)
    if session_id not in store._asked:
        return  # never asked, or withdrawn by the claim that took the session
    with store._transaction(session_id, "withdraw the request", synced=False) as conn:
        conn.execute(
            "DELETE FROM handoffs WHERE session_id = ? AND pid = ?", (session_id, os.getpid())
        )
        store._asked.discard(session_id)


def sqlite_handoff_requests(store: SQLiteStore) -> list[str]:
    from nous_actor.store import sqlite

    try:
        rows = follower_of(store).query(
            "SELECT h.session_id, w.token, h.pid FROM handoffs AS h JOIN writers AS w "
            "ON w.session_id = h.session_id WHERE w.pid = ? AND h.pid <> w.pid "
            "AND h.until > ?",
            (os.getpid(), _now_text()),
        )
    except StoreError as exc:
        if "no such table" in str(exc):  # nobody ever asked
            return []
        raise
    with sqlite._live_lock:
        # Several processes may ask for one session: one row each.
        held = [(str(sid), pid) for sid, token, pid in rows if token in sqlite._live_tokens]
        stale = {
            (str(sid), str(token)) for sid, token, _ in rows if token not in sqlite._live_tokens
        }
    for sid, token in sorted(stale):  # a claim of this process that no session holds any
        store.release(sid, token)  # more (its release failed): let the asker have it
    alive: dict[int, bool] = {}
    # An asker that died asks nothing, and never hides the request of one that lives.
    return sorted({sid for sid, pid in held if alive.setdefault(pid, sqlite._pid_alive(pid))})


def sqlite_watch(
    store: SQLiteStore,
    session_id: str,
    from_seq: int = 0,
    *,
    buffer: int = DEFAULT_WATCH_BUFFER,
    timeout: float = 30.0,
) -> FollowedWatch:
    session_id = valid_store_id(session_id)
    from_seq = _check_from_seq(from_seq)
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"buffer must be an int >= 1, got {buffer!r}")
    return follower_of(store).add(session_id, from_seq, buffer, timeout)


def sqlite_wait_changed(store: SQLiteStore, after: int, timeout: float) -> int:
    return follower_of(store).wait_changed(after, timeout)


_followers: weakref.WeakKeyDictionary[SQLiteStore, SQLiteFollower] = weakref.WeakKeyDictionary()
_followers_lock = threading.Lock()


def follower_of(store: SQLiteStore) -> SQLiteFollower:
    """The one `SQLiteFollower` of ``store`` (made on first use)."""
    with _followers_lock:
        f = _followers.get(store)
        if f is None:
            f = _followers[store] = SQLiteFollower(store)
        return f


def close_follower(store: SQLiteStore) -> None:
    """End ``store``'s follower, if it has one (the store is closing)."""
    with _followers_lock:
        f = _followers.pop(store, None)
    if f is not None:
        f.close()
