"""Test support for code built on nous_actor (imports Hypothesis; the core never imports this).

* `nous_actor.testing.strategies`: Hypothesis strategies for messages,
  events, programs of log operations and whole logs.
* `nous_actor.testing.reference`: a naive reference fold to check against.
* `nous_actor.testing.machines`: `SessionMachine`, a reusable
  ``RuleBasedStateMachine`` driving a session against the pure ``Log`` as model.
* `nous_actor.testing.simulation`: `Simulation`, a deterministic run of every
  actor and runtime thread of a test on its own thread, on a virtual clock,
  with faults (`Schedule`, `Fault`, `FaultRates`); `explore`, `replay`.
* `nous_actor.testing.sim_machine`: `schedules` (a strategy) and
  `SimulationMachine`, sessions of a registry under simulation against a model.
* `nous_actor.testing.races`: ready race scenarios and planted defects.
"""

try:
    import hypothesis  # noqa: F401  (the strategies and machines below are built on it)
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] != "hypothesis":
        raise
    raise ModuleNotFoundError(
        "nous_actor.testing needs Hypothesis, which is not installed; "
        "install the testing extra: pip install 'nous-actor[testing]'",
        name="hypothesis",
    ) from exc

from nous_actor.testing.machines import SessionMachine
from nous_actor.testing.reference import (
    reference_derive_indexed,
    reference_project,
    reference_shadowed,
    reference_surface,
)
from nous_actor.testing.sim_machine import SimulationMachine, schedules
from nous_actor.testing.simulation import (
    Fault,
    FaultRates,
    Schedule,
    SimulatedCrash,
    Simulation,
    SimulationFailure,
    explore,
    replay,
)
from nous_actor.testing.stores import DelegatingStore
from nous_actor.testing.strategies import (
    LogOp,
    event_data,
    json_values,
    log_programs,
    logs,
    messages,
    run_program,
    times,
)

__all__ = [
    "DelegatingStore",
    "Fault",
    "FaultRates",
    "LogOp",
    "Schedule",
    "SessionMachine",
    "SimulatedCrash",
    "Simulation",
    "SimulationFailure",
    "SimulationMachine",
    "event_data",
    "explore",
    "json_values",
    "log_programs",
    "logs",
    "messages",
    "reference_derive_indexed",
    "reference_project",
    "reference_shadowed",
    "reference_surface",
    "replay",
    "run_program",
    "schedules",
    "times",
]
