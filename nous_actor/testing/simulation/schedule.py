"""What decides a simulated run: a seed or pinned choices, and the faults to inject."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "DEFAULT_WAIT",
    "EPOCH",
    "FAULT_KINDS",
    "Fault",
    "FaultKind",
    "FaultRates",
    "Schedule",
    "SimulatedCrash",
    "SimulationError",
    "SimulationStalled",
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

DEFAULT_STEP_TIMEOUT: Final = 30.0
"""Real seconds one step may hold the simulation before the run fails with
`SimulationStalled` (a step is a session's turn, a commit, a caller's resumption: well
under a second even on a loaded machine, a SQLite write waiting for another
process at most the store's 5 s; one that takes half a minute is blocked on
something the simulation does not run)."""

EPOCH: Final = datetime(2030, 1, 1, tzinfo=UTC)
"""Virtual time 0 as a wall-clock time (the time of events made in a simulation)."""


class SimulationError(RuntimeError):
    """The simulation itself cannot go on (a step limit reached, a wrong use)."""


class SimulationStalled(SimulationError):
    """A step held the simulation for its ``step_timeout`` of real time without handing
    it on: it blocks on something the simulation does not control (a ``queue.Queue``, a
    real lock or ``threading.Event``, I/O), which nothing in the run can answer, since
    nothing else runs meanwhile. ``task`` names the step's task."""

    def __init__(self, message: str, task: str) -> None:
        super().__init__(message)
        self.task = task

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.task))


def _int_from(name: str, value: Any, low: int | None = 0) -> int:
    """``value`` if it is an int (not a bool) of at least ``low``; else a typed error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is an int, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} is an int >= {low}, got {value!r}")
    return value


def _number_from(name: str, value: Any, low: float, high: float | None = None) -> float:
    """``value`` if it is a finite real number in ``[low, high]``; else a typed error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} is a number, got {value!r}")
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        where = f">= {low:g}" if high is None else f"between {low:g} and {high:g}"
        raise ValueError(f"{name} is a finite number {where}, got {value!r}")
    return value


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
    * ``restart_registry``: a live registry that a `Supervisor` runs (through its
      ``child_spec``) crashes, and the supervisor restarts it. A registry that runs on
      its own is never a target (nothing would restart it on real threads either): the
      fault then stays armed and is not injected.

    Raises:
        TypeError, ValueError: a ``step`` or ``target`` that is not an int >= 0, a
            ``kind`` not in `FAULT_KINDS`, ``seconds`` not a finite number >= 0.
    """

    step: int
    kind: FaultKind
    target: int = 0
    seconds: float = 1.0

    def __post_init__(self) -> None:
        _int_from("a fault's step", self.step)
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"a fault's kind is one of {FAULT_KINDS}, got {self.kind!r}")
        _int_from("a fault's target", self.target)
        _number_from("a fault's seconds", self.seconds, 0.0)


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

    def __post_init__(self) -> None:
        """Raises ``TypeError`` or ``ValueError`` for a rate that is not a number between 0
        and 1, or a ``horizon`` that is not an int >= 0."""
        for kind in FAULT_KINDS:
            _number_from(f"FaultRates' {kind} (a chance per step)", getattr(self, kind), 0.0, 1.0)
        _int_from("FaultRates' horizon (steps)", self.horizon)

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
        """Raises ``TypeError`` or ``ValueError`` for a ``seed`` that is not an int,
        ``choices`` that are not ints >= 0, ``faults`` that are not `Fault` s, ``rates``
        that is not a `FaultRates`, a ``bias`` not in [0, 1). A list of choices or faults
        is kept as a tuple."""
        _int_from("a schedule's seed", self.seed, low=None)
        if self.choices is not None:
            if isinstance(self.choices, str | bytes) or not hasattr(self.choices, "__iter__"):
                raise TypeError(
                    f"a schedule's choices are a sequence of ints >= 0 (or None), "
                    f"got {self.choices!r}"
                )
            choices = tuple(self.choices)
            for c in choices:
                _int_from("each of a schedule's choices", c)
            object.__setattr__(self, "choices", choices)
        if isinstance(self.faults, str | bytes) or not hasattr(self.faults, "__iter__"):
            raise TypeError(f"a schedule's faults are a sequence of Fault, got {self.faults!r}")
        faults = tuple(self.faults)
        for f in faults:
            if not isinstance(f, Fault):
                raise TypeError(f"a schedule's faults are Fault(step, kind, ...), got {f!r}")
        object.__setattr__(self, "faults", faults)
        if self.rates is not None and not isinstance(self.rates, FaultRates):
            raise TypeError(f"a schedule's rates are a FaultRates or None, got {self.rates!r}")
        if isinstance(self.bias, bool) or not isinstance(self.bias, int | float):
            raise TypeError(f"a schedule's bias is a number in [0, 1), got {self.bias!r}")
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
