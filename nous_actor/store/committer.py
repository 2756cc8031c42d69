"""Group commit: one writer thread per store, batching appends from every session on it.

Sessions hand their validated events to the store's `Committer` and
are told, in order, which of them are durably stored. Appends that arrive
while a transaction is being written (from one session or many) go into the
next transaction together, so the cost of a commit (an fsync with
``durability="full"``) is shared.

A transaction is shared fairly: the writer keeps what waits per session and
fills each transaction round robin, first the oldest item of every session
that has one, then more of each up to ``share`` events a session. A session
flooded with appends thus writes its backlog ``share`` events at a time, and
another session's append goes into the next transaction, not behind the
backlog (first in, first out put it behind every queued event of the flood).
The share is small while other sessions write too (``share``: their appends
wait for short transactions) and larger once the flooded session has been
alone for `MIXED_WINDOW` (``alone``: its backlog goes in fewer fsyncs, and a
newcomer waits for one transaction of that size at most).
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from nous_actor._log import get_logger
from nous_actor.core._frozen import short_repr
from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.runtime import forks, scheduling, telemetry
from nous_actor.store.base import Store
from nous_actor.store.shared import NO_TURN, write_turn

__all__ = ["Committer", "committer_for"]

logger = get_logger(__name__)

Notify = Callable[[StoreError | None], None]
"""``notify(error)``: an item is done: stored (``None``), or not (the error)."""

MAX_BATCH: Final = 2000
"""Events a transaction holds at most (one larger item goes alone)."""
MAX_BATCH_BYTES: Final = 32 * 1024 * 1024
"""Bytes of event data a transaction holds at most (one larger item goes alone): 20
pipelined appends of 15 MiB each made one transaction of 300 MB, which outlasted a
PostgreSQL store's bound and failed every write in it, other sessions' small ones
too."""
SHARE: Final = 16
"""Events of one session a transaction holds at most while other sessions wait too (one
larger item goes alone): their appends wait for short commits. With 50 threads flooding
one SQLite session (``durability="full"``), 4 other sessions' appends waited for the
commit: p50 6.6 ms, p99 19 ms with a share of 256; 1.2 and 4.4 ms with 16."""
ALONE: Final = 256
"""Events of one session a transaction holds at most once no other session has written
for `MIXED_WINDOW`: a backlog goes in fewer commits, each still short enough for a
newcomer to wait for."""
MIXED_WINDOW: Final = 0.1
"""Seconds after a transaction of several sessions during which the share stays small:
sessions that append one call at a time are not waiting at every instant, and a
transaction of ``alone`` events started between two of their calls would hold the next."""


_GATHER_PAUSE: Final = 1.0
"""Seconds without gathering after a wait in vain: callers that come at random (a web
app's) would otherwise make every other transaction wait."""
_GATHER_MAX: Final = 256
"""Transactions of more items than this are not followed by a wait (nor counted: the
count costs a look at each session)."""
_COHORTS: Final = 4
"""Transactions whose one-item sessions are counted as awaiting each call."""
GATHER: Final = 0.002
"""Seconds a transaction may wait for the next items of the sessions that await each
call (see `Committer._gather`)."""


class _Item:
    """One queued write (or drop) of one session; ``done(err)`` once it is stored or not.

    A subclass may stand for its own notice (`Write`): one object per batch in flight
    instead of an item and a callback."""

    __slots__ = ("call", "events", "kind", "notify", "seqs", "session_id")

    def __init__(
        self,
        kind: str,
        session_id: str,
        notify: Notify | None,
        events: Sequence[Event] = (),
        seqs: Sequence[int] = (),
        call: str | None = None,
    ) -> None:
        self.kind = kind
        self.session_id = session_id
        self.notify = notify
        self.events = events
        self.seqs = seqs
        self.call = call

    def done(self, err: StoreError | None) -> None:
        """The item is stored (``err`` ``None``) or not: tell whoever submitted it."""
        assert self.notify is not None  # (set unless a subclass overrides this)
        self.notify(err)


class Write(_Item):
    """A write that is its own notice: subclass it, override `done`, and give it to
    `Committer.submit_write` (what a session's actor does for each batch it commits)."""

    __slots__ = ()

    def __init__(self, session_id: str, events: Sequence[Event], call: str | None = None):
        super().__init__("write", session_id, None, events, (), call)

    def done(self, err: StoreError | None) -> None:
        raise NotImplementedError


class Committer:
    """The one writer thread of a store.

    Guarantees: a session's items are written in the order submitted, and
    its ``notify`` calls come in that order too; once an item of a session
    fails, every later item of that session fails without being written
    (until `reset`), so the store never holds a later event without
    an earlier one. Each transaction holds the oldest waiting item of every
    session that has one (while ``max_batch`` events allow), and at most
    ``share`` events of any one session (an item larger than that goes alone);
    ``alone`` events instead once a single session has been writing for
    ``mixed_window`` seconds with no other.

    ``commits`` (batches written, failed ones too) and ``items`` (items answered) are
    counters anyone may read: they grow while the writer answers.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_batch: int = MAX_BATCH,
        share: int = SHARE,
        alone: int = ALONE,
        mixed_window: float = MIXED_WINDOW,
        gather: float = GATHER,
    ) -> None:
        # A weak reference, so that a store nobody uses any more is collected
        # and its writer thread ends (it checks once a second while idle).
        try:
            self._store: Callable[[], Store | None] = weakref.ref(store)
        except TypeError:  # a store class without __weakref__: keep it alive
            self._store = lambda: store
        self.max_batch = max_batch
        self.share = share
        self.alone = alone
        self.mixed_window = mixed_window
        self.gather = gather
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._failed: dict[str, StoreError] = {}
        self._failed_lock = threading.Lock()
        self.commits = 0
        self.items = 0
        self._thread: threading.Thread | None = None
        # Its writer: a thread (a task of a simulation, each batch a step).
        self._queue = scheduling.current().committer_queue(self)

    def submit(
        self, session_id: str, events: Sequence[Event], notify: Notify, call: str | None = None
    ) -> None:
        """Queue ``events`` of one session for the next transaction; ``call``: the id of
        the forwarded call that appends them, recorded with them (the store's ``write``
        takes ``calls=``)."""
        self._queue.put(_Item("write", session_id, notify, events=events, call=call))

    def submit_write(self, write: Write) -> None:
        """`submit` of a write that is its own notice (its `Write.done` is called)."""
        self._queue.put(write)

    def submit_drop(self, session_id: str, seqs: Sequence[int], notify: Notify) -> None:
        """Queue a deletion of snapshotted seqs, ordered after the session's earlier writes."""
        self._queue.put(_Item("drop", session_id, notify, seqs=seqs))

    def reset(self, session_id: str) -> None:
        """Forget an earlier failure of ``session_id`` (it was reloaded from the store)."""
        with self._failed_lock:
            self._failed.pop(session_id, None)

    def failed(self, session_id: str) -> StoreError | None:
        """The error that fails every later item of ``session_id`` without writing it
        (an earlier write of it failed), until `reset`; ``None`` if it writes."""
        with self._failed_lock:
            return self._failed.get(session_id)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the thread."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        intake = self._queue
        budget, share, alone, window = self.max_batch, self.share, self.alone, self.mixed_window
        waiting: dict[str, deque[_Item]] = {}  # per session, in the order served
        stop = False
        mixed_until = -1.0  # until when the share is small (several sessions wrote lately)
        # Sessions that await each call, seen in the last `_COHORTS` transactions: how many
        # items the next one waits for (`_gather`).
        recent: tuple[frozenset[str], ...] = ()
        expect = 0
        gather = self.gather
        gather_after = -1.0  # no waiting before then (the last wait was in vain)
        first: _Item | None = None
        item: _Item | None = None
        mine: deque[_Item] | None = None
        while True:
            # Nothing of the last batch stays referenced from this frame while it waits:
            # an item holds its session's callback, so the session's actor and this
            # store, and the store is what ends this thread once nobody uses it.
            first = item = mine = None
            fresh: list[_Item] = []
            if not waiting:
                if stop:
                    return
                try:
                    first = intake.get(timeout=1.0)
                except queue.Empty:
                    if self._store() is None:
                        return
                    continue
                if first is None:
                    return
                fresh.append(first)
            # Everything queued now is seen before the next transaction is filled
            # (what arrives meanwhile waits for the one after).
            if not stop:
                stop = _drain(intake, fresh)
            if (
                not waiting
                and not stop
                and len(fresh) < expect
                and gather
                and scheduling.monotonic() >= gather_after
            ):
                came = self._gather(fresh, expect, gather)
                if came is False:  # fewer came in time: start counting again, and wait
                    recent = ()  # no more for a while (callers that come at random)
                    gather_after = scheduling.monotonic() + _GATHER_PAUSE
                elif came:
                    stop = True
            with contextlib.ExitStack() as turn:
                turned = turn.enter_context(self._turn())  # let go before answering
                if turned and not stop:
                    # What came while other processes wrote the file goes in this commit.
                    stop = _drain(intake, fresh)
                # The share: small while a session with one item waits beside others (one
                # that awaits each call), or did lately; else (one session alone, or every
                # session with a backlog) transactions hold more of each.
                now = scheduling.monotonic()
                light = _light_beside_others(waiting, fresh)
                if light:
                    mixed_until = now + window
                cap = share if light or now < mixed_until else alone
                if not waiting and _fits(fresh, budget, cap):
                    self._write(fresh, turn.close)  # no backlog: all of it, in order
                    recent, expect = _expect(fresh, recent)
                    continue
                for item in fresh:
                    mine = waiting.get(item.session_id)
                    if mine is None:
                        waiting[item.session_id] = deque((item,))
                    else:
                        mine.append(item)
                batch = _fill(waiting, budget, cap)
                self._write(batch, turn.close)
            recent, expect = _expect(batch, recent)
            batch = []

    def _turn(self) -> contextlib.AbstractContextManager[bool]:
        """The store's turn at writing, taken before a transaction is filled (its
        ``write_turn()``: a SQLite file's, among the processes that write it), so that
        what comes while it waits for it goes in that transaction; whether it came.
        A store without one: no wait here (the write waits, if it must)."""
        store = self._store()
        return NO_TURN if store is None else write_turn(store)

    def _gather(self, fresh: list[_Item], expect: int, gather: float) -> bool | None:
        """Wait (at most ``gather`` seconds) for as many items as the sessions that await
        each call (one item each in the last `_COHORTS` transactions) before writing fewer:
        woken together by a commit, they send their next appends over a few
        milliseconds, and a commit started at the first of them would split them (two
        fsyncs; with 100 coroutines on one loop, 51 a commit instead of 100).
        ``False`` if fewer came in time, ``None`` if all did, ``True`` if the intake
        said stop."""
        intake = self._queue
        deadline = scheduling.monotonic() + gather
        while len(fresh) < expect:
            left = deadline - scheduling.monotonic()
            if left <= 0:
                return False
            try:
                item = intake.get(timeout=left)
            except queue.Empty:
                return False
            if item is None:
                return True
            fresh.append(item)
        return None

    def _write(self, batch: list[_Item], written: Callable[[], None] = lambda: None) -> None:
        """Commit one batch and answer its items (never raises: the writer lives on);
        ``written`` is called once the store is written, before the answers (the turn
        at writing is let go then)."""
        try:
            interrupt = self._commit(batch, written)
        except BaseException as exc:  # never let the writer thread die silently
            logger.error("store.committer_failed", reason=type(exc).__name__, error=str(exc))
            err = StoreError(f"the store's writer failed: {type(exc).__name__}: {exc}")
            for item in batch:
                _notify(item, err)
            return
        if interrupt is not None:  # its items are answered (failed): only logged here
            logger.error(
                "store.committer_failed", reason=type(interrupt).__name__, error=str(interrupt)
            )

    def _commit(self, batch: list[_Item], written: Callable[[], None]) -> BaseException | None:
        """Write one batch and answer each of its items exactly once (``written`` called
        in between); returns the ``KeyboardInterrupt``/``SystemExit`` a store's write
        raised (its items failed)."""
        writes: dict[str, list[Event]] = {}
        calls: dict[str, list[tuple[str, int, int]]] = {}
        drops: list[_Item] = []
        done: list[tuple[_Item, StoreError | None]] = []
        with self._failed_lock:
            failed = dict(self._failed)
        for item in batch:
            err = failed.get(item.session_id)
            if err is not None:
                done.append((item, _after(err, item.session_id)))
            elif item.kind == "write":
                writes.setdefault(item.session_id, []).extend(item.events)
                if item.call is not None and item.events:
                    calls.setdefault(item.session_id, []).append(
                        (item.call, item.events[0].seq, item.events[-1].seq)
                    )
                done.append((item, None))
            else:
                drops.append(item)
                done.append((item, None))
        refused: dict[str, StoreError] = {}
        whole: StoreError | None = None
        interrupt: BaseException | None = None
        store = self._store()
        if store is None:
            whole = StoreError("the store was garbage-collected")
        elif writes:
            sink = telemetry.sink
            start = time.time_ns() if sink is not None else 0
            try:
                # (a store that forwards calls records them: see `nous_actor.store.shared`)
                refused = (
                    cast(Any, store).write(writes, calls=calls) if calls else store.write(writes)
                )
            except StoreError as exc:
                whole = exc
            except BaseException as exc:  # a store of the user's that broke the protocol
                whole = StoreError(f"store write failed: {type(exc).__name__}: {exc}")
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    interrupt = exc
            if sink is not None:
                events = sum(len(evs) for evs in writes.values())
                sink.committed(events, start, time.time_ns(), whole is not None or bool(refused))
        drop_errors: dict[int, StoreError] = {}
        for item in drops:
            if store is not None and whole is None and item.session_id not in refused:
                try:
                    store.drop(item.session_id, item.seqs)
                except Exception as exc:
                    drop_errors[id(item)] = (
                        exc
                        if isinstance(exc, StoreError)
                        else StoreError(f"store drop failed: {exc}", session_id=item.session_id)
                    )
        written()
        self.commits += 1
        self.items += len(batch)
        newly_failed: dict[str, StoreError] = {}
        for item, err in done:
            if err is None:
                if whole is not None:
                    err = _for_session(whole, item.session_id)
                elif item.session_id in refused:
                    err = _for_session(refused[item.session_id], item.session_id)
                else:
                    err = drop_errors.get(id(item))
                if err is not None and item.kind == "write":
                    newly_failed.setdefault(item.session_id, err)
            _notify(item, err)
        if newly_failed:
            with self._failed_lock:
                for sid, err in newly_failed.items():
                    # A copy, without the traceback: its frames hold the store and the
                    # batch, which would keep the store (and this thread) alive.
                    self._failed.setdefault(sid, copy.copy(err))
                    logger.error(
                        "store.write_failed",
                        session_id=sid,
                        reason=type(err).__name__,
                        error=str(err),
                    )
        return interrupt


def _drain(intake: Any, fresh: list[_Item]) -> bool:
    """Move everything queued in ``intake`` now to ``fresh``; whether it said stop."""
    for _ in range(intake.qsize()):
        try:
            item = intake.get_nowait()
        except queue.Empty:
            break
        if item is None:
            return True
        fresh.append(item)
    return False


def _fill(waiting: dict[str, deque[_Item]], budget: int, share: int) -> list[_Item]:
    """The next transaction: the oldest item of every waiting session (while they fit in
    ``budget`` events and `MAX_BATCH_BYTES`), then more of each, up to ``share`` events
    a session. Sessions that keep items move behind the others; an item larger than the
    budget, the bytes or the share is taken alone (an item counts its events, a drop
    one). Takes the items out of ``waiting``."""
    batch: list[_Item] = []
    taken: dict[str, int] = {}
    size = 0
    nbytes = 0
    for sid, mine in waiting.items():
        if size >= budget or nbytes >= MAX_BATCH_BYTES:
            break
        n = len(mine[0].events) or 1
        b = _bytes(mine[0])
        if batch and (size + n > budget or nbytes + b > MAX_BATCH_BYTES):
            continue
        batch.append(mine.popleft())
        taken[sid] = n
        size += n
        nbytes += b
    for sid, n in taken.items():
        mine = waiting[sid]
        while mine and size < budget:
            more = len(mine[0].events) or 1
            b = _bytes(mine[0])
            if n + more > share or size + more > budget or nbytes + b > MAX_BATCH_BYTES:
                break
            batch.append(mine.popleft())
            n += more
            size += more
            nbytes += b
        # Served: to the back of the round (or out, once it has nothing waiting).
        del waiting[sid]
        if mine:
            waiting[sid] = mine
    return batch


def _bytes(item: _Item) -> int:
    """The bytes of event data ``item`` writes, as far as they are known without encoding
    (an event appended through a session holds its JSON text; one made of a mapping
    counts nothing: its size is found when it is encoded)."""
    total = 0
    for ev in item.events:
        d = ev._data
        if type(d) is str:
            total += len(d)
    return total


def _expect(
    batch: list[_Item], recent: tuple[frozenset[str], ...]
) -> tuple[tuple[frozenset[str], ...], int]:
    """After writing ``batch``: the sessions that await each call (one item each in this
    transaction and the `_COHORTS` - 1 before) and how many items the next transaction
    waits for: all of them, so that groups answered by different commits merge; none
    after a backlog (several items of a session: written without waiting)."""
    if len(batch) > _GATHER_MAX:
        return (), 0  # (many sessions at once: a backlog, never waited for)
    sessions = frozenset(item.session_id for item in batch)
    if len(sessions) != len(batch):
        return (), 0
    recent = (sessions, *recent[: _COHORTS - 1])
    return recent, len(frozenset().union(*recent))


def _light_beside_others(waiting: dict[str, deque[_Item]], fresh: list[_Item]) -> bool:
    """Whether several sessions have items waiting, one of them a single item (stops at
    the first such session: with thousands waiting, one item each, it looks at one)."""
    counts: dict[str, int] = {}
    for item in fresh:
        counts[item.session_id] = counts.get(item.session_id, 0) + 1
    if len(counts) + len(waiting) < 2:
        return False  # (a session in both has two items or more: never the light one)
    for sid, n in counts.items():
        if n == 1 and sid not in waiting:
            return len(counts) > 1 or any(s != sid for s in waiting)
    for sid, mine in waiting.items():
        if len(mine) == 1 and sid not in counts:
            return len(waiting) > 1 or any(s != sid for s in counts)
    return False


def _fits(items: list[_Item], budget: int, share: int) -> bool:
    """Whether one transaction may take all of ``items``, as `_fill` would."""
    if len(items) > budget:  # (every item counts at least one event)
        return False
    per: dict[str, int] = {}
    total = 0
    for item in items:
        n = len(item.events) or 1
        total += n
        per[item.session_id] = per.get(item.session_id, 0) + n
    if total > budget and len(items) > 1:
        return False
    if len(items) > 1 and sum(_bytes(item) for item in items) > MAX_BATCH_BYTES:
        return False
    # Each session's first item is taken whatever its size; more only within the share.
    firsts: dict[str, int] = {}
    for item in items:
        sid = item.session_id
        if sid not in firsts:
            firsts[sid] = len(item.events) or 1
    return all(per[sid] <= share or per[sid] == firsts[sid] for sid in per)


def _for_session(err: StoreError, session_id: str) -> StoreError:
    if getattr(err, "session_id", None) == session_id:
        return err
    out = (ConflictError if isinstance(err, ConflictError) else StoreError)(
        str(err), session_id=session_id
    )
    out.__cause__ = err
    return out


def _after(err: StoreError, session_id: str) -> StoreError:
    return StoreError(
        f"not written: an earlier write of this session failed ({err}); "
        "restart the session to reload it from the store",
        session_id=session_id,
    )


def _notify(item: _Item, err: StoreError | None) -> None:
    try:
        item.done(err)
    except BaseException as exc:  # a session's callback must not stop the writer
        logger.error(
            "store.notify_failed",
            session_id=item.session_id,
            reason=type(exc).__name__,
            error=short_repr(exc),
        )


_committers: weakref.WeakKeyDictionary[object, Committer] = weakref.WeakKeyDictionary()
_committers_lock = forks.lock()


def committer_for(store: Store) -> Committer:
    """The committer of ``store`` (one per store object, started on first use)."""
    with _committers_lock:
        c = _committers.get(store)
        if c is None:
            c = Committer(store)
            _committers[store] = c
        return c
