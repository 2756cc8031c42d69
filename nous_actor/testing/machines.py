"""A reusable Hypothesis state machine: a session driven side by side with the pure Log.

Subclass `SessionMachine` and override `SessionMachine.make_session`
to run the same rules against your own setup (a supervised session, a session
on your store)::

    class MyMachine(SessionMachine):
        def make_session(self) -> Session:
            return my_registry.open(f"test-{self.machine_id}")

    TestMySessions = MyMachine.TestCase
"""

from __future__ import annotations

import itertools
import threading
from datetime import datetime
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nous_actor.core.event import SURFACE_TYPES, Event, EventType, InvalidEvent
from nous_actor.core.log import Log
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session
from nous_actor.testing.strategies import event_data, times

__all__ = ["SessionMachine"]


def _check(ok: bool, message: str) -> None:
    """Fail the step with ``message`` unless ``ok`` (an ``assert`` would vanish under
    ``python -O``, and pytest does not rewrite the asserts of an installed module)."""
    if not ok:
        raise AssertionError(message)


_ids = itertools.count()
_surface = st.sampled_from(sorted(SURFACE_TYPES))
_types = st.sampled_from(list(EventType))
_BAD_EVENTS = [
    ("no_such_type", {}),
    ("user_message", {"content": {1, 2}}),
    ("turn_start", {"surface_op": ("replace", 0, 1)}),
    ("user_message", {"surface_op": ("replace", 5, 2)}),
    ("user_message", {"metadata": {"x": float("nan")}}),
]


@st.composite
def _append(draw: st.DrawFn) -> tuple[EventType, dict[str, Any], datetime]:
    etype = draw(_types)
    return etype, draw(event_data(etype)), draw(times())


@st.composite
def _replace(draw: st.DrawFn) -> tuple[EventType, dict[str, Any], datetime]:
    etype = draw(_surface)
    start = draw(st.integers(0, 40))
    stop = start + draw(st.integers(0, 10) | st.just(10**6))
    data = {**draw(event_data(etype)), "surface_op": ("replace", start, stop)}
    return etype, data, draw(times())


_op = st.one_of(
    _append().map(lambda a: ("append", a)),
    _replace().map(lambda a: ("append", a)),
    st.just(("derive", None)),
    st.just(("snapshot", None)),
)


