"""What a ``compact`` call carries, and how its summary is written off the actor.

`_Compaction` is the call as it travels from the handle to the actor and back;
`SummarySlot` holds a coroutine summariser's place on the caller's event loop
from the call on; `summary_slot` takes one. Nothing here touches the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nous_actor.core.compaction import CompactionError, Compactor, run_summariser


@dataclasses.dataclass(frozen=True)
class _Compaction:
    """One ``compact`` call, as it travels from the handle to the actor and back."""

    compactor: Compactor
    time: datetime | None
    force: bool
    cid: str
    explicit: bool  # the caller chose the id (so it may be in the log already)
    loop: asyncio.AbstractEventLoop | None  # the caller's loop, for a coroutine summariser
    attempt: int = 0
    slot: SummarySlot | None = None  # its place on that loop, taken at the call
    context: object = None  # the caller's trace context, for the compaction's span
    turn_id: str | None = None  # made through this turn: committed only while it is open


_LOOP_ENDED = (
    "the event loop that was to run the coroutine summariser ended before the summary ran; "
    "log unchanged (await the compaction before the loop ends)"
)


class SummarySlot:
    """A coroutine summariser's place on the caller's event loop, taken at the call.

    A task on that loop waits for the summary's input from the session. If the
    loop ends first (``asyncio.run`` returning cancels its tasks; a closed loop
    refuses new work), the compaction fails at once with `CompactionError`
    instead of waiting out its bound for a summary that can never run. (A loop
    merely stopped may run again, so work handed to it waits for that: one stopped
    and then closed by hand, ``loop.close()`` without ``asyncio.run``, tells
    nobody, and the compaction stays pending until the session stops; await the
    compaction before the loop ends.)
    """

    __slots__ = ("_job", "_lock", "_lost", "_pending", "_used", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._lost = False  # the task ended without work: the loop is ending
        self._used = False  # work was submitted (or released)
        self._pending: Any = None  # submitted, not yet handed to the task
        self._job: asyncio.Future[Any] = loop.create_future()
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            job = await self._job
        except asyncio.CancelledError:  # the loop ends before the work reached the task
            with self._lock:
                self._lost = True
                job, self._pending = self._pending, None
            if job is None and self._job.done() and not self._job.cancelled():
                job = self._job.result()  # handed over, but the task never resumed
            if job is not None:
                job[2](None, CompactionError(_LOOP_ENDED))
            return
        if job is None:  # no summary needed
            return
        compactor, summary_input, deliver = job
        try:
            summary = await run_summariser(compactor, summary_input)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # the loop ends while the summary is written
                deliver(None, CompactionError(_LOOP_ENDED))
            else:  # raised by the summariser itself (a call of its own was cancelled)
                deliver(None, exc)
        except BaseException as exc:
            deliver(None, exc)
        else:
            deliver(summary, None)

    def submit(self, compactor: Compactor, summary_input: Any, deliver: Deliver) -> bool:
        """Have the summary written on the loop (any thread); ``False`` if this slot was
        used already. If the loop ended, or ends before the task took the work,
        ``deliver`` is told so at once."""
        job = (compactor, summary_input, deliver)
        with self._lock:
            if self._used:
                return False
            self._used = True
            lost = self._lost
            if not lost:
                self._pending = job
        if lost:
            deliver(None, CompactionError(_LOOP_ENDED))
            return True
        try:
            self.loop.call_soon_threadsafe(self._hand_over)
        except RuntimeError:  # the loop is closed
            with self._lock:
                job, self._pending = self._pending, None
            if job is not None:
                deliver(None, CompactionError(_LOOP_ENDED))
        return True

    def _hand_over(self) -> None:
        with self._lock:
            job, self._pending = self._pending, None
        if job is None:  # the task ended meanwhile and answered it
            return
        if self._job.done():
            job[2](None, CompactionError(_LOOP_ENDED))
        else:
            self._job.set_result(job)

    def release(self) -> None:
        """No summary is needed: let the task end (any thread)."""
        with self._lock:
            if self._used:
                return
            self._used = True
        try:
            self.loop.call_soon_threadsafe(_set_if_pending, self._job)
        except RuntimeError:
            pass


def _set_if_pending(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


def summary_slot(compactor: Compactor) -> SummarySlot | None:
    """A `SummarySlot` on the running event loop if ``compactor`` summarises with a
    coroutine function and this is called from a loop, else ``None``."""
    if not _is_async(compactor.summarise):
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return SummarySlot(loop)


Deliver = Callable[[Any, "BaseException | None"], None]


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def _run_awaitable(aw: Any) -> Any:
    async def wait() -> Any:
        return await aw

    return asyncio.run(wait())
