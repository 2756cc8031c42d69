"""What every `NousSession` of one session id shares in a process: its lock, its state,
and the turns the running task is in.

`_Mutex` is a lock that coroutines on any event loop in any thread hold across
awaits; `_shared_for` gives the one `_Shared` of a session id in a registry;
`_turn_of` the turn through which the running task calls it, if any.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field

from nous_actor.errors import CallTimeout
from nous_actor.runtime import forks
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn

# -- one lock per session, for coroutines on any loop in any thread ---------------------------


class _Mutex:
    """A lock that coroutines hold across awaits, from any event loop in any thread.

    Waiters are served first come, first served. A waiter cancelled (or timed
    out) while the lock is handed to it passes the lock on: it is never lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self, timeout: float, session_id: str) -> None:
        """Wait at most `timeout` seconds for the lock.

        Raises:
            CallTimeout: not acquired in time (the lock is not taken).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._held:
                self._held = True
                return
            waiter: asyncio.Future[None] = loop.create_future()
            entry = (loop, waiter)
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException as exc:
            with self._lock:
                try:
                    self._waiters.remove(entry)
                    handed = False
                except ValueError:
                    handed = True
            if handed and waiter.done() and not waiter.cancelled():
                self.release()  # it was ours already: pass it on
            # (handed but cancelled: _wake finds it cancelled and passes it on)
            if isinstance(exc, TimeoutError):
                raise CallTimeout(
                    session_id,
                    f"another call on this session held it for more than {timeout:g} s",
                ) from None
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._wake, waiter)
                except RuntimeError:  # its loop is closed: the next one
                    continue
                return
            self._held = False

    def _wake(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled():
            self.release()
        else:
            waiter.set_result(None)


@dataclass(eq=False)
class _Shared:
    """What every `NousSession` of one session id in one registry shares."""

    lock: _Mutex = field(default_factory=_Mutex)
    # Whether the surface may end in a cleared marker that the next add_items
    # replaces: None unknown (read the surface), False no, as long as the log's next
    # seq is still ``after`` (another process, or other code, may write it meanwhile).
    marker: bool | None = None
    after: int | None = None
    # Whether a turn was ever opened on it here: then a call outside any turn first
    # waits for an open turn to end, before it takes the lock.
    turns: bool = False


# The turns the running task is in: which session (its `_Shared`) and through what.
_IN_TURN: contextvars.ContextVar[tuple[tuple[_Shared, Turn], ...]] = contextvars.ContextVar(
    "nous_actor_openai_turns", default=()
)


def _turn_of(shared: _Shared) -> Turn | None:
    for key, turn in _IN_TURN.get():
        if key is shared:
            return turn
    return None


_SHARED_LOCK = forks.lock()
_SHARED: weakref.WeakKeyDictionary[Sessions, weakref.WeakValueDictionary[str, _Shared]] = (
    weakref.WeakKeyDictionary()
)


def _shared_for(sessions: Sessions, session_id: str) -> _Shared:
    with _SHARED_LOCK:
        by_id = _SHARED.get(sessions)
        if by_id is None:
            by_id = _SHARED[sessions] = weakref.WeakValueDictionary()
        shared = by_id.get(session_id)
        if shared is None:
            shared = by_id[session_id] = _Shared()
        return shared
