"""Live feeds of `nous_actor.store.postgres`: `PostgresWatch`, and the listener feeding it.

`_Listener` is one store's listening connection and its thread: ``LISTEN``
on the store's channel wakes it (hand-off requests, releases), and, while the
store watches a session, on its commit channel too; it reads each watched
session's new rows by seq into its `PostgresWatch` feeds, counts every change
for `wait_changed`, and remembers the sessions another process asks this one
to hand over. A store that watches nothing never hears other processes'
commits: a process holding sessions is not woken by every commit of every
other process.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
import weakref
from functools import partial
from typing import Any, Final

import psycopg
from psycopg import sql

from nous_actor.core.codec import CodecError, event_from_row
from nous_actor.errors import StoreError
from nous_actor.store.feed import FollowedWatch, prune_freed
from nous_actor.store.postgres.connection import _Context, _Link, _refusal
from nous_actor.store.postgres.failures import _PERMANENT_CONNECT_SQLSTATES, _connection_lost
from nous_actor.store.postgres.schema import _Sql
from nous_actor.store.subscription import Subscription

_IDLE_CHECK_S: Final = 5.0  # the listener checks an idle connection this often

_REFUSALS_TO_END: Final = 3
"""How many refusals for good in a row (the database dropped, the role dropped, the
password changed: see `_PERMANENT_CONNECT_SQLSTATES`), spread over at least the store's
timeout, end the store's watches: a server restarting refuses nothing for good, and is
waited for however long it takes."""


class PostgresWatch(FollowedWatch):
    """A live feed of one session's committed events, read from PostgreSQL.

    A `nous_actor.Subscription` (``get(timeout)``, ``get_nowait()``,
    ``for ev in watch``, ``async for``, ``close()``), fed by the store's
    listener: every committed event with ``seq >= from_seq`` exactly once, in
    seq order. At most ``buffer`` events are held in memory; the rest wait in
    the database, so the feed is never cut off as lagging. It ends (after the
    pending events) when closed, or when its store closes (then with
    `StoreError`).
    """

    def __init__(
        self,
        listener: _Listener,
        session_id: str,
        from_seq: int,
        buffer: int,
        timeout: float,
    ) -> None:
        super().__init__(session_id, from_seq, buffer, timeout, listener.remove, listener.poke)
        self.dirty = True  # the listener's: there may be rows to read


class _Listener:
    """One store's listening connection and its thread, feeding every watch of the store."""

    def __init__(self, ctx: _Context, q: _Sql, closing: threading.Event, holder: str) -> None:
        self.where = ctx.location
        self.channel = q.channel
        self.commits = q.commits
        self.hearing = False  # LISTENing on the commit channel (on this connection)
        self.events_table = q.events
        self.closing = closing
        self.mutex = threading.Lock()
        # Each session's watches, held weakly: a watch its reader dropped without closing
        # it is freed, and its entry goes at the thread's next look (``gone``: the ids of
        # those the collector freed, appended without the lock; the thread is woken).
        self.watches: dict[str, list[weakref.ref[PostgresWatch]]] = {}
        self.gone: list[str] = []
        self.ctx = ctx
        self.link = _Link("listen", ctx, closing)
        self.fresh = True
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.ended: StoreError | None = None
        # Change counter (every notification, every reconnect) for wait_changed, and the
        # sessions this store holds that another process asked for (ask_handoff).
        self.changed = threading.Condition(self.mutex)
        self.version = 0
        self.asked: dict[str, dict[str, float]] = {}  # id -> {asker: until (monotonic)}
        self.me = holder
        self.thread = threading.Thread(target=self._run, name="nous-postgres-listen", daemon=True)
        self.thread.start()

    def add(self, session_id: str, from_seq: int, buffer: int, timeout: float) -> PostgresWatch:
        w = PostgresWatch(self, session_id, from_seq, buffer, timeout)
        with self.mutex:
            if self.ended is not None:
                raise self.ended
            self.watches.setdefault(session_id, []).append(
                weakref.ref(w, partial(_freed, self.gone, self.wake_w, session_id))
            )
        self.poke()
        return w

    def remove(self, sub: Subscription) -> None:
        with self.mutex:
            ws = self.watches.get(sub.session_id, [])
            for ref in ws:
                if ref() is sub:
                    ws.remove(ref)
                    break
            if not ws:
                self.watches.pop(sub.session_id, None)
        if not self.watches:
            self.poke()  # stop hearing commits

    def _prune(self) -> None:
        """Under ``mutex``: drop the entries of the watches the collector freed."""
        prune_freed(self.gone, self.watches)

    def poke(self) -> None:
        with contextlib.suppress(OSError):
            self.wake_w.send(b"x")

    def _all(self) -> list[PostgresWatch]:
        with self.mutex:
            self._prune()
            return [w for ws in self.watches.values() for ref in ws if (w := ref()) is not None]

    def _run(self) -> None:
        delay = 0.05
        refused: list[float] = []  # when the server refused for good, in a row
        while not self.closing.is_set():
            try:
                conn = self.link.get(time.monotonic() + 5.0)
            except StoreError as exc:
                _connection_lost(self.where, "listen", "watch sessions", exc)
                if _refusal(exc.__cause__ or exc) not in _PERMANENT_CONNECT_SQLSTATES:
                    refused.clear()
                else:
                    refused.append(time.monotonic())
                    if (
                        len(refused) >= _REFUSALS_TO_END
                        and refused[-1] - refused[0] >= self.ctx.timeout
                    ):
                        self._give_up(exc, len(refused), refused[-1] - refused[0])
                        return
                self.closing.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                if self.fresh:
                    with self._bounded(conn):
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self.fresh = False
                    self.hearing = False
                    self._all_dirty()  # notifications may have been missed: read again
                    self._bump()
                self._serve(conn)
                delay = 0.05
            except (psycopg.Error, OSError, CodecError) as exc:
                if self.closing.is_set():
                    break
                _connection_lost(self.where, "listen", "watch sessions", exc)
                self.link.drop()
                self.fresh = True
                self.closing.wait(delay)
                delay = min(delay * 2, 5.0)
        self._end(StoreError(f"the store on {self.where} was closed; the watch has ended"))

    def _all_dirty(self) -> None:
        """Mark every watch to be read again (in a frame of its own: the listener's loop,
        which runs for the store's life, holds no watch a reader dropped)."""
        for w in self._all():
            w.dirty = True

    def _give_up(self, exc: StoreError, times: int, seconds: float) -> None:
        """The server refused this store's connection for good: end every watch (and
        this listener: the store's next watch starts another)."""
        self._end(
            StoreError(
                f"the watch has ended: the server refused to reconnect {times} times over "
                f"{seconds:.3g} s ({exc}). Once the database and role are usable again, "
                "watch again from the last seq you read"
            )
        )
        with self.link.lock:
            self.link.drop()

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        """Read notifications and rows until the connection fails or the store closes."""
        query = (
            f"SELECT seq, type, time, data FROM {self.events_table} "
            "WHERE session_id = %s AND seq >= %s ORDER BY seq LIMIT %s"
        )
        while not self.closing.is_set():
            with self._bounded(conn):
                more = self._read(conn, query)
            if more:
                continue
            ready, _, _ = select.select(
                [conn.fileno(), self.wake_r.fileno()], [], [], _IDLE_CHECK_S
            )
            with contextlib.suppress(OSError):
                while self.wake_r.recv(4096):
                    pass
            if not ready:
                with self._bounded(conn):
                    conn.execute("SELECT 1")  # an idle connection may be dead: find out

    def _bounded(self, conn: psycopg.Connection[Any]) -> contextlib.AbstractContextManager[None]:
        """The ``with`` body's statements end within the store's timeout, or the
        connection is cut (see `connection._Watchdog`) and reopened."""
        deadline = time.monotonic() + self.ctx.timeout
        return self.ctx.bounded(conn, deadline, self.link.name, "watch sessions")

    def _read(self, conn: psycopg.Connection[Any], query: str) -> bool:
        """Hear what was notified, and read the new rows of every watch that may have
        some, as far as its room goes; whether a watch has more to read at once."""
        self._hear_commits(conn)
        for n in conn.notifies(timeout=0):
            self._note(n.payload)
        more = False
        for w in self._all():
            if not w.dirty:
                continue
            room = w.room()
            if room <= 0:
                continue
            rows = conn.execute(query, (w.session_id, w.next_fetch, room)).fetchall()
            events = [event_from_row(*r) for r in rows]
            if events:
                w.next_fetch = events[-1].seq + 1
                w.deliver(events)
            if len(rows) < room:
                w.dirty = False
            else:
                more = True
        return more

    def _hear_commits(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN on the commit channel while there is a watch, UNLISTEN once there is
        none. A watch heard again is read again (commits made meanwhile said nothing
        to this store)."""
        with self.mutex:
            self._prune()
            want = bool(self.watches)
        if want is self.hearing:
            return
        verb = "LISTEN {}" if want else "UNLISTEN {}"
        conn.execute(sql.SQL(verb).format(sql.Identifier(self.commits)))
        self.hearing = want
        for w in self._all():
            w.dirty = True

    def _bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def wait_changed(self, after: int, timeout: float) -> int:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self.changed:
            while self.version <= after and self.ended is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(left)
            if self.ended is not None:
                raise self.ended
            return self.version

    def _note(self, payload: str) -> None:
        last, _, sid = payload.partition(" ")
        if last in ("handoff", "withdraw"):  # a request for a session (see ask_handoff)
            self._request(last, sid)
            self._bump()
            return
        self._bump()
        try:
            top = int(last)
        except ValueError:  # "released <id>": a change, nothing to read
            return
        with self.mutex:
            for ref in self.watches.get(sid, ()):
                w = ref()
                if w is not None and top >= w.next_fetch:
                    w.dirty = True

    def _request(self, kind: str, body: str) -> None:
        try:
            req = json.loads(body)
            sid, asker, seconds = str(req["s"]), str(req["a"]), float(req["t"])
        except (ValueError, KeyError, TypeError):
            return  # not ours to read
        if asker == self.me:
            return  # this store's own request
        with self.mutex:
            now = time.monotonic()
            askers = self.asked.setdefault(sid, {})
            if kind == "withdraw":
                askers.pop(asker, None)
            else:
                askers[asker] = now + seconds
            for a in [a for a, until in askers.items() if until <= now]:
                del askers[a]
            if not askers:
                del self.asked[sid]

    def requested(self) -> list[str]:
        """The sessions some other store asks for now."""
        now = time.monotonic()
        with self.mutex:
            return sorted(
                sid for sid, askers in self.asked.items() if any(u > now for u in askers.values())
            )

    def _end(self, err: StoreError) -> None:
        with self.mutex:
            self.ended = err
            watches = [w for ws in self.watches.values() for ref in ws if (w := ref()) is not None]
            self.watches.clear()
            self.changed.notify_all()
        for w in watches:
            w._finish(err)

    def discard(self) -> None:
        """Let an ended listener go (its thread returns at once after `_give_up`)."""
        if self.thread is not threading.current_thread():
            self.thread.join(self.ctx.timeout)
        for s in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                s.close()

    def stop(self) -> None:
        self.closing.set()
        self.poke()
        if self.thread is not threading.current_thread():
            self.thread.join(5.0)
        self._end(StoreError(f"the store on {self.where} was closed; the watch has ended"))
        with self.link.lock:
            self.link.drop()
        for s in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                s.close()


def _freed(
    gone: list[str], wake: socket.socket, session_id: str, ref: weakref.ref[PostgresWatch]
) -> None:
    """(The collector's, as it frees a watch of ``session_id``.) Note it for the listener,
    which drops its entry under its lock, and wake it (this takes no lock: it may run in
    any thread)."""
    gone.append(session_id)
    with contextlib.suppress(OSError):
        wake.send(b"x")
