"""Test support for code built on nous_actor (imports Hypothesis; the core never imports this).

* `nous_actor.testing.strategies`: Hypothesis strategies for messages,
  events, programs of log operations and whole logs.
* `nous_actor.testing.reference`: a naive reference fold to check against.
* `nous_actor.testing.machines`: `SessionMachine`, a reusable
  ``RuleBasedStateMachine`` driving a session against the pure ``Log`` as model.
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
    "LogOp",
    "SessionMachine",
    "event_data",
    "json_values",
    "log_programs",
    "logs",
    "messages",
    "reference_derive_indexed",
    "reference_project",
    "reference_shadowed",
    "reference_surface",
    "run_program",
    "times",
]
