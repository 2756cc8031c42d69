"""The Log agrees with a plain-list model folded by the naive reference, whatever the path.

The model of a log is the tuple of events it should retain plus its count; its
surface is :func:`reference_surface` of those events. Logs are checked after
every step, only at the end, at random points, and across branches (appending
to an old version after a newer one was derived from it), so that both the
lazy full fold and the memoised incremental fold are exercised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nous_actor import Event, EventType, Log, Message
from nous_actor.core.event import SURFACE_TYPES
from nous_actor.testing import (
    event_data,
    log_programs,
    reference_derive_indexed,
    reference_shadowed,
    reference_surface,
)
from nous_actor.testing.strategies import LogOp, times


@dataclass(frozen=True)
class Model:
    """What a log should hold: its retained events (oldest first) and its count."""

    events: tuple[Event, ...] = ()
    count: int = 0

    def apply(self, op: LogOp) -> Model:
        """The model after ``op``, built with the public ``Event`` constructor."""
        if op.kind == "materialize":
            return self
        if op.kind == "snapshot":
            dropped = reference_shadowed(self.events)
            return Model(tuple(e for e in self.events if e.seq not in dropped), self.count)
        data = op.data
        if op.kind == "replace":
            data = {**data, "surface_op": ("replace", op.start, op.stop)}
        seq = self.count + (op.gap if op.kind == "append_at" else 0)
        return Model((*self.events, Event(seq, op.etype, op.time, data)), seq + 1)

    def surface_seqs(self) -> list[int]:
        return [e.seq for e in reference_surface(self.events)]

    def derive_indexed(self) -> list[tuple[int, Message]]:
        return reference_derive_indexed(self.events)


def assert_agrees(log: Log, model: Model) -> None:
    """``log`` holds the model's events and count, and folds as the reference does."""
    assert log.count() == model.count
    assert log.events() == list(model.events)
    assert [e.seq for e in log.surface()] == model.surface_seqs()
    assert log.derive_indexed() == model.derive_indexed()


@given(log_programs())
def test_log_matches_model_after_every_step(program: list[LogOp]) -> None:
    """Events, count and fold equal the independently built model after each operation."""
    log, model = Log(), Model()
    for op in program:
        log, model = op.apply(log), model.apply(op)
        assert_agrees(log, model)


@given(log_programs())
def test_log_matches_model_when_derived_only_at_the_end(program: list[LogOp]) -> None:
    """A log never read until the end (bar the program's own materializes) folds correctly."""
    log, model = Log(), Model()
    for op in program:
        log, model = op.apply(log), model.apply(op)
    assert_agrees(log, model)


@given(log_programs(), st.data())
def test_log_matches_model_when_derived_at_random_points(
    program: list[LogOp], data: st.DataObject
) -> None:
    """Reading at random steps (so folds go stale and are rebuilt or updated) stays correct."""
    reads = data.draw(st.lists(st.booleans(), min_size=len(program), max_size=len(program)))
    log, model = Log(), Model()
    for op, read in zip(program, reads, strict=True):
        log, model = op.apply(log), model.apply(op)
        if read:
            assert_agrees(log, model)
    assert_agrees(log, model)


@given(log_programs())
def test_snapshot_drops_exactly_the_reference_shadowed(program: list[LogOp]) -> None:
    """At every snapshot, retained seqs become the previous ones minus the reference shadowed."""
    log = Log()
    for op in [*program, LogOp("snapshot")]:
        if op.kind == "snapshot":
            before = log.events()
            dropped = reference_shadowed(before)
            log = log.snapshot()
            assert [e.seq for e in log.events()] == [e.seq for e in before if e.seq not in dropped]
        else:
            log = op.apply(log)


@given(log_programs())
def test_count_matches_a_counting_model(program: list[LogOp]) -> None:
    """``count()`` is one past the last seq ever assigned, whatever was snapshotted."""
    log, count = Log(), 0
    for op in program:
        log = op.apply(log)
        if op.kind == "append":
            count += 1
        elif op.kind in ("replace", "append_at"):
            count += 1 + op.gap
        assert log.count() == count


@st.composite
def branching_programs(draw: st.DrawFn, max_steps: int = 30) -> list[tuple[int, LogOp, bool]]:
    """Steps ``(parent index, op, read the result?)``; parent indexes any earlier version."""
    ops = draw(log_programs(max_ops=max_steps))
    steps = []
    for i, op in enumerate(ops):
        parent = draw(st.integers(0, i))  # version 0 is the empty log
        steps.append((parent, op, draw(st.booleans())))
    return steps


@given(branching_programs(), st.data())
def test_every_version_matches_its_model_after_branching(
    steps: list[tuple[int, LogOp, bool]], data: st.DataObject
) -> None:
    """Operations on any old version leave every version, old and new, agreeing with its model."""
    versions, models = [Log()], [Model()]
    for parent, op, read in steps:
        versions.append(op.apply(versions[parent]))
        models.append(models[parent].apply(op))
        if read:
            assert_agrees(versions[-1], models[-1])
            other = data.draw(st.integers(0, len(versions) - 1), label="re-read")
            assert_agrees(versions[other], models[other])
    for log, model in zip(versions, models, strict=True):
        assert_agrees(log, model)


