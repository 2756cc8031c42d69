"""Recovery: claiming a session in its store and reading its log, off the dispatcher.

A session that starts on a store asks `recover` for its log; the answer comes
back through its ``deliver_recovery`` (the session posts it to its own inbox), so no
dispatcher thread ever waits for a store. The reads run on `READERS`, a bounded
pool.

Opens come in crowds (an orchestrator that reopens its agents, a registry that
restarts after a crash), and a store pays per transaction more than per session:
on SQLite each claim is a write transaction of its own. A store that offers the
optional batch methods ``claim_many(ids) -> [token | ConflictError]`` and
``load_many(ids) -> {id: events | StoreError}`` (`SQLiteStore` does) therefore
gets its opens queued and served in batches of up to `BATCH`: one claim
transaction and one read per batch, by at most `DRAINS` readers at a time. Any
other store is served one session per reader task, so a store whose ``load``
blocks holds up only the session it is reading.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Final, Protocol

from nous_actor._log import get_logger
from nous_actor.core._frozen import safe_str
from nous_actor.core.event import Event
from nous_actor.core.log import Log
from nous_actor.errors import StoreError
from nous_actor.runtime import forks
from nous_actor.runtime.dispatcher import Workers
from nous_actor.store.base import Store

__all__ = [
    "BATCH",
    "DRAINS",
    "EAGER_FOLD",
    "READERS",
    "Recovered",
    "Recovering",
    "recover",
    "release",
]

logger = get_logger("nous_actor.session")

READERS: Final = Workers(8, name="nous-reader")
"""Where sessions are recovered from their stores (claim, load, fold): never on a
dispatcher thread, and never more than 8 at a time."""

BATCH: Final = 256
"""Opens of one store served by one claim transaction and one read, at most."""

DRAINS: Final = 2
"""Readers serving one store's queued opens at once (one claims while another folds)."""

Recovered = tuple[str | None, Log | None, BaseException | None, float]
"""What `recover` delivers: (claim token, folded log, None, seconds taken), or
(None, None, the error, 0.0)."""


class Recovering(Protocol):
    """A session waiting for its recovery (a session's actor): queued as it is, one
    object per session waiting, where an id and a callback were three."""

    @property
    def session_id(self) -> str: ...

    def deliver_recovery(self, result: Recovered, /) -> None:
        """The result, on the reader that recovered the session (keep it short)."""


def recover(store: Store, who: Recovering) -> None:
    """Claim ``who.session_id`` in ``store``, load and fold its log on a reader, and call
    ``who.deliver_recovery`` with the result on that reader (exactly once, whatever
    fails).

    On a failure after the claim was taken, the claim is released before the result
    is delivered, so the error the session reports leaves the session free to retry."""
    kind = type(store)
    if getattr(kind, "claim_many", None) is None or getattr(kind, "load_many", None) is None:
        READERS.submit(lambda: _one(store, who))
        return
    key = id(store)
    with _lock:
        queue = _queues.get(key)
        if queue is None:
            queue = _queues[key] = _Queue(store)
        queue.items.append(who)
        start = queue.drains < DRAINS
        if start:
            queue.drains += 1
    if start:
        READERS.submit(lambda: _drain(key, queue))


def release(store: Store, session_id: str, token: str) -> None:
    """Give up a claim; a failure is logged (the claim ends with this process anyway)."""
    try:
        store.release(session_id, token)
    except Exception as exc:
        logger.warning(
            "session.release_failed",
            session_id=session_id,
            reason=type(exc).__name__,
            error=safe_str(exc),
        )


# -- one session at a time (any store) ------------------------------------------------


def _one(store: Store, who: Recovering) -> None:
    session_id = who.session_id
    token: str | None = None
    try:
        token = store.claim(session_id)
        t0 = time.perf_counter()
        log = _folded(store.load(session_id))
        result: Recovered = (token, log, None, time.perf_counter() - t0)
    except BaseException as exc:
        if token is not None:
            release(store, session_id, token)
        result = (None, None, exc, 0.0)
    who.deliver_recovery(result)


EAGER_FOLD: Final = 64
"""A log recovered with more events than this is folded at recovery, on the reader (off
the session's thread), so that the first derive costs no fold; a shorter one by its
first read, if one comes (folding 64 events costs ~20 µs, less than the fold's objects
cost a session that is opened and never read: 10,000 opened at once kept 30,000 more
objects for the collector to go through)."""


def _folded(events: list[Event]) -> Log:
    """The log of ``events``, folded here (off the session's thread) if it is long (see
    `EAGER_FOLD`)."""
    log = Log.restore(events)
    if len(events) > EAGER_FOLD:
        log._folded()
    return log


# -- batches (stores with claim_many and load_many) ----------------------------------------


class _Queue:
    __slots__ = ("drains", "items", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.items: deque[Recovering] = deque()
        self.drains = 0


_lock = threading.Lock()
_queues: dict[int, _Queue] = {}  # by id(store); an entry holds its store while it has work


def _forget_queues() -> None:
    """(In a forked child.) The recoveries queued are the parent's sessions'."""
    global _lock
    _lock = threading.Lock()
    _queues.clear()


forks.after_fork(_forget_queues)


def _drain(key: int, queue: _Queue) -> None:
    """Serve ``queue`` batch by batch until it is empty."""
    while True:
        with _lock:
            items = queue.items
            if not items:
                queue.drains -= 1
                if not queue.drains and _queues.get(key) is queue:
                    del _queues[key]
                return
            batch = [items.popleft() for _ in range(min(BATCH, len(items)))]
        _batch(queue.store, batch)


def _batch(store: Any, batch: Sequence[Recovering]) -> None:
    """Claim every session of ``batch`` in one transaction, read them in one read, fold
    each, and deliver each result (every deliver is called, whatever fails)."""
    t0 = time.perf_counter()
    ids = [who.session_id for who in batch]
    try:
        claims: list[str | StoreError] = list(store.claim_many(ids))
        if len(claims) != len(ids):
            raise StoreError(
                f"the store's claim_many answered {len(claims)} claims for {len(ids)} ids"
            )
    except BaseException as exc:
        for who in batch:
            who.deliver_recovery((None, None, exc, 0.0))
        if not isinstance(exc, Exception):
            raise
        return
    claimed = [sid for sid, got in zip(ids, claims, strict=True) if isinstance(got, str)]
    loaded: dict[str, list[Event] | StoreError] = {}
    failed: BaseException | None = None
    if claimed:
        try:
            loaded = store.load_many(claimed)
        except BaseException as exc:
            failed = exc
    for who, sid, got in zip(batch, ids, claims, strict=True):
        if not isinstance(got, str):
            who.deliver_recovery((None, None, got, 0.0))
            continue
        try:
            if failed is not None:
                raise failed
            events = loaded.get(sid)
            if events is None:
                raise StoreError("the store's load_many left this session out", session_id=sid)
            if isinstance(events, BaseException):
                raise events
            result: Recovered = (got, _folded(events), None, time.perf_counter() - t0)
        except BaseException as exc:
            release(store, sid, got)
            result = (None, None, exc, 0.0)
        who.deliver_recovery(result)
    if failed is not None and not isinstance(failed, Exception):
        raise failed
