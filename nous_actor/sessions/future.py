"""Futures answered by a session actor: bounded waits, and awaitable without blocking asyncio."""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import weakref
from _thread import LockType, allocate_lock
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, Final, TypeVar

import pykka

from nous_actor._log import get_logger
from nous_actor.core._frozen import short_repr
from nous_actor.core.args import check_bound
from nous_actor.errors import CallTimeout
from nous_actor.runtime import forks, scheduling

__all__ = ["DEFAULT_TIMEOUT", "ForwardedFuture", "SessionFuture"]

T = TypeVar("T")

logger = get_logger(__name__)

DEFAULT_TIMEOUT = 30.0
"""Seconds a call on a session waits for its answer unless told otherwise."""

_PENDING, _VALUE, _ERROR = 0, 1, 2

_UNSET: Final = pykka.Future()._get_hook_result
"""Pykka's marker of a get hook's result not computed yet, one for every future (Pykka
makes one per future, an object the cyclic collector tracks for each call in flight)."""

_ANSWER_LOCKS: Final = tuple(forks.lock() for _ in range(64))
"""The locks that make a future's answer and its callbacks one step, shared by futures
in stripes (a lock of its own would be one more object per call in flight for the
cyclic collector); each is held for a few attribute reads and writes."""


class SessionFuture(pykka.Future[T]):
    """The answer to one call on a session: a Pykka future with two differences.

    * ``get()`` without a timeout waits at most the session handle's default
      bound (`nous_actor.CallTimeout` after it), never forever.
    * ``await future`` inside asyncio suspends the coroutine without blocking
      the event loop (Pykka's own ``__await__`` calls the blocking ``get``).

    Everything else (``pykka.get_all``, ``map``, ``join``) works as in Pykka.
    A future is answered exactly once; later answers are refused with
    ``queue.Full`` as in Pykka.
    """

    __slots__ = (
        "_callbacks",
        "_get_hook",
        "_get_hook_result",
        "_lock",
        "_needs_loop",
        "_ready",
        "_session_id",
        "_state",
        "_tb",
        "_timeout",
        "_value",
        "_waiter",
        "_waker",
    )

    def __init__(self, session_id: str = "?", timeout: float = DEFAULT_TIMEOUT) -> None:
        # Pykka's Future.__init__, with its marker shared (see _UNSET).
        self._get_hook = None
        self._get_hook_result = _UNSET
        self._session_id = session_id
        self._timeout = timeout
        self._state = _PENDING
        self._value: Any = None
        # Guards the answer (once) and the callbacks.
        self._lock = _ANSWER_LOCKS[(id(self) >> 4) & 63]
        # Made (held) by the first thread that blocks in get(), released by the answer:
        # an awaited or callback-driven call never makes one.
        self._ready: LockType | None = None
        # One callback as it is, a list only from the second (most futures with a
        # callback have one: a session opening, the registry's news of it).
        self._callbacks: Callable[[], None] | list[Callable[[], None]] | None = None
        # The coroutine awaiting it, if one does: woken by its loop's waker, with no
        # callback object made for it.
        self._waiter: asyncio.Future[Any] | None = None
        self._waker: _LoopWaker | None = None
        self._tb: Any = None
        # The event loop that must run for this future to be answered (a coroutine
        # summariser's): a blocking get() from inside it would wait out its bound.
        self._needs_loop: asyncio.AbstractEventLoop | None = None

    # -- answering (the actor thread, or the handle in Pykka's stop race) ------------------

    def _resolve(self, value: Any, state: int = _VALUE) -> bool:
        """Answer with ``value`` unless already answered (with ``state`` `_ERROR`: fail with
        it, as `_fail`); ``True`` if this call did."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._value = value
            if state == _ERROR:
                self._tb = value.__traceback__  # re-raised from here each time: no growth
            self._state = state
            callbacks, self._callbacks = self._callbacks, None
            waiter, waker = self._waiter, self._waker
            self._waiter = self._waker = None  # an answered future keeps no loop alive
            ready = self._ready
        if ready is not None:
            ready.release()  # the first blocked get() takes it, and passes it on
        if waker is not None:
            try:
                waker.push(waiter)  # type: ignore[arg-type]  # set with the waker
            except BaseException as exc:
                _callback_failed(exc, self._session_id)
        if callbacks is not None:
            if type(callbacks) is list:
                for cb in callbacks:
                    _run_callback(cb, self._session_id)
            else:
                _run_callback(callbacks, self._session_id)  # type: ignore[arg-type]
        return True

    def set(self, value: Any | None = None) -> None:
        if not self._resolve(value):
            raise queue.Full

    def set_exception(self, exc_info: Any = None) -> None:
        if exc_info is None:
            import sys

            exc_info = sys.exc_info()
        exc = exc_info[1] if exc_info[1] is not None else exc_info[0]()
        if not self._resolve(exc, _ERROR):
            raise queue.Full

    def set_get_hook(self, func: Any) -> None:
        if self._state != _PENDING:
            raise queue.Full
        super().set_get_hook(func)

    def _fail(self, exc: BaseException) -> bool:
        """Answer with ``exc`` unless already answered; ``True`` if this call did."""
        return self._resolve(exc, _ERROR)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the future is answered (at once if it already is).

        ``fn`` runs in the thread that answers: keep it short, never let it raise.
        """
        with self._lock:
            if self._state == _PENDING:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = fn
                elif type(callbacks) is list:
                    callbacks.append(fn)
                else:
                    self._callbacks = [callbacks, fn]  # type: ignore[list-item]
                return
        _run_callback(fn, self._session_id)

    def _relay(self, to: SessionFuture[Any], value: Any) -> None:
        """Once answered, answer ``to``: with ``value`` if this future succeeded, else with
        this future's error."""
        self.add_done_callback(_Relay(self, to, value))

    def done(self) -> bool:
        """Whether the future has been answered."""
        return self._state != _PENDING

    def failed(self) -> bool:
        """Whether the future has been answered with an error."""
        return self._state == _ERROR

    # -- waiting ---------------------------------------------------------------------------

    def get(self, *, timeout: float | None = None) -> T:
        """The answer, waiting at most ``timeout`` seconds (default: the session's bound).

        Raises:
            CallTimeout: no answer in time (the call may still be applied).
            RuntimeError: called from inside the event loop that must run this
                future's coroutine summariser (``await`` it instead).
            Exception: whatever the call raised (e.g. ``InvalidEvent``, ``SessionStopped``).
            TypeError, ValueError: ``timeout`` is not ``None`` or a number of seconds
                (NaN is refused; 0 or less: at once; infinite: no bound).
        """
        if timeout is not None:
            timeout = check_bound(timeout, "get(timeout)")
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if self._state == _PENDING:
            if self._needs_loop is not None and asyncio._get_running_loop() is self._needs_loop:
                raise RuntimeError(
                    f"get() on session {self._session_id!r} blocks the event loop that must "
                    "run its coroutine summariser, so it could never be answered: "
                    "'await' the future instead"
                )
            bound = self._timeout if timeout is None else timeout
            if not scheduling.current().wait(self.done, bound, self._acquire):
                raise CallTimeout(
                    self._session_id, f"no answer within {bound:g} s; the call may still apply"
                )
        if self._state == _ERROR:
            raise self._value.with_traceback(self._tb)
        return self._value  # type: ignore[no-any-return]

    def _acquire(self, timeout: float | None) -> bool:
        """Block until answered, at most ``timeout``; whether it was answered."""
        with self._lock:
            if self._state != _PENDING:
                return True
            ready = self._ready
            if ready is None:
                ready = self._ready = allocate_lock()
                ready.acquire()
        bound = threading.TIMEOUT_MAX if timeout is None else timeout
        if not ready.acquire(True, min(max(bound, 0), threading.TIMEOUT_MAX)):
            return False
        ready.release()  # for the next thread blocked on this future
        return True

    def __await__(self) -> Generator[Any, None, T]:
        if self._get_hook is not None or self._state != _PENDING:
            return self._await_slow()
        loop, waker = _waker()
        # The awaiting task waits on ``waiter`` itself: the loop's waker gives it this
        # future's value or error (`_LoopWaker._drain`), so the await is the waiter's
        # own iterator, with no generator of ours around it.
        waiter: asyncio.Future[T] = loop.create_future()
        waker.watch(loop, waiter, self)
        with self._lock:
            pending = self._state == _PENDING
            first = pending and self._waker is None  # the one awaiting coroutine
            if first:
                self._waiter, self._waker = waiter, waker
        if not pending:
            waker.push(waiter)
        elif not first:  # awaited by more than one coroutine at once
            self.add_done_callback(partial(waker.push, waiter))
        return waiter.__await__()

    def _await_slow(self) -> Generator[Any, None, T]:
        """An answered future's value, or a future made by map/filter/join (computed by
        a blocking get, in the loop's executor)."""
        if self._get_hook is not None:
            loop = asyncio.get_running_loop()
            waiting = loop.run_in_executor(None, partial(self.get, timeout=self._timeout))
            return (yield from waiting.__await__())
        return self.get(timeout=0)
        yield  # (a generator)

    __iter__ = __await__

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _VALUE: "done", _ERROR: "failed"}[self._state]
        return f"<SessionFuture {self._session_id!r} {state}>"


