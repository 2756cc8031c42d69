"""Rewind (Log.as_of), fork (Log.fork) and audit (nous_actor.core.history) on the pure Log."""

from __future__ import annotations

import dataclasses
import tracemalloc
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import Compactor, EventType, Log, Replace
from nous_actor.core.history import compactions, explain, replaced, shadowed_by, turns
from nous_actor.testing import LogOp, log_programs, logs, reference_derive_indexed, run_program
from nous_actor.testing.reference import reference_shadowed

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def users(n: int) -> Log:
    log = Log()
    for i in range(n):
        log = log.append("user_message", {"content": f"m{i}"}, T0)
    return log


def nested() -> Log:
    """q, a, s1 = Replace(0, 1), s2 = Replace(0, 0): s2 shadows s1, which shadows q and a."""
    return (
        Log()
        .append("user_message", {"content": "q"}, T0)
        .append("assistant_message", {"content": "a"}, T0)
        .append("system_message", {"content": "s1", "surface_op": Replace(0, 1)}, T0)
        .append("system_message", {"content": "s2", "surface_op": Replace(0, 0)}, T0)
    )


def gapped() -> Log:
    """m0..m4, a summary of 1..3 (seq 5), snapshot (drops 1..3), then m6, m7."""
    log = users(5).append("system_message", {"content": "S", "surface_op": Replace(1, 3)}, T0)
    log = log.snapshot()
    return log.append("user_message", {"content": "m6"}, T0).append(
        "user_message", {"content": "m7"}, T0
    )


# -- as_of -------------------------------------------------------------------------------


def test_as_of_holds_the_events_through_seq() -> None:
    """as_of(seq) keeps exactly the events with seq <= seq, and count() == seq + 1."""
    log = users(5)
    past = log.as_of(2)
    assert [e.seq for e in past.events()] == [0, 1, 2]
    assert past.count() == 3
    assert [m.content for m in past.derive_messages()] == ["m0", "m1", "m2"]


def test_as_of_rewinds_over_a_compaction() -> None:
    """The surface as of a seq before a summary shows the messages it later replaced."""
    log = users(3).append("system_message", {"content": "S", "surface_op": Replace(0, 2)}, T0)
    assert [m.content for m in log.derive_messages()] == ["S"]
    assert [m.content for m in log.as_of(2).derive_messages()] == ["m0", "m1", "m2"]


def test_as_of_the_head_equals_the_log() -> None:
    """as_of(count() - 1) is equal to the log itself, surface included."""
    log = nested()
    assert log.as_of(3) == log
    assert log.as_of(3).derive_indexed() == log.derive_indexed()


def test_appending_to_as_of_continues_after_seq_and_leaves_the_log_alone() -> None:
    """An append to a rewound log takes seq + 1; the log it came from does not change."""
    log = users(5)
    log.derive_messages()  # memoise the fold the rewound version must not disturb
    branch = log.as_of(1).append("user_message", {"content": "other"}, T0)
    assert [e.seq for e in branch.events()] == [0, 1, 2]
    assert [m.content for m in branch.derive_messages()] == ["m0", "m1", "other"]
    assert [m.content for m in log.derive_messages()] == ["m0", "m1", "m2", "m3", "m4"]
    assert log.count() == 5


def test_as_of_keeps_snapshot_gaps_and_count() -> None:
    """On a snapshotted log, as_of keeps the surviving seqs and sets count to seq + 1."""
    log = gapped()
    past = log.as_of(6)
    assert [e.seq for e in past.events()] == [0, 4, 5, 6]
    assert past.count() == 7
    assert log.as_of(2).count() == 3
    assert [e.seq for e in log.as_of(2).events()] == [0]


def test_as_of_after_a_snapshot_does_not_bring_dropped_events_back() -> None:
    """Events a snapshot dropped stay gone in the past too (documented limitation)."""
    assert [m.content for m in gapped().as_of(4).derive_messages()] == ["m0", "m4"]


@pytest.mark.parametrize(
    ("seq", "match"),
    [(-1, r"as_of\(-1\): seq must be >= 0"), (5, r"as_of\(5\) is past the head.* 4")],
)
def test_as_of_rejects_a_boundary_outside_the_log(seq: int, match: str) -> None:
    """A negative seq or one past the head raises ValueError naming it."""
    with pytest.raises(ValueError, match=match):
        users(5).as_of(seq)


@pytest.mark.parametrize("seq", [True, 1.0, "1"])
def test_as_of_rejects_a_non_int_seq(seq: object) -> None:
    """as_of takes an int (not a bool, float or str) and says so."""
    with pytest.raises(TypeError, match="takes an int seq"):
        users(3).as_of(seq)  # type: ignore[arg-type]


