"""A stateful test of sessions on a shared dispatcher: a registry driven side by side with a model.

Sessions (ids from a small set) run on a `Dispatcher` of 1 to 4 threads, on a
`MemoryStore` or an `SQLiteStore` in a temporary directory. Callers are
threads and asyncio coroutines; rules append (one by one, pipelined, from
several threads at once, from coroutines), read, crash a session with a
``KeyboardInterrupt`` in a handler (the registry restarts it from the store),
stop it and open it again.

The model is what was acknowledged. The invariants: every call is answered
within its bound; each session's log holds every acknowledged append at the
seq it was acknowledged with, nothing that was never sent, nothing twice, and
each caller's appends in the order that caller made them (an append that
failed with `SessionStopped` may be absent, or present in its place); and no
two handlers of one session ever run at once (a probe handler injected
through ``_call`` between the appends checks a per-session "inside" flag).

The same rules run twice: on real threads (a real dispatcher, caller threads,
``asyncio.run``), and under a deterministic `Simulation` whose schedule
Hypothesis draws (the callers become simulated callers, the coroutines run on
the simulation's event loop), so that a failing interleaving shrinks.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nous_actor import (
    CallTimeout,
    Dispatcher,
    Event,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    SQLiteStore,
    Store,
)
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.future import SessionFuture
from nous_actor.testing.sim_machine import schedules
from nous_actor.testing.simulation import Schedule, Simulation

IDS = ("a", "b", "c", "d")
SWITCH_INTERVAL = 1e-5  # seconds between forced thread switches (Python's default: 5 ms)

Sent = tuple[str, SessionFuture[Any]]  # an append's marker and its future


def _interrupt(actor: SessionActor) -> None:
    raise KeyboardInterrupt("crashed by the machine")


class DispatcherMachine(RuleBasedStateMachine):
    """A registry of sessions on a shared dispatcher vs. the appends it acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.dispatcher: Dispatcher | None = None
        self.store: Store | None = None
        self.registry: Sessions | None = None
        self.tmp: str | None = None
        self.handles: dict[str, Session] = {}
        self.acked: dict[str, dict[str, Event]] = {}  # per session: marker -> acknowledged event
        self.unacked: dict[str, set[str]] = {}  # markers of appends that failed
        self.streams = 0  # callers made so far: each marks its appends "<stream>:<k>"
        self.lock = threading.Lock()
        self.inside: dict[str, bool] = {}
        self.problems: list[str] = []  # overlaps and unanswered calls, found off the main thread
        self.switch_interval = sys.getswitchinterval()
        self.sim: Simulation | None = None

    @initialize(
        threads=st.integers(1, 4),
        throughput=st.sampled_from([1, 4, 64]),
        backend=st.sampled_from(["memory", "sqlite"]),
        opened=st.sets(st.sampled_from(IDS), min_size=1),
    )
    def start(self, threads: int, throughput: int, backend: str, opened: set[str]) -> None:
        sys.setswitchinterval(SWITCH_INTERVAL)  # threads interleave finely: overlaps can show
        self.dispatcher = Dispatcher(threads, throughput=throughput)
        self._build(backend, opened)

    def _build(self, backend: str, opened: set[str]) -> None:
        if backend == "sqlite":
            self.tmp = tempfile.mkdtemp(prefix="nous-dispatcher-machine-")
            self.store = SQLiteStore(os.path.join(self.tmp, "sessions.db"))
        else:
            self.store = MemoryStore()
        self.registry = Sessions(
            self.store,
            dispatcher=self.dispatcher,
            timeout=BOUND,
            backoff=None,
            max_restarts=10_000,
        )
        for sid in sorted(opened):
            self._open(sid)

    # -- helpers -------------------------------------------------------------------------------

    def _concurrently(self, calls: list[Callable[[], None]], bound: float) -> None:
        """Run ``calls`` at once, a thread each; wait at most ``bound`` for them all."""
        go = threading.Barrier(len(calls), timeout=BOUND)

        def run(call: Callable[[], None]) -> None:
            go.wait()
            call()

        threads = [threading.Thread(target=run, args=(call,)) for call in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(bound)
            assert not t.is_alive()

    def _run_async(self, main: Coroutine[Any, Any, Any]) -> Any:
        """Run the coroutine ``main`` to its end on an event loop; its result."""
        return asyncio.run(main)

    def _stream(self) -> int:
        with self.lock:
            self.streams += 1
            return self.streams

    def _probe(self, sid: str) -> Callable[[SessionActor], None]:
        """A handler that fails the run if another handler of ``sid`` is running meanwhile."""

        def probe(actor: SessionActor) -> None:
            with self.lock:
                if self.inside.get(sid):
                    self.problems.append(f"two handlers of {sid!r} ran at once")
                self.inside[sid] = True
            try:
                if actor.session_id != sid:
                    self.problems.append(f"a call to {sid!r} ran on {actor.session_id!r}")
                for _ in range(200):  # room for an overlap to show
                    pass
            finally:
                with self.lock:
                    self.inside[sid] = False

        return probe

    def _send(self, handle: Session, stream: int, n: int) -> list[Sent]:
        """Pipeline ``n`` appends from this caller, a probe after each."""
        sent: list[Sent] = []
        for k in range(n):
            marker = f"{stream}:{k}"
            sent.append((marker, handle.append("user_message", {"content": marker})))
            handle._call(self._probe(handle.session_id))
        return sent

    def _settle(self, sid: str, sent: list[Sent]) -> list[bool]:
        """Wait (bounded) for each append; record it as acknowledged or not; which were."""
        out = []
        for marker, fut in sent:
            try:
                ev = fut.get(timeout=BOUND)
            except CallTimeout:
                self.problems.append(f"append {marker} to {sid!r} was never answered")
                out.append(False)
            except SessionStopped:  # also SessionCrashed: the call was not applied
                self.unacked[sid].add(marker)
                out.append(False)
            else:
                assert ev.data["content"] == marker
                self.acked[sid][marker] = ev
                out.append(True)
        return out

    def _check(self, sid: str, events: list[Event]) -> None:
        """``events`` (a read of ``sid``) agrees with what was acknowledged."""
        assert [ev.seq for ev in events] == list(range(len(events)))
        markers = [ev.data["content"] for ev in events]
        assert len(set(markers)) == len(markers), "an append is stored twice"
        for marker, ev in self.acked[sid].items():
            assert ev.seq < len(events), f"acknowledged {marker} is missing"
            assert events[ev.seq] == ev, f"acknowledged {marker} is not where it was"
        sent = self.acked[sid].keys() | self.unacked[sid]
        assert set(markers) <= sent, "an event nobody appended"
        last: dict[str, int] = {}
        for marker in markers:
            stream, k = marker.split(":")
            assert int(k) > last.get(stream, -1), f"{marker} is out of its caller's order"
            last[stream] = int(k)

    def _open(self, sid: str) -> Session:
        assert self.registry is not None
        handle = self.registry.open(sid)
        self.handles[sid] = handle
        self.acked.setdefault(sid, {})
        self.unacked.setdefault(sid, set())
        return handle

    # -- rules ---------------------------------------------------------------------------------

    @rule(sid=st.sampled_from(IDS))
    def open(self, sid: str) -> None:
        """Open (or find) a session by id."""
        self._open(sid)

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), n=st.integers(1, 6))
    def append_pipelined(self, data: st.DataObject, n: int) -> None:
        """Several appends sent before any answer: acknowledged in order, one seq each."""
        sid = data.draw(st.sampled_from(sorted(self.handles)))
        sent = self._send(self.handles[sid], self._stream(), n)
        assert all(self._settle(sid, sent))
        seqs = [self.acked[sid][m].seq for m, _ in sent]
        assert seqs == list(range(seqs[0], seqs[0] + n))

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), callers=st.integers(1, 4), n=st.integers(1, 4))
    def append_from_threads(self, data: st.DataObject, callers: int, n: int) -> None:
        """Caller threads, each appending one by one to a session, all at once."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.handles)), min_size=callers))
        ids = ids[:callers]
        sent: list[list[Sent]] = [[] for _ in ids]

        def call(i: int, handle: Session, stream: int) -> None:
            for k in range(n):
                marker = f"{stream}:{k}"
                fut = handle.append("user_message", {"content": marker})
                sent[i].append((marker, fut))
                handle._call(self._probe(handle.session_id))
                try:
                    fut.get(timeout=BOUND)
                except (SessionStopped, CallTimeout):
                    pass  # settled (and judged) below

        calls = [partial(call, i, self.handles[sid], self._stream()) for i, sid in enumerate(ids)]
        self._concurrently(calls, n * BOUND + 1)  # each of its calls waits at most BOUND
        for sid, s in zip(ids, sent, strict=True):
            assert all(self._settle(sid, s))

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), coroutines=st.integers(1, 4), n=st.integers(1, 4))
    def append_from_coroutines(self, data: st.DataObject, coroutines: int, n: int) -> None:
        """Coroutines on one event loop, each awaiting its appends one by one."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.handles)), min_size=coroutines))
        ids = ids[:coroutines]
        sent: list[list[Sent]] = [[] for _ in ids]

        async def call(i: int, handle: Session, stream: int) -> None:
            for k in range(n):
                marker = f"{stream}:{k}"
                fut = handle.append("user_message", {"content": marker})
                sent[i].append((marker, fut))
                try:
                    await fut
                    await handle._call(self._probe(handle.session_id))
                except (SessionStopped, CallTimeout):
                    pass  # settled (and judged) below

        async def main() -> None:
            await asyncio.gather(
                *(call(i, self.handles[sid], self._stream()) for i, sid in enumerate(ids))
            )

        self._run_async(main())
        for sid, s in zip(ids, sent, strict=True):
            assert all(self._settle(sid, s))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def read_from_a_coroutine(self, data: st.DataObject) -> None:
        """A coroutine reads a session (reopening it if it was stopped): the model's log."""
        sid = data.draw(st.sampled_from(sorted(self.handles)))
        handle = self.handles[sid]

        async def read() -> tuple[int, list[Event]]:
            return await handle.count(), await handle.events()

        count, events = self._run_async(read())
        assert count == len(events)
        self._check(sid, events)

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), before=st.integers(0, 3), after=st.integers(0, 3))
    def crash(self, data: st.DataObject, before: int, after: int) -> None:
        """A KeyboardInterrupt in a handler, between pipelined appends: the ones before it are
        acknowledged and survive the restart from the store; the ones after it are either
        refused (not applied) or reach the restarted session."""
        sid = data.draw(st.sampled_from(sorted(self.handles)))
        handle = self.handles[sid]
        handle.count().get(timeout=BOUND)  # it runs: the appends below reach one actor
        stream = self._stream()
        first = self._send(handle, stream, before)
        crashed = handle._call(_interrupt)
        rest = [
            (m, handle.append("user_message", {"content": m}))
            for m in (f"{stream}:{before + k}" for k in range(after))
        ]
        with pytest.raises(SessionCrashed):
            crashed.get(timeout=BOUND)
        assert all(self._settle(sid, first))
        self._settle(sid, rest)

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), n=st.integers(0, 6))
    def stop(self, data: st.DataObject, n: int) -> None:
        """Stop a session while a thread pipelines appends to it: each is answered."""
        sid = data.draw(st.sampled_from(sorted(self.handles)))
        handle = self.handles[sid]
        stream = self._stream()
        sent: list[Sent] = []

        def call() -> None:
            sent.extend(self._send(handle, stream, n))

        self._concurrently([call, partial(handle.stop, timeout=BOUND)], BOUND)
        self._settle(sid, sent)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def open_again(self, data: st.DataObject) -> None:
        """Open a session by id again: the handle it gives reaches the live actor the old
        handle reaches, and reads the same log."""
        sid = data.draw(st.sampled_from(sorted(self.handles)))
        old = self.handles[sid]
        new = self._open(sid)
        assert new.count().get(timeout=BOUND) == old.count().get(timeout=BOUND)
        ref_old, ref_new = old._actor(), new._actor()
        assert ref_old is not None
        assert ref_new is not None
        assert ref_old.actor_urn == ref_new.actor_urn

    # -- invariants and teardown ---------------------------------------------------------------

    @invariant()
    def no_overlap_and_every_call_answered(self) -> None:
        assert self.problems == []

    @invariant()
    def every_live_session_holds_exactly_what_was_acknowledged(self) -> None:
        for sid, handle in self.handles.items():
            if handle.is_alive():  # a read would reopen a stopped one: read_from_a_coroutine does
                events = handle.events().get(timeout=BOUND)
                assert handle.count().get(timeout=BOUND) == len(events)
                self._check(sid, events)

    def teardown(self) -> None:
        sys.setswitchinterval(self.switch_interval)
        try:
            if self.registry is not None:
                self.registry.close(timeout=BOUND)
                assert self.registry.live() == []
        finally:
            if self.dispatcher is not None:
                self.dispatcher.close(timeout=BOUND)
            if self.store is not None:
                self.store.close()
            if self.sim is not None:
                self.sim.close()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)


