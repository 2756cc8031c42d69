"""Faults as a simulation injects them: armed at their step, applied at the first chance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nous_actor.errors import StoreError
from nous_actor.testing.simulation.schedule import Fault, SimulatedCrash
from nous_actor.testing.simulation.tasks import ACTOR, THREADED, finished

if TYPE_CHECKING:
    from nous_actor.testing.simulation.core import Simulation

__all__: list[str] = []

COMMIT_FAULTS = ("fail_commit", "doubt_commit", "slow_commit")
"""Faults taken by the committer's next step (not applied to an actor)."""


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


def inject_faults(sim: Simulation) -> None:
    """Arm the faults due at this step; apply the armed ones that find a target."""
    faults = sim.faults
    while faults and faults[0].step <= sim.steps:
        sim._armed.append(faults.popleft())
    if not sim._armed:
        return
    keep: list[Fault] = []
    for fault in sim._armed:
        if fault.kind in COMMIT_FAULTS:
            keep.append(fault)  # taken by the committer's next step
        elif not apply_fault(sim, fault):
            keep.append(fault)
    sim._armed = keep


def take_fault(sim: Simulation, kind: str) -> Fault | None:
    """The first armed fault of ``kind``, taken (recorded as injected), or ``None``."""
    for i, fault in enumerate(sim._armed):
        if fault.kind == kind:
            del sim._armed[i]
            sim.injected.append(fault)
            return fault
    return None


def apply_fault(sim: Simulation, fault: Fault) -> bool:
    """Crash or stop the fault's target; ``False`` if no actor can take it now."""
    sim._actors = [t for t in sim._actors if not finished(t)]
    stack = sim._stack
    if fault.kind == "restart_registry":
        targets = [
            t
            for t in sim._actors
            if t.kind == THREADED
            and type(t.obj).__name__ == "RegistryActor"
            and not t.obj.actor_stopped.is_set()
            and t.began
            and t not in stack
        ]
    else:
        targets = [
            t
            for t in sim._actors
            if hasattr(t.obj, "session_id")
            and t.kind == ACTOR
            and not t.obj.actor_stopped.is_set()
            and not getattr(t.obj, "_loading", False)
            and t.obj._began
            and t not in stack
        ]
    if not targets:
        return False
    task = targets[fault.target % len(targets)]
    actor = task.obj
    sim.injected.append(fault)
    sim.trace.append(f"{sim.steps} FAULT {fault.kind} {task.label}")
    if fault.kind == "stop":
        actor.actor_ref.stop(block=False)
        return True
    crash = SimulatedCrash(f"{fault.kind} at step {sim.steps} (a fault of the schedule)")
    if task.kind == THREADED:
        actor._crash(crash)
        sim._make_ready(task)
        return True
    die = getattr(actor, "_die", None)
    if die is not None:
        die(crash)
    else:
        actor._crash(crash)
    inbox = actor.actor_inbox
    if inbox._token.acquire(False):  # not scheduled: its teardown needs a turn
        sim._make_ready(task)
    return True
