"""A live feed of one session's events: catch-up from the log, then live, exactly once."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Final

from nous_actor.core.args import check_bound
from nous_actor.core.event import Event
from nous_actor.errors import CallTimeout, SessionStopped, SubscriptionLagged
from nous_actor.runtime import scheduling, telemetry

__all__ = ["Subscription"]

DEFAULT_BUFFER = 10_000
"""Live events a subscriber may have pending before it is cut off as lagging."""


class _Moved(SessionStopped):
    """(Internal.) How a stopped session that lives on ends its feeds (see `MOVED`)."""


MOVED: Final = _Moved("", "the session stopped here and lives on in the store")
"""What a session that a registry stopped but that lives on (passivated, handed over to
another process) ends its subscriptions with: a registry handle's subscription then
follows the session through the store; any other ends as after any stop."""


class Subscription(Iterator[Event], AsyncIterator[Event]):
    """Every event of a session with ``seq >= from_seq``, exactly once, in seq order.

    First the retained events already in the log (catch-up), then each newly
    appended event as the session commits it; no gaps, no duplicates, because
    the session takes the catch-up and registers the subscriber in one step.

    Iterate it (``for ev in sub``) or ``async for ev in sub``; iteration ends
    when the session stops or the subscription is closed. `get` waits
    with a bound. (A registry handle's subscription goes on when its session is
    passivated or handed over to another process: it follows the session
    through the store, and ends when the session is stopped for good.)

    A slow subscriber never blocks the session: once more than ``buffer`` live
    events are pending it is cut off, and after the pending events the next
    read raises `nous_actor.SubscriptionLagged` whose ``next_seq`` says
    where to resume (``since(next_seq)`` or ``subscribe(from_seq=next_seq)``).
    """

    def __init__(
        self,
        session_id: str,
        *,
        from_seq: int = 0,
        buffer: int = DEFAULT_BUFFER,
        on_close: Callable[[Subscription], None] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            raise ValueError(f"buffer must be an int >= 1, got {buffer!r}")
        self.session_id = session_id
        self.from_seq = from_seq
        self.buffer = buffer
        self.timeout = timeout
        self._on_close = on_close
        self._cond = scheduling.current().condition()
        self._items: deque[Event] = deque()
        self._live = 0  # live (not catch-up) events among _items
        self._ended = False
        self._error: BaseException | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # -- the session's side (its actor thread) -----------------------------------------

    def _catch_up(self, events: Iterable[Event]) -> None:
        with self._cond:
            self._items.extend(events)

    def _push(self, ev: Event) -> bool:
        """Deliver ``ev``; ``False`` if this subscriber is done and should be dropped."""
        if ev.seq < self.from_seq:
            return True
        with self._cond:
            if self._ended:
                return False
            if self._live >= self.buffer:
                self._end_locked(SubscriptionLagged(self.session_id, ev.seq))
                sink = telemetry.sink
                if sink is not None:
                    sink.lagged()
                return False
            self._items.append(ev)
            self._live += 1
            self._cond.notify_all()
            self._wake_async()
        return True

    def _finish(self, error: BaseException | None = None) -> None:
        """End the feed: normally (``None``, or `MOVED`) or with ``error`` after the
        pending events."""
        if error is MOVED:
            error = None
        with self._cond:
            if not self._ended:
                self._end_locked(error)

    def _end_locked(self, error: BaseException | None) -> None:
        self._ended = True
        self._error = error
        self._cond.notify_all()
        self._wake_async()

    def _wake_async(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_set_if_pending, fut)
            except RuntimeError:  # loop closed: nobody waits any more
                pass

    # -- the consumer's side -----------------------------------------------------------

    _inner: Subscription | None = None
    """A feed this one reads on from once its own events are read (a registry handle's,
    whose session stopped here and lives on: see `nous_actor.sessions.handle`'s
    ``Following``); ``None``: its own events are all it has."""

    def _pop_locked(self) -> Event:
        ev = self._items.popleft()
        if self._live > len(self._items):
            self._live = len(self._items)
        return ev

    def _raise_end(self, stop: type[Exception]) -> Event:
        if self._error is not None:
            raise self._error.with_traceback(None)
        raise stop

    def _next_locked(self, stop: type[Exception]) -> Event | Subscription | None:
        """(Under ``_cond``.) Its next own event, else the feed it reads on from, else
        ``None`` (nothing yet); once it ended with nothing left, its error, or ``stop``."""
        if self._items:
            return self._pop_locked()
        if self._inner is not None:
            return self._inner
        if self._ended:
            self._raise_end(stop)
        return None

    def get(self, timeout: float | None = None) -> Event:
        """The next event, waiting at most ``timeout`` seconds (default: the handle's bound).

        Raises:
            CallTimeout: nothing arrived in time (the subscription stays usable).
            SubscriptionLagged: the subscriber was cut off; resume from ``next_seq``.
            SessionStopped: the feed ended (session stopped or subscription closed).
            TypeError, ValueError: ``timeout`` is not ``None`` or a number of seconds
                (NaN is refused; 0 or less: what is pending only; infinite: no bound).
        """
        bound = self.timeout if timeout is None else check_bound(timeout, "get(timeout)")
        host = scheduling.current()
        deadline = host.now() + bound
        while True:
            with self._cond:
                try:
                    got = self._next_locked(_Ended)
                except _Ended:
                    raise SessionStopped(self.session_id, "the subscription has ended") from None
            if isinstance(got, Event):
                return got
            if got is not None:
                return got.get(max(deadline - host.now(), 0.0))
            left = deadline - host.now()
            if left <= 0 or not host.wait(self._readable, left, self._wait_readable):
                raise CallTimeout(self.session_id, f"no event within {bound:g} s")

    def get_nowait(self) -> Event | None:
        """The next pending event, or ``None`` if there is none right now.

        Raises:
            SubscriptionLagged, SessionCrashed: the feed ended with that error.
            SessionStopped: the feed ended (nothing more will come).
        """
        with self._cond:
            try:
                got = self._next_locked(_Ended)
            except _Ended:
                raise SessionStopped(self.session_id, "the subscription has ended") from None
        if got is None or isinstance(got, Event):
            return got
        return got.get_nowait()

    def pending(self) -> int:
        """How many events are waiting to be read."""
        with self._cond:
            own, inner = len(self._items), self._inner
        return own + (0 if inner is None else inner.pending())

    def __iter__(self) -> Subscription:
        return self

    def _readable(self) -> bool:
        return bool(self._items) or self._ended or self._inner is not None

    def _wait_readable(self, timeout: float | None) -> bool:
        with self._cond:
            bound = None if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)
            return self._cond.wait_for(self._readable, bound)

    def __next__(self) -> Event:
        while True:
            with self._cond:
                got = self._next_locked(StopIteration)
            if isinstance(got, Event):
                return got
            if got is not None:
                return next(got)
            if not scheduling.current().wait(self._readable, None, self._wait_readable):
                raise CallTimeout(self.session_id, "no event (nothing else could run)")

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            with self._cond:
                got = self._next_locked(StopAsyncIteration)
                if got is None:
                    loop = asyncio.get_running_loop()
                    fut: asyncio.Future[None] = loop.create_future()
                    self._waiters.append((loop, fut))
            if isinstance(got, Event):
                return got
            if got is not None:
                return await got.__anext__()
            try:
                await fut
            except BaseException:
                # Cancelled (an `aget` whose bound ran out): no longer waiting. (Left
                # in the list, each poll of an idle feed would add one for good.)
                with self._cond:
                    if (loop, fut) in self._waiters:
                        self._waiters.remove((loop, fut))
                raise

    async def aget(self, timeout: float | None = None) -> Event:
        """`get` for asyncio code: the next event, awaited without blocking the loop, at
        most ``timeout`` seconds (default: the handle's bound).

        Raises:
            CallTimeout: nothing arrived in time (the subscription stays usable).
            SubscriptionLagged: the subscriber was cut off; resume from ``next_seq``.
            SessionStopped: the feed ended (session stopped or subscription closed).
            TypeError, ValueError: ``timeout`` is not ``None`` or a number of seconds
                (NaN is refused; 0 or less: what is pending only; infinite: no bound).
        """
        bound = self.timeout if timeout is None else check_bound(timeout, "aget(timeout)")
        ready = self.get_nowait()  # (what is pending is answered, whatever the bound)
        if ready is not None:
            return ready
        try:
            return await asyncio.wait_for(self.__anext__(), bound)
        except StopAsyncIteration:
            raise SessionStopped(self.session_id, "the subscription has ended") from None
        except TimeoutError:
            raise CallTimeout(self.session_id, f"no event within {bound:g} s") from None

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving; iteration ends after the events already pending."""
        self._finish(None)
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "ended" if self._ended else "following the store" if self._inner else "open"
        return f"<Subscription session={self.session_id!r} {state} pending={self.pending()}>"


class _Ended(Exception):
    """(Internal.) The feed ended with nothing left to read: `get` says so its own way."""


def _set_if_pending(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
