"""The runtime's pieces as a simulation runs them: tasks, the dispatcher, futures, inboxes,
the committer's queue, condition variables.

Each piece is handed what of the simulation it calls (make a task ready, take a switch
point; a future waits through the host, the protocol the runtime calls), never the
simulation's class."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import pykka

from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import DispatchedActor, Dispatcher
from nous_actor.testing.simulation.schedule import SimulationError

__all__: list[str] = []


ACTOR, THREADED, FUNCTION, TIMER, CALLER, COMMITTER, LOOP = range(7)
"""The kinds of task: a dispatched actor, a thread-per-actor actor, a function (a thread
of the runtime), a timer, a generator caller, a store's committer, the event loop."""


class Task:
    """One thing the simulation steps: what it is (``kind``), and where it stands."""

    __slots__ = (
        "began",
        "daemon",
        "ended",
        "gen",
        "id",
        "kind",
        "label",
        "obj",
        "queued",
        "running",
        "send",
        "thread",
        "until",
        "waiting",
    )

    def __init__(self, kind: int, label: str, obj: Any, tid: int) -> None:
        self.kind = kind
        self.label = label
        self.obj = obj
        self.id = tid
        self.queued = False  # in the run list
        self.began = False
        self.ended = False
        self.gen: Generator[Any, Any, Any] | None = None
        self.waiting: Any = None  # a future a caller waits for
        self.until = 0.0  # a caller's or committer's virtual wake time
        self.send: Any = None
        self.daemon = False  # a timer that re-arms itself forever
        self.running = False  # a step of it is under way (perhaps suspended in a wait)
        self.thread: Any = None  # the simulated thread of a task that is one


class SimDispatcher(Dispatcher):
    """The dispatcher of a simulation: a runnable actor becomes a ready task."""

    def __init__(self, throughput: int, ready: Callable[[DispatchedActor], None]) -> None:
        super().__init__(1, throughput=throughput, name="nous-sim")
        self._ready = ready

    def _schedule(self, actor: DispatchedActor) -> None:
        self._ready(actor)

    def close(self, timeout: float = 5.0) -> None:  # a pinned actor's end: nothing to stop
        pass


class SimFuture(pykka.ThreadingFuture[Any]):
    """A Pykka future whose ``get`` runs the simulation while it waits (the simulation it
    is given, or, made with no argument as Pykka makes more of its class, the one
    installed)."""

    def __init__(self, host: scheduling.Host | None = None) -> None:
        super().__init__()
        host = scheduling.current() if host is None else host
        if host is scheduling.REAL:
            raise SimulationError("a simulated future outside its simulation")
        self._host = host

    def _done(self) -> bool:
        return self._result is not None

    def _answered(self, _timeout: float | None) -> bool:
        return self._result is not None

    def get(self, *, timeout: float | None = None) -> Any:
        if self._result is None and self._get_hook is None:
            self._host.wait(self._done, timeout, self._answered)
            if self._result is None:
                raise pykka.Timeout(f"{timeout} seconds (virtual)")
        return super().get(timeout=timeout)


class SimInbox:
    """The inbox of a thread-per-actor actor under simulation (made by Pykka's
    ``_create_actor_inbox``, before the actor): once `bind` gave it the actor's task, a
    put makes the task ready."""

    __slots__ = ("_q", "_ready", "_task")

    def __init__(self, ready: Callable[[Task], None]) -> None:
        self._task: Task | None = None
        self._q: deque[Any] = deque()
        self._ready = ready

    def bind(self, task: Task) -> None:
        """The actor starts as ``task``: what was put before is its to take."""
        self._task = task
        if self._q:
            self._ready(task)

    def put(self, envelope: Any, /) -> None:
        self._q.append(envelope)
        if self._task is not None:
            self._ready(self._task)

    def put_nowait(self, envelope: Any, /) -> None:
        self.put(envelope)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._q.popleft()

    def get_nowait(self) -> Any:
        return self._q.popleft()

    def empty(self) -> bool:
        return not self._q

    def qsize(self) -> int:
        return len(self._q)


class CommitQueue:
    """A committer's queue under simulation: items wait for the committer's next step."""

    __slots__ = ("_ready", "items", "task")

    def __init__(self, task: Task, ready: Callable[[Task], None]) -> None:
        self.task = task
        self.items: deque[Any] = deque()
        self._ready = ready

    def put(self, item: Any) -> None:
        if item is None:  # close(): nothing to stop
            return
        self.items.append(item)
        self._ready(self.task)

    def get_nowait(self) -> Any:
        return self.items.popleft()

    def empty(self) -> bool:
        return not self.items


class SimCondition(threading.Condition):
    """A condition variable whose ``notify`` is a switch point of the schedule (once the
    notifier leaves the ``with`` block): the woken thread may run before the notifier
    goes on, as on real threads."""

    def __init__(self, preempt: Callable[[], None]) -> None:
        super().__init__()
        self._preempt = preempt
        self._notified = False

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        self._notified = True

    def notify_all(self) -> None:
        super().notify_all()
        self._notified = True

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        if self._notified:
            self._notified = False
            self._preempt()


def finished(task: Task) -> bool:
    """An actor task whose actor has ended (stopped and answered its inbox)."""
    return task.ended or bool(getattr(task.obj, "_ended", False))


def nothing() -> None:
    pass


def is_done(fut: Any) -> bool:
    """Whether a future (Pykka's, ours, or asyncio's) is answered."""
    done = getattr(fut, "done", None)
    if done is not None:
        return bool(done())
    return getattr(fut, "_result", None) is not None


def run_inline(task: Task) -> None:
    """A dispatched actor after the simulation ended: every message that lands, at once."""
    actor = task.obj
    inbox = actor.actor_inbox
    while True:
        actor._turn(1 << 30)
        inbox.give()
        if inbox.empty() or not inbox.take():
            return


def value_of(fut: Any) -> Any:
    """What ``x = yield fut`` gives: the future's value once answered (``None`` if it
    failed or its bound passed first: its ``get()`` then raises)."""
    if fut is None or not is_done(fut):
        return None
    try:
        return fut.get(timeout=0)
    except BaseException:
        return None


def actor_label(actor: Any) -> str:
    sid = getattr(actor, "session_id", None)
    name = type(actor).__name__
    return name if sid is None else f"{name}({sid})"
