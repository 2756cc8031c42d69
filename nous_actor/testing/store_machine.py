"""`StoreMachine`: a store driven side by side with a plain dict model, and
`store_machine`, which binds it to a store of yours."""

from __future__ import annotations

import itertools
import reprlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from nous_actor.core.event import SURFACE_TYPES, Event, EventType
from nous_actor.errors import ConflictError
from nous_actor.store.base import Store
from nous_actor.testing.strategies import event_data, times

__all__ = ["StoreMachine", "assert_same_events", "store_machine"]


def _strict(value: Any) -> Any:
    """``value`` as a comparable tree that keeps JSON types apart (``True`` is not ``1``)."""
    if isinstance(value, bool) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, Mapping):
        return ("object", tuple(sorted((str(k), _strict(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_strict(v) for v in value))
    return ("other", repr(value))


def assert_same_events(got: Sequence[Event], want: Sequence[Event]) -> None:
    """Assert that ``got`` are exactly the events ``want``, in the same order.

    Same seq and type, the same instant to the microsecond (in UTC), the same
    ``data`` with the same JSON types (``1`` is not ``1.0`` nor ``True``), the
    same ``surface_op``.

    Raises:
        AssertionError: they differ; the message says where and how (raised by an
            explicit check, so it holds under ``python -O`` too).
    """
    got_seqs, want_seqs = [e.seq for e in got], [e.seq for e in want]
    if got_seqs != want_seqs:
        raise AssertionError(
            f"seqs differ: got {_short(got_seqs)}, expected {_short(want_seqs)} "
            "(a store loads every event written and not dropped, once, in seq order)"
        )
    for g, w in zip(got, want, strict=True):
        where = f"seq {w.seq}"
        if g.type is not w.type:
            raise AssertionError(f"{where}: type {g.type!r} != {w.type!r}")
        if g.time != w.time:
            raise AssertionError(f"{where}: time {g.time.isoformat()} != {w.time.isoformat()}")
        if g.time.utcoffset() != timedelta(0):
            raise AssertionError(f"{where}: time is not UTC: {g.time!r} (load times in UTC)")
        if g.time.microsecond != w.time.microsecond:
            raise AssertionError(f"{where}: microseconds lost (keep times to the microsecond)")
        if _strict(g.data) != _strict(w.data):
            raise AssertionError(
                f"{where}: data {_short(g.data)} != {_short(w.data)} (keep the data with "
                "its JSON types: 1 is not 1.0 nor True)"
            )
        if g.surface_op != w.surface_op:
            raise AssertionError(f"{where}: surface_op {g.surface_op!r} != {w.surface_op!r}")
        if not g == w:
            raise AssertionError(f"{where}: event {_short(g)} != {_short(w)}")


def _short(value: object) -> str:
    """``repr(value)``, cut to a readable length (stored events may hold megabytes)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 300
_REPR.maxlist = _REPR.maxdict = 20


# -- the stateful test ---------------------------------------------------------------------

_SESSIONS = ("a", "b", "c")


_Spec = tuple[EventType, dict[str, Any], datetime]


@st.composite
def _event_specs(draw: st.DrawFn) -> _Spec:
    etype = draw(st.sampled_from(list(EventType)))
    data = draw(event_data(etype))
    if etype in SURFACE_TYPES and draw(st.booleans()):
        start = draw(st.integers(0, 12))
        data = {**data, "surface_op": ("replace", start, start + draw(st.integers(0, 6)))}
    return etype, data, draw(times())


# How a write picks each seq: past the head (with a gap), a stored one, one repeated in
# the write, or a hole below the head that was never stored (or was dropped).
_seq_choice = st.tuples(
    st.sampled_from(["new"] * 5 + ["stored", "repeat", "hole"]), st.integers(0, 3)
)


class StoreMachine(RuleBasedStateMachine):
    """A store driven side by side with a plain dict model (Hypothesis's DatabaseComparison).

    Rules write (fresh seqs with gaps, seqs already stored, seqs repeated in
    one write; one session or several per write), drop, delete, claim and
    release (also with stale tokens). The invariant: every session loads
    exactly as the model says, and ``sessions()`` lists the non-empty ones.

    Override `make_store` (and `close_store`), or use
    `store_machine`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.store = self.make_store()
        self.model: dict[str, dict[int, Event]] = {sid: {} for sid in _SESSIONS}
        self.claims: dict[str, str] = {}
        self.stale: dict[str, list[str]] = {sid: [] for sid in _SESSIONS}

    def make_store(self) -> Store:
        """A new, empty store for one example."""
        raise NotImplementedError("override make_store, or bind one with store_machine()")

    def close_store(self, store: Store) -> None:
        """Release the store at the end of one example."""
        store.close()

    def _plan(
        self, sid: str, steps: list[tuple[tuple[str, int], _Spec]]
    ) -> tuple[list[Event], bool]:
        """The events of one session's part of a write, and whether it must conflict."""
        stored = self.model[sid]
        head = max(stored, default=-1) + 1
        events: list[Event] = []
        for (kind, n), spec in steps:
            taken = {e.seq for e in events}
            holes = [s for s in range(head) if s not in stored and s not in taken]
            if kind == "stored" and stored:
                seq = sorted(stored)[n % len(stored)]
            elif kind == "repeat" and events:
                seq = events[n % len(events)].seq
            elif kind == "hole" and holes:  # below the head, never stored: not a conflict
                seq = holes[n % len(holes)]
            else:
                seq = head + n  # every seq picked so far is below head
                head = seq + 1
            etype, data, time = spec
            events.append(Event(seq, etype, time, data))
        seqs = [e.seq for e in events]
        conflict = len(set(seqs)) != len(seqs) or any(s in stored for s in seqs)
        return events, conflict

    @rule(
        writes=st.dictionaries(
            st.sampled_from(_SESSIONS),
            st.lists(st.tuples(_seq_choice, _event_specs()), max_size=4),
            min_size=1,
            max_size=3,
        )
    )
    def write(self, writes: dict[str, list[tuple[tuple[str, int], _Spec]]]) -> None:
        call: dict[str, list[Event]] = {}
        expect_refused: set[str] = set()
        for sid, steps in writes.items():
            call[sid], conflict = self._plan(sid, steps)
            if conflict:
                expect_refused.add(sid)
        refused = self.store.write(call)
        if set(refused) != expect_refused:
            raise AssertionError(
                f"write({_short(call)}) must refuse exactly the sessions {expect_refused!r} "
                "(each with a seq already stored or repeated in the write; every other "
                f"session commits), but it returned {refused!r}"
            )
        for sid, err in refused.items():
            if not isinstance(err, ConflictError):
                raise AssertionError(
                    f"a seq already stored (or twice in one write) refuses its session with "
                    f"ConflictError: write() returned {err!r} for {sid!r}"
                )
        for sid, events in call.items():
            if sid not in expect_refused:
                self.model[sid].update((e.seq, e) for e in events)

    @rule(sid=st.sampled_from(_SESSIONS), picks=st.lists(st.integers(0, 40), max_size=5))
    def drop(self, sid: str, picks: list[int]) -> None:
        stored = sorted(self.model[sid])
        seqs = [stored[p % len(stored)] if stored and p < 30 else p + 1000 for p in picks]
        self.store.drop(sid, seqs)
        for s in seqs:
            self.model[sid].pop(s, None)

    @rule(sid=st.sampled_from(_SESSIONS))
    def delete(self, sid: str) -> None:
        self.store.delete(sid)
        self.model[sid].clear()
        if sid in self.claims:
            self.stale[sid].append(self.claims.pop(sid))

    @rule(sid=st.sampled_from(_SESSIONS))
    def claim(self, sid: str) -> None:
        if sid in self.claims:
            self._refused(sid)
        else:
            self.claims[sid] = self.store.claim(sid)

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.claims)))
        token = self.claims.pop(sid)
        self.store.release(sid, token)
        self.stale[sid].append(token)

    @precondition(lambda self: any(self.stale.values()))
    @rule(data=st.data())
    def release_stale(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(s for s, t in self.stale.items() if t)))
        token = data.draw(st.sampled_from(self.stale[sid]))
        self.store.release(sid, token)  # a no-op: the model does not change

    @invariant()
    def store_equals_model(self) -> None:
        next_seq = getattr(self.store, "next_seq", None)  # optional (store.shared)
        for sid in _SESSIONS:
            want = [self.model[sid][s] for s in sorted(self.model[sid])]
            try:
                assert_same_events(self.store.load(sid), want)
            except AssertionError as exc:
                raise AssertionError(
                    f"load({sid!r}) must give what was written and not dropped or deleted: {exc}"
                ) from None
            if next_seq is not None:
                expected = max(self.model[sid]) + 1 if self.model[sid] else 0
                got = next_seq(sid)
                if got != expected:
                    raise AssertionError(
                        f"next_seq({sid!r}) is the last stored seq + 1 (0 with no events): "
                        f"got {got!r}, expected {expected}"
                    )
        listed = self.store.sessions()
        expected_ids = sorted(s for s in _SESSIONS if self.model[s])
        if listed != expected_ids:
            raise AssertionError(
                "sessions() lists each session with stored events once, sorted: "
                f"got {listed!r}, expected {expected_ids!r}"
            )

    @invariant()
    def claims_hold(self) -> None:
        for sid in self.claims:
            self._refused(sid)

    def _refused(self, sid: str) -> None:
        """A claim of ``sid``, which a claim of this machine holds, must be refused."""
        try:
            self.store.claim(sid)
        except ConflictError:
            return
        raise AssertionError(
            f"one live writer per session: {sid!r} is claimed (and not released, nor "
            "deleted), and another claim of it returned a token; it must raise ConflictError"
        )

    def teardown(self) -> None:
        self.close_store(self.store)


_machine_ids = itertools.count()


def store_machine(
    make_store: Callable[[], Store],
    close_store: Callable[[Store], None] | None = None,
) -> type[StoreMachine]:
    """A `StoreMachine` bound to ``make_store`` (called once per example).

    ``close_store(store)`` ends each example (default ``store.close()``). Run
    it with ``store_machine(...).TestCase`` (a unittest/pytest test class) or
    ``hypothesis.stateful.run_state_machine_as_test(store_machine(...))``.
    """

    class BoundStoreMachine(StoreMachine):
        def make_store(self) -> Store:
            return make_store()

        def close_store(self, store: Store) -> None:
            if close_store is None:
                store.close()
            else:
                close_store(store)

    name = getattr(make_store, "__qualname__", type(make_store).__name__)
    BoundStoreMachine.__name__ = BoundStoreMachine.__qualname__ = (
        f"StoreMachine[{name}#{next(_machine_ids)}]"
    )
    return BoundStoreMachine