class SessionMachine(RuleBasedStateMachine):
    """Drive a session and a plain `Log` (the model) with the same operations.

    Invariant: the session's log equals the model — same ``count()``, same
    surface and messages, and the retained events are the model's (or, after
    a snapshot raced with appends, lie between the model's unshadowed events
    and all of them).
    """

    timeout = 10.0
    threads = 3

    def __init__(self) -> None:
        super().__init__()
        self.machine_id = next(_ids)
        self.session = self.make_session()
        self.model = Log()
        self.snapshot_raced = False

    def make_session(self) -> Session:
        """The session under test (override for your own setup)."""
        return Session.start(f"machine-{self.machine_id}", timeout=self.timeout)

    def _record(self, events: list[Event]) -> None:
        for ev in sorted(events, key=lambda e: e.seq):
            self.model = self.model.append_at(ev.seq, ev.type, ev.data, ev.time)

    @rule(a=_append())
    def append(self, a: tuple[EventType, dict[str, Any], datetime]) -> None:
        ev = self.session.append(*a).get()
        _check(
            ev.seq == self.model.count(),
            f"append gives the next seq: got seq {ev.seq}, expected {self.model.count()}",
        )
        self._record([ev])

    @rule(a=_replace())
    def replace(self, a: tuple[EventType, dict[str, Any], datetime]) -> None:
        self.append(a)

    @rule(a=_append(), gap=st.integers(0, 3))
    def append_at(self, a: tuple[EventType, dict[str, Any], datetime], gap: int) -> None:
        seq = self.model.count() + gap
        ev = self.session.append_at(seq, *a).get()
        _check(ev.seq == seq, f"append_at({seq}) gives an event of seq {seq}, got seq {ev.seq}")
        self._record([ev])

    @precondition(lambda self: self.model.count() > 0)
    @rule(back=st.integers(1, 3))
    def append_at_behind_head(self, back: int) -> None:
        seq = max(0, self.model.count() - back)
        try:
            self.session.append_at(seq, "user_message", {"content": "x"}).get()
        except InvalidEvent as exc:
            _check(
                exc.reason == "seq_behind_head",
                f"append_at behind the head is refused with reason 'seq_behind_head', "
                f"got {exc.reason!r}",
            )
        else:
            raise AssertionError("append_at behind the head was accepted")

    @rule(bad=st.sampled_from(_BAD_EVENTS), or_log=st.booleans())
    def append_invalid(self, bad: tuple[str, dict[str, Any]], or_log: bool) -> None:
        if or_log:
            got = self.session.append_or_log(*bad).get()
            _check(
                got is None,
                f"append_or_log of an invalid event {bad!r} logs it and gives None, got {got!r}",
            )
            return
        try:
            self.session.append(*bad).get()
        except InvalidEvent:
            pass
        else:
            raise AssertionError(f"invalid event {bad!r} was accepted")

    @rule()
    def snapshot(self) -> None:
        dropped = self.session.snapshot().get()
        before = len(self.model.events())
        self.model = self.model.snapshot()
        if not self.snapshot_raced:
            kept = len(self.model.events())
            _check(
                dropped == before - kept,
                f"snapshot drops what the model's snapshot drops: {before - kept} events, "
                f"but it reported {dropped}",
            )
        self.snapshot_raced = False

    @rule(seq=st.integers(0, 60))
    def since(self, seq: int) -> None:
        got = self.session.since(seq).get()
        if not self.snapshot_raced:
            _check(
                got == self.model.since(seq),
                f"since({seq}) gives the model's events from seq {seq}: got {got!r}, "
                f"expected {self.model.since(seq)!r}",
            )

    @rule(ops=st.lists(_op, min_size=1, max_size=12))
    def concurrent_callers(self, ops: list[tuple[str, Any]]) -> None:
        """Several threads call at once; the model replays the appends in seq order."""
        lanes = [ops[i :: self.threads] for i in range(self.threads)]
        appended: list[Event] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(lanes))
        lock = threading.Lock()

        def caller(lane: list[tuple[str, Any]]) -> None:
            try:
                barrier.wait(self.timeout)
                futures: list[SessionFuture[Any]] = []
                for kind, arg in lane:
                    if kind == "append":
                        futures.append(self.session.append(*arg))
                    elif kind == "derive":
                        futures.append(self.session.derive_indexed())
                    else:
                        futures.append(self.session.snapshot())
                for (kind, _), fut in zip(lane, futures, strict=True):
                    result = fut.get()
                    if kind == "append":
                        with lock:
                            appended.append(result)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        workers = [threading.Thread(target=caller, args=(lane,)) for lane in lanes]
        for w in workers:
            w.start()
        for w in workers:
            w.join(self.timeout * 2)
        _check(
            not any(w.is_alive() for w in workers),
            f"a caller thread hung: its calls did not answer within {self.timeout * 2:g} s",
        )
        if errors:
            raise errors[0]
        seqs = sorted(e.seq for e in appended)
        _check(
            seqs == list(range(self.model.count(), self.model.count() + len(appended))),
            f"appends from several threads at once take exactly the next seqs, each once "
            f"(from {self.model.count()}), got {seqs}",
        )
        self._record(appended)
        if any(kind == "snapshot" for kind, _ in ops):
            self.snapshot_raced = True

    @invariant()
    def session_equals_model(self) -> None:
        log = self.session.log().get()
        _check(
            log.count() == self.model.count(),
            f"the session's log counts {log.count()} events, the model {self.model.count()}",
        )
        _check(
            log.derive_indexed() == self.model.derive_indexed(),
            "the session's surface (derive_indexed) differs from the model's",
        )
        _check(
            log.derive_messages() == self.model.derive_messages(),
            "the session's messages (derive_messages) differ from the model's",
        )
        if self.snapshot_raced:
            kept = {e.seq for e in log.events()}
            needed = {e.seq for e in self.model.snapshot().events()}
            _check(
                needed <= kept,
                f"the session dropped events a snapshot keeps: seqs {sorted(needed - kept)}",
            )
            extra = kept - {e.seq for e in self.model.events()}
            _check(not extra, f"the session holds events the model never had: {sorted(extra)}")
        else:
            _check(log == self.model, "the session's log differs from the model's")

    def teardown(self) -> None:
        self.session.stop()
