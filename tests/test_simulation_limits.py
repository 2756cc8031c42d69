"""What a simulation cannot control it says so: a step blocked on something it does not
run fails the run (never a hang), a thread of the test's own that sends into it fails
the run, shrinking keeps the run's step limit, a drawn schedule's bias reaches the
machine's run, a registry that nothing would restart is never crashed by a fault, and
every argument a schedule is made of is checked where it is given."""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
import traceback
from collections.abc import Generator
from typing import Any

import pytest
from bounds import BOUND, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import MemoryStore, Sessions, SessionStopped
from nous_actor.runtime import scheduling
from nous_actor.testing.races import (
    compaction_scenario,
    registry_scenario,
    restart_scenario,
    stop_race_scenario,
    subscription_scenario,
)
from nous_actor.testing.sim_machine import SimulationMachine, schedules
from nous_actor.testing.simulation import (
    DEFAULT_STEP_TIMEOUT,
    Fault,
    FaultRates,
    Schedule,
    Simulation,
    SimulationError,
    SimulationFailure,
    SimulationStalled,
    explore,
    replay,
)

STEP_TIMEOUT = 1.5
"""The bound of the stalling tests: a step of theirs takes well under a millisecond."""


def _sim_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nous-sim-")]


# -- a step that never hands the simulation back ----------------------------------------------


def test_an_executor_function_blocked_on_a_queue_fails_the_run_naming_it() -> None:
    """A run_in_executor function that reads a queue.Queue its coroutine fills (it returns
    on a real loop) holds the run: it fails with SimulationStalled naming the function's
    task and what to do, within the bound; nothing runs after it, the runtime is back on
    threads, and the function's thread ends alone once it is answered."""
    q: queue.Queue[str | None] = queue.Queue()

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())

        async def main() -> int:
            chat = await sessions.aopen("c")

            def worker() -> int:
                n = 0
                while (item := q.get()) is not None:
                    chat.append("user_message", {"content": item})
                    n += 1
                return n

            w = asyncio.get_running_loop().run_in_executor(None, worker)
            for i in range(3):
                await asyncio.sleep(0.1)
                q.put(str(i))
            q.put(None)
            return await w

        sim.go(main(), "main")
        sim.run()
        sessions.close()

    began = time.monotonic()
    out = replay(scenario, 0, step_timeout=STEP_TIMEOUT)
    took = time.monotonic() - began
    assert isinstance(out.error, SimulationStalled), out.error
    assert out.error.task.startswith("executor:")
    assert "worker" in out.error.task
    text = str(out.error)
    assert "queue.py" in text  # where it is blocked
    assert "step_timeout" in text
    assert "run_in_executor" in text
    assert STEP_TIMEOUT <= took < STEP_TIMEOUT + BOUND
    assert any("STALLED executor:" in line for line in out.trace)
    assert scheduling.current() is scheduling.REAL
    q.put(None)  # answers the abandoned function: its thread ends, alone
    wait_until(lambda: not _sim_threads_alive(), BOUND, "the stalled step's thread ended")
    with Sessions(MemoryStore()) as reg:  # the runtime runs on threads again
        assert reg.open("a").append("user_message", {"content": "x"}).get(timeout=BOUND).seq == 0


def test_a_caller_blocked_on_a_real_event_fails_the_run_and_is_not_shrunk() -> None:
    """A plain function caller waiting on a threading.Event nobody sets: explore fails
    with the stall at once (no shrinking, which would wait out the bound at every try),
    and the test's own code after the stall runs no step (the registry's close fails
    with the stall too)."""
    event = threading.Event()
    closes: list[BaseException] = []

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        sim.go(event.wait, "real-event")
        try:
            sim.run()
        finally:
            try:
                sessions.close()
            except BaseException as exc:
                closes.append(exc)
                raise

    began = time.monotonic()
    with pytest.raises(SimulationFailure) as info:
        explore(scenario, range(5), step_timeout=STEP_TIMEOUT)
    assert time.monotonic() - began < STEP_TIMEOUT + BOUND
    failure = info.value
    assert isinstance(failure.outcome.error, SimulationStalled)
    assert failure.outcome.error.task.startswith("real-event#")
    assert failure.shrunk is failure.outcome
    assert "step_timeout=1.5" in str(failure)
    assert [type(e) for e in closes] == [SimulationStalled]
    event.set()
    wait_until(lambda: not _sim_threads_alive(), BOUND, "the stalled caller's thread ended")