def test_as_of_on_an_empty_log_is_an_error() -> None:
    """There is no seq to rewind to in an empty log."""
    with pytest.raises(ValueError, match="empty"):
        Log().as_of(0)


def test_as_of_shares_storage_instead_of_copying() -> None:
    """Rewinding a 10k-event log allocates a few hundred bytes per call, not a copy."""
    log = users(10_000)
    log.derive_messages()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [log.as_of(s) for s in range(5_000, 5_100)]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert len(kept) == 100
    assert grown < 100 * 1_000  # a copy of the prefix alone would be ~40 kB per call


def _without_snapshots(program: list[LogOp]) -> list[LogOp]:
    return [op for op in program if op.kind != "snapshot"]


@given(log_programs(max_ops=30).map(_without_snapshots), st.data())
def test_property_as_of_equals_the_log_as_it_was(
    program: list[LogOp], data: st.DataObject
) -> None:
    """as_of(v.count() - 1) equals an earlier version v: events, count and surface."""
    versions = []
    log = Log().append("user_message", {"content": "first"}, T0)
    for op in program:
        versions.append(log)
        log = op.apply(log)
    versions.append(log)
    v = data.draw(st.sampled_from(versions), label="version")
    past = log.as_of(v.count() - 1)
    assert past == v
    assert past.derive_indexed() == v.derive_indexed()


@given(logs(max_ops=30).filter(lambda lg: lg.count() > 0), st.data())
def test_property_as_of_is_the_retained_prefix_folded(log: Log, data: st.DataObject) -> None:
    """as_of(seq) holds the retained events through seq and folds like the reference."""
    s = data.draw(st.integers(0, log.count() - 1), label="seq")
    past = log.as_of(s)
    prefix = [e for e in log.events() if e.seq <= s]
    assert past.events() == prefix
    assert past.count() == s + 1
    assert past.derive_indexed() == reference_derive_indexed(prefix)


# -- fork --------------------------------------------------------------------------------


def test_fork_holds_the_prefix_with_seqs_preserved() -> None:
    """fork(n) holds the retained events through n, seqs unchanged, count n + 1."""
    log = gapped()
    child = log.fork(6)
    assert [e.seq for e in child.events()] == [0, 4, 5, 6]
    assert child.events() == log.events()[:4]
    assert child.count() == 7
    assert child.append("user_message", {"content": "x"}, T0).count() == 8


def test_fork_through_a_snapshot_gap_keeps_the_gap() -> None:
    """A boundary on a dropped seq gives count boundary + 1, so the next seq follows it."""
    child = gapped().fork(3)
    assert [e.seq for e in child.events()] == [0]
    assert child.append("user_message", {"content": "x"}, T0).events()[-1].seq == 4


def test_fork_then_append_leaves_the_parent_unchanged() -> None:
    """Appends and replaces on a fork never show in the parent, and the reverse."""
    parent = users(4)
    parent.derive_messages()
    child = parent.fork(1)
    child = child.append("system_message", {"content": "S", "surface_op": Replace(0, 9)}, T0)
    parent2 = parent.append("user_message", {"content": "m4"}, T0)
    assert [m.content for m in parent.derive_messages()] == ["m0", "m1", "m2", "m3"]
    assert [m.content for m in child.derive_messages()] == ["S"]
    assert [e.seq for e in parent2.events()] == [0, 1, 2, 3, 4]


def _turns() -> Log:
    """user(0), turn_start(1), assistant(2), turn_end(3), user(4), turn_start(5), assistant(6)."""
    return (
        Log()
        .append("user_message", {"content": "q1"}, T0)
        .append("turn_start", {}, T0)
        .append("assistant_message", {"content": "a1"}, T0)
        .append("turn_end", {}, T0)
        .append("user_message", {"content": "q2"}, T0)
        .append("turn_start", {}, T0)
        .append("assistant_message", {"content": "a2"}, T0)
    )


@pytest.mark.parametrize("seq", [1, 2, 5, 6])
def test_fork_inside_an_open_turn_is_refused(seq: int) -> None:
    """A boundary from a turn_start up to before its turn_end raises ValueError naming both."""
    opened = 1 if seq < 3 else 5
    with pytest.raises(
        ValueError,
        match=rf"fork\(through_seq={seq}\) is inside the turn opened at seq {opened}; "
        rf"fork before seq {opened} or after that turn's turn_end",
    ):
        _turns().fork(seq)


@pytest.mark.parametrize("seq", [0, 3, 4])
def test_fork_outside_any_turn_is_allowed(seq: int) -> None:
    """Before a turn_start, at its turn_end or after it, fork succeeds."""
    assert _turns().fork(seq).count() == seq + 1


