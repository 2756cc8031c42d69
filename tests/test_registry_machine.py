"""A stateful test of the session registry: Sessions driven side by side with a plain model.

Rules open sessions by id (from a small set), append valid events through any
handle, crash a session with a BaseException in a handler, passivate idle
sessions (advancing an injected clock), and reopen. The invariant: through
every handle, each session's log is exactly its acknowledged appends, and
each crash was counted as one restart.

The same rules run twice: on real threads, and under a deterministic
`Simulation` whose schedule (the interleaving of the sessions, the registry
and the committer, and slow commits) Hypothesis draws, so that a failing
interleaving shrinks with the rules.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from bounds import BOUND
from freed import Freed
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nous_actor import (
    Backoff,
    Event,
    EventType,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SQLiteStore,
    Store,
)
from nous_actor.sessions.actor import SessionActor
from nous_actor.testing.sim_machine import schedules
from nous_actor.testing.simulation import Schedule, Simulation
from nous_actor.testing.strategies import event_data, times

IDS = ("a", "b", "c")
IDLE = 1000.0  # fake seconds; the registry's own reaper would wake every IDLE / 2 real seconds


class Boom(BaseException):
    """A BaseException raised inside a session's handler to crash it."""


def _boom(actor: SessionActor) -> None:
    raise Boom("crashed by the machine")


@st.composite
def _appends(draw: st.DrawFn) -> tuple[EventType, dict[str, Any], datetime]:
    etype = draw(st.sampled_from(list(EventType)))
    return etype, draw(event_data(etype)), draw(times())


class RegistryMachine(RuleBasedStateMachine):
    """Sessions on a store vs. a dict of acknowledged events per session id."""

    handles = Bundle("handles")

    simulated = False
    """Whether the registry runs under a `Simulation` (made by the first rule)."""

    def make_store(self) -> Store:
        return MemoryStore()

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.restarted: queue.Queue[float] = queue.Queue()
        self.model: dict[str, list[Event]] = {}
        self.crashes: dict[str, int] = {}
        self.all_handles: list[Session] = []
        self.sim: Simulation | None = None
        if not self.simulated:
            self.begin()

    def begin(self) -> None:
        """Make the store and the registry (under the simulation, if there is one)."""
        self.store = self.make_store()
        self.registry = Sessions(
            self.store,
            idle_timeout=IDLE,
            clock=lambda: self.now,
            backoff=Backoff(0.001, 0.001, 0.0),
            scheduler=self._schedule,
            max_restarts=1_000,
            timeout=BOUND,
        )

    def _schedule(self, delay: float, restart: Callable[[], None]) -> None:
        """Restart at once (in the crashed session's thread), then tell the machine."""
        restart()
        self.restarted.put(delay)

    # -- rules -----------------------------------------------------------------------------

    @rule(target=handles, sid=st.sampled_from(IDS))
    def open(self, sid: str) -> Session:
        handle = self.registry.open(sid)
        self.model.setdefault(sid, [])
        self.crashes.setdefault(sid, 0)
        self.all_handles.append(handle)
        return handle

    @rule(handle=handles, a=_appends())
    def append(self, handle: Session, a: tuple[EventType, dict[str, Any], datetime]) -> None:
        ev = handle.append(*a).get()
        assert ev.seq == len(self.model[handle.session_id])
        self.model[handle.session_id].append(ev)

    @rule(handle=handles, batch=st.lists(_appends(), min_size=2, max_size=6))
    def append_pipelined(
        self, handle: Session, batch: list[tuple[EventType, dict[str, Any], datetime]]
    ) -> None:
        """Several appends sent before any answer; acknowledged in order, one seq each."""
        futures = [handle.append(*a) for a in batch]
        got = [f.get() for f in futures]
        start = len(self.model[handle.session_id])
        assert [ev.seq for ev in got] == list(range(start, start + len(batch)))
        self.model[handle.session_id].extend(got)

    @rule(handle=handles)
    def crash(self, handle: Session) -> None:
        with pytest.raises(SessionCrashed):
            handle._call(_boom).get()
        if self.sim is not None:  # its restart is a step of the simulation
            self.sim.wait(lambda: not self.restarted.empty(), BOUND)
        self.restarted.get(timeout=BOUND)  # the registry has restarted it
        self.crashes[handle.session_id] += 1

    @precondition(lambda self: self.model)
    @rule(touched=st.sets(st.sampled_from(IDS)))
    def passivate(self, touched: set[str]) -> None:
        """Advance the clock past the idle timeout; sessions called since then stay live."""
        self.now += IDLE
        touched &= set(self.model)
        for sid in touched:
            self.registry.open(sid).count().get()
        expected = set(self.registry.live()) - touched
        # What a passivated session leaves in memory: its actor (and its log) freed,
        # whatever handles the machine keeps (checked where threads are real).
        freed = Freed(self._actors(expected)) if self.sim is None else None
        assert sorted(self.registry.passivate_idle(self.now)) == sorted(expected)
        assert self.registry.live() == sorted(touched)
        if freed is not None:
            assert freed.wait(BOUND) == [], "a passivated session's actor is still alive"

    def _actors(self, ids: set[str]) -> Iterator[object]:
        for sid in ids:
            ref = self.registry._live_ref(sid, BOUND)
            assert ref is not None, sid
            yield ref.actor_inbox._actor  # type: ignore[attr-defined]

    @rule(handle=handles)
    def reopen(self, handle: Session) -> None:
        """Open the session again by id: the same actor the old handle reaches."""
        again = self.registry.open(handle.session_id)
        ref, found = handle._actor(), again._actor()
        assert ref is not None
        assert found is not None
        assert found.actor_urn == ref.actor_urn
        self.all_handles.append(again)

    # -- invariant and teardown ------------------------------------------------------------

    @invariant()
    def every_handle_sees_exactly_the_acknowledged_appends(self) -> None:
        for handle in self.all_handles:
            expected = self.model[handle.session_id]
            assert handle.count().get() == len(expected)
            assert handle.events().get() == expected
        for sid, n in self.crashes.items():
            assert self.registry.restart_count(sid) == n

    def teardown(self) -> None:
        try:
            if hasattr(self, "registry"):
                self.registry.close()
                self.store.close()
        finally:
            if self.sim is not None:
                self.sim.close()


