"""Futures answered by a session actor: bounded waits, and awaitable without blocking asyncio."""

from __future__ import annotations

import asyncio
import queue
import threading
from _thread import allocate_lock
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, TypeVar

import pykka
import structlog

from nous_actor._frozen import short_repr
from nous_actor.errors import CallTimeout

__all__ = ["DEFAULT_TIMEOUT", "SessionFuture"]

T = TypeVar("T")

logger = structlog.get_logger(__name__)

DEFAULT_TIMEOUT = 30.0
"""Seconds a call on a session waits for its answer unless told otherwise."""

_PENDING, _VALUE, _ERROR = 0, 1, 2


class SessionFuture(pykka.Future[T]):
    """The answer to one call on a session: a Pykka future with two differences.

    * ``get()`` without a timeout waits at most the session handle's default
      bound (:class:`~nous_actor.CallTimeout` after it), never forever.
    * ``await future`` inside asyncio suspends the coroutine without blocking
      the event loop (Pykka's own ``__await__`` calls the blocking ``get``).

    Everything else (``pykka.get_all``, ``map``, ``join``) works as in Pykka.
    A future is answered exactly once; later answers are refused with
    ``queue.Full`` as in Pykka.
    """

    def __init__(self, session_id: str = "?", timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__()
        self._session_id = session_id
        self._timeout = timeout
        self._state = _PENDING
        self._value: Any = None
        self._setter = allocate_lock()  # taken by whoever answers, once
        self._ready = allocate_lock()  # held until answered
        self._ready.acquire()
        self._cb_lock = allocate_lock()
        self._callbacks: list[Callable[[], None]] | None = []
        self._tb: Any = None

    # -- answering (the actor thread, or the handle in Pykka's stop race) ------------------

    def _answer(self, state: int, value: Any) -> None:
        if not self._setter.acquire(False):
            raise queue.Full
        self._value = value
        if state == _ERROR:
            self._tb = value.__traceback__  # re-raised from here each time: no growth
        self._state = state
        with self._cb_lock:
            callbacks, self._callbacks = self._callbacks, None
        self._ready.release()
        for cb in callbacks or ():
            _run_callback(cb, self._session_id)

    def set(self, value: Any | None = None) -> None:
        self._answer(_VALUE, value)

    def set_exception(self, exc_info: Any = None) -> None:
        if exc_info is None:
            import sys

            exc_info = sys.exc_info()
        exc = exc_info[1] if exc_info[1] is not None else exc_info[0]()
        self._answer(_ERROR, exc)

    def set_get_hook(self, func: Any) -> None:
        if self._state != _PENDING:
            raise queue.Full
        super().set_get_hook(func)

    def _resolve(self, value: Any) -> bool:
        """Answer with ``value`` unless already answered; ``True`` if this call did."""
        try:
            self._answer(_VALUE, value)
        except queue.Full:
            return False
        return True

    def _fail(self, exc: BaseException) -> bool:
        """Answer with ``exc`` unless already answered; ``True`` if this call did."""
        try:
            self._answer(_ERROR, exc)
        except queue.Full:
            return False
        return True

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the future is answered (at once if it already is).

        ``fn`` runs in the thread that answers: keep it short, never let it raise.
        """
        with self._cb_lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        _run_callback(fn, self._session_id)

    def done(self) -> bool:
        """Whether the future has been answered."""
        return self._state != _PENDING

    # -- waiting ---------------------------------------------------------------------------

    def get(self, *, timeout: float | None = None) -> T:
        """The answer, waiting at most ``timeout`` seconds (default: the session's bound).

        Raises:
            CallTimeout: no answer in time (the call may still be applied).
            Exception: whatever the call raised (e.g. ``InvalidEvent``, ``SessionStopped``).
        """
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if self._state == _PENDING:
            bound = self._timeout if timeout is None else timeout
            if not self._ready.acquire(True, min(max(bound, 0), threading.TIMEOUT_MAX)):
                raise CallTimeout(
                    self._session_id, f"no answer within {bound:g} s; the call may still apply"
                )
            self._ready.release()
        if self._state == _ERROR:
            raise self._value.with_traceback(self._tb)
        return self._value  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, T]:
        if self._get_hook is not None:  # map/filter/join: computed by a blocking get
            loop = asyncio.get_running_loop()
            waiting = loop.run_in_executor(None, partial(self.get, timeout=self._timeout))
            return (yield from waiting.__await__())
        if self._state == _PENDING:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                try:
                    loop.call_soon_threadsafe(_set_if_pending, waiter)
                except RuntimeError:  # the loop was closed meanwhile: nobody waits
                    pass

            self.add_done_callback(wake)
            try:
                yield from asyncio.wait_for(waiter, self._timeout).__await__()
            except TimeoutError:
                raise CallTimeout(
                    self._session_id,
                    f"no answer within {self._timeout:g} s; the call may still apply",
                ) from None
        return self.get(timeout=0)

    __iter__ = __await__

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _VALUE: "done", _ERROR: "failed"}[self._state]
        return f"<SessionFuture {self._session_id!r} {state}>"


def _run_callback(fn: Callable[[], None], session_id: str) -> None:
    """Run a done callback; whatever it raises is logged, never passed on (it runs in
    the thread that answers: a session's actor or a store's writer)."""
    try:
        fn()
    except BaseException as exc:
        logger.error(
            "future.callback_failed",
            session_id=session_id,
            reason=type(exc).__name__,
            error=short_repr(exc),
        )


def _set_if_pending(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