def test_a_coroutine_blocking_the_loop_fails_the_run_naming_its_task() -> None:
    """A coroutine that blocks on a queue.Queue blocks the loop, as it would: the stall
    names the loop and the coroutine's task, and the loop is closed after the run."""
    q: queue.Queue[int] = queue.Queue()
    loops: list[asyncio.AbstractEventLoop] = []

    def scenario(sim: Simulation) -> None:
        async def blocks() -> None:
            await asyncio.sleep(0.1)
            q.get()

        loops.append(sim.loop)
        sim.go(blocks(), "blocks-the-loop")
        sim.run()

    out = replay(scenario, 0, step_timeout=STEP_TIMEOUT)
    assert isinstance(out.error, SimulationStalled), out.error
    assert out.error.task.startswith("loop#")
    assert "running blocks-the-loop#" in out.error.task
    assert loops[0].is_closed()
    q.put(1)
    wait_until(lambda: not _sim_threads_alive(), BOUND, "the stalled loop's thread ended")


def test_slow_steps_that_go_on_are_not_a_stall() -> None:
    """Steps each slower than a tenth of the bound, longer than the bound together: the
    run ends normally (the bound is per step, and every step that ends resets it)."""
    slow = threading.Event()  # never set: each wait is a slow step, in real time

    def scenario(sim: Simulation) -> None:
        def caller() -> Generator[Any, Any, None]:
            for _ in range(12):
                slow.wait(0.1)
                yield

        sim.go(caller(), "slow")
        sim.run()

    out = replay(scenario, 0, step_timeout=1.0)
    assert out.error is None


def test_the_step_bound_is_checked() -> None:
    assert DEFAULT_STEP_TIMEOUT >= 30.0  # a loaded machine's slow step never trips it
    for bad in (0, -1.0, math.nan, math.inf, "10", True):
        with pytest.raises(ValueError, match="step_timeout"):
            Simulation(0, step_timeout=bad)  # type: ignore[arg-type]
    assert Simulation(0, step_timeout=None).step_timeout is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_steps": 0}, ValueError),  # every run would fail at its first step
        ({"max_steps": -5}, ValueError),
        ({"max_steps": 1.5}, TypeError),
        ({"max_steps": True}, TypeError),
        ({"restarts": -1}, ValueError),
        ({"restarts": "3"}, TypeError),
    ],
)
def test_the_step_and_restart_counts_are_checked(kwargs: dict[str, Any], error: type) -> None:
    name = next(iter(kwargs))
    with pytest.raises(error, match=f"{name} must be an int"):
        Simulation(0, **kwargs)
    assert Simulation(0, max_steps=1, restarts=0).max_steps == 1


def test_run_outside_the_with_block_says_to_enter_it() -> None:
    sim = Simulation(0)
    with pytest.raises(SimulationError, match="with Simulation"):
        sim.run()
    with sim:  # the refusal left it unused: it still runs once
        sim.run()


# -- a thread the simulation does not run -----------------------------------------------------


def test_a_thread_of_the_tests_own_sending_into_the_run_fails_it() -> None:
    """A thread the simulation does not run appends without waiting (its send would land
    at a real time, so a seed would not replay): the run fails, naming the thread, under
    every seed, where each run passed with a different digest before."""
    names: list[str] = []

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("c")

        def background() -> None:
            chat.append("user_message", {"content": "from a thread of mine"})

        def caller() -> Generator[Any, Any, None]:
            yield chat.append("user_message", {"content": "first"})
            th = threading.Thread(target=background, name="my-background")
            th.start()
            th.join(BOUND)
            names.append(th.name)
            yield

        sim.go(caller(), "caller")
        sim.run()
        sessions.close()

    for seed in range(10):
        out = replay(scenario, seed)
        assert isinstance(out.error, SimulationError), (seed, out.error)
        assert "'my-background'" in str(out.error)
        assert "sim.go" in str(out.error)
    assert names == ["my-background"] * 10


# -- shrinking keeps the run's settings -------------------------------------------------------


def _livelock(sim: Simulation) -> None:
    sessions = Sessions(MemoryStore())
    chat = sessions.open("c")

    def poller() -> Generator[Any, Any, None]:
        while not (yield chat.count()):  # waits for an event nobody appends
            pass

    sim.go(poller(), "poller")
    sim.run()
    sessions.close()