class SimulatedDispatcherMachine(DispatcherMachine):
    """The same rules under a `Simulation`: sessions, registry, committer, caller "threads"
    (simulated callers, resumed inside each other's waits) and coroutines (on the
    simulation's loop) are steps on this thread, in the order of a schedule Hypothesis
    draws (with slow commits); a failure shrinks to few choices as well as few rules."""

    @initialize(
        schedule=schedules(max_faults=2, kinds=("slow_commit",)),
        throughput=st.sampled_from([1, 4, 64]),
        backend=st.sampled_from(["memory", "sqlite"]),
        opened=st.sets(st.sampled_from(IDS), min_size=1),
    )
    def start(  # type: ignore[override]
        self, schedule: Schedule, throughput: int, backend: str, opened: set[str]
    ) -> None:
        self.sim = Simulation(schedule, throughput=throughput)
        self.sim.__enter__()
        self._build(backend, opened)

    def _concurrently(self, calls: list[Callable[[], None]], bound: float) -> None:
        assert self.sim is not None
        for k, call in enumerate(calls):
            self.sim.go(call, f"thread{k}")
        self.sim.run()

    def _run_async(self, main: Coroutine[Any, Any, Any]) -> Any:
        assert self.sim is not None
        return self.sim.loop.run_until_complete(main)


_profile = settings.default
assert _profile is not None

TestDispatcherMachine = DispatcherMachine.TestCase
TestDispatcherMachine.settings = settings(
    _profile, stateful_step_count=30, max_examples=_profile.max_examples
)

TestSimulatedDispatcherMachine = SimulatedDispatcherMachine.TestCase
TestSimulatedDispatcherMachine.settings = settings(
    _profile, stateful_step_count=30, max_examples=min(_profile.max_examples, 50)
)
