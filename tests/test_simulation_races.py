"""Our own races, under simulation (hundreds of schedules, with faults) and on real threads.

The session, registry, subscription, compaction and stop/crash races of
`nous_actor.testing.races` hold under every schedule tried; a failure names
its seed and the shortest failing schedule found (`SimulationFailure`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nous_actor.testing.races import (
    compaction_scenario,
    registry_scenario,
    restart_scenario,
    run_real,
    stop_race_scenario,
    subscription_scenario,
)
from nous_actor.testing.simulation import FaultRates, explore

FAULTS = FaultRates(crash=0.01, fail_commit=0.01, doubt_commit=0.005, slow_commit=0.03, stop=0.005)
REGISTRY_FAULTS = FaultRates(
    crash=0.01,
    fail_commit=0.01,
    doubt_commit=0.005,
    slow_commit=0.03,
    stop=0.005,
    restart_registry=0.003,
)

SCENARIOS: dict[str, Callable[..., Any]] = {
    "registry": registry_scenario,
    "subscription": subscription_scenario,
    "stop_race": stop_race_scenario,
    "compaction": compaction_scenario,
    "restart": restart_scenario,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_race_holds_under_a_hundred_schedules(name: str) -> None:
    """100 seeded schedules of the race, interleavings only: none fails."""
    assert explore(SCENARIOS[name](), range(100)) == 100


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_race_holds_under_schedules_with_faults(name: str) -> None:
    """100 seeded schedules with crashes, stops, failed, doubtful (written, reported
    failed) and slow commits: none fails."""
    assert explore(SCENARIOS[name](), range(1000, 1100), rates=FAULTS) == 100


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_race_holds_on_sqlite_under_simulation(name: str) -> None:
    """The same races on a SQLite file, 20 schedules with faults each."""
    assert explore(SCENARIOS[name](store="sqlite"), range(20), rates=FAULTS) == 20


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_race_holds_on_real_threads(name: str) -> None:
    """The same scenario on real threads (callers are threads; no injected faults)."""
    assert run_real(SCENARIOS[name](), timeout=10.0) is None


def test_the_registry_race_holds_when_the_registry_restarts() -> None:
    """100 schedules of the registry race with crashes of the registry itself (its
    supervisor restarts it) besides the other faults: none fails."""
    assert explore(registry_scenario(), range(100), rates=REGISTRY_FAULTS) == 100


def test_the_registry_race_holds_while_idle_sessions_are_passivated() -> None:
    """100 schedules where callers pause long enough (virtual seconds) for the passivator
    to stop their sessions between calls, with faults: none fails."""
    assert explore(registry_scenario(idle_timeout=1.0), range(100), rates=REGISTRY_FAULTS) == 100
