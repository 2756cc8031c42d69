"""What the viewer reads: a store it cannot write to, and the store's sessions a page at a time.

`ReadOnlyStore` wraps any store and refuses every write in Python;
`read_only_sqlite` opens a SQLite file through read-only connections
(``mode=ro``), so SQLite itself refuses a write too. `SessionIndex` pages,
sorts and filters the store's session index (`nous_actor.store.list_sessions`),
which stores give whole: it keeps the index for `INDEX_TTL` seconds, so that
turning the pages of 100,000 sessions reads the store once, not once a page.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from nous_actor.core.event import Event
from nous_actor.errors import StoreError
from nous_actor.store import SessionInfo, Store, list_sessions, shared
from nous_actor.store.base import valid_store_id
from nous_actor.store.sqlite import SQLiteStore
from nous_actor.store.sqlite.connection import _Connection
from nous_actor.store.sqlite.follower import follower_of
from nous_actor.store.subscription import Subscription

__all__ = [
    "FRESH_WAIT",
    "INDEX_TTL",
    "IndexPage",
    "ReadOnlyStore",
    "SessionIndex",
    "read_only_sqlite",
]

INDEX_TTL: Final = 5.0
"""Seconds after which a page asks for a fresh read of the session index (in the background)."""

FRESH_WAIT: Final = 10.0
"""Seconds a fresh page (the list's Reload) waits for a read of the index under way."""

SortKey = Literal["id", "events", "next_seq", "last_write"]
SORT_KEYS: Final[tuple[str, ...]] = ("id", "events", "next_seq", "last_write")


class _ReadOnlyConnection(_Connection):
    """A SQLite store's connection whose every connection is opened with ``mode=ro``.

    The store opens its connections in one method, ``connect`` (the store's own
    and its follower's, which watches the file); this is the one place that is
    overridden, so that SQLite refuses any write whatever path it would take.
    Opening checks the file as the store does (a foreign file is refused,
    unchanged); a store that would need completing is refused.
    """

    def connect(self, target: str, timeout: float, uri: bool) -> sqlite3.Connection:
        full = Path(os.path.abspath(self.path)).as_uri()
        return super().connect(f"{full}?mode=ro", timeout, uri=True)


class _ReadOnlySQLiteStore(SQLiteStore):
    """A `SQLiteStore` on a `_ReadOnlyConnection`."""

    _connection_type = _ReadOnlyConnection

    def retained_before(self, session_id: str, seq: int) -> int:
        """How many of ``session_id``'s events with a seq below ``seq`` are stored: one
        count over the primary key's index, nothing decoded, on the follower's
        connection (never behind a write).

        Raises:
            StoreError: the id is not valid, or the store is closed.
        """
        session_id = valid_store_id(session_id)
        rows = follower_of(self._connection).query(
            "SELECT count(*) FROM events WHERE session_id = ? AND seq < ?", (session_id, seq)
        )
        return int(rows[0][0]) if rows else 0


def read_only_sqlite(path: str | os.PathLike[str]) -> ReadOnlyStore:
    """The nous_actor store in the SQLite file ``path``, opened read-only.

    Raises:
        StoreError: there is no store at ``path``, or the file is not one (it is
            left unchanged).
    """
    return ReadOnlyStore(_ReadOnlySQLiteStore(path, create=False))


def _refuse(what: str) -> StoreError:
    return StoreError(f"the viewer reads the store and never writes to it (refused: {what})")


class ReadOnlyStore:
    """A `Store` that reads through ``inner`` and refuses every write with `StoreError`.

    The optional read methods (``index``, ``load_since``, ``watch``,
    ``held_by``, ``wait_changed``) go to the store's own where it has them,
    through `nous_actor.store.shared`, so a SQLite or PostgreSQL store is
    followed as fast as it can be.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"<read-only {self.inner!r}>"

    @property
    def where(self) -> str:
        """How a page names the store: its file, or its server and schema."""
        inner = self.inner
        return str(getattr(inner, "path", None) or getattr(inner, "location", None) or inner)

    # -- reads -------------------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        return self.load_since(session_id, 0)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def index(self) -> list[SessionInfo]:
        return list_sessions(self.inner)

    def next_seq(self, session_id: str) -> int:
        """The seq ``session_id``'s next event gets (0: no stored event), read without
        decoding an event (SQLite: one indexed ``max``)."""
        return shared.next_seq(self.inner, session_id)

    def info(self, session_id: str) -> SessionInfo | None:
        """``session_id``'s entry in the index (``None``: no stored event), read without
        decoding an event (one indexed query on SQLite and PostgreSQL)."""
        found = list_sessions(self.inner, prefix=session_id, limit=1)
        return found[0] if found and found[0].session_id == session_id else None

    def retained_before(self, session_id: str, seq: int) -> int | None:
        """How many of ``session_id``'s events with a seq below ``seq`` the store holds
        (fewer than were read: a snapshot dropped some, or the session was deleted), or
        ``None`` when that cannot be told without reading the events.

        A read-only SQLite file counts them (one indexed count); another store is asked
        for its index entry, which says it when no event from ``seq`` on is stored.

        Raises:
            StoreError: the store failed.
        """
        own = getattr(self.inner, "retained_before", None)
        if own is not None:
            return int(own(session_id, seq))
        info = self.info(session_id)
        if info is None:
            return 0
        if info.error is not None or info.next_seq > seq:
            return None
        return info.events

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        return shared.load_since(self.inner, session_id, from_seq)

    def watch(
        self, session_id: str, from_seq: int = 0, *, buffer: int = 1000, timeout: float = 30.0
    ) -> Subscription:
        return shared.watch(self.inner, session_id, from_seq, buffer=buffer, timeout=timeout)

    def held_by(self, session_id: str) -> str | None:
        return shared.held_by(self.inner, session_id)

    def wait_changed(self, after: int, timeout: float) -> int:
        return shared.wait_changed(self.inner, after, timeout)

    def close(self) -> None:
        self.inner.close()

    # -- writes: refused -------------------------------------------------------------------

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        raise _refuse("write")

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        raise _refuse("drop")

    def delete(self, session_id: str) -> None:
        raise _refuse("delete")

    def claim(self, session_id: str) -> str:
        raise _refuse("claim")

    def release(self, session_id: str, token: str) -> None:
        raise _refuse("release")


@dataclass(frozen=True, slots=True)
class IndexPage:
    """One page of the session list.

    Attributes:
        rows: the sessions of the page, each a JSON-ready dict (``session_id``,
            ``events``, ``next_seq``, ``last_write``, ``holder``, ``error``).
        total: how many sessions match the filter.
        sessions: how many sessions the store holds.
        offset: the index of the first row among the matches.
        read_at: when the index was read (seconds since the epoch).
    """

    rows: list[dict[str, Any]]
    total: int
    sessions: int
    offset: int
    read_at: float


def _sort_key(key: str) -> Any:
    if key == "events":
        return lambda i: (i.events, i.session_id)
    if key == "next_seq":
        return lambda i: (i.next_seq, i.session_id)
    if key == "last_write":
        return lambda i: (i.last_time.timestamp() if i.last_time else 0.0, i.session_id)
    return lambda i: i.session_id


class SessionIndex:
    """The store's sessions, sorted, filtered and cut into pages.

    The index is read whole (sorting by the latest write needs every session) once,
    then again in the background whenever a page is asked for and the last read is
    older than `INDEX_TTL` seconds: a page never waits for a read but the first.
    Each sort order is computed once per read. The holder of a session is asked
    for the rows of the page only.
    """

    def __init__(self, store: ReadOnlyStore, ttl: float = INDEX_TTL) -> None:
        self.store = store
        self.ttl = ttl
        self._lock = threading.Lock()
        self._infos: list[SessionInfo] = []
        self._sorted: dict[str, list[SessionInfo]] = {}
        self._reading = threading.Lock()  # held by whoever reads the index
        self._read_at = 0.0
        self._read_mono: float | None = None

    def _read(self) -> None:
        """Read the index (under ``_reading``) and put it in place."""
        started = time.monotonic()
        infos = self.store.index()
        with self._lock:
            self._infos, self._sorted = infos, {}
            self._read_mono, self._read_at = started, time.time()

    def _refresh(self) -> None:
        try:
            self._read()
        except StoreError:
            pass  # the next page's read says so
        finally:
            self._reading.release()

    def _fresh(self) -> None:
        """Read the index now, unless a read that started after this call ends first
        (one under way when it is called is waited for, then read after: it may have
        begun before what the caller wants to see). Waits at most `FRESH_WAIT` seconds
        for a read under way; past that the pages keep using the last one."""
        asked = time.monotonic()
        if not self._reading.acquire(timeout=FRESH_WAIT):
            return
        try:
            if self._read_mono is None or self._read_mono < asked:
                self._read()
        finally:
            self._reading.release()

    def _current(
        self, fresh: bool = False
    ) -> tuple[dict[str, list[SessionInfo]], list[SessionInfo], float]:
        """The index as last read. The first call reads it; later, once it is older than
        `ttl`, a thread reads it again while the pages keep using the last one. With
        ``fresh`` (the list's Reload) it is read again before it is used."""
        if fresh:
            self._fresh()
        elif self._read_mono is None:
            with self._reading:
                if self._read_mono is None:
                    self._read()
        elif time.monotonic() - self._read_mono > self.ttl and self._reading.acquire(
            blocking=False
        ):
            threading.Thread(target=self._refresh, name="nous-viewer-index", daemon=True).start()
        with self._lock:
            return self._sorted, self._infos, self._read_at

    def page(
        self,
        *,
        offset: int = 0,
        limit: int = 100,
        sort: str = "last_write",
        descending: bool = True,
        query: str = "",
        fresh: bool = False,
    ) -> IndexPage:
        """The sessions ``offset`` to ``offset + limit`` of those whose id holds ``query``
        (case-insensitive), in ``sort`` order; with ``fresh``, from an index read for this
        call (however young the last read), not the one last read.

        Raises:
            ValueError: ``sort`` is not one of `SORT_KEYS`.
            StoreError: the store failed.
        """
        if sort not in SORT_KEYS:
            raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
        cache, infos, read_at = self._current(fresh)
        with self._lock:
            ordered = cache.get(sort)
            if ordered is None:
                ordered = cache[sort] = sorted(infos, key=_sort_key(sort))
        if descending:
            ordered = ordered[::-1]
        if query:
            needle = query.casefold()
            ordered = [i for i in ordered if needle in i.session_id.casefold()]
        chosen = ordered[offset : offset + limit]
        rows = [self._row(i) for i in chosen]
        return IndexPage(rows, len(ordered), len(infos), offset, read_at)

    def _row(self, info: SessionInfo) -> dict[str, Any]:
        holder: str | None = None
        error = info.error
        if error is None:
            try:
                holder = self.store.held_by(info.session_id)
            except StoreError as exc:
                error = str(exc)
        return {
            "session_id": info.session_id,
            "events": info.events,
            "next_seq": info.next_seq,
            "last_write": None if info.last_time is None else info.last_time.isoformat(),
            "holder": holder,
            "error": error,
        }
