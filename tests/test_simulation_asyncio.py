"""asyncio under the simulation: coroutine callers and summarisers on its own event loop.

Coroutines given to `Simulation.go` run on `sim.loop`, a `SimEventLoop`: one
ready callback a step, interleaved with the actors, the committer and the
generator callers as the seed chooses; its timers wait on the virtual clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from nous_actor import Sessions, SessionStopped
from nous_actor.core.compaction import Compactor
from nous_actor.runtime import scheduling
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.races import compaction_scenario, registry_scenario
from nous_actor.testing.simulation import (
    FaultRates,
    Schedule,
    SimEventLoop,
    Simulation,
    SimulationError,
    explore,
    replay,
)

RATES = FaultRates(crash=0.01, fail_commit=0.01, slow_commit=0.03, stop=0.005)


def _loop_steps(sim: Simulation) -> list[str]:
    return [line for line in sim.trace if " loop#" in line]


def test_coroutine_callers_open_append_and_read_with_await() -> None:
    """Coroutines await aopen, appends and reads; no thread of the runtime's is started
    (only the simulation's own); the loop's callbacks are steps of the trace."""
    before = set(threading.enumerate())
    with Simulation(5) as sim:
        sessions = Sessions(MemoryStore())
        acked: list[int] = []

        async def caller(name: str) -> int:
            chat = await sessions.aopen("chat")
            for i in range(3):
                ev = await chat.append("user_message", {"content": f"{name} {i}"})
                acked.append(ev.seq)
            return int(await chat.count())

        a = sim.go(caller("alice"), "alice")
        b = sim.go(caller("bob"), "bob")
        sim.run()
        assert a is not None
        assert b is not None
        assert sorted(acked) == [0, 1, 2, 3, 4, 5]
        assert max(a.result(), b.result()) == 6
        assert isinstance(sim.loop, SimEventLoop)
        assert any("alice#" in line for line in _loop_steps(sim))
        started = set(threading.enumerate()) - before
        assert {t for t in started if not t.name.startswith("nous-sim-")} == set()
        sessions.close()
    assert {t for t in set(threading.enumerate()) - before if t.is_alive()} == set()


def test_asyncio_timers_wait_on_the_virtual_clock() -> None:
    """asyncio.sleep and asyncio.wait_for pass virtual seconds: an hour in no wall time."""
    t0 = time.perf_counter()
    with Simulation(0) as sim:

        async def sleeper() -> tuple[float, float]:
            await asyncio.sleep(3600)
            slept = sim.now()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.sleep(10), 1.5)
            return slept, sim.now()

        task = sim.go(sleeper(), "sleeper")
        sim.run()
        assert task is not None
        assert task.result() == (3600.0, 3601.5)
        assert sim.loop.time() == sim.now()
    assert time.perf_counter() - t0 < 5.0


def test_async_for_over_a_subscription_gets_every_event() -> None:
    """A coroutine reads a subscription with async for while another appends."""
    with Simulation(3) as sim:
        sessions = Sessions(MemoryStore())
        got: list[int] = []

        async def writer() -> None:
            chat = await sessions.aopen("feed")
            for i in range(5):
                await chat.append("user_message", {"content": str(i)})

        async def reader() -> None:
            chat = await sessions.aopen("feed")
            async with await chat.asubscribe() as sub:
                async for ev in sub:
                    got.append(ev.seq)
                    if len(got) == 5:
                        break

        sim.go(reader(), "reader")
        sim.go(writer(), "writer")
        sim.run()
        assert got == [0, 1, 2, 3, 4]
        assert any("executor:" in line for line in sim.trace)  # asubscribe: a task, no thread
        sessions.close()


def test_a_coroutine_summariser_runs_on_the_callers_loop() -> None:
    """A compaction asked for from a coroutine has its coroutine summariser run on the
    simulation's loop (the caller's); its asyncio.sleep passes virtual seconds while the
    session answers other calls."""
    with Simulation(4) as sim:
        sessions = Sessions(MemoryStore())
        loops: list[Any] = []

        async def summarise(ms: Any) -> str:
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(2.0)  # a model call
            return f"summary of {len(ms)}"

        async def caller() -> tuple[float, float, Any]:
            chat = await sessions.aopen("a")
            for i in range(6):
                await chat.append("user_message", {"content": f"m{i} " * 30})
            t = sim.now()
            fut = chat.compact(Compactor(budget=1, summarise=summarise, keep_recent=1))
            assert await chat.count() == 6
            answered = sim.now() - t
            with pytest.raises(RuntimeError, match="await"):  # a blocking get() here
                fut.get()
            result = await fut
            return answered, sim.now() - t, result

        task = sim.go(caller(), "caller")
        sim.run()
        assert task is not None
        answered, took, result = task.result()
        assert answered < 2.0 <= took
        assert result.summary_seq is not None
        assert loops == [sim.loop]
        sessions.close()


def test_call_soon_threadsafe_from_a_simulated_task_lands_on_the_loop() -> None:
    """What the runtime's tasks hand to the loop (call_soon_threadsafe) runs as a step of
    the loop, after the task that handed it over."""
    with Simulation(1) as sim:
        seen: list[str] = []
        loop = sim.loop
        scheduling.spawn(lambda: loop.call_soon_threadsafe(seen.append, "ran"), "hander")
        sim.run()
        assert seen == ["ran"]
        handed = next(i for i, line in enumerate(sim.trace) if " hander#" in line)
        ran = next(i for i, line in enumerate(sim.trace) if line.endswith(" list.append"))
        assert handed < ran
        assert " loop#" in sim.trace[ran]


def test_a_coroutine_that_raises_fails_the_run() -> None:
    """What a coroutine caller raises is the run's failure, as for a generator caller."""

    async def broken() -> None:
        await asyncio.sleep(1)
        raise ValueError("broken caller")

    with Simulation(0) as sim:
        sim.go(broken(), "broken")
        with pytest.raises(ValueError, match="broken caller"):
            sim.run()
        assert any("broken#" in line and "failed ValueError" in line for line in sim.trace)


