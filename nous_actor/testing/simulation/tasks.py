"""The runtime's pieces as a simulation runs them: tasks, the dispatcher, futures, inboxes,
the committer's queue."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any

import pykka

from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import DispatchedActor, Dispatcher
from nous_actor.testing.simulation.schedule import SimulationError

if TYPE_CHECKING:
    from nous_actor.testing.simulation.core import Simulation

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

    def __init__(self, sim: Simulation) -> None:
        super().__init__(1, throughput=sim.throughput, name="nous-sim")
        self._sim = sim

    def _schedule(self, actor: DispatchedActor) -> None:
        self._sim._actor_ready(actor)

    def close(self, timeout: float = 5.0) -> None:  # a pinned actor's end: nothing to stop
        pass


class SimFuture(pykka.ThreadingFuture[Any]):
    """A Pykka future whose ``get`` runs the simulation while it waits."""

    def __init__(self, sim: Simulation | None = None) -> None:
        super().__init__()
        from nous_actor.testing.simulation.core import Simulation

        host = scheduling.current() if sim is None else sim
        if not isinstance(host, Simulation):
            raise SimulationError("a simulated future outside its simulation")
        self._sim = host

    def _done(self) -> bool:
        return self._result is not None

    def get(self, *, timeout: float | None = None) -> Any:
        if self._result is None and self._get_hook is None:
            self._sim.wait(self._done, timeout)
            if self._result is None:
                raise pykka.Timeout(f"{timeout} seconds (virtual)")
        return super().get(timeout=timeout)


class SimInbox:
    """The inbox of a thread-per-actor actor under simulation: a put makes it ready."""

    __slots__ = ("_q", "_sim", "_task")

    def __init__(self, sim: Simulation, task: Task, items: Iterable[Any]) -> None:
        self._sim = sim
        self._task = task
        self._q: deque[Any] = deque(items)

    def put(self, envelope: Any, /) -> None:
        self._q.append(envelope)
        self._sim._make_ready(self._task)

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

    __slots__ = ("_sim", "items", "task")

    def __init__(self, sim: Simulation, task: Task) -> None:
        self._sim = sim
        self.task = task
        self.items: deque[Any] = deque()

    def put(self, item: Any) -> None:
        if item is None:  # close(): nothing to stop
            return
        self.items.append(item)
        self._sim._make_ready(self.task)

    def get_nowait(self) -> Any:
        return self.items.popleft()

    def empty(self) -> bool:
        return not self.items


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


def drain_queue(q: Any) -> list[Any]:
    items = []
    while not q.empty():
        items.append(q.get_nowait())
    return items


def actor_label(actor: Any) -> str:
    sid = getattr(actor, "session_id", None)
    name = type(actor).__name__
    return name if sid is None else f"{name}({sid})"