def test_shrinking_and_the_replay_line_keep_max_steps() -> None:
    """explore(max_steps=300) of a livelock: the shrunk run stops at 300 steps too (it
    ran 50,000 before), and the replay line it prints, run as printed, fails the same
    way (it passed without max_steps for a scenario that needs more than 300)."""
    with pytest.raises(SimulationFailure) as info:
        explore(_livelock, range(2), max_steps=300)
    failure = info.value
    assert failure.shrunk.steps <= 310
    assert failure.shrunk.max_steps == 300
    assert "max_steps=300)" in str(failure).splitlines()[-1]
    again = replay(_livelock, failure.schedule, max_steps=300)
    assert isinstance(again.error, SimulationError)
    assert "300 steps" in str(again.error)


# -- SimulationMachine keeps the drawn schedule ----------------------------------------------


@settings(max_examples=10, deadline=None)
@given(schedules(max_faults=3))
def test_the_machine_runs_the_drawn_schedule_with_its_bias(schedule: Schedule) -> None:
    """The machine's run gets the drawn schedule whole (its bias, its rates), less the
    faults of kinds it does not inject (the bias was dropped)."""
    machine = SimulationMachine()
    try:
        machine.start(schedule)
        assert machine.sim is not None
        ran = machine.sim.schedule
        assert (ran.seed, ran.choices, ran.bias, ran.rates) == (
            schedule.seed,
            schedule.choices,
            schedule.bias,
            schedule.rates,
        )
        kinds = set(machine.fault_kinds)
        assert ran.faults == tuple(f for f in schedule.faults if f.kind in kinds)
    finally:
        machine.teardown()


def test_a_biased_schedule_reaches_the_machines_run() -> None:
    machine = SimulationMachine()
    try:
        machine.start(Schedule(5, bias=0.9))
        assert machine.sim is not None
        assert machine.sim.schedule.bias == 0.9
    finally:
        machine.teardown()


# -- restart_registry: only a registry a supervisor restarts ----------------------------------


def test_a_registry_of_its_own_is_never_crashed_by_a_fault() -> None:
    """A plain Sessions (nothing restarts it on real threads) is no target of
    restart_registry: the fault is not injected and the registry goes on (every open
    failed with SessionStopped for good before)."""
    with Simulation(Schedule(0, faults=(Fault(0, "restart_registry"),))) as sim:
        reg = Sessions(MemoryStore())
        reg.open("a").append("user_message", {"content": "x"}).get()
        sim.run()
        assert sim.injected == []
        assert reg.open("a").count().get() == 1
        reg.close()


def test_the_compaction_scenario_holds_under_registry_faults() -> None:
    """The schedule an outside test found (seed 11 with every kind of fault) failed the
    library's own compaction scenario with SessionStopped: its registry had been crashed
    for good."""
    rates = FaultRates(
        crash=0.01,
        stop=0.005,
        fail_commit=0.01,
        doubt_commit=0.01,
        slow_commit=0.03,
        restart_registry=0.005,
    )
    assert replay(compaction_scenario(), Schedule(11, rates=rates)).error is None


