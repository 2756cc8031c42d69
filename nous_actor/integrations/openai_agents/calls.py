"""How a `NousSession`'s calls reach its session: `_Calls`, the line a `NousSession` holds
to its session (its handle, whether it is closed), and `NousSessionClosed`, what a closed
one raises.

Mutations run one at a time under the session's lock and finish even if their
caller is cancelled; a call goes through the running task's turn when it is in
one, else to the registry's handle, which sends it to wherever the session is
(this process, or the worker process that holds it) in the order sent, and
holds it while the session moves or restarts: no call is sent again here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.errors import CallTimeout, SessionStopped
from nous_actor.integrations._once import append_once, append_one_once
from nous_actor.integrations.openai_agents.shared import _shared_for, _turn_of
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session, SessionCalls
from nous_actor.sessions.registry import Sessions

T = TypeVar("T")

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

    async def live(self) -> SessionCalls:
        """What the running task's calls go through: its turn of the session when it is
        in one, else the registry's handle (opened on first use, without blocking the
        loop; it finds the session wherever it is from then on)."""
        turn = _turn_of(self.shared)
        if turn is not None:
            return turn
        return await self.handle_of()

    async def handle_of(self) -> Session:
        """The registry's handle of the session (opened on first use)."""
        handle = self.handle
        if handle is None:
            handle = self.handle = await self.sessions.aopen(self.session_id)
        return handle

    def held_here(self) -> bool:
        """Whether the session runs in this process now (its handle's actor is here)."""
        handle = self.handle
        ref = None if handle is None else handle._ref
        return ref is not None and ref.is_alive()

    async def wait_for_turn(self) -> None:
        """Answered once no turn is open (an empty append waits like a write)."""
        await self.read(lambda h: h.append_many([]))

    async def read(self, read: Callable[[SessionCalls], SessionFuture[T]]) -> T:
        return await read(await self.live())

    async def count(self) -> int:
        """The session's next seq, as it is now."""
        return await (await self.live()).count()

    async def append(self, pending: Pending, time: datetime) -> list[Event]:
        """Append `pending` as one batch: stored whole (one transaction) or not at all,
        exactly once (also when the worker process holding the session dies before it
        answers: see `append_once`), and no other call's events come between its items
        (also a call of another process); its events, as stored."""
        calls = await self.live()
        batch = [(etype, data, time) for etype, data in pending]
        return await append_once(await self.handle_of(), lambda: calls.append_many(batch))

    def plans(self) -> Iterator[int]:
        """The attempts of a planned append (`planned`, then `append_at`), for the
        registry's `timeout` in all.

        Raises:
            CallTimeout: the attempts went on that long (another process wrote the
                session before each one could append).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.sessions.timeout
        attempt = 0
        while attempt == 0 or loop.time() < deadline:
            yield attempt
            attempt += 1
        raise CallTimeout(
            self.session_id,
            f"other processes wrote it before each of {attempt} plans could be appended "
            f"for {self.sessions.timeout:g} s; nothing was appended",
        )

    async def planned(self, plan: Callable[[list[Any]], T | None]) -> tuple[T | None, int]:
        """``plan`` of the session's surface, and the next seq of the log it was read
        from (both asked at once: one round trip to wherever the session is)."""
        calls = await self.live()
        count, surface = calls.count(), calls.surface()
        seq = await count
        return plan(await surface), seq

    async def append_at(
        self, seq: int, etype: EventType, data: Any, time: datetime
    ) -> Event | None:
        """Append one event planned on the log up to ``seq``, if nothing was appended since
        (a worker process may write the session too): the event; ``None`` if something
        was: nothing was appended, plan again. Through a turn, nothing else can be
        appended."""
        calls = await self.live()
        handle = await self.handle_of()
        if _turn_of(self.shared) is not None:
            return await append_one_once(handle, lambda: calls.append(etype, data, time))
        try:
            return await append_one_once(handle, lambda: calls.append_at(seq, etype, data, time))
        except InvalidEvent as exc:
            if exc.reason == "seq_behind_head":
                return None
            raise
