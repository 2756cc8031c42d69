"""The simulation cannot lie: every interleaving real threads allow is a schedule it can
choose, a blocking wait suspends its own simulated thread, timers fire on the virtual
clock whatever else runs, and the Hypothesis strategy finds races that need long runs."""

from __future__ import annotations

from typing import Any

import hypothesis

from nous_actor import Sessions
from nous_actor.sessions.handle import Session
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.races import index_race_scenario
from nous_actor.testing.sim_machine import schedules
from nous_actor.testing.simulation import Simulation, explore, replay, shrink


def _delivered_before_acknowledged(seed: int) -> bool:
    """Under ``seed``: did a subscriber see an event while its append's future was not
    done yet (a session with no store: the feed and the answer are one turn apart)?"""
    early: list[bool] = []
    with Simulation(seed) as sim:
        chat = Session.start(f"feed-{seed}")
        sub = chat.subscribe()
        futs: dict[int, Any] = {}

        def writer() -> Any:
            for i in range(4):
                futs[i] = chat.append("user_message", {"content": str(i)})
                yield
            yield from list(futs.values())

        def reader() -> Any:
            for _ in range(4):
                ev = sub.get()
                early.append(not futs[ev.seq].done())
                yield

        sim.go(writer(), "writer")
        sim.go(reader(), "reader")
        sim.run()
        chat.stop()
    return any(early)


def test_a_subscriber_may_see_an_event_before_its_append_is_acknowledged() -> None:
    """Delivery to subscribers and the append's answer are two steps the schedule orders
    either way (on real threads a subscriber sometimes sees the event first)."""
    seen = [seed for seed in range(200) if _delivered_before_acknowledged(seed)]
    assert seen, "no schedule delivered an event before its append was acknowledged"
    assert len(seen) < 200, "every schedule delivered first: the other order is lost"


def test_two_callers_taking_turns_never_wait_out_their_bound() -> None:
    """Two generator callers each in ``with chat.turn() as turn:`` blocks: the second
    waits for the first's turn (its thread suspended), never inside the first's step."""

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore())
        chat = sessions.open("chat")

        def caller(name: str) -> Any:
            for i in range(3):
                with chat.turn() as turn:
                    f = turn.append("user_message", {"content": f"{name} {i}"})
                    yield f
                    f.get()

        sim.go(caller("alice"), "alice")
        sim.go(caller("bob"), "bob")
        sim.run()
        assert chat.count().get() == 6 + 2 * 6  # each turn adds its start and end
        sessions.close()

    assert explore(scenario, range(200)) == 200


def test_the_passivator_runs_on_time_whatever_else_is_runnable() -> None:
    """A session idle for 120 virtual seconds with ``idle_timeout=60`` is passivated in
    every schedule: timers fire when the virtual clock reaches them."""

    def scenario(sim: Simulation) -> None:
        sessions = Sessions(MemoryStore(), idle_timeout=60.0)
        sessions.open("idle").append("user_message", {"content": "x"}).get()
        live: list[list[str]] = []

        def watcher() -> Any:
            yield 120.0
            live.append(sessions.live())

        sim.go(watcher(), "watcher")
        sim.run()
        assert live == [[]], f"still live after 120 s idle: {live}"
        sessions.close()

    assert explore(scenario, range(200)) == 200


def test_the_schedules_strategy_finds_a_race_that_needs_a_long_interleaving() -> None:
    """The planted user-code race of `index_race_scenario` needs ~25 non-zero choices
    (the compaction's every step while the agent could run): Hypothesis' `schedules()`
    finds it within 300 examples, and the fixed agent holds under what it found."""
    scenario = index_race_scenario()
    found = hypothesis.find(
        schedules(max_faults=0),
        lambda s: replay(scenario, s).error is not None,
        settings=hypothesis.settings(max_examples=300, database=None, deadline=None),
    )
    assert isinstance(replay(scenario, found).error, (AssertionError, IndexError))
    assert replay(index_race_scenario(fixed=True), found).error is None
    shortest = shrink(scenario, replay(scenario, found), runs=300)
    assert sum(1 for c in shortest.schedule.choices or () if c) >= 15