def test_fork_inside_a_turn_is_refused_even_when_the_turn_is_shadowed() -> None:
    """A turn_start that a later replace shadowed still opens its turn for fork."""
    log = _turns().append("system_message", {"content": "S", "surface_op": Replace(0, 9)}, T0)
    with pytest.raises(ValueError, match="inside the turn opened at seq 5"):
        log.fork(6)


def test_fork_at_the_head_after_a_snapshotting_compaction_is_allowed() -> None:
    """A closed turn stays closed for fork after a snapshotting compaction dropped its turn_end."""
    log = Log()
    for etype, text in [
        ("turn_start", None),
        ("user_message", "Q1"),
        ("assistant_message", "A1"),
        ("turn_end", None),
        ("system_message", "note"),
        ("user_message", "Q2"),
        ("assistant_message", "A2"),
    ]:
        log = log.append(etype, {} if text is None else {"content": text}, T0)
    out = Compactor(budget=1, keep_recent=2, summarise=lambda ms: "S", snapshot=True).compact(log)
    assert out.log.fork(out.log.count() - 1).count() == out.log.count()


@pytest.mark.parametrize(
    ("seq", "match"), [(-1, r"-1\b.*>= 0"), (7, r"\b7\b.*past the head: the newest seq is 6")]
)
def test_fork_rejects_a_boundary_outside_the_log(seq: int, match: str) -> None:
    """A negative boundary or one past the head raises ValueError naming the boundary."""
    with pytest.raises(ValueError, match=match):
        _turns().fork(seq)


@pytest.mark.parametrize("seq", [-1, 7])
def test_fork_boundary_errors_name_fork(seq: int) -> None:
    """fork's own boundary errors name fork(through_seq=...), not as_of."""
    with pytest.raises(ValueError, match=rf"^fork\(through_seq={seq}\)"):
        _turns().fork(seq)


def test_fork_rejects_a_non_int_boundary() -> None:
    """fork(True) is a TypeError, not seq 1."""
    with pytest.raises(TypeError, match="int"):
        _turns().fork(True)


def _no_turn_starts(program: list[LogOp]) -> list[LogOp]:
    return [
        dataclasses.replace(op, etype=EventType.STEP_START)
        if op.etype is EventType.TURN_START
        else op
        for op in program
    ]


@given(log_programs(max_ops=30).map(_no_turn_starts), st.data())
def test_property_fork_then_append_never_changes_the_parent(
    program: list[LogOp], data: st.DataObject
) -> None:
    """Whatever is appended to (or snapshotted on) a fork, the parent stays as it was,
    and an append to the parent leaves the fork alone."""
    parent = run_program(program).append("user_message", {"content": "head"}, T0)
    events, surface, count = parent.events(), parent.derive_indexed(), parent.count()
    child = parent.fork(data.draw(st.integers(0, count - 1), label="through_seq"))
    for op in data.draw(log_programs(max_ops=5), label="child_ops"):
        child = op.apply(child)
    assert parent.events() == events
    assert parent.derive_indexed() == surface
    assert parent.count() == count
    child_events, child_surface = child.events(), child.derive_indexed()
    parent.append("user_message", {"content": "after"}, T0)
    assert child.events() == child_events
    assert child.derive_indexed() == child_surface


# -- audit -------------------------------------------------------------------------------


def test_shadowed_by_lists_the_direct_replaces() -> None:
    """shadowed_by(seq) is the sorted seqs of every replace whose range covers the event."""
    assert shadowed_by(nested(), 0) == [2, 3]
    assert shadowed_by(nested(), 1) == [2]
    assert shadowed_by(nested(), 2) == [3]


def test_shadowed_by_transitive_follows_the_chain_of_summaries() -> None:
    """With transitive=True, the replaces that shadow the shadowing replaces are included."""
    assert shadowed_by(nested(), 1, transitive=True) == [2, 3]


def test_shadowed_by_is_empty_for_a_visible_event() -> None:
    """An event no replace covers is shadowed by nothing."""
    assert shadowed_by(nested(), 3) == []
    assert shadowed_by(nested(), 3, transitive=True) == []


def test_a_replace_never_shadows_an_event_after_it() -> None:
    """An event appended after a replace, inside its range, is not shadowed by it."""
    log = users(1).append("system_message", {"content": "S", "surface_op": Replace(0, 9)}, T0)
    log = log.append("user_message", {"content": "late"}, T0)
    assert shadowed_by(log, 2) == []


def test_replaced_lists_what_a_replace_shadows() -> None:
    """replaced(seq) is the sorted seqs of the earlier events in the replace's range."""
    assert replaced(nested(), 2) == [0, 1]
    assert replaced(nested(), 3) == [0, 2]


def test_replaced_transitive_is_everything_a_summary_of_summaries_stands_for() -> None:
    """With transitive=True, what the replaced replaces stood for is included too."""
    assert replaced(nested(), 3, transitive=True) == [0, 1, 2]