class ForwardedFuture(SessionFuture[T]):
    """The answer to a call another process sent to a session held here: a
    `SessionFuture` that also carries the call's id (``call_id``), which the holder
    records with what the call appends, in the same transaction (its caller checks it
    with ``session.applied(call_id)`` when the answer never reached it)."""

    __slots__ = ("call_id",)

    def __init__(self, session_id: str, timeout: float, call_id: str) -> None:
        super().__init__(session_id, timeout)
        self.call_id = call_id


class _Relay:
    """`SessionFuture._relay`'s callback: one object for the cyclic collector, where a
    ``partial`` was two (it and its arguments' tuple), per session opened at once."""

    __slots__ = ("src", "to", "value")

    def __init__(self, src: SessionFuture[Any], to: SessionFuture[Any], value: Any) -> None:
        self.src = src
        self.to = to
        self.value = value

    def __call__(self) -> None:
        src = self.src
        if src._state == _ERROR:
            self.to._fail(src._value)
        else:
            self.to._resolve(self.value)


def _run_callback(fn: Callable[[], None], session_id: str) -> None:
    """Run a done callback; whatever it raises is logged, never passed on (it runs in
    the thread that answers: a session's actor or a store's writer)."""
    try:
        fn()
    except BaseException as exc:
        _callback_failed(exc, session_id)


