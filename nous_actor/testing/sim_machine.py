"""Hypothesis on top of the simulation: schedules that shrink, and a ready state machine.

* `schedules`: a strategy for a `Schedule`: a seed with a bias (swarm-style
  distributions of choices, which find races that need long interleavings), or
  pinned choices, and faults. A failing pinned schedule shrinks towards fewer
  faults and fewer, smaller choices: past its end a run takes the first option
  at every step.
* `SimulationMachine`: a ``RuleBasedStateMachine`` that drives sessions of a
  registry under a `Simulation` (appends, compactions with a slow summariser,
  subscriptions, forks, crashes; appends and compactions from asyncio callers
  too, on the simulation's event loop) and checks them against a plain model:
  every acknowledged append is in its session's log, under its seq; every
  subscription got events exactly once, in seq order, without gaps; a fork
  is the prefix of its session. Subclass it and override `make_store` and
  `make_sessions` (or add rules) to drive your own agents' sessions::

      class MyAgents(SimulationMachine):
          def make_sessions(self, store):
              return Sessions(store, max_sessions=3, idle_timeout=60)

      TestMyAgents = MyAgents.TestCase
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nous_actor.core.compaction import CompactionError, Compactor
from nous_actor.errors import CallTimeout, SessionStopped, StoreError, TooManySessions
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.store.subscription import Subscription
from nous_actor.testing.races import crash_session
from nous_actor.testing.simulation import FAULT_KINDS, Fault, FaultKind, Schedule, Simulation

__all__ = ["BIASES", "SimulationMachine", "faults", "schedules"]

_TOLERATED = (SessionStopped, StoreError, CompactionError, TooManySessions)


def faults(
    kinds: tuple[FaultKind, ...] = FAULT_KINDS, horizon: int = 400
) -> st.SearchStrategy[Fault]:
    """A fault of one of ``kinds``, armed at a step below ``horizon``."""
    return st.builds(
        Fault,
        st.integers(0, horizon),
        st.sampled_from(kinds),
        st.integers(0, 255),
        st.sampled_from((0.5, 2.0)),
    )


BIASES: tuple[float, ...] = (0.0, 0.5, 0.8, 0.9, 0.95)
"""The biases a seeded schedule is drawn with (a swarm of choice distributions: from
uniform to long runs of the thread chosen last)."""


def schedules(
    *,
    max_choices: int = 400,
    max_faults: int = 4,
    kinds: tuple[FaultKind, ...] = FAULT_KINDS,
    horizon: int = 400,
) -> st.SearchStrategy[Schedule]:
    """A `Schedule` with up to ``max_faults`` faults: either a seed with a bias (each
    run's choices drawn from the seed, each example from another distribution of
    them, so that races needing long interleavings are likely), or up to
    ``max_choices`` pinned choices (past their end a run takes the first option at
    every step). A failing pinned schedule shrinks towards fewer faults and fewer,
    smaller choices; a failing seeded one replays as it is (`shrink` makes it a
    short pinned one)."""
    pinned = st.builds(
        lambda choices, fs: Schedule(0, tuple(choices), tuple(fs)),
        st.lists(st.integers(0, 255), max_size=max_choices),
        st.lists(faults(kinds, horizon), max_size=max_faults),
    )
    seeded = st.builds(
        lambda seed, bias, fs: Schedule(seed, faults=tuple(fs), bias=bias),
        st.integers(0, 2**32 - 1),
        st.sampled_from(BIASES),
        st.lists(faults(kinds, horizon), max_size=max_faults),
    )
    return st.one_of(pinned, seeded)


class SimulationMachine(RuleBasedStateMachine):
    """Sessions of a registry under a simulation, against a model of what was acknowledged.

    Rules start callers (they run when the machine `settle` s); the invariants
    are checked once everything has run.
    """

    session_ids: tuple[str, ...] = ("a", "b", "c")
    """The sessions the rules pick from."""

    fault_kinds: tuple[FaultKind, ...] = ("crash", "stop", "fail_commit", "slow_commit")
    """What the drawn schedule may inject."""

    def __init__(self) -> None:
        super().__init__()
        self.sim: Simulation | None = None
        self.sessions: Sessions | None = None
        self.acked: dict[str, dict[int, str]] = {sid: {} for sid in self.session_ids}
        self.subs: list[tuple[str, int, Subscription, list[int]]] = []
        self.forks: list[tuple[str, int, Any]] = []
        self.settled = True
        self._n = 0

    # -- what a subclass overrides ------------------------------------------------------------

    def make_store(self) -> Store:
        """The store of the run (made inside the simulation)."""
        return MemoryStore()

    def make_sessions(self, store: Store) -> Sessions:
        """The registry of the run (made inside the simulation)."""
        return Sessions(store)

    # -- life ---------------------------------------------------------------------------------

    @initialize(schedule=schedules(max_faults=3))
    def start(self, schedule: Schedule) -> None:
        kinds = set(self.fault_kinds)
        schedule = replace(schedule, faults=tuple(f for f in schedule.faults if f.kind in kinds))
        self.sim = Simulation(schedule)
        self.sim.__enter__()
        self.store = self.make_store()
        self.sessions = self.make_sessions(self.store)

    def teardown(self) -> None:
        if self.sim is not None:
            try:
                if self.sessions is not None:
                    self.sessions.close()
            finally:
                self.sim.close()

    def _go(self, caller: Generator[Any, Any, None] | Coroutine[Any, Any, None]) -> None:
        assert self.sim is not None
        self._n += 1
        self.sim.go(caller, f"rule{self._n}")
        self.settled = False

    # -- rules ----------------------------------------------------------------------------------

    @rule(data=st.data(), text=st.text(max_size=6))
    def append(self, data: st.DataObject, text: str) -> None:
        """A caller appends a message."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        sessions, acked = self.sessions, self.acked[sid]

        def caller() -> Generator[Any, Any, None]:
            f = sessions.open(sid).append("user_message", {"content": text})
            yield f
            try:
                ev = f.get()
            except _TOLERATED:
                return
            acked[ev.seq] = text

        self._go(caller())

    @rule(data=st.data(), text=st.text(max_size=6))
    def append_from_a_coroutine(self, data: st.DataObject, text: str) -> None:
        """An asyncio caller appends a message (``await aopen``, ``await append``)."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        sessions, acked = self.sessions, self.acked[sid]

        async def caller() -> None:
            try:
                handle = await sessions.aopen(sid)
                ev = await handle.append("user_message", {"content": text})
            except _TOLERATED:
                return
            acked[ev.seq] = text

        self._go(caller())

    @rule(data=st.data())
    def compact_from_a_coroutine(self, data: st.DataObject) -> None:
        """An asyncio caller compacts with a coroutine summariser (it runs on the caller's
        loop, the simulation's, and awaits virtual seconds)."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        sessions = self.sessions

        async def summarise(ms: Any) -> str:
            await asyncio.sleep(1.5)
            return f"summary of {len(ms)}"

        async def caller() -> None:
            comp = Compactor(budget=1, summarise=summarise, keep_recent=1)
            try:
                handle = await sessions.aopen(sid)
                await handle.compact(comp, force=True)
            except _TOLERATED:
                pass

        self._go(caller())

    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        """A caller compacts, with a summariser that takes virtual seconds."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        assert self.sim is not None
        sessions, sim = self.sessions, self.sim

        def summarise(ms: Any) -> str:
            sim.sleep(1.5)
            return f"summary of {len(ms)}"

        def caller() -> Generator[Any, Any, None]:
            f = sessions.open(sid).compact(
                Compactor(budget=1, summarise=summarise, keep_recent=1), force=True
            )
            yield f
            try:
                f.get()
            except _TOLERATED:
                pass

        self._go(caller())

    @rule(data=st.data())
    def subscribe(self, data: st.DataObject) -> None:
        """A subscriber joins from the session's current count."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        try:
            h = self.sessions.open(sid)
            start = h.count().get()
            self.subs.append((sid, start, h.subscribe(start), []))
        except _TOLERATED:
            pass

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """A caller forks a session at an acknowledged seq."""
        sid = data.draw(st.sampled_from(self.session_ids))
        if not self.acked[sid]:
            return
        through = data.draw(st.sampled_from(sorted(self.acked[sid])))
        assert self.sessions is not None
        sessions, forks = self.sessions, self.forks

        def caller() -> Generator[Any, Any, None]:
            f = sessions.open(sid).fork(through)
            yield f
            try:
                forks.append((sid, through, f.get()))
            except (*_TOLERATED, ValueError):
                pass

        self._go(caller())

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A caller crashes a session (its registry restarts it from the store)."""
        sid = data.draw(st.sampled_from(self.session_ids))
        assert self.sessions is not None
        sessions = self.sessions

        def caller() -> Generator[Any, Any, None]:
            try:
                f = crash_session(sessions.open(sid))
            except _TOLERATED:
                return
            yield f
            try:
                f.get()
            except _TOLERATED:
                pass

        self._go(caller())

    @rule()
    def settle(self) -> None:
        """Everything started so far runs to its end."""
        assert self.sim is not None
        self.sim.run()
        self.settled = True

    # -- invariants -----------------------------------------------------------------------------

    def _log(self, sid: str) -> Any:
        assert self.sessions is not None
        for _ in range(5):
            try:
                return self.sessions.open(sid).events().get()
            except (SessionStopped, StoreError):
                continue
        raise AssertionError(f"session {sid!r} could not be read after 5 tries")

    @invariant()
    def acknowledged_appends_are_in_the_log(self) -> None:
        if not self.settled or self.sim is None:
            return
        for sid, acked in self.acked.items():
            if not acked:
                continue
            got = {ev.seq: ev.data.get("content") for ev in self._log(sid)}
            for seq, text in acked.items():
                assert got.get(seq) == text, f"{sid}: acknowledged seq {seq} is {got.get(seq)!r}"

    @invariant()
    def subscriptions_get_each_event_once_in_order(self) -> None:
        if not self.settled or self.sim is None:
            return
        for sid, start, sub, seen in self.subs:
            try:
                while (ev := sub.get_nowait()) is not None:
                    seen.append(ev.seq)
            except (SessionStopped, CallTimeout):
                pass
            assert seen == list(range(start, start + len(seen))), (
                f"{sid}: a subscription from {start} got seqs {seen}"
            )

    @invariant()
    def forks_are_prefixes(self) -> None:
        if not self.settled or self.sim is None:
            return
        for sid, through, log in self.forks:
            stored = [ev for ev in self._log(sid) if ev.seq <= through]
            forked = [ev for ev in log.events() if ev.seq <= through]
            assert [e.seq for e in forked] == [e.seq for e in stored], f"{sid}: fork differs"
