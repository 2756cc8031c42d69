"""What decides a simulated run: a seed or pinned choices, and the faults to inject."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

__all__ = [
    "DEFAULT_WAIT",
    "EPOCH",
    "FAULT_KINDS",
    "Fault",
    "FaultKind",
    "FaultRates",
    "Schedule",
    "SimulatedCrash",
    "SimulationError",
]

FaultKind = Literal[
    "crash", "stop", "fail_commit", "doubt_commit", "slow_commit", "restart_registry"
]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "crash",
    "stop",
    "fail_commit",
    "doubt_commit",
    "slow_commit",
    "restart_registry",
)

DEFAULT_WAIT: Final = 30.0
"""Virtual seconds a caller waits for a yielded future without a bound of its own."""

EPOCH: Final = datetime(2030, 1, 1, tzinfo=UTC)
"""Virtual time 0 as a wall-clock time (the time of events made in a simulation)."""


class SimulationError(RuntimeError):
    """The simulation itself cannot go on (a step limit reached, a wrong use)."""


class SimulatedCrash(BaseException):
    """What a ``crash`` fault crashes an actor with (a ``BaseException``, as an actor's
    crash is: a handler that raised an ``Exception`` only fails its call)."""


@dataclass(frozen=True)
class Fault:
    """A fault the schedule injects: armed at ``step``, it fires at the first chance.

    * ``crash``: a live session crashes (the ``target``-th, modulo how many are live);
    * ``stop``: a live session is stopped (normally; its next call reopens it);
    * ``fail_commit``: the next commit fails (nothing written; sessions see a
      store failure);
    * ``doubt_commit``: the next commit is written but reported failed (a connection
      lost after the commit: its appends are stored, never acknowledged);
    * ``slow_commit``: the next commit waits ``seconds`` of virtual time;
    * ``restart_registry``: a live registry crashes (its supervisor restarts it).
    """

    step: int
    kind: FaultKind
    target: int = 0
    seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"a fault's kind is one of {FAULT_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class FaultRates:
    """Chances per step that a seeded schedule injects each fault (drawn up front)."""

    crash: float = 0.0
    stop: float = 0.0
    fail_commit: float = 0.0
    doubt_commit: float = 0.0
    slow_commit: float = 0.0
    restart_registry: float = 0.0
    horizon: int = 400
    """Steps over which faults are drawn."""

    def draw(self, rng: random.Random) -> tuple[Fault, ...]:
        out: list[Fault] = []
        rates = [(kind, getattr(self, kind)) for kind in FAULT_KINDS if getattr(self, kind)]
        rand = rng.random
        for step in range(self.horizon):
            for kind, rate in rates:
                if rand() < rate:
                    out.append(Fault(step, kind, rng.randrange(1 << 16), rng.choice((0.5, 2.0))))
        return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """Everything that decides a run: a seed, or pinned choices, and the faults.

    With ``choices`` (a pinned schedule) every decision of the run is read from
    it in turn (modulo the number of options); past its end the first option is
    taken. Without, decisions are drawn from ``seed``: uniformly, or with ``bias``
    (between 0 and 1) the thread chosen last is kept with that chance, which makes
    the long runs of one thread that some races need likely. ``faults`` are injected
    as they come due; with ``rates`` and no explicit faults they are drawn from the
    seed (with both, the explicit faults and the drawn ones).
    """

    seed: int = 0
    choices: tuple[int, ...] | None = None
    faults: tuple[Fault, ...] = ()
    rates: FaultRates | None = None
    bias: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.bias < 1.0:
            raise ValueError(f"a schedule's bias is in [0, 1), got {self.bias!r}")

    def __str__(self) -> str:
        parts = [f"seed={self.seed}"]
        if self.choices is not None:
            parts.append(f"choices={list(self.choices)}")
        if self.faults:
            parts.append(f"faults={list(self.faults)}")
        if self.bias:
            parts.append(f"bias={self.bias:g}")
        return f"Schedule({', '.join(parts)})"
