"""The deterministic simulation: tasks on the test's thread, virtual time, faults, replay."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pykka
import pytest
from hypothesis import HealthCheck, find, given, settings

from nous_actor import Sessions
from nous_actor.core.compaction import Compactor
from nous_actor.errors import CallTimeout, SessionStopped, StoreError
from nous_actor.runtime import scheduling
from nous_actor.sessions.future import SessionFuture
from nous_actor.store.memory import MemoryStore
from nous_actor.supervision import Backoff, ChildSpec, SupervisedActor, Supervisor
from nous_actor.testing.races import (
    MUTATIONS,
    compaction_scenario,
    crash_session,
    mutate,
    registry_scenario,
    subscription_scenario,
)
from nous_actor.testing.sim_machine import schedules
from nous_actor.testing.simulation import (
    EPOCH,
    Fault,
    FaultRates,
    Schedule,
    SimulatedCrash,
    Simulation,
    SimulationError,
    SimulationFailure,
    explore,
    replay,
)

RATES = FaultRates(crash=0.01, fail_commit=0.01, slow_commit=0.03, stop=0.005)
ROOT = Path(__file__).resolve().parent.parent


def test_a_seed_replays_the_same_run_event_for_event() -> None:
    """Three runs of one seed give one trace and one digest."""
    scenario = registry_scenario(sessions=4, callers=3, appends=6)
    runs = [replay(scenario, Schedule(7, rates=RATES)) for _ in range(3)]
    assert all(r.error is None for r in runs)
    assert runs[0].trace == runs[1].trace == runs[2].trace
    assert len({r.digest for r in runs}) == 1
    assert runs[0].steps > 50


def test_seeds_choose_different_interleavings() -> None:
    """Different seeds give different runs of the same scenario."""
    scenario = registry_scenario(sessions=4, callers=3, appends=6)
    digests = {replay(scenario, seed).digest for seed in range(8)}
    assert len(digests) == 8


_CHILD = """
import structlog
structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
from nous_actor.testing.races import compaction_scenario, registry_scenario
from nous_actor.testing.simulation import FaultRates, Schedule, replay
rates = FaultRates(crash=0.01, fail_commit=0.01, slow_commit=0.03, stop=0.005)
for scenario in (
    registry_scenario(sessions=4, callers=3, appends=6),
    registry_scenario(sessions=4, callers=1, appends=6, async_callers=2),
    compaction_scenario(),
):
    out = replay(scenario, Schedule(11, rates=rates))
    print(out.digest, out.error)
"""


def test_the_digest_is_the_same_in_other_processes_with_other_hash_seeds() -> None:
    """A seed's digest does not depend on the process or on PYTHONHASHSEED: with generator
    callers, with coroutine callers beside them, and with a coroutine summariser on the
    simulation's event loop."""
    scenarios = (
        registry_scenario(sessions=4, callers=3, appends=6),
        registry_scenario(sessions=4, callers=1, appends=6, async_callers=2),
        compaction_scenario(),
    )
    here = [replay(s, Schedule(11, rates=RATES)).digest for s in scenarios]
    for hash_seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=ROOT,
            check=True,
        )
        lines = [line.split() for line in done.stdout.splitlines()]
        assert [line[1] for line in lines] == ["None"] * len(scenarios), done.stdout
        assert [line[0] for line in lines] == here, hash_seed


def test_a_pinned_schedule_replays_a_seeded_run() -> None:
    """The decisions a seeded run took, pinned, give the same run."""
    scenario = registry_scenario(sessions=4, callers=3, appends=6)
    seeded = replay(scenario, Schedule(3, rates=RATES))
    pinned = replay(scenario, seeded.replay)
    assert pinned.schedule.choices == seeded.replay.choices
    assert pinned.digest == seeded.digest


def test_a_call_bound_passes_on_the_virtual_clock() -> None:
    """A call nobody answers times out after its bound of virtual seconds, at once."""
    t0 = time.perf_counter()
    with Simulation(0) as sim:
        fut: SessionFuture[Any] = SessionFuture("s", 30.0)
        with pytest.raises(CallTimeout, match="within 30 s"):
            fut.get()
        assert sim.now() == pytest.approx(30.0)
    assert time.perf_counter() - t0 < 5.0