def _callback_failed(exc: BaseException, session_id: str) -> None:
    logger.error(
        "future.callback_failed",
        session_id=session_id,
        reason=type(exc).__name__,
        error=short_repr(exc),
    )


TICK: Final = 0.05
"""Granularity, in seconds, of the bound on an awaited call: a ``CallTimeout`` comes
at most this much after the bound."""


class _LoopWaker:
    """What wakes the coroutines of one event loop that await session futures.

    Futures answered in other threads (a session's actor, a store's writer)
    queue their waiters (the asyncio futures their tasks await) here; the first
    of a batch schedules one callback on the loop (one ``call_soon_threadsafe``,
    one wake-up of the loop), which answers them all with their futures' values
    or errors. Bounds are enforced by one loop timer for every awaited
    future, in buckets of `TICK` seconds, not by a timer per await; the timer is
    cancelled once no await is left to bound (an idle loop keeps no timer of ours).
    """

    __slots__ = ("armed", "buckets", "lock", "loop", "ready", "scheduled", "timer", "watched")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the waker is the value of a weak-keyed map from its loop.
        self.loop = weakref.ref(loop)
        self.lock = allocate_lock()
        self.ready: list[asyncio.Future[Any]] = []
        self.scheduled = False
        self.buckets: dict[int, dict[asyncio.Future[Any], SessionFuture[Any]]] = {}
        self.watched: dict[asyncio.Future[Any], int] = {}  # each waiter's bucket
        self.armed: int | None = None  # the bucket the loop timer is set for
        self.timer: asyncio.TimerHandle | None = None  # that timer

    # -- any thread ------------------------------------------------------------------------

    def push(self, waiter: asyncio.Future[Any]) -> None:
        with self.lock:
            self.ready.append(waiter)
            if self.scheduled:
                return
            self.scheduled = True
        loop = self.loop()
        if loop is None:  # the loop is gone: nobody waits
            return
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop was closed meanwhile: nobody waits
            pass

    # -- the loop's thread -----------------------------------------------------------------

    def _drain(self) -> None:
        with self.lock:
            ready, self.ready = self.ready, []
            self.scheduled = False
        watched, buckets = self.watched, self.buckets
        for waiter in ready:
            bucket = watched.pop(waiter, None)
            if bucket is None:  # timed out meanwhile: answered by _expire
                continue
            fut = buckets[bucket].pop(waiter)
            if not buckets[bucket]:
                self._emptied(bucket)
            if waiter.done():  # its task was cancelled
                continue
            if fut._state == _ERROR:
                waiter.set_exception(fut._value.with_traceback(fut._tb))
            else:
                waiter.set_result(fut._value)

    def watch(
        self,
        loop: asyncio.AbstractEventLoop,
        waiter: asyncio.Future[Any],
        fut: SessionFuture[Any],
    ) -> None:
        bucket = math.ceil((loop.time() + fut._timeout) / TICK)
        waiting = self.buckets.get(bucket)
        if waiting is None:
            waiting = self.buckets[bucket] = {}
            if self.armed is None or bucket < self.armed:
                if self.timer is not None:  # superseded by an earlier bucket
                    self.timer.cancel()
                self.armed = bucket
                self.timer = loop.call_at(bucket * TICK, self._expire, bucket)
        waiting[waiter] = fut
        self.watched[waiter] = bucket

    def _emptied(self, bucket: int) -> None:
        del self.buckets[bucket]
        if not self.buckets and self.timer is not None:  # nothing left to bound
            self.timer.cancel()
            self.timer = None
            self.armed = None

    def _expire(self, bucket: int) -> None:
        if bucket != self.armed:  # superseded by an earlier timer
            return
        self.armed = None
        self.timer = None
        loop = self.loop()
        if loop is None:
            return
        now = loop.time()
        for key in sorted(self.buckets):
            if key * TICK > now:
                self.armed = key
                self.timer = loop.call_at(key * TICK, self._expire, key)
                return
            for waiter, fut in self.buckets.pop(key).items():
                self.watched.pop(waiter, None)
                if not waiter.done():
                    waiter.set_exception(
                        CallTimeout(
                            fut._session_id,
                            f"no answer within {fut._timeout:g} s; the call may still apply",
                        )
                    )


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = (
    weakref.WeakKeyDictionary()
)
_last: list[_LoopWaker | None] = [None]  # the last one looked up: the common case


def _waker() -> tuple[asyncio.AbstractEventLoop, _LoopWaker]:
    loop = asyncio.get_running_loop()
    waker = _last[0]
    if waker is not None and waker.loop() is loop:
        return loop, waker
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    _last[0] = waker
    return loop, waker
