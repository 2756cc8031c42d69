"""Supervision, OTP style, on Pykka: knows nothing of sessions or stores.

`actor` holds `SupervisedActor` (exit reports, `BaseException` containment),
its `Exit`, and the `Cell` beside its Pykka ref (``started``, ``finished``, the
monitor); `supervisor` holds `Supervisor`, `ChildSpec` and the
`RestartPolicy` that the session registry uses too.
"""

from nous_actor.supervision.actor import (
    HANDLED_LATER,
    ActorCrashed,
    Cell,
    Clock,
    DispatchedSupervisedActor,
    Exit,
    Monitor,
    RestartIntensityExceeded,
    RestartType,
    Scheduler,
    Strategy,
    SupervisedActor,
    cell_of,
    start_monitored,
)
from nous_actor.supervision.supervisor import (
    Backoff,
    ChildSpec,
    RestartIntensity,
    RestartPolicy,
    Supervisor,
    _timer,
)

__all__ = [
    "HANDLED_LATER",
    "ActorCrashed",
    "Backoff",
    "Cell",
    "ChildSpec",
    "Clock",
    "DispatchedSupervisedActor",
    "Exit",
    "Monitor",
    "RestartIntensity",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "RestartType",
    "Scheduler",
    "Strategy",
    "SupervisedActor",
    "Supervisor",
    "_timer",
    "cell_of",
    "start_monitored",
]
