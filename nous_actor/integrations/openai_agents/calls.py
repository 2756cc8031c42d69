"""How a `NousSession`'s calls reach its session: `_Calls`, the line a `NousSession` holds
to its session (its handle, whether it is closed), how often a call is sent again, and
`NousSessionClosed`, what a closed one raises.

Mutations run one at a time under the session's lock and finish even if their
caller is cancelled; a call goes through the running task's turn when it is in
one, else to the registry's handle, and is sent again when a stopped session
refused it (appends pinned to one actor, so that the items keep their order).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, TypeVar

from nous_actor.core.event import EventType
from nous_actor.errors import SessionStopped
from nous_actor.integrations._resend import refused, resend
from nous_actor.integrations.openai_agents.shared import _shared_for, _turn_of
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session, SessionCalls
from nous_actor.sessions.registry import Sessions

T = TypeVar("T")

MAX_ATTEMPTS: Final = 5
"""How often a call is sent again when its session stopped before applying it."""


Pending = list[tuple[EventType, dict[str, Any]]]


class NousSessionClosed(SessionStopped, RuntimeError):
    """A call on a `NousSession` after its `close()`.

    A `SessionStopped` like every stopped call of this library, and a
    `RuntimeError` like a call on a closed session of the SDK's own
    (`SQLiteSession` raises ``RuntimeError("SQLiteSession is closed")``), so
    code written for either catches it. Nothing was applied: make a new
    `NousSession` to go on.
    """


class _Calls:
    """How the calls of one `NousSession` reach session ``session_id`` of ``sessions``:
    the handle (opened on first use, reopened when its session stopped), the state
    shared with every other `NousSession` on that id in the registry (``shared``: the
    lock mutations take, the open turns), and whether the `NousSession` is closed
    (then every call raises `NousSessionClosed`, and it stays closed)."""

    def __init__(self, session_id: str, sessions: Sessions) -> None:
        self.session_id = session_id
        self.sessions = sessions
        self.shared = _shared_for(sessions, session_id)
        self.handle: Session | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def check_open(self) -> None:
        if self.closed:
            raise NousSessionClosed(
                self.session_id, "this NousSession is closed; make a new one to go on"
            )

    async def mutate(self, body: Callable[[], Awaitable[T]]) -> T:
        """Run `body` holding the session's lock; once started, it finishes even if the
        caller is cancelled (then the cancellation is raised)."""
        shared = self.shared
        if shared.turns and _turn_of(shared) is None:
            # Outside any turn, while turns are used here: wait for the open one to
            # end before taking the lock (a write waiting for it would hold the lock
            # the turn's own calls need).
            await self.wait_for_turn()
        await shared.lock.acquire(self.sessions.timeout, self.session_id)

        async def locked() -> T:
            try:
                return await body()
            except BaseException:
                shared.marker = None  # what was stored is not known for sure
                raise
            finally:
                shared.lock.release()

        task = asyncio.ensure_future(locked())
        cancelled: BaseException | None = None
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
        if cancelled is not None:
            if not task.cancelled():
                task.exception()  # observed
            raise cancelled
        return task.result()

    async def live(self) -> Session:
        """The handle, with its session running (started or restarted off the loop)."""
        handle = self.handle
        if handle is None:
            handle = self.handle = await asyncio.to_thread(self._open_handle)
        elif not handle.is_alive():
            await asyncio.to_thread(_reopen, handle)
        return handle

    def _open_handle(self) -> Session:
        handle = self.sessions.open(self.session_id)
        handle.is_alive()  # resolves its actor here, in the worker thread
        return handle

    async def wait_for_turn(self) -> None:
        """Answered once no turn is open (an empty append waits like a write)."""
        await self.read(lambda h: h.append_many([]))

    async def read(self, read: Callable[[SessionCalls], SessionFuture[T]]) -> T:
        turn = _turn_of(self.shared)
        if turn is not None:
            return await read(turn)
        return await resend(self.live, read, MAX_ATTEMPTS)

    async def append(self, pending: Pending, time: datetime) -> None:
        """Append `pending` in order; resend the part a stopped session refused."""
        turn = _turn_of(self.shared)
        if turn is not None:  # one atomic batch through the turn; never sent again
            await turn.append_many([(etype, data, time) for etype, data in pending])
            return
        for attempt in range(MAX_ATTEMPTS):
            handle = await self.live()
            done, error, clean = await _append_pinned(handle, pending, time)
            if error is None:
                return
            if not (clean and refused(error)) or attempt == MAX_ATTEMPTS - 1:
                raise error
            pending = pending[done:]


def _reopen(handle: Session) -> None:
    handle.count().get()  # any call restarts a stopped session of a registry


async def _append_pinned(
    handle: Session, pending: Pending, time: datetime
) -> tuple[int, BaseException | None, bool]:
    """Send every append of `pending` to the session's current actor, pipelined.

    Returns how many leading appends were acknowledged, the first error, and
    whether every append after the first error failed too (the ones a stopped
    session refused); then resending the rest keeps the order.
    """
    # The one place this module reaches inside a handle: the appends are pinned
    # to the actor the session has now, as nous_actor.sessions.faults.crash_amid does. A
    # registry handle re-resolves a stopped actor on each call, so without the
    # pin an append sent after a crash would reach the restarted session while
    # earlier ones were refused, and the items would land out of order. The pin
    # keeps the handle's touch, so that the registry sees the session in use.
    try:
        ref = handle._actor()
    except SessionStopped as exc:
        return 0, exc, True
    if ref is None:
        return 0, SessionStopped(handle.session_id, "the session is stopped"), True
    pinned = Session(handle.session_id, lambda: ref, timeout=handle.timeout, touch=handle._touch)
    futures = [pinned.append(etype, data, time) for etype, data in pending]
    done = 0
    error: BaseException | None = None
    clean = True
    for fut in futures:  # every future is awaited, so none is left unobserved
        try:
            await fut
        except Exception as exc:
            if error is None:
                error = exc
            clean = clean and refused(exc)
        else:
            if error is None:
                done += 1
            else:
                clean = False
    return done, error, clean
