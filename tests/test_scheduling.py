"""The scheduling seam: a thread started through the installed host keeps that host for its
waits and its clock, whatever host is installed later (a real thread left running by one
test must not ask a later test's simulation to suspend it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bounds import BOUND

from nous_actor.runtime import scheduling
from nous_actor.runtime.flag import Flag
from nous_actor.sessions.handoff import HandOver
from nous_actor.store.memory import MemoryStore
from nous_actor.testing import Simulation


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What the threads of the test raised (kept, not printed)."""
    errors: list[BaseException] = []

    def keep(args: threading.ExceptHookArgs) -> None:
        errors.append(args.exc_value if args.exc_value is not None else RuntimeError())

    monkeypatch.setattr(threading, "excepthook", keep)
    return errors


def _seen_by_thread(start: Callable[[Callable[[], None]], None]) -> dict[str, Any]:
    """Start a thread through the real host with ``start``, enter a simulation, then let
    the thread wait on a flag and read the clock: what it saw."""
    seen: dict[str, Any] = {}
    go = threading.Event()
    finished = threading.Event()

    def body() -> None:
        try:
            if not go.wait(BOUND):
                return
            flag = Flag()
            seen["waited"] = flag.wait(0.001)  # nobody sets it: a real wait times out
            seen["host"] = scheduling.current()
            seen["clock"] = scheduling.monotonic()
        except BaseException as exc:
            seen["error"] = exc
        finally:
            finished.set()

    start(body)
    with Simulation(0) as sim:
        sim.run(until=1e9)  # the virtual clock is far from the real one
        go.set()
        assert finished.wait(BOUND)
    return seen


STARTS: dict[str, Callable[[Callable[[], None]], None]] = {
    "spawn": lambda fn: scheduling.spawn(fn, "nous-test"),
    "call_later": lambda fn: scheduling.call_later(0.0, fn, "nous-test"),
    "call_at": lambda fn: scheduling.current().call_at(scheduling.monotonic(), fn, "nous-test"),
    "service": lambda fn: scheduling.current().service(fn, "nous-test", 0.25, lambda: False),
}


@pytest.mark.parametrize("how", sorted(STARTS))
def test_a_real_thread_keeps_the_real_host_while_a_simulation_runs(how: str) -> None:
    """A thread the real host started waits on real time and reads the real clock even
    once a simulation's host is installed (it is no thread the simulation runs)."""
    seen = _seen_by_thread(STARTS[how])
    assert "error" not in seen, seen.get("error")
    assert seen["waited"] is False
    assert seen["host"] is scheduling.REAL
    assert abs(seen["clock"] - time.monotonic()) < BOUND  # the real clock, not the virtual


def test_the_test_thread_gets_the_simulation_host_while_it_runs() -> None:
    """The thread that entered a simulation (started by no host) gets its host, and the
    real one back once it ends."""
    with Simulation(0) as sim:
        assert scheduling.current() is sim
        assert scheduling.monotonic() == 0.0
    assert scheduling.current() is scheduling.REAL


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    s = MemoryStore()
    yield s
    s.close()


def test_a_hand_over_thread_left_running_does_not_fail_a_later_simulation(
    store: MemoryStore, thread_errors: list[BaseException]
) -> None:
    """A registry's hand-over thread that outlives its test (its registry never closed)
    goes on waiting on real time while a later test's simulation runs, instead of failing
    with `SimulationError` (the simulation's wait is for the threads it runs)."""
    first = threading.Event()
    go = threading.Event()
    looked_again = threading.Event()
    calls = 0

    def holds_any() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            first.set()
            go.wait(BOUND)
        else:
            looked_again.set()
        return True

    hand = HandOver(
        store,
        timeout=BOUND,
        holds_any=holds_any,
        live_ref=lambda _s, _t: None,
        idle_for=lambda _s: None,
    )
    hand.start()
    thread = hand._thread
    assert isinstance(thread, threading.Thread)
    try:
        assert first.wait(BOUND)
        with Simulation(0):
            go.set()  # the thread now waits for the store to change, then looks again
            for _ in range(int(BOUND / 0.05)):
                if looked_again.wait(0.05) or thread_errors or not thread.is_alive():
                    break
        assert thread_errors == []
        assert looked_again.is_set()
    finally:
        hand.stop()
        thread.join(BOUND)
    assert not thread.is_alive()
