"""Faults as a simulation injects them: armed at their step, applied at the first chance."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nous_actor.errors import StoreError
from nous_actor.testing.simulation.schedule import Fault, SimulatedCrash
from nous_actor.testing.simulation.tasks import ACTOR, THREADED, Task

__all__: list[str] = []

COMMIT_FAULTS = ("fail_commit", "doubt_commit", "slow_commit")
"""Faults taken by the committer's next step (not applied to an actor)."""


class Faults:
    """The faults of one run, each where it stands: planned, pending until its step, armed
    until it finds a target (an actor, or the committer's next step), then injected."""

    __slots__ = ("armed", "injected", "pending", "planned")

    def __init__(self, planned: Iterable[Fault]) -> None:
        self.planned = tuple(planned)
        self.pending: deque[Fault] = deque(sorted(self.planned, key=lambda f: f.step))
        self.armed: list[Fault] = []
        self.injected: list[Fault] = []

    def inject(self, step: int, strike: Callable[[Fault], bool]) -> None:
        """Arm the faults due at ``step``; apply the armed ones that find a target
        (``strike(fault)``: whether one took it). The committer's stay armed for its next
        step."""
        pending = self.pending
        while pending and pending[0].step <= step:
            self.armed.append(pending.popleft())
        if not self.armed:
            return
        keep: list[Fault] = []
        for fault in self.armed:
            if fault.kind in COMMIT_FAULTS:
                keep.append(fault)  # taken by the committer's next step
            elif strike(fault):
                self.injected.append(fault)
            else:
                keep.append(fault)
        self.armed = keep

    def take(self, kind: str) -> Fault | None:
        """The first armed fault of ``kind``, taken (recorded as injected), or ``None``."""
        for i, fault in enumerate(self.armed):
            if fault.kind == kind:
                del self.armed[i]
                self.injected.append(fault)
                return fault
        return None

    def end(self) -> None:
        """No fault fires from now on."""
        self.pending.clear()
        self.armed.clear()


class FailingStore:
    """What a ``fail_commit`` fault writes to: it refuses every write, storing nothing (or,
    ``written``, stores it and then fails: a ``doubt_commit``)."""

    def __init__(self, store: Any, written: bool = False) -> None:
        self._store = store
        self._written = written

    def write(self, appends: Any) -> dict[str, StoreError]:
        if self._written:
            self._store.write(appends)
            raise StoreError(
                "simulated commit failure after the write (a fault of the schedule); "
                "whether it was stored is unknown"
            )
        raise StoreError("simulated commit failure (a fault of the schedule); nothing written")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def targets_of(fault: Fault, actors: Iterable[Task], busy: Sequence[Task]) -> list[Task]:
    """The actors that can take ``fault`` now (none whose step is under way, ``busy``):
    for ``restart_registry`` a registry a supervisor watches (`supervised`), else the
    sessions that have begun."""
    if fault.kind == "restart_registry":
        return [
            t
            for t in actors
            if t.kind == THREADED
            and type(t.obj).__name__ == "RegistryActor"
            and not t.obj.actor_stopped.is_set()
            and t.began
            and supervised(t.obj)
            and t not in busy
        ]
    return [
        t
        for t in actors
        if hasattr(t.obj, "session_id")
        and t.kind == ACTOR
        and not t.obj.actor_stopped.is_set()
        and not getattr(t.obj, "_loading", False)
        and t.obj._began
        and t not in busy
    ]


def supervised(actor: Any) -> bool:
    """Whether a supervisor watches ``actor`` (its exit goes to a monitor: a registry run
    through its ``child_spec`` by a `Supervisor`, which restarts it). A registry that runs
    on its own is never crashed by a fault: on real threads nothing would restart it, and
    every later call would fail, which no real run of a correct program shows."""
    cell = getattr(actor, "cell", None)
    return getattr(cell, "_monitor", None) is not None


def strike(fault: Fault, task: Task, step: int) -> bool:
    """Crash or stop the actor of ``task``; whether its task must be made ready (its
    crash or teardown needs a step)."""
    actor = task.obj
    if fault.kind == "stop":
        actor.actor_ref.stop(block=False)
        return False
    crash = SimulatedCrash(f"{fault.kind} at step {step} (a fault of the schedule)")
    if task.kind == THREADED:
        actor._crash(crash)
        return True
    die = getattr(actor, "_die", None)
    if die is not None:
        die(crash)
    else:
        actor._crash(crash)
    return bool(actor.actor_inbox.take())  # not scheduled: a turn tears it down