def test_replaced_is_empty_for_a_plain_event() -> None:
    """A plain append replaced nothing."""
    assert replaced(nested(), 1) == []
    assert replaced(nested(), 1, transitive=True) == []


def test_replaced_includes_shadowed_bookkeeping_events() -> None:
    """A summary over a turn stands for its turn_start and turn_end too."""
    log = _turns().append("turn_end", {}, T0)
    log = log.append("system_message", {"content": "S", "surface_op": Replace(0, 7)}, T0)
    assert replaced(log, 8) == list(range(8))


@pytest.mark.parametrize("fn", [shadowed_by, replaced, explain])
def test_audit_of_an_unknown_seq_is_a_key_error(fn: object) -> None:
    """Auditing a seq never appended, or dropped by a snapshot, raises KeyError saying which."""
    with pytest.raises(KeyError, match="no retained event with seq 2"):
        fn(gapped(), 2)  # type: ignore[operator]
    with pytest.raises(KeyError, match="no retained event with seq 99"):
        fn(gapped(), 99)  # type: ignore[operator]


def test_explain_a_shadowed_event() -> None:
    """explain gives type, position, visibility and both relations for a shadowed event."""
    assert explain(nested(), 1) == {
        "seq": 1,
        "type": "assistant_message",
        "position": 1,
        "surface_op": None,
        "visible": False,
        "shadowed_by": [2],
        "shadowed_by_transitive": [2, 3],
        "replaces": [],
        "replaces_transitive": [],
    }


def test_explain_a_visible_replace() -> None:
    """explain of the standing summary says it is visible, where it stands and what it replaced."""
    assert explain(nested(), 3) == {
        "seq": 3,
        "type": "system_message",
        "position": 0,
        "surface_op": [0, 0],
        "visible": True,
        "shadowed_by": [],
        "shadowed_by_transitive": [],
        "replaces": [0, 2],
        "replaces_transitive": [0, 1, 2],
    }


def test_explain_says_a_bookkeeping_event_is_never_visible() -> None:
    """An unshadowed bookkeeping event is still not visible (it projects to nothing)."""
    assert explain(_turns(), 1)["visible"] is False
    assert explain(_turns(), 1)["shadowed_by"] == []


def test_compactions_is_empty_without_compaction_records() -> None:
    """A log with replaces but no compaction record lists no compactions."""
    log = nested().append("step_end", {"step": "tool"}, T0)
    assert compactions(log) == []


@given(logs(max_ops=20))
def test_property_shadowed_by_agrees_with_the_reference(log: Log) -> None:
    """An event has a direct shadowing replace iff the reference fold calls it shadowed."""
    shadowed = reference_shadowed(log.events())
    for ev in log.events():
        assert bool(shadowed_by(log, ev.seq)) == (ev.seq in shadowed)


@given(logs(max_ops=20))
def test_property_replaced_is_the_inverse_of_shadowed_by(log: Log) -> None:
    """c is in replaced(r) exactly when r is in shadowed_by(c)."""
    seqs = [e.seq for e in log.events()]
    forward = {(c, r) for c in seqs for r in shadowed_by(log, c)}
    backward = {(c, r) for r in seqs for c in replaced(log, r)}
    assert forward == backward


@given(logs(max_ops=20))
def test_property_transitive_audit_is_the_closure_of_the_direct_one(log: Log) -> None:
    """transitive=True gives the reachable set of the direct relation, both ways."""

    def closure(start: int, step: object) -> list[int]:
        seen: set[int] = set()
        todo = [start]
        while todo:
            for nxt in step(log, todo.pop()):  # type: ignore[operator]
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return sorted(seen)

    for ev in log.events():
        assert shadowed_by(log, ev.seq, transitive=True) == closure(ev.seq, shadowed_by)
        assert replaced(log, ev.seq, transitive=True) == closure(ev.seq, replaced)


def test_turns_lists_a_turn_whose_start_a_snapshot_dropped() -> None:
    """A ``turn_end`` whose ``turn_start`` is gone (a summary shadowed it and a
    snapshot dropped it) is still a turn of the audit: from its end, with no start seq
    (it was left out)."""
    end = {"turn_id": "t1", "owner": "runner", "policy": "reject", "how": "closed"}
    log = (
        Log()
        .append("user_message", {"content": "q"}, T0)
        .append("turn_end", end, T0)
        .append("turn_start", {"turn_id": "t2", "owner": "next", "policy": "enqueue"}, T0)
    )
    assert [
        (r["turn_id"], r["owner"], r["policy"], r["start_seq"], r["end_seq"], r["how"])
        for r in turns(log)
    ] == [
        ("t1", "runner", "reject", None, 1, "closed"),
        ("t2", "next", "enqueue", 2, None, None),
    ]
