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
* ``handoff_poll`` (an attribute, seconds): look for requests this often rather
  than at each change of the store (see `handoff_poll`).
* ``next_seq(session_id) -> int``: the stored history's next seq, without a
  claim and without decoding it.
* ``load_surface(session_id) -> (seqs, messages)``: what
  ``Log.restore(load_since(session_id, 0)).derive_indexed()`` gives, as two
  lists, read without a claim and without an event per row (a reader's cold
  read). Used only where the store's class defines it at least as far down as
  ``load_since``: a subclass that changes ``load_since`` alone is read through it.
* ``write_turn() -> context manager of bool``: the store's turn at writing among
  the processes that write it, taken ahead of a write (a SQLite file's); in the
  block, this thread's writes take no other turn (see `write_turn`).
* ``wait_changed(after, timeout) -> int``: wait at most ``timeout`` seconds for
  anything to change in the store (a commit, a claim, a release, a request)
  after the change counter ``after``; returns the counter now. (`PostgresStore`
  counts releases and requests, and commits only while it watches a session.)

Forwarding (a call made where a session is not held goes to its holder) needs
three more; a store without them keeps the hand-off alone:

* ``advertise(address) -> None``: where this store object's process answers
  calls for the sessions it holds (``None``: nowhere); written with every
  claim it takes from then on, and at once into the claims it holds.
* ``holder_address(session_id) -> (holder, address) | None``: the live holder
  (as ``held_by`` names it) and the address it advertised (``None``: none).
* ``forwarding_key() -> bytes``: the store's shared secret, the same bytes in
  every process that opens the store (a store reachable from this process
  alone, such as `MemoryStore`, has none).

Neither reading nor watching takes a claim, so neither ever blocks a writer.

The functions above are this package's own; it names for users the feed
they build on (`FollowedWatch`, from `nous_actor.store.feed`) and the SQLite
follower (`SQLiteFollower`, `FOLLOW_INTERVAL`, from
`nous_actor.store.sqlite.follower`). The SQLite implementations of the
optional methods live with `SQLiteStore`, in `nous_actor.store.sqlite`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from nous_actor.core.args import check_bound as _check_bound
from nous_actor.core.args import check_seconds as _check_seconds
from nous_actor.core.event import Event
from nous_actor.core.log import Log
from nous_actor.core.message import Message
from nous_actor.errors import StoreError
from nous_actor.store.base import Store, valid_store_id
from nous_actor.store.feed import DEFAULT_WATCH_BUFFER as DEFAULT_WATCH_BUFFER
from nous_actor.store.feed import FollowedWatch as FollowedWatch
from nous_actor.store.feed import _check_buffer, _check_from_seq, _fill
from nous_actor.store.sqlite.follower import FOLLOW_INTERVAL as FOLLOW_INTERVAL
from nous_actor.store.sqlite.follower import SQLiteFollower as SQLiteFollower
from nous_actor.store.sqlite.follower import close_follower as close_follower
from nous_actor.store.sqlite.follower import follower_of as follower_of
from nous_actor.store.subscription import Subscription

__all__ = [
    "NO_TURN",
    "FOLLOW_INTERVAL",
    "FollowedWatch",
    "advertise",
    "ask_handoff",
    "forwarding_key",
    "forwards_between_processes",
    "handoff_requests",
    "handoff_poll",
    "held_by",
    "holder_address",
    "load_since",
    "next_seq",
    "release_many",
    "supports_forwarding",
    "tells_holders",
    "supports_handoff",
    "wait_changed",
    "watch",
    "withdraw_handoff",
    "write_turn",
]

FALLBACK_INTERVAL: Final = 0.05
"""How often a store without ``watch`` or ``wait_changed`` is read again by the
fallbacks here."""


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


def load_surface(store: Store, session_id: str) -> tuple[list[int], list[Message]]:
    """The committed surface of ``session_id``: the seqs and the messages of
    ``Log.restore(load_since(store, session_id)).derive_indexed()``, read without
    claiming the session; by the store's own ``load_surface`` when it has one that
    reads what its ``load_since`` reads (see the module docs), else folded.

    Raises:
        StoreError: the session id is not valid, or the store failed (a stored row is
            malformed).
    """
    own: Callable[[str], tuple[list[int], list[Message]]] | None = _own(store, "load_surface")
    if own is not None and _as_deep(type(store), "load_surface", "load_since"):
        return own(session_id)
    pairs = Log.restore(load_since(store, session_id)).derive_indexed()
    return [seq for seq, _ in pairs], [m for _, m in pairs]


def _as_deep(cls: type, name: str, base: str) -> bool:
    """Whether ``cls`` defines ``name`` in the class that defines ``base`` or below it."""
    found = _deep.get((cls, name, base))
    if found is None:
        mro = cls.__mro__
        where = [
            next((i for i, c in enumerate(mro) if n in vars(c)), len(mro)) for n in (name, base)
        ]
        found = _deep[(cls, name, base)] = where[0] <= where[1]
    return found


_deep: dict[tuple[type, str, str], bool] = {}


def next_seq(store: Store, session_id: str) -> int:
    """The next seq of ``session_id``'s stored history (its last event's seq + 1, 0 if
    it has none), read without claiming the session and without decoding it when the
    store can tell by itself (SQLite and PostgreSQL: one indexed ``max``).

    Raises:
        StoreError: the session id is not valid, or the store failed.
    """
    own: Callable[[str], int] | None = _own(store, "next_seq")
    if own is not None:
        return int(own(session_id))
    events = load_since(store, session_id)
    return events[-1].seq + 1 if events else 0


def write_turn(store: Store) -> contextlib.AbstractContextManager[bool]:
    """The store's turn at writing among the processes that write it, taken ahead of a
    write and held for the ``with`` block: whether it came. A store's committer takes
    it before it fills a transaction, so that what its sessions send while other
    processes write goes in that transaction (`SQLiteStore`: the file's queue of
    writers). A store without one: ``False`` at once (its writes wait, if they must).
    """
    own: Callable[[], contextlib.AbstractContextManager[bool]] | None = _own(store, "write_turn")
    return own() if own is not None else NO_TURN


NO_TURN: Final = contextlib.nullcontext(False)
"""No turn at writing (`write_turn` of a store without one)."""


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

    ``timeout`` is the feed's gets' default bound: any number of seconds but NaN (0
    or less: a get answers what is there, without waiting), checked here for every
    store, before its own ``watch`` is asked.

    Raises:
        TypeError, ValueError: ``from_seq``, ``buffer`` or ``timeout`` is not valid.
        StoreError: the session id is not valid, or the store is closed.
    """
    from_seq = _check_from_seq(from_seq)
    buffer = _check_buffer(buffer)
    timeout = _check_bound(timeout, "watch(timeout)")
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


def release_many(store: Store, claims: Sequence[tuple[str, str]]) -> None:
    """Give up many claims at once (``(session id, token)`` pairs): in one transaction
    where the store can (SQLite), else one `Store.release` each. A pair whose token no
    longer holds its session is skipped, as `Store.release` does.

    Raises:
        StoreError: the store failed (a claim not given up then lapses as its holder's
            would: when its process ends, or its lease runs out).
    """
    own: Callable[[Sequence[tuple[str, str]]], None] | None = _own(store, "release_many")
    if own is not None:
        own(claims)
        return
    failed: StoreError | None = None
    for session_id, token in claims:
        try:
            store.release(session_id, token)
        except StoreError as exc:  # the others are still given up
            failed = failed or exc
    if failed is not None:
        raise failed


def supports_forwarding(store: Store) -> bool:
    """Whether ``store`` keeps its holders' addresses (``advertise`` and
    ``holder_address``), so that calls can go to a session's holder."""
    return _own(store, "advertise") is not None and _own(store, "holder_address") is not None


