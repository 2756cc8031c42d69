"""Many runs of a scenario: `replay` one schedule, `explore` or `find` among seeds, and
`shrink` a failing schedule to a shorter one that fails the same way."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from nous_actor.testing.simulation.schedule import (
    DEFAULT_STEP_TIMEOUT,
    Fault,
    FaultRates,
    Schedule,
    SimulationError,
    SimulationStalled,
    _int_from,
)
from nous_actor.testing.simulation.scheduler import Simulation

__all__ = ["Outcome", "Scenario", "SimulationFailure", "explore", "find", "replay", "shrink"]

Scenario = Callable[[Simulation], None]
"""``scenario(sim)``: builds what it tests inside ``sim``, starts callers, runs it and
checks its invariants (raises ``AssertionError`` when one breaks)."""


@dataclass
class Outcome:
    """One run of a scenario: what broke (or ``None``), the trace and its digest."""

    schedule: Schedule
    error: BaseException | None
    trace: list[str] = field(repr=False)
    digest: str
    steps: int
    replay: Schedule = field(repr=False)
    handoffs: int = 0
    """How often the baton passed between real threads (`Simulation.handoffs`)."""
    max_steps: int = 50_000
    """The step limit of the run (`shrink` replays with it)."""
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT
    """The real seconds a step of the run could take (`Simulation`'s ``step_timeout``)."""


def replay(
    scenario: Scenario,
    schedule: Schedule | int,
    *,
    max_steps: int = 50_000,
    quiet: bool = True,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> Outcome:
    """Run ``scenario`` once under ``schedule``: the same schedule, the same outcome
    (``quiet=False``: the runtime's log events are printed as on threads;
    ``max_steps`` and ``step_timeout`` as `Simulation` takes them)."""
    sim = Simulation(schedule, max_steps=max_steps, quiet=quiet, step_timeout=step_timeout)
    error: BaseException | None = None
    try:
        with sim:
            scenario(sim)
            sim.run()
    except (AssertionError, SimulationError, Exception) as exc:
        error = exc
    return Outcome(
        sim.schedule,
        error,
        sim.trace,
        sim.digest(),
        sim.steps,
        sim.replay_schedule(),
        sim.handoffs,
        max_steps,
        step_timeout,
    )


class SimulationFailure(AssertionError):
    """A scenario failed under a schedule: the seed, the shortest failing schedule found,
    and how to replay it."""

    def __init__(self, outcome: Outcome, shrunk: Outcome, tried: int) -> None:
        self.outcome = outcome
        self.shrunk = shrunk
        self.seed = outcome.schedule.seed
        self.schedule = shrunk.schedule
        self.schedules_run = tried
        super().__init__(
            f"the scenario failed under seed {self.seed} (schedule {tried} of the run): "
            f"{type(outcome.error).__name__}: {outcome.error}\n"
            f"{_where(outcome.error)}"
            f"shortest failing schedule ({len(shrunk.schedule.choices or ())} choices, "
            f"{len(shrunk.schedule.faults)} faults, {shrunk.steps} steps): {shrunk.schedule}\n"
            f"replay it with nous_actor.testing.simulation.replay(scenario, "
            f"{shrunk.schedule!r}{_settings(shrunk)})"
        )


def _settings(outcome: Outcome) -> str:
    """The arguments of `replay` besides the schedule that the run was made with (those
    that are not the defaults)."""
    out = ""
    if outcome.max_steps != 50_000:
        out += f", max_steps={outcome.max_steps}"
    if outcome.step_timeout != DEFAULT_STEP_TIMEOUT:
        out += f", step_timeout={outcome.step_timeout!r}"
    return out


def _where(error: BaseException | None) -> str:
    """Where ``error`` was raised: its traceback (the scenario's frames, with their source
    lines), or nothing."""
    if error is None or error.__traceback__ is None:
        return ""
    frames = traceback.extract_tb(error.__traceback__)
    return "where it failed:\n" + "".join(traceback.format_list(frames[-8:]))


def explore(
    scenario: Scenario,
    seeds: Iterable[int] = range(200),
    *,
    rates: FaultRates | None = None,
    faults: Sequence[Fault] = (),
    max_steps: int = 50_000,
    shrink_runs: int = 200,
    quiet: bool = True,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> int:
    """Run ``scenario`` under each seed; the number of schedules run if none failed.

    Each schedule injects ``faults`` (explicit) and those drawn from ``rates``;
    ``quiet=False`` prints the runtime's log events as on threads; ``max_steps``
    and ``step_timeout`` are each run's (and each shrinking run's), as `Simulation`
    takes them.

    Raises:
        SimulationFailure: a schedule failed (with its seed and the shortest
            failing schedule found from it, pinned, to replay).
        TypeError: ``seeds`` is not an iterable of ints.
    """
    n = 0
    planned = tuple(faults)
    _int_from("shrink_runs", shrink_runs)
    for n, seed in enumerate(_seeds(seeds), 1):
        schedule = Schedule(seed, faults=planned, rates=rates)
        out = replay(
            scenario, schedule, max_steps=max_steps, quiet=quiet, step_timeout=step_timeout
        )
        if out.error is not None:
            raise SimulationFailure(out, shrink(scenario, out, runs=shrink_runs), n)
    return n


def find(
    scenario: Scenario,
    seeds: Iterable[int] = range(200),
    *,
    rates: FaultRates | None = None,
    faults: Sequence[Fault] = (),
    max_steps: int = 50_000,
    quiet: bool = True,
    step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
) -> tuple[int, Outcome] | None:
    """The first failing schedule among ``seeds`` (each with ``faults`` and those drawn
    from ``rates``): (how many were run, its outcome).

    Raises:
        TypeError: ``seeds`` is not an iterable of ints.
    """
    planned = tuple(faults)
    for n, seed in enumerate(_seeds(seeds), 1):
        schedule = Schedule(seed, faults=planned, rates=rates)
        out = replay(
            scenario, schedule, max_steps=max_steps, quiet=quiet, step_timeout=step_timeout
        )
        if out.error is not None:
            return n, out
    return None


def _seeds(seeds: Iterable[int]) -> Iterable[int]:
    if isinstance(seeds, int | str | bytes) or not hasattr(seeds, "__iter__"):
        raise TypeError(f"seeds is an iterable of int seeds (range(200), [3, 7]), got {seeds!r}")
    return seeds


def _raised_at(error: BaseException | None) -> tuple[str, int] | None:
    """Where ``error`` was raised: the file and line of its traceback's last frame."""
    tb = None if error is None else error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno


def shrink(scenario: Scenario, failing: Outcome, *, runs: int = 200) -> Outcome:
    """A shorter pinned schedule that still fails the same way (the same exception type,
    raised at the same line of the same file), by dropping faults and cutting and
    zeroing choices, within ``runs`` runs, each with the failing run's ``max_steps``
    and ``step_timeout``. A run failed by a step that never ended (`SimulationStalled`)
    is not shrunk: each try would wait out the bound, and leave one more thread
    blocked."""
    best = failing
    kind = type(failing.error)
    where = _raised_at(failing.error)
    budget = [runs]
    if isinstance(failing.error, SimulationStalled):
        return failing

    def fails(s: Schedule) -> Outcome | None:
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        out = replay(scenario, s, max_steps=failing.max_steps, step_timeout=failing.step_timeout)
        if not isinstance(out.error, kind) or _raised_at(out.error) != where:
            return None  # another failure (another assertion of the scenario, say)
        return out

    first = fails(failing.replay)
    if first is None:
        return failing
    best = first
    # drop faults one at a time
    i = 0
    while i < len(best.schedule.faults) and budget[0] > 0:
        faults = best.schedule.faults[:i] + best.schedule.faults[i + 1 :]
        out = fails(replace(best.schedule, faults=faults))
        if out is not None:
            best = replace(out, schedule=replace(out.schedule, faults=faults))
        else:
            i += 1
    # cut the choices: keep the shortest prefix that fails (past it, the first option)
    choices = list(best.schedule.choices or ())
    lo, hi = 0, len(choices)
    while lo < hi and budget[0] > 0:
        mid = (lo + hi) // 2
        out = fails(replace(best.schedule, choices=tuple(choices[:mid])))
        if out is not None:
            hi = mid
            best = out
        else:
            lo = mid + 1
    choices = list((best.schedule.choices or ())[:hi])
    # zero single choices, from the end
    for j in range(len(choices) - 1, -1, -1):
        if budget[0] <= 0:
            break
        if choices[j] == 0:
            continue
        trial = [*choices[:j], 0, *choices[j + 1 :]]
        out = fails(replace(best.schedule, choices=tuple(trial)))
        if out is not None:
            choices = trial
            best = out
    while choices and choices[-1] == 0:
        choices.pop()
    return replace(best, schedule=replace(best.schedule, choices=tuple(choices)))