def test_idle_sessions_are_passivated_on_the_virtual_clock() -> None:
    """The passivator is a timer of the simulation: an hour passes in no wall time."""
    with Simulation(0) as sim:
        reg = Sessions(MemoryStore(), idle_timeout=60.0)
        reg.open("a").append("user_message", {"content": "x"}).get()
        assert reg.live() == ["a"]
        sim.run(until=sim.now() + 3600)
        assert reg.live() == []
        assert reg.open("a").count().get() == 1  # reopened from the store
        reg.close()


def test_events_carry_virtual_time() -> None:
    """An event appended without a time is stamped from the virtual clock."""
    with Simulation(0) as sim:
        reg = Sessions(MemoryStore())
        sim.run(until=42.0)
        ev = reg.open("a").append("user_message", {"content": "x"}).get()
        assert ev.time >= EPOCH
        assert (ev.time - EPOCH).total_seconds() == pytest.approx(sim.now())
        reg.close()


def test_ids_come_from_the_seed() -> None:
    """Actor URNs, claim tokens and compaction ids repeat with the seed."""

    def ids(seed: int) -> list[str]:
        with Simulation(seed):
            store = MemoryStore()
            reg = Sessions(store)
            h = reg.open("a")
            for i in range(4):
                h.append("user_message", {"content": f"m{i} " * 30}).get()
            res = h.compact(Compactor(budget=1, summarise=lambda ms: "s", keep_recent=1)).get()
            out = [str(res.compaction_id), *store._claims.values()]
            out += [t.obj.actor_urn for t in reg_tasks()]
            reg.close()
            return out

    def reg_tasks() -> list[Any]:
        host = scheduling.current()
        assert isinstance(host, Simulation)
        return list(host._actors)

    assert ids(5) == ids(5)
    assert ids(5) != ids(6)


def test_the_runtime_starts_no_thread_in_a_simulation() -> None:
    """Committer, readers, summarisers, timers and the registry start no thread of the
    runtime's: each runs as a simulated thread (one of the simulation's, one running at a
    time), and none is left once the simulation closes."""
    before = set(threading.enumerate())
    with Simulation(1, max_steps=100_000) as sim:
        reg = Sessions(MemoryStore(), idle_timeout=5.0)
        h = reg.open("a")
        for i in range(5):
            h.append("user_message", {"content": f"m{i} " * 30}).get()
        h.compact(Compactor(budget=1, summarise=lambda ms: "s", keep_recent=1)).get()
        crash_session(h)
        sim.run(until=sim.now() + 30)
        assert h.count().get() >= 7
        started = [t.name for t in set(threading.enumerate()) - before]
        assert [name for name in started if not name.startswith("nous-sim-")] == []
        reg.close()
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


def test_turns_and_commits_take_no_hand_off_between_real_threads() -> None:
    """A caller appending to a session with a store hands the baton to no other real
    thread for the session's turns and its commits (steps that cannot block run on the
    thread that chose them): the run's hand-offs stay those into and out of the caller,
    however many appends it makes."""
    with Simulation(0) as sim:
        reg = Sessions(MemoryStore())
        h = reg.open("a")

        def caller() -> Any:
            for i in range(20):
                yield h.append("user_message", {"content": f"m{i}"})

        sim.go(caller())
        before = sim.handoffs
        sim.run()
        assert sim.handoffs - before <= 3
        assert h.count().get() == 20
        reg.close()


def test_a_failed_commit_fails_its_appends_and_restarts_the_session() -> None:
    """A fail_commit fault: the append fails with StoreError; the session comes back."""
    with Simulation(Schedule(0, faults=(Fault(0, "fail_commit"),))) as sim:
        reg = Sessions(MemoryStore())
        h = reg.open("a")
        with pytest.raises(StoreError, match="simulated commit failure"):
            h.append("user_message", {"content": "lost"}).get()
        sim.run()
        assert h.append("user_message", {"content": "kept"}).get().seq == 0
        assert reg.restart_count("a") == 1
        reg.close()


