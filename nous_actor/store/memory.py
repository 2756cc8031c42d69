"""An in-memory `Store`: same rules as the durable ones, no durability."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from functools import partial

from nous_actor.core.args import check_bound, check_seconds
from nous_actor.core.event import Event
from nous_actor.core.ids import plain_id
from nous_actor.errors import ConflictError, StoreError
from nous_actor.runtime import scheduling
from nous_actor.runtime.unique import unique_hex
from nous_actor.store.base import CALL_RECORD_SECONDS, CallRecords, SessionInfo, valid_store_id
from nous_actor.store.subscription import Subscription

__all__ = ["MemoryStore"]

_SEQ_END = 2**63
"""Seqs are below this in every store (the SQL stores' integers are 64-bit)."""


class MemoryStore:
    """A `Store` in a dict: same rules, no durability.

    Events are kept as the immutable `Event` values they are. `claim` and
    `write` refuse a session id that is not valid (see `nous_actor.core.ids`) with
    `StoreError`, storing nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._events: dict[str, dict[int, Event]] = {}
        self._claims: dict[str, str] = {}
        self._closed = False
        self._version = 0  # counts every change (wait_changed)
        self._asked: dict[str, float] = {}  # id -> until when it is asked for
        self._address: str | None = None  # where its holders answer calls (forwarding)
        # Each session's watches, held weakly: a watch its reader dropped without
        # closing it is freed (a long-running process would otherwise keep, and feed,
        # every such watch for the rest of its life). Its entry goes at the next write or
        # watch (``_gone``: what the collector freed, appended without the lock).
        self._watches: dict[str, list[weakref.ref[_MemoryWatch]]] = {}
        self._gone: list[tuple[str, weakref.ref[_MemoryWatch]]] = []
        # The forwarded calls' records, oldest first: (session, call id) -> (when, seqs).
        self._calls: dict[tuple[str, str], tuple[float, int, int]] = {}

    def _changed(self) -> None:
        """Under the lock: something changed (wake `wait_changed`)."""
        self._version += 1
        self._lock.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed; open a new one")

    _valid_id = staticmethod(valid_store_id)

    def load(self, session_id: str) -> list[Event]:
        session_id = plain_id(session_id)
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id, {})
            return [stored[k] for k in sorted(stored)]

    def next_seq(self, session_id: str) -> int:
        """The next seq of ``session_id``'s stored history (0 if it has none)."""
        session_id = plain_id(session_id)
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id)
            return max(stored) + 1 if stored else 0

    def write(
        self, appends: Mapping[str, Sequence[Event]], calls: CallRecords | None = None
    ) -> dict[str, StoreError]:
        """Store each session's events (see `Store.write`), and record the forwarded
        ``calls`` of the sessions stored (see `applied_call`)."""
        refused: dict[str, StoreError] = {}
        # Plain ids: a str subclass with its own __hash__ is the session of its text.
        checked = [
            (self._valid_id(sid) if events else sid, events) for sid, events in appends.items()
        ]
        with self._lock:
            self._check_open()
            for sid, events in checked:
                stored = self._events.get(sid, {})
                seqs = [ev.seq for ev in events]
                if any(not 0 <= s < _SEQ_END for s in seqs):
                    refused[sid] = StoreError(
                        f"seq {max(seqs)} is not below 2**63, the largest a store keeps "
                        "(as SQL's 64-bit integers); none of this write's events of this "
                        "session were stored",
                        session_id=sid,
                    )
                    continue
                taken = [s for s in seqs if s in stored]
                if taken or len(set(seqs)) != len(seqs):
                    refused[sid] = ConflictError(
                        f"seq {(taken or seqs)[0]} is already stored (another writer?); "
                        "reopen the session to continue from the store",
                        session_id=sid,
                    )
                    continue
                self._events.setdefault(sid, {}).update((ev.seq, ev) for ev in events)
                for ref in self._watches.get(sid, ()):
                    w = ref()
                    if w is not None:
                        w._offer(sorted(events, key=lambda ev: ev.seq))
            if calls:
                self._record(calls, refused)
            self._prune_watches()
            self._changed()
        return refused

    def _record(self, calls: CallRecords, refused: Mapping[str, StoreError]) -> None:
        """Under the lock: record the calls of the sessions stored; forget records older
        than `CALL_RECORD_SECONDS`."""
        now = scheduling.monotonic()
        records = self._calls
        while records:
            key = next(iter(records))
            if records[key][0] >= now - CALL_RECORD_SECONDS:
                break
            del records[key]
        for sid, made in calls.items():
            if sid not in refused:
                for call, first, last in made:
                    records[(sid, call)] = (now, first, last)

    def applied_call(self, session_id: str, call_id: str) -> tuple[int, int] | None:
        """The first and last seq of what the forwarded call ``call_id`` appended to
        ``session_id``, or ``None`` if no write recorded it (in the last
        `CALL_RECORD_SECONDS` at least)."""
        session_id = plain_id(session_id)
        with self._lock:
            self._check_open()
            found = self._calls.get((session_id, call_id))
        return None if found is None else (found[1], found[2])

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        session_id = plain_id(session_id)
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id)
            if stored is not None:
                for s in seqs:
                    stored.pop(s, None)
            self._changed()

    def sessions(self) -> list[str]:
        with self._lock:
            self._check_open()
            return sorted(sid for sid, evs in self._events.items() if evs)

    def delete(self, session_id: str) -> None:
        session_id = plain_id(session_id)
        with self._lock:
            self._check_open()
            self._events.pop(session_id, None)
            self._claims.pop(session_id, None)
            self._changed()

    def claim(self, session_id: str) -> str:
        session_id = self._valid_id(session_id)
        with self._lock:
            self._check_open()
            if session_id in self._claims:
                raise ConflictError(
                    "already has a live writer in this store; use its handle, "
                    "or stop that session first",
                    session_id=session_id,
                )
            token = unique_hex()
            self._claims[session_id] = token
            self._changed()
            return token

    def release(self, session_id: str, token: str) -> None:
        with self._lock:
            if self._claims.get(session_id) == token:
                del self._claims[session_id]
                self._changed()

    def index(
        self, *, prefix: str = "", after: str | None = None, limit: int | None = None
    ) -> list[SessionInfo]:
        """Every stored session's size, next seq, latest time and holder, sorted by id;
        only ids starting with ``prefix``, after ``after``, at most ``limit``.

        Used by `nous_actor.store.list_sessions` (which checks the arguments).

        Raises:
            StoreError: the store is closed.
        """
        with self._lock:
            self._check_open()
            out: list[SessionInfo] = []
            for sid, evs in sorted(self._events.items()):
                if not evs or not sid.startswith(prefix) or (after is not None and sid <= after):
                    continue
                if limit is not None and len(out) >= limit:
                    break
                holder = "this process" if sid in self._claims else None
                last = max(ev.time for ev in evs.values())
                out.append(SessionInfo(sid, len(evs), max(evs) + 1, last, None, holder))
            return out

    # -- sharing (see nous_actor.store.shared) -------------------------------------------

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        """The stored events of `session_id` with ``seq >= from_seq``, in seq order.

        Raises:
            StoreError: the id is not valid, or the store is closed.
        """
        session_id = self._valid_id(session_id)
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id, {})
            return [stored[k] for k in sorted(stored) if k >= from_seq]

    def watch(
        self, session_id: str, from_seq: int = 0, *, buffer: int = 1000, timeout: float = 30.0
    ) -> Subscription:
        """Every stored event of `session_id` with ``seq >= from_seq``, then each one as
        it is written, exactly once, in seq order (never cut off: the events are in
        memory anyway).

        Raises:
            StoreError: the id is not valid, or the store is closed.
            TypeError, ValueError: `timeout` (the gets' default bound) is not a number
                of seconds, or NaN.
        """
        session_id = self._valid_id(session_id)
        timeout = check_bound(timeout, "watch(timeout)")
        w = _MemoryWatch(self, session_id, from_seq, buffer, timeout)
        with self._lock:
            self._check_open()
            stored = self._events.get(session_id, {})
            w._offer([stored[k] for k in sorted(stored) if k >= from_seq])
            self._prune_watches()
            self._watches.setdefault(session_id, []).append(
                weakref.ref(w, partial(_freed, self._gone, session_id))
            )
        return w

    def _unwatch(self, sub: Subscription) -> None:
        with self._lock:
            ws = self._watches.get(sub.session_id, [])
            for ref in ws:
                if ref() is sub:
                    ws.remove(ref)
                    break
            if not ws:
                self._watches.pop(sub.session_id, None)

    def _prune_watches(self) -> None:
        """Under the lock: drop the entries of the watches the collector freed."""
        gone = self._gone
        while gone:
            sid, ref = gone.pop()
            ws = self._watches.get(sid)
            if ws is None:
                continue
            if ref in ws:
                ws.remove(ref)
            if not ws:
                del self._watches[sid]

    def held_by(self, session_id: str) -> str | None:
        """``"this process"`` if `session_id` is claimed in this store, else `None`."""
        session_id = self._valid_id(session_id)
        with self._lock:
            self._check_open()
            return "this process" if session_id in self._claims else None

    def advertise(self, address: str | None) -> None:
        """Where the sessions claimed in this store answer calls (one address per store
        object: its registries share it)."""
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a str or None, got {type(address).__name__}")
        with self._lock:
            self._check_open()
            self._address = address

    def holder_address(self, session_id: str) -> tuple[str, str | None] | None:
        """``("this process", address)`` if `session_id` is claimed, else `None`."""
        session_id = self._valid_id(session_id)
        with self._lock:
            self._check_open()
            if session_id not in self._claims:
                return None
            return "this process", self._address

    def ask_handoff(self, session_id: str, seconds: float) -> None:
        """Ask whoever holds `session_id` (now or in the next `seconds`) to hand it over.

        Raises:
            StoreError: the id is not valid, or the store is closed.
        """
        session_id = self._valid_id(session_id)
        seconds = check_seconds(seconds, "seconds")
        with self._lock:
            self._check_open()
            self._asked[session_id] = scheduling.monotonic() + seconds
            self._changed()

    def withdraw_handoff(self, session_id: str) -> None:
        """Take the request for `session_id` back (the asker got it, or gave up)."""
        with self._lock:
            self._check_open()
            if self._asked.pop(session_id, None) is not None:
                self._changed()

    def handoff_requests(self) -> list[str]:
        """The claimed sessions a request stands for."""
        now = scheduling.monotonic()
        with self._lock:
            self._check_open()
            for sid in [sid for sid, until in self._asked.items() if until <= now]:
                del self._asked[sid]
            return sorted(sid for sid in self._asked if sid in self._claims)

    def wait_changed(self, after: int, timeout: float) -> int:
        """Wait at most `timeout` s for a change after counter `after`; the counter now."""
        scheduling.current().wait(
            lambda: self._version > after or self._closed,
            max(timeout, 0.0),
            partial(self._wait_version, after),
        )
        with self._lock:
            self._check_open()
            return self._version

    def _wait_version(self, after: int, timeout: float | None) -> bool:
        deadline = time.monotonic() + (timeout or 0.0)
        with self._lock:
            while self._version <= after and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return self._version > after or self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            watches = [
                w for ws in self._watches.values() for ref in ws if (w := ref()) is not None
            ]
            self._watches.clear()
            self._gone.clear()
            self._lock.notify_all()
        for w in watches:
            w._finish(StoreError("the store was closed; the watch has ended"))

    def __repr__(self) -> str:
        return f"<MemoryStore sessions={len(self._events)}>"


def _freed(
    gone: list[tuple[str, weakref.ref[_MemoryWatch]]],
    session_id: str,
    ref: weakref.ref[_MemoryWatch],
) -> None:
    """(The collector's, as it frees a watch of ``session_id``.) Note it for the store,
    which drops its entry under its lock (this takes none: it may run in any thread)."""
    gone.append((session_id, ref))


class _MemoryWatch(Subscription):
    """A `MemoryStore` watch: the store hands it each write as it happens."""

    def __init__(
        self, store: MemoryStore, session_id: str, from_seq: int, buffer: int, timeout: float
    ) -> None:
        super().__init__(
            session_id, from_seq=from_seq, buffer=buffer, timeout=timeout, on_close=store._unwatch
        )
        self.next_seq = from_seq

    def _offer(self, events: Sequence[Event]) -> None:
        """Under the store's lock: take the events not delivered yet, in seq order."""
        fresh = [ev for ev in events if ev.seq >= self.next_seq]
        if not fresh:
            return
        self.next_seq = fresh[-1].seq + 1
        with self._cond:
            if self._ended:
                return
            self._items.extend(fresh)
            self._cond.notify_all()
            self._wake_async()