def forwards_between_processes(store: Store) -> bool:
    """Whether calls can go to a session's holder in another process on ``store``: it
    keeps holders' addresses and has a shared secret (``forwarding_key``)."""
    return supports_forwarding(store) and _own(store, "forwarding_key") is not None


def tells_holders(store: Store) -> bool:
    """Whether ``store`` can say who holds a session (``holder_address`` or ``held_by``):
    without either, a claim refused by another writer is all there is to know."""
    return _own(store, "holder_address") is not None or _own(store, "held_by") is not None


def advertise(store: Store, address: str | None) -> None:
    """Tell ``store`` where this process answers calls for the sessions it holds (no-op
    for a store that keeps no addresses).

    Raises:
        StoreError: the store is closed or failed.
    """
    own: Callable[[str | None], None] | None = _own(store, "advertise")
    if own is not None:
        own(address)


def holder_address(store: Store, session_id: str) -> tuple[str, str | None] | None:
    """The live holder of ``session_id`` and the address it answers at (``None`` if it
    advertised none); ``None`` if nobody holds it (or the store cannot tell).

    Raises:
        StoreError: the session id is not valid, or the store failed.
    """
    own: Callable[[str], tuple[str, str | None] | None] | None = _own(store, "holder_address")
    if own is not None:
        return own(session_id)
    who = held_by(store, session_id)
    return None if who is None else (who, None)


def forwarding_key(store: Store) -> bytes | None:
    """The store's shared secret for forwarding between processes; ``None`` for a store
    that has none (reachable from this process only).

    Raises:
        StoreError: the store is closed or failed.
    """
    own: Callable[[], bytes] | None = _own(store, "forwarding_key")
    return None if own is None else bytes(own())


def handoff_poll(store: Store) -> float | None:
    """How often a holder looks for hand-off requests on ``store`` (its attribute
    ``handoff_poll``, seconds), or ``None``: it waits for the store to change
    (``wait_changed``) and looks then. A store whose change feed is itself a poll of
    something every commit changes (`SQLiteStore`: the file) names an interval: a
    holder waiting for changes there woke, and read the requests, at every commit of
    every process."""
    poll = getattr(store, "handoff_poll", None)
    if isinstance(poll, (int, float)) and not isinstance(poll, bool) and 0 < poll <= 1:
        return float(poll)
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


# -- the fallback feed -----------------------------------------------------------------------


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


# The public classes are named by this package, where users import them from.
FollowedWatch.__module__ = __name__
SQLiteFollower.__module__ = __name__