SCENARIOS = {
    "compaction": compaction_scenario(),
    "registry": registry_scenario(),
    "restart": restart_scenario(),
    "stop_race": stop_race_scenario(),
    "subscription": subscription_scenario(),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_registry_fault_at_any_step_never_fails_the_librarys_own_scenarios(name: str) -> None:
    """restart_registry armed at every tenth step of each scenario's run: none fails
    (compaction failed under 8 of these 20, subscription, stop_race and restart under 1
    each, with SessionStopped: their registry runs on its own)."""
    for step in range(0, 200, 10):
        out = replay(SCENARIOS[name], Schedule(0, faults=(Fault(step, "restart_registry"),)))
        assert out.error is None, (step, out.error)


@settings(max_examples=60, deadline=None)
@given(schedules(horizon=80), st.sampled_from(sorted(SCENARIOS)))
def test_default_schedules_never_fail_the_librarys_own_scenarios(
    schedule: Schedule, name: str
) -> None:
    """schedules() draws every kind of fault, restart_registry too (here within the first
    80 steps: the scenarios end within about 200): no scenario of the library fails under
    one (those on a registry of their own failed with SessionStopped once it crashed)."""
    out = replay(SCENARIOS[name], schedule)
    assert not isinstance(out.error, SessionStopped), out.error
    assert out.error is None, out.error


# -- arguments checked where they are given ---------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: Fault(-1, "crash"), ValueError, "step is an int >= 0"),
        (lambda: Fault(1.5, "crash"), TypeError, "step is an int"),  # type: ignore[arg-type]
        (lambda: Fault(0, "crash", target=-2), ValueError, "target"),
        (lambda: Fault(0, "slow_commit", seconds=-3), ValueError, "seconds"),
        (lambda: Fault(0, "slow_commit", seconds=math.nan), ValueError, "finite"),
        (lambda: Fault(0, "slow_commit", seconds="2"), TypeError, "seconds"),  # type: ignore[arg-type]
        (lambda: FaultRates(crash=2.0), ValueError, "between 0 and 1"),
        (lambda: FaultRates(crash=-1), ValueError, "between 0 and 1"),
        (lambda: FaultRates(stop=math.nan), ValueError, "stop"),
        (lambda: FaultRates(horizon=-1), ValueError, "horizon"),
        (lambda: Schedule(seed=1.5), TypeError, "seed is an int"),  # type: ignore[arg-type]
        (lambda: Schedule(0, choices=(-1, 5)), ValueError, "choices"),
        (lambda: Schedule(0, choices=("a",)), TypeError, "choices"),  # type: ignore[arg-type]
        (lambda: Schedule(0, faults=("crash",)), TypeError, "Fault"),  # type: ignore[arg-type]
        (lambda: Schedule(0, rates=0.1), TypeError, "FaultRates"),  # type: ignore[arg-type]
        (lambda: Schedule(0, bias="x"), TypeError, "bias"),  # type: ignore[arg-type]
        (lambda: Simulation(1.5), TypeError, "Schedule or an int seed"),  # type: ignore[arg-type]
        (lambda: explore(_livelock, 5), TypeError, "iterable of int seeds"),  # type: ignore[arg-type]
    ],
)
def test_a_wrong_argument_is_refused_saying_what_to_pass(
    make: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        make()


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_faults_seconds_are_a_finite_number_from_zero(seconds: float) -> None:
    if math.isfinite(seconds) and seconds >= 0:
        assert Fault(0, "slow_commit", seconds=seconds).seconds == seconds
    else:
        with pytest.raises(ValueError, match="seconds"):
            Fault(0, "slow_commit", seconds=seconds)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_fault_rate_is_a_chance(rate: float) -> None:
    if 0 <= rate <= 1:
        assert FaultRates(crash=rate).crash == rate
    else:
        with pytest.raises(ValueError, match="crash"):
            FaultRates(crash=rate)


def test_a_schedule_keeps_lists_as_tuples() -> None:
    s = Schedule(0, choices=[1, 2], faults=[Fault(3, "crash")])  # type: ignore[arg-type]
    assert s.choices == (1, 2)
    assert s.faults == (Fault(3, "crash"),)
    assert hash(s) == hash(Schedule(0, choices=(1, 2), faults=(Fault(3, "crash"),)))


@pytest.mark.parametrize(
    ("yielded", "error", "words"),
    [
        ("hello", TypeError, "yields a future"),
        (-5, ValueError, ">= 0"),
        (math.nan, ValueError, ">= 0"),
        (True, TypeError, "yields a future"),
    ],
)
def test_a_caller_that_yields_what_is_not_a_wait_fails_at_its_yield(
    yielded: object, error: type[Exception], words: str
) -> None:
    """A caller that yields a string or a negative time failed nothing (the string was
    taken for a future, -5 for no sleep): the run fails with the error raised at the
    caller's own yield, which a caller may also catch and go on."""

    def wrong(sim: Simulation) -> None:
        def caller() -> Generator[Any, Any, None]:
            yield yielded

        sim.go(caller(), "wrong")
        sim.run()

    out = replay(wrong, 0)
    assert isinstance(out.error, error), out.error
    assert words in str(out.error)
    assert "wrong#" in str(out.error)
    frames = traceback.extract_tb(out.error.__traceback__)
    assert any(f.name == "caller" for f in frames)  # raised at its yield

    caught: list[BaseException] = []

    def catches(sim: Simulation) -> None:
        def caller() -> Generator[Any, Any, None]:
            try:
                yield yielded
            except (TypeError, ValueError) as exc:
                caught.append(exc)
            yield 0.5

        sim.go(caller(), "catches")
        sim.run()
        assert sim.now() == 0.5

    assert replay(catches, 0).error is None
    assert [type(e) for e in caught] == [error]


def test_a_caller_may_sleep_for_ever_and_yield_futures_and_nothing() -> None:
    """What a caller may yield still works: nothing, seconds (0, a float), a future."""

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("c")

        def caller() -> Generator[Any, Any, None]:
            yield
            yield 0
            yield 0.25
            ev = yield chat.append("user_message", {"content": "x"})
            assert ev.seq == 0

        sim.go(caller(), "ok")
        sim.run()
        assert sim.now() >= 0.25
        sessions.close()

    assert replay(scenario, 3).error is None


class _Draw:
    """What a rule's ``data`` draws: always ``value``."""

    def __init__(self, value: str) -> None:
        self.value = value

    def draw(self, _strategy: object) -> str:
        return self.value


def test_a_caller_waiting_when_the_simulation_closes_ends_quietly() -> None:
    """Callers still inside a wait when the machine tears down (the registry closed
    under them): the simulation's close ends them, and what their steps raise then is
    not the run's. It failed with ValueError (a caller taken off the run list twice),
    or with the SessionStopped of such a caller, once the bias reached the machine."""
    machine = SimulationMachine()
    machine.sim = Simulation(Schedule(0, bias=0.9))
    machine.sim.__enter__()
    machine.store = machine.make_store()
    machine.sessions = machine.make_sessions(machine.store)
    try:
        for sid in ("a", "b", "a"):
            machine.compact(_Draw(sid))
        machine.settle()
        machine.compact(_Draw("a"))
        machine.compact(_Draw("a"))
        machine.append(_Draw("a"), "")
        machine.append_from_a_coroutine(_Draw("a"), "")
        machine.compact(_Draw("a"))
        machine.compact(_Draw("a"))
    finally:
        machine.teardown()
    assert scheduling.current() is scheduling.REAL


_FIRST_RUN = """
import uuid
from nous_actor import MemoryStore, Sessions
from nous_actor.testing.simulation import replay

seen = []
def scenario(sim):
    sessions = Sessions(MemoryStore())
    def agent():
        chat = sessions.open("c")
        yield chat.append("user_message", {"content": "x"})
        seen.append(uuid.uuid4().hex)
    sim.go(agent(), "agent")
    sim.run()
    sessions.close()

for _ in range(2):
    replay(scenario, 4)
print(seen[0] == seen[1], seen[0])
"""


def test_the_first_run_in_a_process_draws_the_ids_of_every_later_run() -> None:
    """In a fresh process, the first run's seeded ids equal a replay's: the runtime's
    set-up on its first registry (the OpenTelemetry sink's import draws uuid4s) took
    ids from the seeded stream, so the run that failed and its replay differed."""
    import subprocess
    import sys

    from bounds import INTERPRETER_BOUND

    done = subprocess.run(
        [sys.executable, "-c", _FIRST_RUN],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
        check=True,
    )
    same, _ = done.stdout.split()
    assert same == "True", done.stdout


def _lottery(sim: Simulation) -> None:
    """Two agents each append their name if the session is empty (a check-then-act race
    with two outcomes a test asserts against, one assertion each)."""
    sessions = Sessions(MemoryStore())

    def agent(name: str) -> Generator[Any, Any, None]:
        chat = sessions.open("lottery")
        n = yield chat.count()
        if n == 0:
            yield chat.append("user_message", {"content": name})

    sim.go(agent("alice"), "alice")
    sim.go(agent("bob"), "bob")
    sim.run()
    got = [m.content for m in sessions.open("lottery").derive_messages().get(timeout=BOUND)]
    sessions.close()
    assert got != ["bob"], "BUG-1: bob won alone"
    assert len(got) == 1, f"BUG-2: two winners {got}"


def test_the_shrunk_schedule_fails_the_way_the_run_did() -> None:
    """Shrinking keeps the failure the run had: the same exception type raised at the same
    line (any AssertionError counted, so the shortest schedule replayed another assertion
    of the scenario than the one reported)."""
    for seed in range(40):
        try:
            explore(_lottery, [seed])
        except SimulationFailure as failure:
            first = failure.outcome.error
            assert first is not None
            replayed = replay(_lottery, failure.schedule).error
            assert type(replayed) is type(first)
            bug = str(first).split(":")[0]  # BUG-1 or BUG-2: which assertion failed
            assert str(replayed).split(":")[0] == bug, (seed, first, replayed)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda sim: sim.sleep(math.nan), ValueError),  # waited out the step bound
        (lambda sim: sim.sleep(-1), ValueError),
        (lambda sim: sim.sleep("x"), TypeError),
        (lambda sim: sim.go(42), TypeError),  # failed at run() only
        (lambda sim: sim.go(iter(()), name=5), TypeError),
    ],
)
def test_bad_arguments_of_sleep_and_go_are_refused_at_the_call(
    call: Any, error: type[Exception]
) -> None:
    with Simulation(0) as sim:
        with pytest.raises(error):
            call(sim)
        sim.run()  # nothing was started: the run has nothing to do
    with pytest.raises(ValueError, match="shrink_runs"):
        explore(lambda sim: None, [0], shrink_runs=-1)