def test_a_coroutine_that_never_ends_is_reported_and_cancelled_at_close() -> None:
    """A coroutine still waiting when nothing else can run is named; leaving the block
    cancels it and runs it to its end (its finally runs)."""
    ended: list[str] = []
    never: asyncio.Future[None] | None = None

    async def stuck() -> None:
        nonlocal never
        never = asyncio.get_running_loop().create_future()
        try:
            await never
        finally:
            ended.append("finally")

    with Simulation(0) as sim:
        task = sim.go(stuck(), "stuck")
        with pytest.raises(SimulationError, match="stuck#"):
            sim.run()
    assert task is not None
    assert task.cancelled()
    assert ended == ["finally"]
    assert sim.loop.is_closed()


def test_run_until_complete_runs_the_simulation_until_the_coroutine_is_done() -> None:
    """sim.loop.run_until_complete(coro): the test's own code can await."""
    with Simulation(2) as sim:
        sessions = Sessions(MemoryStore())

        async def append() -> int:
            chat = await sessions.aopen("a")
            ev = await chat.append("user_message", {"content": "x"})
            await chat.astop()
            return ev.seq

        assert sim.loop.run_until_complete(append()) == 0
        with pytest.raises(SimulationError, match=r"sim\.go"):
            sim.loop.run_forever()
        sessions.close()


def test_a_stopped_session_fails_an_awaited_call() -> None:
    """An awaited call on a session stopped by a generator caller meanwhile ends with a
    result or SessionStopped, never a timeout."""

    def run(seed: int) -> list[str]:
        with Simulation(seed) as sim:
            sessions = Sessions(MemoryStore())
            chat = sessions.open("race")
            outcomes: list[str] = []

            async def caller() -> None:
                for i in range(4):
                    try:
                        await chat.append("user_message", {"content": str(i)})
                        outcomes.append("ok")
                    except SessionStopped:
                        outcomes.append("stopped")

            def stopper() -> Any:
                yield
                chat.stop()

            sim.go(caller(), "caller")
            sim.go(stopper(), "stopper")
            sim.run()
            sessions.close()
            return outcomes

    for seed in range(20):
        assert len(run(seed)) == 4


def test_seeds_interleave_the_loop_with_the_actors_differently() -> None:
    """The loop's steps are choices of the schedule like any other task's."""
    scenario = compaction_scenario()
    digests = {replay(scenario, seed).digest for seed in range(8)}
    assert len(digests) == 8


@pytest.mark.parametrize(
    "scenario",
    [compaction_scenario(), registry_scenario(sessions=4, callers=1, appends=6, async_callers=2)],
    ids=["compaction", "registry"],
)
def test_a_seed_replays_a_run_with_coroutines_event_for_event(scenario: Any) -> None:
    """Three runs of one seed (with faults) give one trace and one digest."""
    runs = [replay(scenario, Schedule(9, rates=RATES)) for _ in range(3)]
    assert all(r.error is None for r in runs), [r.error for r in runs]
    assert runs[0].trace == runs[1].trace == runs[2].trace
    assert len({r.digest for r in runs}) == 1
    assert any(" loop#" in line for line in runs[0].trace)


def test_the_registry_race_with_asyncio_callers_holds_under_faults() -> None:
    """100 schedules of the registry race with two coroutine callers beside the generator
    ones, with crashes of sessions and of the registry, failed and slow commits."""
    rates = FaultRates(
        crash=0.01,
        fail_commit=0.01,
        doubt_commit=0.005,
        slow_commit=0.03,
        stop=0.005,
        restart_registry=0.003,
    )
    assert explore(registry_scenario(async_callers=2), range(100), rates=rates) == 100