def test_a_slow_commit_takes_virtual_time() -> None:
    """A slow_commit fault holds the commit for its virtual seconds."""
    with Simulation(Schedule(0, faults=(Fault(0, "slow_commit", seconds=2.0),))) as sim:
        reg = Sessions(MemoryStore())
        h = reg.open("a")
        t = sim.now()
        h.append("user_message", {"content": "x"}).get()
        assert sim.now() - t >= 2.0
        reg.close()


def test_a_crash_fault_restarts_the_session_from_the_store() -> None:
    """A crash fault stops a live session; the registry restarts it; nothing acked is lost."""
    with Simulation(Schedule(0, faults=(Fault(40, "crash"),))) as sim:
        reg = Sessions(MemoryStore())
        h = reg.open("a")
        acked = 0
        for i in range(30):
            try:
                h.append("user_message", {"content": str(i)}).get()
                acked += 1
            except SessionStopped:
                pass
        sim.run()
        assert [f.kind for f in sim.injected] == ["crash"]
        assert reg.restart_count("a") == 1
        assert h.count().get() == acked
        reg.close()


def test_a_registry_restart_fault_is_answered_by_its_supervisor() -> None:
    """restart_registry crashes the registry; its supervisor starts a fresh one."""
    with Simulation(Schedule(0, faults=(Fault(30, "restart_registry"),))) as sim:
        store = MemoryStore()
        reg = Sessions(store, start=False)
        sup = Supervisor.start([reg.child_spec()])
        h = reg.open("a")
        for i in range(20):
            try:
                h.append("user_message", {"content": str(i)}).get()
            except SessionStopped:
                pass
        sim.run()
        assert [f.kind for f in sim.injected] == ["restart_registry"]
        assert h.append("user_message", {"content": "after"}).get().data["content"] == "after"
        sup.stop()


def test_a_simulation_leaves_the_runtime_on_threads() -> None:
    """After the block: no host, the real uuid4, sessions on real threads again."""
    real_uuid4 = uuid.uuid4
    with Simulation(0) as sim:
        assert scheduling.current() is sim
        assert uuid.uuid4 is not real_uuid4
    assert scheduling.current() is scheduling.REAL
    assert uuid.uuid4 is real_uuid4
    with Sessions(MemoryStore()) as reg:
        assert reg.open("a").append("user_message", {"content": "x"}).get(timeout=10).seq == 0


def test_simulations_do_not_nest() -> None:
    """A second simulation inside one is refused."""
    with Simulation(0), pytest.raises(RuntimeError, match="do not nest"), Simulation(1):
        pass


def test_a_livelock_is_reported_after_max_steps() -> None:
    """A caller that never ends fails the run with SimulationError."""

    def forever() -> Any:
        while True:
            yield

    with Simulation(0, max_steps=100) as sim:
        sim.go(forever())
        with pytest.raises(SimulationError, match="100 steps"):
            sim.run()


def test_sqlite_runs_under_simulation_deterministically(tmp_path: Path) -> None:
    """The SQLite store's commits and recoveries are steps too; a seed replays."""
    scenario = registry_scenario(sessions=3, callers=2, appends=5, store="sqlite")
    a = replay(scenario, Schedule(4, rates=RATES))
    b = replay(scenario, Schedule(4, rates=RATES))
    assert a.error is None
    assert a.digest == b.digest
    assert any("committer" in line for line in a.trace)


def test_a_failure_names_its_seed_and_a_shorter_schedule_that_replays() -> None:
    """explore() raises with the seed and a shrunk pinned schedule that fails the same way."""
    mutation = next(m for m in MUTATIONS if m.function == "_submit")
    scenario = registry_scenario(sessions=3, callers=2, appends=4)
    with mutate(mutation), pytest.raises(SimulationFailure) as info:
        explore(scenario, range(200))
    failure = info.value
    assert f"seed {failure.seed}" in str(failure)
    assert "replay it with" in str(failure)
    original = failure.outcome.replay.choices or ()
    assert len(failure.schedule.choices or ()) <= len(original)
    with mutate(mutation):
        again = replay(scenario, failure.schedule)
    assert type(again.error) is type(failure.outcome.error)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(schedules(max_faults=2, kinds=("crash", "stop", "fail_commit", "slow_commit")))
