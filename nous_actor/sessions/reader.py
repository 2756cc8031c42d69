"""A read-only view of a session that never takes it: reads of the committed history.

`Sessions.read` (or `SessionReader(session_id, store)`) gives one. Any process
may read any session this way, whoever holds it: nothing is claimed, so no
writer is ever blocked and no reader is ever refused. The names are the
handle's read methods, and each returns a `SessionFuture` (``.get()``, or
``await`` from asyncio without blocking the loop)::

    reader = sessions.read("chat-42")
    messages = reader.derive_messages().get()
    for event in reader.subscribe(from_seq=len(messages)): ...

What a read sees is the store's **committed prefix** at the moment of the read:
every event acknowledged before the read began, never an event that was not
committed. Called from an event loop's thread, a read is made by a small pool (never
on the loop); from any other thread, in that thread before the future is returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, TypeVar

from nous_actor.core.args import check_timeout
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log
from nous_actor.core.message import Message
from nous_actor.runtime.dispatcher import Workers
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.store import shared
from nous_actor.store.base import Store, is_store
from nous_actor.store.subscription import Subscription

__all__ = ["READS", "SessionReader"]

T = TypeVar("T")

READS: Final = Workers(4, name="nous-read")
"""Where readers' reads run (never on the caller's event loop or a dispatcher thread)."""


def _check_seq(seq: object, what: str) -> int:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"{what} takes an int seq, got {type(seq).__name__}")
    if seq < 0:
        raise ValueError(f"{what} takes a seq >= 0, got {seq}")
    return seq


class SessionReader:
    """The committed history of one session in a store, read without taking the session.

    Every method reads the store afresh (one query), so two calls may see
    different prefixes when a writer commits in between; for one consistent
    view, take `log` once and read from the `Log`. `subscribe` follows new
    commits from any process.

    Args:
        session_id: the session's id.
        store: the store it lives in.
        timeout: the default bound, in seconds, of every wait on a result.

    Raises:
        TypeError, ValueError: ``session_id`` or ``timeout`` is not valid, or
            ``store`` is not a store.
    """

    __slots__ = ("session_id", "store", "timeout")

    def __init__(self, session_id: str, store: Store, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        session_id = check_session_id(session_id)
        if not is_store(store):
            raise TypeError(
                f"store must implement nous_actor.store.Store, got {type(store).__name__}"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < float("inf")
        ):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.session_id = session_id
        self.store = store
        self.timeout = float(timeout)

    def _read(self, work: Callable[[], T]) -> SessionFuture[T]:
        fut: SessionFuture[T] = SessionFuture(self.session_id, self.timeout)

        def run() -> None:
            try:
                fut._resolve(work())
            except BaseException as exc:
                fut._fail(exc)

        if asyncio._get_running_loop() is None:
            run()  # a thread's call: read here (the future is answered on return)
        else:
            READS.submit(run)  # never on the event loop
        return fut

    def _load(self, from_seq: int = 0) -> Log:
        return Log.restore(shared.load_since(self.store, self.session_id, from_seq))

    def _surface(self) -> tuple[list[int], list[Message]]:
        """The committed surface's seqs and messages: read straight from the rows where
        the store can (``load_surface``: no event built per row), else folded."""
        return shared.load_surface(self.store, self.session_id)

    # -- reads: the handle's names ---------------------------------------------------------

    def log(self) -> SessionFuture[Log]:
        """The committed history as a `Log` value (audit it with `nous_actor.core.history`:
        ``shadowed_by``, ``replaced``, ``explain``)."""
        return self._read(self._load)

    def derive_messages(self) -> SessionFuture[list[Any]]:
        """The model-visible messages of the committed history (a fresh list)."""
        return self._read(lambda: self._surface()[1])

    def derive_indexed(self) -> SessionFuture[list[tuple[int, Any]]]:
        """``(seq, message)`` pairs of the committed surface."""
        return self._read(lambda: list(zip(*self._surface(), strict=True)))

    def surface(self) -> SessionFuture[list[Any]]:
        """The committed surface events, in position order."""
        return self._read(lambda: self._load().surface())

    def events(self) -> SessionFuture[list[Any]]:
        """Every committed event still stored, oldest first."""
        return self._read(lambda: list(shared.load_since(self.store, self.session_id, 0)))

    def since(self, seq: int) -> SessionFuture[list[Any]]:
        """Committed events with ``seq >= seq`` (one read of only those rows).

        Raises:
            TypeError, ValueError: ``seq`` is not an int >= 0 (raised here).
        """
        seq = _check_seq(seq, "since(seq)")
        return self._read(lambda: list(shared.load_since(self.store, self.session_id, seq)))

    def count(self) -> SessionFuture[int]:
        """The next seq of the committed history (0 for a session with no events)."""
        return self._read(lambda: shared.next_seq(self.store, self.session_id))

    def as_of(self, seq: int) -> SessionFuture[Log]:
        """The committed log as it was right after event ``seq`` (see `Log.as_of`).

        Raises:
            TypeError, ValueError: ``seq`` is not an int >= 0 (raised here).
        """
        seq = _check_seq(seq, "as_of(seq)")
        return self._read(lambda: self._load().as_of(seq))

    def held_by(self) -> SessionFuture[str | None]:
        """Who holds the session now (e.g. ``"process 4242"``), or ``None`` if nobody
        does (or the store cannot tell)."""
        return self._read(lambda: shared.held_by(self.store, self.session_id))

    def subscribe(
        self, from_seq: int = 0, *, buffer: int = 1000, timeout: float | None = None
    ) -> Subscription:
        """Follow the session's commits from any process: every committed event with
        ``seq >= from_seq``, exactly once, in seq order (those stored already, then
        each as it commits; on SQLite a commit is seen within milliseconds). Close it
        when done (``with`` works). ``timeout`` is its gets' default bound (default: the
        reader's); checked as a handle's ``subscribe(timeout=)`` is (any number but NaN:
        0 or less, a get answers what is there, without waiting).

        Raises:
            TypeError, ValueError: ``from_seq``, ``buffer`` or ``timeout`` is not valid.
            StoreError: the store is closed.
        """
        _check_seq(from_seq, "subscribe(from_seq)")
        bound = check_timeout(timeout, "subscribe(timeout)")
        return shared.watch(
            self.store,
            self.session_id,
            from_seq,
            buffer=buffer,
            timeout=self.timeout if bound is None else bound,
        )

    def __repr__(self) -> str:
        return f"<SessionReader {self.session_id!r} on {self.store!r}>"
