"""The simulation as users meet it: quiet runs, a fault window that ends before the
scenario's own checks, ``x = yield fut``, explicit faults for explore and find, a restart
intensity that fault rates do not exhaust, and failures that say where they failed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from nous_actor import Sessions
from nous_actor.errors import SessionStopped, StoreError
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.races import registry_scenario
from nous_actor.testing.simulation import (
    Fault,
    FaultRates,
    Schedule,
    Simulation,
    SimulationFailure,
    explore,
    find,
    replay,
)

CRASHY = FaultRates(crash=0.03, fail_commit=0.02, stop=0.01)


def test_a_simulation_is_quiet_unless_told(caplog: pytest.LogCaptureFixture) -> None:
    """Crashes and failed commits log nothing inside a simulation (they are its point);
    ``quiet=False`` lets the runtime's events through as on threads."""
    caplog.set_level(logging.DEBUG, logger="nous_actor")
    scenario = registry_scenario(sessions=3, callers=2, appends=6)
    explore(scenario, range(5), rates=CRASHY)
    assert [r for r in caplog.records if r.name.startswith("nous_actor")] == []
    out = replay(scenario, Schedule(1, rates=CRASHY), quiet=False)
    assert out.error is None
    assert any(r.name.startswith("nous_actor") for r in caplog.records)


def test_a_scenario_ends_its_fault_window_before_its_checks() -> None:
    """After ``sim.end_faults()`` no fault fires: the scenario's own final checks see
    a quiet system, however many faults the rates still had planned."""
    with Simulation(Schedule(3, rates=FaultRates(crash=0.2, stop=0.2, horizon=5000))) as sim:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("a")
        for i in range(5):
            try:
                chat.append("user_message", {"content": str(i)}).get()
            except (SessionStopped, StoreError):
                pass
        sim.run()
        sim.end_faults()
        injected = len(sim.injected)
        # The crash storm may have outrun the session's restart intensity (the registry
        # gave it up): open() gives it a fresh chance, as it would a user.
        chat = sessions.open("a")
        for i in range(30):
            chat.append("user_message", {"content": f"checked {i}"}).get()
        assert len(sim.injected) == injected
        sessions.close()


def test_yield_future_gives_its_value() -> None:
    """``x = yield fut`` in a generator caller: the future's value (``None`` when it
    failed: its ``get()`` raises)."""
    got: list[Any] = []
    with Simulation(4) as sim:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("a")

        def caller() -> Any:
            ev = yield chat.append("user_message", {"content": "hi"})
            n = yield chat.count()
            got.extend([ev.seq, n])

        sim.go(caller(), "caller")
        sim.run()
        sessions.close()
    assert got == [0, 1]


def test_explore_and_find_take_explicit_faults() -> None:
    """Explicit faults besides (or instead of) rates: each schedule injects them."""
    seen: list[list[str]] = []

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("a")
        for i in range(10):
            try:
                chat.append("user_message", {"content": str(i)}).get()
            except SessionStopped:
                pass
        sim.run()
        seen.append([f.kind for f in sim.injected])
        sessions.close()

    assert explore(scenario, range(3), faults=(Fault(8, "crash"),)) == 3
    assert seen == [["crash"]] * 3
    seen.clear()
    explore(scenario, range(2), faults=(Fault(8, "crash"),), rates=FaultRates(stop=0.001))
    assert all("crash" in kinds for kinds in seen)

    def fails_on_crash(sim: Simulation) -> None:
        scenario(sim)
        assert "crash" not in seen[-1], "crashed"

    hit = find(fails_on_crash, range(3), faults=(Fault(8, "crash"),))
    assert hit is not None
    assert hit[0] == 1


def test_fault_rates_do_not_exhaust_the_default_restart_intensity() -> None:
    """Under fault rates (faults come many per virtual second) the registry's default
    restart intensity is not used up: no session is given up on."""
    rates = FaultRates(crash=0.05, fail_commit=0.03)

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        for i in range(40):
            try:
                sessions.open("a").append("user_message", {"content": str(i)}).get()
            except (SessionStopped, StoreError):
                pass
        sim.run()
        assert sessions.restart_count("a") > 5
        ref = sessions._ref
        assert ref is not None
        registry = ref._actor_weakref()
        assert registry is not None
        assert registry.restarts.given_up("a") is None, registry.restarts.given_up("a")
        sessions.close()

    assert explore(scenario, range(20), rates=rates) == 20


def test_a_failure_names_where_the_scenario_failed() -> None:
    """``str(SimulationFailure)`` carries the failing assertion's traceback: its file,
    line and source."""

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        n = sessions.open("a").count().get()
        assert n == 1, "the planted failure"

    with pytest.raises(SimulationFailure) as info:
        explore(scenario, range(2))
    text = str(info.value)
    assert "the planted failure" in text
    assert "test_simulation_users.py" in text
    assert 'assert n == 1, "the planted failure"' in text
