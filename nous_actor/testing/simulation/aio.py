"""The simulation's event loop: asyncio callers and coroutine summarisers, one callback a step.

`SimEventLoop` is an ``asyncio`` event loop owned by a `Simulation` (its
``sim.loop``), which it knows only as a `Stepper` (the clock, a task, a
wait). It never blocks and never starts a thread: ``time()`` is the
simulation's virtual clock; ``call_soon`` and ``call_soon_threadsafe`` (from
a session's turn, the committer, a subscription's feed) queue a callback that
the loop's task runs at one of its steps, one callback a step, in order,
interleaved with the other tasks as the schedule chooses (what a callback
raises goes to that step, which traces it); a timer
(``asyncio.sleep``, ``asyncio.wait_for``, a bound on an awaited call) comes
due when the virtual clock reaches it, and the clock moves on to it when
nothing else can run. ``run_in_executor`` runs its function as a task of the
simulation (a simulated thread of its own), not on a thread of the executor: it
runs alone between the waits of its that the simulation runs, so a function that
waits for the loop through a real primitive (a ``queue.Queue`` a coroutine fills)
is never answered, and the run fails with `SimulationStalled` after the
simulation's ``step_timeout``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import threading
from asyncio import events
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from contextvars import Context
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from nous_actor.testing.simulation.schedule import SimulationError

__all__ = ["SimEventLoop"]

T = TypeVar("T")


class Stepper(Protocol):
    """What the loop asks of the simulation that steps it."""

    def now(self) -> float:
        """The virtual clock, in seconds."""

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` as a task of the simulation (a simulated thread of its own)."""

    def wait(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Suspend the calling simulated thread until ``done()`` (others run meanwhile)."""


class SimEventLoop(asyncio.BaseEventLoop):
    """An event loop stepped by a `Simulation`, on its virtual clock (see the module)."""

    if TYPE_CHECKING:  # BaseEventLoop's own, which typeshed leaves out
        _ready: deque[Any]
        _scheduled: list[Any]
        _thread_id: int | None

        def _check_closed(self) -> None: ...

        def _check_running(self) -> None: ...

    def __init__(self, sim: Stepper) -> None:
        super().__init__()
        self._sim = sim
        self._stepping = False  # a callback taken by the simulation's step runs
        self._raised: list[BaseException | None] = []  # by the callback of this step
        self._made = 0  # tasks created: their default names and their order
        # Held until done (asyncio holds its tasks weakly): a task nobody references any
        # more is still cancelled and run to its end when the simulation closes.
        self._order: dict[asyncio.Task[Any], int] = {}
        self.errors: list[BaseException | None] = []
        """What callbacks of the loop raised (and asyncio would only have logged)."""

    # -- what a selector loop would do -----------------------------------------------------------

    def time(self) -> float:
        """The simulation's virtual clock."""
        return self._sim.now()

    def _write_to_self(self) -> None:  # nothing to wake: the simulation steps the loop
        pass

    def _process_events(self, event_list: Any) -> None:
        pass

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        *,
        name: str | None = None,
        context: Context | None = None,
    ) -> asyncio.Task[T]:
        """A task of this loop; without a ``name``, ``task-N`` in creation order (asyncio's
        own names count every task of the process, which a replay could not repeat)."""
        self._made += 1
        if name is None:
            name = f"task-{self._made}"
        task = super().create_task(coro, name=name, context=context)
        order = self._order
        if len(order) >= 64 and not self._made % 64:  # forget the tasks that are done
            self._order = order = {t: n for t, n in order.items() if not t.done()}
        order[task] = self._made
        return task

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func(*args)`` as a task of the simulation (in place of a thread of
        ``executor``); the future is answered on this loop.

        The function runs alone between its waits that the simulation runs (a
        session's future, a registry's ask): one that blocks on something else (a
        ``queue.Queue``, a real lock or event, I/O) holds the whole run, which fails
        with `SimulationStalled` after the simulation's ``step_timeout``."""
        self._check_closed()
        fut: asyncio.Future[T] = self.create_future()

        def work() -> None:
            try:
                result = func(*args)
            except BaseException as exc:
                answer: Callable[[], None] = functools.partial(_fail, fut, exc)
            else:
                answer = functools.partial(_resolve, fut, result)
            if not self.is_closed():
                self.call_soon_threadsafe(answer)

        self._sim.spawn(work, f"executor:{_name_of(func)}")
        return fut

    def run_forever(self) -> None:
        raise SimulationError(
            "the simulation's loop runs as the simulation runs: start coroutines with "
            "sim.go(coro) and call sim.run(), or sim.loop.run_until_complete(coro)"
        )

    def run_until_complete(self, future: Any) -> Any:
        """Run the simulation until ``future`` (a coroutine or a future) is done; its result.

        Raises:
            SimulationError: nothing was left to run and it is not done.
        """
        self._check_closed()
        self._check_running()
        task = asyncio.ensure_future(future, loop=self)
        self._sim.wait(task.done, None)
        if not task.done():
            raise SimulationError(f"{_name_of(future)} never finished (nothing left to run)")
        return task.result()

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """As asyncio does (log it); what a callback raised in a step is also kept in
        `errors` and given to the step (a failed callback is a defect a test should see:
        the simulation traces it)."""
        if "handle" in context and self._stepping:
            exc = context.get("exception")
            self.errors.append(exc)
            self._raised.append(exc)
        super().call_exception_handler(context)

    # -- what the simulation calls ---------------------------------------------------------------

    def runnable(self) -> bool:
        """Whether a callback is ready (timers due by the virtual clock count)."""
        ready = self._ready
        scheduled = self._scheduled
        if scheduled:
            now = self._sim.now()
            while scheduled and (scheduled[0]._cancelled or scheduled[0]._when <= now):
                handle = heapq.heappop(scheduled)
                if not handle._cancelled:
                    handle._scheduled = False
                    ready.append(handle)
        while ready and ready[0]._cancelled:
            ready.popleft()
        return bool(ready)

    def next_timer(self) -> float | None:
        """When the next timer comes due on the virtual clock, if one is set."""
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            heapq.heappop(scheduled)
        return scheduled[0]._when if scheduled else None

    def next_handle(self) -> asyncio.Handle:
        """The next ready callback, taken (the loop's step runs it with `run_handle`)."""
        handle: asyncio.Handle = self._ready.popleft()
        return handle

    def run_handle(self, handle: asyncio.Handle) -> list[BaseException | None]:
        """Run ``handle`` (the next ready callback, taken by the simulation's step) as the
        loop does, on this thread; what it raised (and asyncio would only have logged)."""
        prev = events._get_running_loop()
        events._set_running_loop(self)
        self._thread_id = threading.get_ident()  # is_running() while it runs
        self._stepping = True
        raised: list[BaseException | None] = []
        self._raised = raised
        try:
            handle._run()
        finally:
            self._stepping = False
            self._thread_id = None
            events._set_running_loop(prev)
        return raised

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        """The loop's tasks not yet done, in creation order."""
        made = [t for t in self._order if not t.done()]  # in creation order
        held = set(made)
        others = [t for t in asyncio.all_tasks(self) if t not in held]
        return made + sorted(others, key=lambda t: t.get_name())


def _resolve(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _name_of(obj: Any) -> str:
    while isinstance(obj, functools.partial):
        obj = obj.func
    return str(getattr(obj, "__qualname__", None) or type(obj).__name__)


def describe(handle: Any) -> str:
    """A callback as the trace names it: its task's name, or its function's qualified name
    (never a repr: addresses differ from run to run)."""
    cb = handle._callback
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return owner.get_name()
    return _name_of(cb)