@given(log_programs(max_ops=20), log_programs(max_ops=10), log_programs(max_ops=10))
def test_append_to_old_version_after_newer_derived(
    prefix: list[LogOp], first: list[LogOp], second: list[LogOp]
) -> None:
    """Branching twice from a derived version keeps it and both branches correct."""
    base = Log().materialize()[1]
    model = Model()
    for op in prefix:
        base, model = op.apply(base), model.apply(op)
    base.derive_indexed()
    a, model_a = base, model
    for op in first:
        a, model_a = op.apply(a), model_a.apply(op)
        a.derive_indexed()
    b, model_b = base, model
    for op in second:
        b, model_b = op.apply(b), model_b.apply(op)
    assert_agrees(b, model_b)
    assert_agrees(a, model_a)
    assert_agrees(base, model)


# -- the stateful machine ---------------------------------------------------------------

MAX_VERSIONS = 24

_surface_types = st.sampled_from(sorted(SURFACE_TYPES))
_all_types = st.sampled_from(list(EventType))


@st.composite
def _typed_data(draw: st.DrawFn, types: st.SearchStrategy[EventType]) -> tuple[EventType, Any]:
    etype = draw(types)
    return etype, draw(event_data(etype))


class LogVersions(RuleBasedStateMachine):
    """Many versions of a log, each beside a plain-list model; every rule picks a version."""

    versions = Bundle("versions")

    def __init__(self) -> None:
        super().__init__()
        self.all: list[tuple[Log, Model, list[tuple[int, Message]]]] = []

    def _keep(self, log: Log, model: Model) -> tuple[Log, Model]:
        self.all.append((log, model, model.derive_indexed()))
        return log, model

    @initialize(target=versions)
    def empty(self) -> tuple[Log, Model]:
        return self._keep(Log(), Model())

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(target=versions, v=versions, typed=_typed_data(_all_types), time=times())
    def append(
        self, v: tuple[Log, Model], typed: tuple[EventType, Any], time: Any
    ) -> tuple[Log, Model]:
        etype, data = typed
        return self._keep(
            v[0].append(etype, data, time), v[1].apply(LogOp("append", etype, data, time=time))
        )

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(
        target=versions,
        v=versions,
        typed=_typed_data(_surface_types),
        start=st.integers(0, 15),
        width=st.integers(0, 6) | st.just(10**6),
        time=times(),
    )
    def replace(
        self,
        v: tuple[Log, Model],
        typed: tuple[EventType, Any],
        start: int,
        width: int,
        time: Any,
    ) -> tuple[Log, Model]:
        etype, data = typed
        op = LogOp("replace", etype, data, start=start, stop=start + width, time=time)
        return self._keep(op.apply(v[0]), v[1].apply(op))

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(
        target=versions,
        v=versions,
        typed=_typed_data(_all_types),
        gap=st.integers(0, 4),
        time=times(),
    )
    def append_at(
        self, v: tuple[Log, Model], typed: tuple[EventType, Any], gap: int, time: Any
    ) -> tuple[Log, Model]:
        etype, data = typed
        op = LogOp("append_at", etype, data, gap=gap, time=time)
        return self._keep(op.apply(v[0]), v[1].apply(op))

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(target=versions, v=versions, program=log_programs(max_ops=6))
    def run_unread(self, v: tuple[Log, Model], program: list[LogOp]) -> tuple[Log, Model]:
        """Several steps without reading in between (only the last version is kept)."""
        log, model = v
        for op in program:
            log, model = op.apply(log), model.apply(op)
        return self._keep(log, model)

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(target=versions, v=versions)
    def snapshot(self, v: tuple[Log, Model]) -> tuple[Log, Model]:
        return self._keep(v[0].snapshot(), v[1].apply(LogOp("snapshot")))

    @precondition(lambda self: len(self.all) < MAX_VERSIONS)
    @rule(target=versions, v=versions)
    def materialize(self, v: tuple[Log, Model]) -> tuple[Log, Model]:
        msgs, log = v[0].materialize()
        assert msgs == [m for _, m in v[1].derive_indexed()]
        return self._keep(log, v[1])

    @rule(v=versions)
    def derive(self, v: tuple[Log, Model]) -> None:
        assert v[0].derive_indexed() == v[1].derive_indexed()

    @rule(v=versions)
    def check_snapshot(self, v: tuple[Log, Model]) -> None:
        """Snapshotting (which takes the version's fold) drops what the model drops."""
        assert v[0].snapshot().events() == list(v[1].apply(LogOp("snapshot")).events)

    @invariant()
    def every_version_agrees_with_its_model(self) -> None:
        for log, model, indexed in self.all:
            assert log.count() == model.count
            assert log.events() == list(model.events)
            assert log.derive_indexed() == indexed


LogVersions.TestCase.settings = settings(
    LogVersions.TestCase.settings,
    max_examples=max(10, settings.default.max_examples // 2),
    stateful_step_count=30,
)
TestLogVersions = LogVersions.TestCase