class SQLiteRegistryMachine(RegistryMachine):
    """The same machine on an SQLiteStore (in memory: same codec and SQL, no files)."""

    def make_store(self) -> Store:
        return SQLiteStore(":memory:")


class SimulatedRegistryMachine(RegistryMachine):
    """The same rules under a `Simulation`: the registry, the sessions, the committer and
    the recoveries are steps on this thread in the order of a schedule Hypothesis draws
    (with slow commits), so a failure shrinks to few choices as well as few rules."""

    simulated = True

    @initialize(schedule=schedules(max_faults=2, kinds=("slow_commit",)))
    def simulate(self, schedule: Schedule) -> None:
        self.sim = Simulation(schedule)
        self.sim.__enter__()
        self.begin()


class SimulatedSQLiteRegistryMachine(SimulatedRegistryMachine):
    """The simulated machine on an SQLiteStore (in memory)."""

    def make_store(self) -> Store:
        return SQLiteStore(":memory:")


_profile = settings.default
assert _profile is not None
_settings = settings(_profile, stateful_step_count=15, max_examples=min(_profile.max_examples, 25))

TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = _settings

TestSQLiteRegistryMachine = SQLiteRegistryMachine.TestCase
TestSQLiteRegistryMachine.settings = _settings

TestSimulatedRegistryMachine = SimulatedRegistryMachine.TestCase
TestSimulatedRegistryMachine.settings = _settings

TestSimulatedSQLiteRegistryMachine = SimulatedSQLiteRegistryMachine.TestCase
TestSimulatedSQLiteRegistryMachine.settings = _settings