def test_clean_scenarios_hold_under_drawn_schedules(schedule: Schedule) -> None:
    """Under any drawn schedule and faults, acknowledged appends reach the subscriber (the
    registry runs on its own here: a crash of it would end the scenario)."""
    assert replay(subscription_scenario(), schedule).error is None


def test_hypothesis_shrinks_a_failing_schedule() -> None:
    """Hypothesis finds a schedule that shows a planted defect and shrinks it."""
    mutation = next(m for m in MUTATIONS if m.function == "_shut" and "False" in m.new)
    scenario = mutation.scenario()
    with mutate(mutation):
        found = find(
            schedules(max_faults=0),
            lambda s: replay(scenario, s).error is not None,
            settings=settings(max_examples=500, database=None, deadline=None),
        )
        assert replay(scenario, found).error is not None
    assert len(found.choices or ()) <= 30


def test_a_coroutine_summariser_runs_as_a_task_on_virtual_time() -> None:
    """A coroutine summariser (called from no event loop) runs in a task of its own; the
    virtual seconds it sleeps pass while the session answers other calls."""
    with Simulation(3) as sim:

        async def summarise(ms: Any) -> str:
            sim.sleep(2.0)  # a model call
            return f"summary of {len(ms)}"

        reg = Sessions(MemoryStore())
        h = reg.open("a")
        for i in range(6):
            h.append("user_message", {"content": f"m{i} " * 30}).get()
        t = sim.now()
        fut = h.compact(Compactor(budget=1, summarise=summarise, keep_recent=1))
        count = h.count()
        answered: list[float] = []
        count.add_done_callback(lambda: answered.append(sim.now()))
        result = fut.get()
        assert count.get() == 6
        assert answered[0] - t < 2.0  # answered while the summary was written
        assert sim.now() - t >= 2.0
        assert result.summary_seq is not None
        reg.close()


class _Worker(SupervisedActor):
    """A user's actor with a thread of its own: crashes on "boom", counts its starts."""

    starts: ClassVar[list[float]] = []

    def on_start(self) -> None:
        host = scheduling.current()
        _Worker.starts.append(host.now() if isinstance(host, Simulation) else -1.0)

    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise SimulatedCrash("boom")
        return message


def test_a_users_supervised_actor_restarts_after_a_virtual_backoff() -> None:
    """A thread-per-actor child of a Supervisor runs as a task; its restart waits the
    backoff on the virtual clock."""
    _Worker.starts = []
    with Simulation(2) as sim:
        spec = ChildSpec("worker", _Worker.start)
        sup = Supervisor.start([spec], backoff=Backoff(1.0, 1.0, 0.0))
        assert sup.proxy().which_children().get(timeout=5) == [("worker", True)]
        worker = pykka.ActorRegistry.get_by_class(_Worker)[0]
        assert worker.ask("ping", timeout=5) == "ping"
        worker.tell("boom")
        sim.run()
        assert len(_Worker.starts) == 2
        assert _Worker.starts[1] - _Worker.starts[0] >= 1.0
        sup.stop()


def test_a_thread_per_actor_actor_runs_with_nothing_set_on_its_ref(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread-per-actor actor under simulation gets its inbox from Pykka's hook (made
    without the actor, bound to its task when it starts): its ref gets what Pykka's
    ``ActorRef.__init__`` sets and nothing else, and it answers as on a thread."""
    sets: list[str] = []
    real = pykka.ActorRef.__setattr__

    def record(ref: pykka.ActorRef[Any], name: str, value: Any) -> None:
        sets.append(name)
        real(ref, name, value)

    monkeypatch.setattr(pykka.ActorRef, "__setattr__", record)
    with Simulation(0):
        ref = _Worker.start()
        made = list(sets)
        assert ref.ask("ping", timeout=5) == "ping"
        ref.stop()
    monkeypatch.undo()
    assert sets == made
    assert sorted(made) == sorted(vars(ref))
