"""The Log contract of DESIGN.md §3, one rule per test."""

from __future__ import annotations

import doctest
import pickle
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from spies import spy
from structlog.testing import capture_logs

import nous_actor.core.log._log
from nous_actor import Event, EventType, FrozenDict, InvalidEvent, Log, Message, Replace, Role
from nous_actor.testing import json_values, reference_shadowed

T0 = datetime(2026, 1, 1, tzinfo=UTC)

SURFACE = [
    EventType.SYSTEM_MESSAGE,
    EventType.USER_MESSAGE,
    EventType.ASSISTANT_MESSAGE,
    EventType.TOOL_RESULT,
]
BOOKKEEPING = [t for t in EventType if t not in SURFACE]


def at(i: int) -> datetime:
    """A fixed, distinct time per index."""
    return T0 + timedelta(seconds=i)


def rep(start: int, stop: int, content: str = "summary") -> dict[str, Any]:
    """Data of a replacing event."""
    return {"content": content, "surface_op": Replace(start, stop)}


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


def surface_seqs(log: Log) -> list[int]:
    return seqs(log.surface())


def users(n: int, log: Log | None = None) -> Log:
    """``log`` (default empty) with ``n`` more user messages, contents ``"u<seq>"``."""
    log = Log() if log is None else log
    for _ in range(n):
        seq = log.count()
        log = log.append("user_message", {"content": f"u{seq}"}, at(seq))
    return log


def step(log: Log, memoised: bool) -> Log:
    """Derive and keep the memoised log when ``memoised``; else leave the log un-derived."""
    return log.materialize()[1] if memoised else log


def snapshot_of(log: Log) -> dict[str, Any]:
    """Everything observable about a log, as plain values."""
    return {
        "count": log.count(),
        "events": log.events(),
        "surface": surface_seqs(log),
        "indexed": log.derive_indexed(),
    }


# Bad inputs for append: (type, data, time, reason).
BAD_APPENDS: list[tuple[Any, Any, Any, str]] = [
    ("user_message", ["not", "a", "mapping"], None, "invalid_event"),
    ("user_message", "text", None, "invalid_event"),
    ("user_message", None, datetime(2026, 1, 1), "invalid_event"),
    ("user_message", None, "2026-01-01T00:00:00Z", "invalid_event"),
    ("bogus_message", None, None, "unknown_event_type"),
    (42, None, None, "unknown_event_type"),
    (None, None, None, "unknown_event_type"),
    ("tool_call", {"surface_op": ("replace", 0, 1)}, None, "surface_op_on_non_surface_event"),
    ("turn_start", {"surface_op": "append"}, None, "surface_op_on_non_surface_event"),
    ("step_end", {"surface_op": Replace(0, 0)}, None, "surface_op_on_non_surface_event"),
    ("user_message", {"surface_op": "prepend"}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ("replace", 1)}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ("delete", 0, 1)}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ("replace", "0", 1)}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ["replace", 0, 1.5]}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ("replace", -1, 2)}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": ("replace", 3, 2)}, None, "invalid_surface_op"),
    ("user_message", {"surface_op": {"replace": [0, 1]}}, None, "invalid_surface_op"),
    ("user_message", {"x": {1, 2}}, None, "unserializable_event_data"),
    ("user_message", {"x": b"bytes"}, None, "unserializable_event_data"),
    ("user_message", {"x": float("nan")}, None, "unserializable_event_data"),
    ("user_message", {"x": [float("inf")]}, None, "unserializable_event_data"),
    ("user_message", {"x": {"y": -float("inf")}}, None, "unserializable_event_data"),
    ("user_message", {1: "non-str key"}, None, "unserializable_event_data"),
    ("user_message", {"x": object()}, None, "unserializable_event_data"),
    ("user_message", {"x": threading.Lock()}, None, "unserializable_event_data"),
    ("user_message", {"x": len}, None, "unserializable_event_data"),
    ("user_message", {"x": T0}, None, "unserializable_event_data"),
    # Validation order: the first failing rule wins.
    ("bogus_message", [1], None, "invalid_event"),
    ("bogus_message", {"surface_op": "prepend", "x": {1}}, None, "unknown_event_type"),
    ("turn_end", {"surface_op": "prepend", "x": {1}}, None, "surface_op_on_non_surface_event"),
    ("user_message", {"surface_op": "prepend", "x": {1}}, None, "invalid_surface_op"),
]
BAD_IDS = [f"{i}-{case[3]}" for i, case in enumerate(BAD_APPENDS)]


# -- empty ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [Log, Log.new], ids=["Log()", "Log.new()"])
def test_new_log_is_empty(make: Callable[[], Log]) -> None:
    """``Log()`` and ``Log.new()`` have no events, count 0 and an empty surface."""
    log = make()
    assert log.count() == 0
    assert log.events() == []
    assert log.since(0) == []
    assert log.surface() == []
    assert log.derive_indexed() == []
    assert log.derive_messages() == []
    assert log.snapshot().events() == []


def test_log_and_log_new_are_equal() -> None:
    """``Log()`` equals ``Log.new()``."""
    assert Log() == Log.new()


# -- append -----------------------------------------------------------------------------


def test_append_assigns_seq_equal_to_count() -> None:
    """Each append takes ``seq = count()`` and bumps the count by one."""
    log = Log()
    for expected in range(5):
        assert log.count() == expected
        log = log.append("turn_start" if expected % 2 else "user_message", {}, at(expected))
        assert log.events()[-1].seq == expected
    assert seqs(log.events()) == [0, 1, 2, 3, 4]
    assert log.count() == 5


def test_append_after_gap_takes_the_next_seq() -> None:
    """After ``append_at`` left a gap, ``append`` takes ``seq = count()`` past it."""
    log = Log().append_at(7, "user_message", {"content": "restored"}, T0)
    log = log.append("user_message", {"content": "next"}, T0)
    assert seqs(log.events()) == [7, 8]


def test_append_stores_type_data_and_time() -> None:
    """The appended event carries the given type, data and time."""
    log = Log().append("tool_result", {"content": "42", "tool_call_id": "c1"}, at(3))
    (ev,) = log.events()
    assert ev.type is EventType.TOOL_RESULT
    assert ev.data == {"content": "42", "tool_call_id": "c1"}
    assert ev.time == at(3)


def test_append_calls_take_the_documented_keyword_names() -> None:
    """``append``, ``append_or_log`` and ``append_at`` take ``seq``/``type``/``data``/``time``."""
    a = Log().append(type="user_message", data={"content": "x"}, time=T0)
    b = Log().append_or_log(type="user_message", data={"content": "x"}, time=T0)
    c = Log().append_at(seq=0, type="user_message", data={"content": "x"}, time=T0)
    assert a == b == c
    assert a.events()[0].data == {"content": "x"}


@pytest.mark.parametrize("etype", list(EventType), ids=str)
def test_append_accepts_enum_and_plain_string_types(etype: EventType) -> None:
    """An ``EventType`` and its plain string value append the same event."""
    a = Log().append(etype, {"k": 1}, T0)
    b = Log().append(etype.value, {"k": 1}, T0)
    assert a == b
    assert b.events()[0].type is etype


def test_append_defaults_data_to_empty_and_time_to_now_utc() -> None:
    """Without data and time the event has empty data and a UTC time of now."""
    before = datetime.now(UTC)
    log = Log().append("turn_start")
    after = datetime.now(UTC)
    (ev,) = log.events()
    assert ev.data == {}
    assert before <= ev.time <= after
    assert ev.time.utcoffset() == timedelta(0)


def test_append_keeps_the_instant_of_an_aware_non_utc_time() -> None:
    """An aware time in another zone is stored as the same instant."""
    local = datetime(2026, 1, 1, 5, 30, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    (ev,) = Log().append("user_message", {}, local).events()
    assert ev.time == T0
    assert ev.time.utcoffset() == timedelta(0)


@pytest.mark.parametrize(("etype", "data", "time", "reason"), BAD_APPENDS, ids=BAD_IDS)
def test_append_raises_invalid_event_with_reason(
    etype: Any, data: Any, time: Any, reason: str
) -> None:
    """A refused event raises ``InvalidEvent`` (a ``ValueError``) with the §2 reason."""
    with pytest.raises(InvalidEvent) as info:
        users(2).append(etype, data, time)
    assert isinstance(info.value, ValueError)
    assert info.value.reason == reason


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
@pytest.mark.parametrize(("etype", "data", "time", "reason"), BAD_APPENDS, ids=BAD_IDS)
def test_refused_append_leaves_log_unchanged(
    etype: Any, data: Any, time: Any, reason: str, memoised: bool
) -> None:
    """After a refused append the log is as before and the next append takes the same seq."""
    log = step(users(2).append("system_message", rep(0, 0), at(2)), memoised)
    before = snapshot_of(log)
    with pytest.raises(InvalidEvent):
        log.append(etype, data, time)
    assert snapshot_of(log) == before
    assert log.append("user_message", {}, T0).events()[-1].seq == 3


def test_unserializable_error_names_the_path() -> None:
    """The ``unserializable_event_data`` message names where the bad value sits."""
    with pytest.raises(InvalidEvent, match=r"data\['metadata'\]\['when'\]"):
        Log().append("user_message", {"metadata": {"when": T0}})


def test_invalid_surface_op_error_says_what_to_use() -> None:
    """The ``invalid_surface_op`` message names the accepted forms."""
    with pytest.raises(InvalidEvent, match=r"Replace\(start, stop\)"):
        Log().append("user_message", {"surface_op": "prepend"})


def test_replace_past_the_end_is_valid() -> None:
    """``Replace(0, 999)`` on a 10-event log is accepted; the part past the end matches nothing."""
    log = users(10).append("system_message", rep(0, 999), at(10))
    assert surface_seqs(log) == [10]
    assert log.events()[-1].surface_op == Replace(0, 999)


@pytest.mark.parametrize(
    "op",
    [Replace(1, 2), ("replace", 1, 2), ["replace", 1, 2]],
    ids=["Replace", "tuple", "list"],
)
def test_replace_forms_are_equivalent(op: Any) -> None:
    """``Replace``, the tuple and the list form all make the same replace."""
    log = users(4).append("system_message", {"content": "s", "surface_op": op}, at(4))
    assert log.events()[-1].surface_op == Replace(1, 2)
    assert log.events()[-1].position == 1
    assert surface_seqs(log) == [0, 4, 3]


@pytest.mark.parametrize("op", [None, "append"], ids=["None", "append"])
def test_plain_surface_op_values_append(op: Any) -> None:
    """``surface_op`` of ``None`` or ``"append"`` is a plain append at position ``seq``."""
    log = users(2).append("user_message", {"content": "x", "surface_op": op}, at(2))
    assert log.events()[-1].surface_op is None
    assert log.events()[-1].position == 2
    assert surface_seqs(log) == [0, 1, 2]


def test_bookkeeping_event_with_none_surface_op_is_accepted() -> None:
    """A bookkeeping event may carry ``surface_op: None``."""
    log = Log().append("request_header", {"surface_op": None}, T0)
    assert log.count() == 1
    assert log.surface() == []


# -- append_or_log ----------------------------------------------------------------------


def test_append_or_log_appends_a_valid_event_silently() -> None:
    """A valid event is appended exactly as by ``append``, with nothing logged."""
    base = users(2)
    with capture_logs() as logs:
        log = base.append_or_log("assistant_message", {"content": "ok"}, at(2))
    assert log == base.append("assistant_message", {"content": "ok"}, at(2))
    assert logs == []


@pytest.mark.parametrize(("etype", "data", "time", "reason"), BAD_APPENDS, ids=BAD_IDS)
def test_append_or_log_drops_with_a_warning(etype: Any, data: Any, time: Any, reason: str) -> None:
    """A refused event is logged as a ``log.event_dropped`` warning and the same log returned."""
    base = users(2).append("system_message", rep(0, 0), at(2))
    before = snapshot_of(base)
    with capture_logs() as logs:
        log = base.append_or_log(etype, data, time)
    assert log is base
    assert snapshot_of(log) == before
    assert len(logs) == 1
    (entry,) = logs
    assert entry["event"] == "log.event_dropped"
    assert entry["log_level"] == "warning"
    assert entry["reason"] == reason
    assert entry["type"] in (etype, str(etype), repr(etype))


_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
    st.binary(max_size=3),
    st.builds(object),
    st.frozensets(st.integers(), max_size=2),
)
_junk_data = st.one_of(
    _junk,
    json_values(),
    st.dictionaries(st.text(max_size=3) | st.integers(), _junk | json_values(3), max_size=3),
    st.fixed_dictionaries(
        {
            "surface_op": st.one_of(
                _junk,
                st.tuples(st.just("replace"), _junk, _junk),
                st.lists(st.just("replace") | st.integers(-2, 3), max_size=4),
            )
        }
    ),
)
_junk_types = st.one_of(
    st.sampled_from(list(EventType)), st.sampled_from([t.value for t in EventType]), _junk
)
_junk_times = st.one_of(
    st.none(),
    st.datetimes(),
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(
        timezones=st.builds(
            timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
        )
    ),
    _junk,
)


@given(etype=_junk_types, data=_junk_data, time=_junk_times)
def test_append_or_log_never_raises(etype: Any, data: Any, time: Any) -> None:
    """For any input ``append_or_log`` appends one event or returns the log with a warning."""
    base = users(2)
    with capture_logs() as logs:
        log = base.append_or_log(etype, data, time)
    if log is base:
        assert [e["event"] for e in logs] == ["log.event_dropped"]
        assert logs[0]["log_level"] == "warning"
    else:
        assert logs == []
        assert log.count() == 3
        assert log.events()[:2] == base.events()


def _cyclic() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _deep() -> list[Any]:
    x: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        x = [x]
    return x


UNWALKABLE: list[Callable[[], Any]] = [_cyclic, _deep]


@pytest.mark.parametrize("make", UNWALKABLE, ids=["cyclic", "deep"])
def test_append_refuses_unwalkable_data(make: Callable[[], Any]) -> None:
    """Cyclic or absurdly deep data raises ``InvalidEvent('unserializable_event_data')``."""
    with pytest.raises(InvalidEvent) as info:
        Log().append("user_message", {"metadata": make()})
    assert info.value.reason == "unserializable_event_data"


@pytest.mark.parametrize("make", UNWALKABLE, ids=["cyclic", "deep"])
def test_append_or_log_drops_unwalkable_data(make: Callable[[], Any]) -> None:
    """Cyclic or absurdly deep data is dropped with a warning, never raised."""
    base = users(1)
    with capture_logs() as logs:
        log = base.append_or_log("user_message", {"metadata": make()})
    assert log is base
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("log.event_dropped", "unserializable_event_data")
    ]


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("broken __repr__")


@pytest.mark.parametrize(
    ("etype", "data"),
    [(_BadRepr(), None), ("user_message", {"surface_op": _BadRepr()})],
    ids=["type", "surface_op"],
)
def test_append_or_log_survives_a_broken_repr(etype: Any, data: Any) -> None:
    """A bad type or surface_op whose ``__repr__`` raises is still dropped with a warning."""
    base = users(1)
    with capture_logs() as logs:
        log = base.append_or_log(etype, data)
    assert log is base
    assert [e["event"] for e in logs] == ["log.event_dropped"]


# -- append_at --------------------------------------------------------------------------


def test_append_at_restores_under_the_given_seq() -> None:
    """``append_at(seq, ...)`` stores the event under ``seq`` and sets ``count() == seq + 1``."""
    log = users(2).append_at(5, "assistant_message", {"content": "a"}, at(5))
    assert seqs(log.events()) == [0, 1, 5]
    assert log.count() == 6


def test_append_at_the_head_is_allowed() -> None:
    """``append_at(count(), ...)`` is the same as ``append``."""
    base = users(3)
    assert base.append_at(3, "turn_end", {}, T0) == base.append("turn_end", {}, T0)


def test_append_at_gaps_keep_positions_as_seqs() -> None:
    """Events restored across a gap stand at their own seqs on the surface."""
    log = Log().append_at(2, "user_message", {"content": "a"}, T0)
    log = log.append_at(9, "system_message", rep(3, 8), T0)
    log = log.append_at(10, "user_message", {"content": "b"}, T0)
    assert surface_seqs(log) == [2, 9, 10]
    assert log.count() == 11


def test_append_at_replace_can_shadow_across_a_gap() -> None:
    """A restored replace shadows restored events by position, gaps or not."""
    log = Log().append_at(3, "user_message", {"content": "a"}, T0)
    log = log.append_at(6, "user_message", {"content": "b"}, T0)
    log = log.append_at(8, "system_message", rep(0, 4), T0)
    assert surface_seqs(log) == [8, 6]


@pytest.mark.parametrize("seq", [0, 2], ids=["zero", "last"])
def test_append_at_behind_head_raises(seq: int) -> None:
    """``append_at`` with ``seq < count()`` raises ``seq_behind_head`` and says what to use."""
    with pytest.raises(InvalidEvent, match=r"seq >= 3") as info:
        users(3).append_at(seq, "user_message", {}, T0)
    assert info.value.reason == "seq_behind_head"


def test_append_at_behind_head_leaves_log_unchanged() -> None:
    """A refused ``append_at`` leaves the log as it was."""
    log = users(3).materialize()[1]
    before = snapshot_of(log)
    with pytest.raises(InvalidEvent):
        log.append_at(1, "user_message", {}, T0)
    assert snapshot_of(log) == before


def test_append_at_checks_the_event_before_the_seq() -> None:
    """``seq_behind_head`` is checked after the event's own validation."""
    with pytest.raises(InvalidEvent) as info:
        users(3).append_at(0, "bogus", {}, T0)
    assert info.value.reason == "unknown_event_type"


@pytest.mark.parametrize("seq", [-1, True, 1.0, "3", None], ids=repr)
def test_append_at_rejects_a_seq_that_is_not_a_non_negative_int(seq: Any) -> None:
    """A negative, bool or non-int seq is ``invalid_event``."""
    with pytest.raises(InvalidEvent) as info:
        Log().append_at(seq, "user_message", {}, T0)
    assert info.value.reason == "invalid_event"


# -- append_event and last_event (beyond §3: restoring stored events) -------------------


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_append_event_restores_an_event_under_its_own_seq(memoised: bool) -> None:
    """``append_event`` appends a ready ``Event`` under its seq, and it folds like any other."""
    ev = Event(4, "system_message", at(4), rep(0, 0))
    log = step(users(2), memoised).append_event(ev)
    assert log.events()[-1] == ev
    assert log.count() == 5
    assert surface_seqs(log) == [4, 1]


def test_append_event_behind_head_raises() -> None:
    """``append_event`` with ``event.seq < count()`` raises ``seq_behind_head``."""
    with pytest.raises(InvalidEvent) as info:
        users(3).append_event(Event(2, "user_message", T0, {}))
    assert info.value.reason == "seq_behind_head"


def test_append_event_refuses_a_non_event() -> None:
    """``append_event`` takes an ``Event`` only."""
    with pytest.raises(TypeError, match="takes an Event"):
        Log().append_event({"seq": 0, "type": "user_message"})  # type: ignore[arg-type]


def test_last_event_is_the_newest_retained_event() -> None:
    """``last_event()`` is ``None`` on an empty log, else the event with seq ``count() - 1``."""
    assert Log().last_event() is None
    log = users(2).append_at(6, "turn_end", {}, T0)
    last = log.last_event()
    assert last is not None
    assert last.seq == log.count() - 1 == 6
    assert log.append("system_message", rep(0, 9), T0).snapshot().last_event() == Event(
        7, "system_message", T0, rep(0, 9)
    )


# -- count, events, since ---------------------------------------------------------------


def test_count_includes_snapshot_dropped_events() -> None:
    """``count()`` still counts events a snapshot dropped."""
    log = users(4).append("system_message", rep(0, 2), at(4)).snapshot()
    assert len(log.events()) == 2
    assert log.count() == 5
    assert log.append("user_message", {}, T0).events()[-1].seq == 5


def test_events_include_shadowed_events() -> None:
    """``events()`` returns every retained event, shadowed ones too, oldest first."""
    log = users(3).append("system_message", rep(0, 1), at(3)).append("turn_end", {}, T0)
    assert seqs(log.events()) == [0, 1, 2, 3, 4]


def test_since_returns_events_at_or_after_seq() -> None:
    """``since(seq)`` returns the retained events with ``event.seq >= seq``, oldest first."""
    log = users(5)
    assert seqs(log.since(0)) == [0, 1, 2, 3, 4]
    assert seqs(log.since(3)) == [3, 4]
    assert seqs(log.since(4)) == [4]


def test_since_returns_events_equal_to_events() -> None:
    """``since(0)`` equals ``events()``."""
    log = users(3).append("system_message", rep(0, 1), at(3))
    assert log.since(0) == log.events()


def test_since_skips_gaps() -> None:
    """A seq inside an ``append_at`` gap starts at the next retained event."""
    log = users(2).append_at(6, "user_message", {}, T0).append("turn_end", {}, T0)
    assert seqs(log.since(3)) == [6, 7]
    assert seqs(log.since(6)) == [6, 7]
    assert seqs(log.since(7)) == [7]


@pytest.mark.parametrize("offset", [0, 1, 100])
def test_since_at_or_past_the_end_is_empty(offset: int) -> None:
    """``since(count() + k)`` is ``[]``."""
    log = users(3)
    assert log.since(log.count() + offset) == []


def test_since_after_snapshot_skips_dropped_events() -> None:
    """After a snapshot ``since`` returns only retained events."""
    log = users(4).append("system_message", rep(1, 2), at(4)).append("turn_end", {}, T0)
    snap = log.snapshot()
    assert seqs(snap.since(0)) == [0, 3, 4, 5]
    assert seqs(snap.since(1)) == [3, 4, 5]
    assert seqs(snap.since(2)) == [3, 4, 5]
    assert seqs(snap.since(5)) == [5]
    assert snap.since(6) == []


# -- surface order and shadowing --------------------------------------------------------


def test_surface_stands_a_replace_where_its_range_began() -> None:
    """A replace stands at the start of its range, not at the end of the surface."""
    log = users(5).append("system_message", rep(1, 2), at(5))
    assert surface_seqs(log) == [0, 5, 3, 4]
    assert [m.content for m in log.derive_messages()] == ["u0", "summary", "u3", "u4"]


def test_surface_ties_on_position_keep_seq_order() -> None:
    """Events at the same position keep seq order."""
    log = users(1).append("system_message", rep(3, 3, "s"), at(1))
    log = users(3, log)  # seqs 2, 3, 4: seq 3 stands at position 3 like the replace
    assert surface_seqs(log) == [0, 2, 1, 3, 4]


@pytest.mark.parametrize("memoised", [False, True], ids=["fresh", "memoised"])
def test_surface_tie_keeps_seq_order_with_later_positions_after_it(memoised: bool) -> None:
    """An append tying with a replace goes after it even when further positions follow."""
    log = users(1).append("system_message", rep(3, 3, "a"), at(1))  # seq 1 at position 3
    log = step(log.append("system_message", rep(6, 6, "b"), at(2)), memoised)  # seq 2 at 6
    log = log.append("user_message", {}, at(3))  # seq 3 at position 3
    assert surface_seqs(log) == [0, 1, 3, 2]


def test_surface_excludes_bookkeeping_events() -> None:
    """Bookkeeping events never reach the surface."""
    log = Log()
    for i, etype in enumerate(EventType):
        log = log.append(etype, {"content": "x"}, at(i))
    assert [e.type for e in log.surface()] == SURFACE
    assert [m.role for m in log.derive_messages()] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
    ]


@pytest.mark.parametrize("etype", list(EventType), ids=str)
def test_any_event_type_can_be_shadowed(etype: EventType) -> None:
    """An event of any type inside a later replace's range is shadowed (snapshot drops it)."""
    log = users(1).append(etype, {"content": "x"}, at(1)).append("user_message", {}, at(2))
    log = log.append("system_message", rep(1, 1), at(3))
    assert reference_shadowed(log.events()) == {1}
    assert seqs(log.snapshot().events()) == [0, 2, 3]
    assert surface_seqs(log) == [0, 3, 2]


def test_replace_event_itself_can_be_shadowed() -> None:
    """A replace inside a later replace's range leaves the surface."""
    log = users(3).append("system_message", rep(1, 2, "s1"), at(3))
    log = log.append("system_message", rep(0, 1, "s2"), at(4))
    assert surface_seqs(log) == [4]
    assert [m.content for m in log.derive_messages()] == ["s2"]


def test_shadowed_replace_still_shadows_its_range() -> None:
    """Nested summaries compose: a shadowed replace keeps hiding its own range."""
    log = users(4)
    log = log.append("system_message", rep(0, 2, "s1"), at(4))  # hides 0, 1, 2
    log = log.append("system_message", rep(0, 0, "s2"), at(5))  # hides 0 and s1 (at 0)
    assert surface_seqs(log) == [5, 3]
    assert reference_shadowed(log.events()) == {0, 1, 2, 4}


def test_replace_never_shadows_later_events() -> None:
    """Events appended after a replace stay visible even inside its range."""
    log = users(2).append("system_message", rep(0, 999), at(2))
    log = users(3, log)  # seqs 3, 4, 5 — all in 0..999
    assert surface_seqs(log) == [2, 3, 4, 5]


def test_replace_with_range_before_its_start_position_gap() -> None:
    """A replace of a range with no events shadows nothing but still stands at its start."""
    log = users(4).append("system_message", rep(10, 12), at(4))
    assert surface_seqs(log) == [0, 1, 2, 3, 4]
    assert log.events()[-1].position == 10


def test_replace_shadows_every_unshadowed_event_in_range_inclusive() -> None:
    """Both ends of the range are inclusive."""
    log = users(6).append("system_message", rep(2, 4), at(6))
    assert surface_seqs(log) == [0, 1, 6, 5]


# -- the corner: a replace starting beyond its own seq ---------------------------------


@pytest.mark.parametrize("memoised", [False, True], ids=["fresh", "memoised"])
def test_corner_replace_beyond_own_seq_then_appends_sorting_before_it(memoised: bool) -> None:
    """Plain appends after a replace whose range starts past its seq sort before it, then tie."""
    log = step(users(2), memoised)
    log = step(log.append("system_message", rep(5, 7, "s"), at(2)), memoised)  # seq 2, pos 5
    expected_after = {3: [0, 1, 3, 2], 4: [0, 1, 3, 4, 2], 5: [0, 1, 3, 4, 2, 5]}
    for seq, expected in expected_after.items():
        log = step(log.append("user_message", {"content": f"u{seq}"}, at(seq)), memoised)
        assert surface_seqs(log) == expected
    log = step(log.append("system_message", rep(3, 5, "t"), at(6)), memoised)
    assert surface_seqs(log) == [0, 1, 6]
    log = step(log.append("user_message", {}, at(7)), memoised)
    assert surface_seqs(log) == [0, 1, 6, 7]


@pytest.mark.parametrize("memoised", [False, True], ids=["fresh", "memoised"])
def test_corner_first_event_is_a_replace_beyond_its_seq(memoised: bool) -> None:
    """A replace at seq 0 standing at position 2 is overtaken by seqs 1 and kept before seq 2."""
    log = step(Log().append("system_message", rep(2, 2, "s"), T0), memoised)
    log = step(log.append("user_message", {}, at(1)), memoised)
    assert surface_seqs(log) == [1, 0]
    log = step(log.append("user_message", {}, at(2)), memoised)
    assert surface_seqs(log) == [1, 0, 2]


@pytest.mark.parametrize("memoised", [False, True], ids=["fresh", "memoised"])
def test_corner_later_replace_shadows_the_early_standing_replace(memoised: bool) -> None:
    """A replace covering the far position of an earlier replace shadows it, not later events."""
    log = step(users(1).append("system_message", rep(4, 9, "far"), at(1)), memoised)
    log = step(users(3, log), memoised)  # seqs 2, 3, 4 (4 ties with "far" at 4)
    log = step(log.append("system_message", rep(4, 4, "near"), at(5)), memoised)
    assert surface_seqs(log) == [0, 2, 3, 5]
    fresh = pickle.loads(pickle.dumps(log))
    assert log.derive_indexed() == fresh.derive_indexed()


# -- projection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("etype", "role"),
    [
        ("system_message", Role.SYSTEM),
        ("user_message", Role.USER),
        ("assistant_message", Role.ASSISTANT),
        ("tool_result", Role.TOOL),
    ],
)
def test_projection_maps_type_to_role(etype: str, role: Role) -> None:
    """Each surface type projects to its role."""
    (msg,) = Log().append(etype, {"content": "c"}, T0).derive_messages()
    assert msg.role is role


def test_projection_takes_every_field_from_data() -> None:
    """Every message field comes straight from ``data``; ``created_at`` is the event time."""
    data = {
        "content": [{"type": "text", "text": "hi"}],
        "reasoning_content": "because",
        "tool_calls": [{"id": "c1", "name": "ls", "arguments": "{}"}],
        "tool_call_id": "c0",
        "name": "bot",
        "metadata": {"k": [1, {"x": None}]},
    }
    (msg,) = Log().append("assistant_message", data, at(7)).derive_messages()
    assert msg == Message(
        "assistant",
        [{"type": "text", "text": "hi"}],
        reasoning_content="because",
        tool_calls=[{"id": "c1", "name": "ls", "arguments": "{}"}],
        tool_call_id="c0",
        name="bot",
        metadata={"k": [1, {"x": None}]},
        created_at=at(7),
    )


@pytest.mark.parametrize(
    "data",
    [{}, {"tool_calls": None, "metadata": None}],
    ids=["missing", "None"],
)
def test_projection_missing_or_none_tool_calls_and_metadata_are_empty(
    data: dict[str, Any],
) -> None:
    """Missing or ``None`` ``tool_calls``/``metadata`` project to empty ones."""
    (msg,) = Log().append("assistant_message", data, T0).derive_messages()
    assert list(msg.tool_calls) == []
    assert dict(msg.metadata) == {}


def test_projection_ignores_other_keys() -> None:
    """``surface_op``, ``source`` and any other key are not projected."""
    log = users(1).append(
        "user_message",
        {"content": "c", "source": "tui", "extra": {"x": 1}, "surface_op": Replace(0, 0)},
        at(1),
    )
    (msg,) = log.derive_messages()
    assert msg == Message("user", "c", created_at=at(1))


def test_projection_filters_nothing() -> None:
    """An assistant event with no content and no tool calls still projects."""
    log = users(1).append("assistant_message", {}, at(1))
    assert log.derive_messages()[1] == Message("assistant", created_at=at(1))


def test_projection_created_at_is_event_time() -> None:
    """``created_at`` is the event's time, for every message."""
    log = users(3)
    assert [m.created_at for m in log.derive_messages()] == [e.time for e in log.events()]


def test_derive_indexed_pairs_each_message_with_its_seq() -> None:
    """``derive_indexed`` pairs each surface message with the seq of its event."""
    log = users(3).append("turn_end", {}, at(3)).append("system_message", rep(1, 1, "s"), at(4))
    indexed = log.derive_indexed()
    assert [seq for seq, _ in indexed] == [0, 4, 2]
    assert [m.content for _, m in indexed] == ["u0", "s", "u2"]
    assert [seq for seq, _ in indexed] == surface_seqs(log)


# -- materialize ------------------------------------------------------------------------


def test_materialize_returns_the_messages_and_an_equal_log() -> None:
    """``materialize`` returns ``derive_messages()`` and a log equal to the original."""
    log = users(3).append("system_message", rep(0, 1), at(3))
    msgs, memo = log.materialize()
    assert msgs == log.derive_messages()
    assert memo == log
    assert memo.derive_indexed() == log.derive_indexed()


def test_materialized_log_keeps_the_fold_current_without_refolding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After ``materialize``, appends and replaces on the result never trigger a full fold."""
    calls = spy(monkeypatch, nous_actor.core.log._log, "_full_fold")
    _, log = users(5).materialize()
    assert [n for _, n in calls] == [5]
    log = log.append("system_message", rep(1, 3), at(5))
    log = log.append("turn_end", {}, at(6))
    log = log.append("user_message", {}, at(7))
    log = log.append("system_message", rep(20, 30), at(8))
    log = log.append_at(10, "user_message", {}, at(10))
    assert surface_seqs(log) == [0, 5, 4, 7, 10, 8]
    assert [n for _, n in calls] == [5]


# -- seed -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "user"])
def test_seed_system_and_user_keep_content_metadata_name(role: str) -> None:
    """``system``/``user`` messages seed ``{content, metadata, name}``."""
    m = Message(role, "c", name="n", metadata={"k": 1}, created_at=T0)
    (ev,) = Log.seed([m]).events()
    assert ev.data == {"content": "c", "metadata": {"k": 1}, "name": "n"}


def test_seed_assistant_keeps_tool_calls_and_reasoning() -> None:
    """An ``assistant`` message seeds its tool calls and its reasoning content."""
    call = {"id": "c1", "name": "ls", "arguments": "{}"}
    m = Message.assistant("c", [call], reasoning_content="r", created_at=T0)
    (ev,) = Log.seed([m]).events()
    assert ev.type is EventType.ASSISTANT_MESSAGE
    assert ev.data == {
        "content": "c",
        "metadata": {},
        "name": None,
        "tool_calls": [call],
        "reasoning_content": "r",
    }


def test_seed_assistant_omits_reasoning_when_none() -> None:
    """``reasoning_content`` is seeded only when it is not ``None``."""
    (ev,) = Log.seed([Message.assistant("c", created_at=T0)]).events()
    assert "reasoning_content" not in ev.data
    assert ev.data == {"content": "c", "metadata": {}, "name": None, "tool_calls": []}


def test_seed_tool_keeps_tool_call_id() -> None:
    """A ``tool`` message seeds ``{content, metadata, name, tool_call_id}``."""
    (ev,) = Log.seed([Message.tool("42", "c1", created_at=T0)]).events()
    assert ev.type is EventType.TOOL_RESULT
    assert ev.data == {"content": "42", "metadata": {}, "name": None, "tool_call_id": "c1"}


def test_seed_appends_one_surface_event_per_message_in_order() -> None:
    """Seeding makes one event per message, in order, under seqs 0..n-1."""
    ms = [
        Message.system("s", created_at=at(0)),
        Message.user("u", created_at=at(1)),
        Message.assistant("a", created_at=at(2)),
        Message.tool("t", "c", created_at=at(3)),
    ]
    log = Log.seed(iter(ms))
    assert [(e.seq, e.type) for e in log.events()] == list(enumerate(SURFACE))
    assert log.derive_messages() == ms


def test_seed_event_time_is_created_at() -> None:
    """Each seeded event's time is its message's ``created_at``."""
    ms = [Message.user("a", created_at=at(5)), Message.user("b", created_at=at(2))]
    assert [e.time for e in Log.seed(ms).events()] == [at(5), at(2)]


def test_seed_skips_non_messages_with_a_warning() -> None:
    """Anything that is not a ``Message`` is skipped and logged as a warning."""
    m = Message.user("kept", created_at=T0)
    with capture_logs() as logs:
        log = Log.seed([{"role": "user", "content": "dict"}, m, "text"])  # type: ignore[list-item]
    assert log.derive_messages() == [m]
    assert log.count() == 1
    assert len(logs) == 2
    assert all(e["log_level"] == "warning" for e in logs)


def test_seed_of_nothing_is_empty() -> None:
    """Seeding an empty sequence gives an empty log."""
    assert Log.seed([]) == Log()


# -- snapshot ---------------------------------------------------------------------------


def test_snapshot_drops_exactly_the_shadowed_events() -> None:
    """A snapshot keeps every unshadowed event (bookkeeping too) and drops the shadowed ones."""
    log = users(2).append("turn_start", {}, at(2)).append("user_message", {}, at(3))
    log = log.append("system_message", rep(1, 2, "s1"), at(4))
    log = log.append("turn_end", {}, at(5))
    log = log.append("system_message", rep(1, 1, "s2"), at(6))  # shadows s1 (at 1)
    assert seqs(log.snapshot().events()) == [0, 3, 5, 6]


def test_snapshot_keeps_surface_count_and_seqs() -> None:
    """Surface, derive, ``count()`` and surviving seqs are unchanged by a snapshot."""
    log = users(4).append("system_message", rep(0, 1), at(4)).append_at(9, "turn_end", {}, T0)
    snap = log.snapshot()
    assert snap.count() == log.count() == 10
    assert snap.derive_indexed() == log.derive_indexed()
    assert surface_seqs(snap) == surface_seqs(log)
    assert snap.events() == [e for e in log.events() if e.seq not in {0, 1}]


def test_snapshot_leaves_the_original_unchanged() -> None:
    """The log a snapshot was taken from keeps its shadowed events."""
    log = users(3).append("system_message", rep(0, 1), at(3)).materialize()[1]
    before = snapshot_of(log)
    log.snapshot()
    assert snapshot_of(log) == before


def test_snapshot_without_shadowed_events_keeps_everything() -> None:
    """A snapshot of a log with nothing shadowed equals the log."""
    log = users(3).append("system_message", rep(7, 9), at(3))
    assert log.snapshot() == log


def test_snapshot_then_replace_behaves_as_on_the_original() -> None:
    """A replace after a snapshot gives the same surface as on the original."""
    log = users(4).append("system_message", rep(1, 2, "s1"), at(4))
    later = rep(0, 1, "s2")
    assert (
        log.snapshot().append("system_message", later, at(5)).derive_indexed()
        == log.append("system_message", later, at(5)).derive_indexed()
    )


# -- returned sequences are the caller's ------------------------------------------------

READERS: dict[str, Callable[[Log], list[Any]]] = {
    "events": lambda log: log.events(),
    "since": lambda log: log.since(1),
    "surface": lambda log: log.surface(),
    "derive_indexed": lambda log: log.derive_indexed(),
    "derive_messages": lambda log: log.derive_messages(),
    "materialize": lambda log: log.materialize()[0],
}


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
@pytest.mark.parametrize("reader", list(READERS))
def test_mutating_a_returned_list_never_changes_the_log(reader: str, memoised: bool) -> None:
    """Clearing, extending or reordering a returned list leaves the log as it was."""
    log = step(users(4).append("system_message", rep(1, 2), at(4)), memoised)
    before = snapshot_of(log)
    for mutate in (list.reverse, lambda xs: xs.append(None), list.clear):
        out = READERS[reader](log)
        assert isinstance(out, list)
        mutate(out)
        assert snapshot_of(log) == before
    assert snapshot_of(log.append("user_message", {}, at(5))) == snapshot_of(
        users(4).append("system_message", rep(1, 2), at(4)).append("user_message", {}, at(5))
    )


def test_returned_lists_are_fresh_each_call() -> None:
    """Two calls never return the same list object."""
    log = users(2).materialize()[1]
    for read in READERS.values():
        assert read(log) is not read(log)


# -- old versions stay valid ------------------------------------------------------------


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_append_leaves_the_old_version_unchanged(memoised: bool) -> None:
    """Appending (plain or replace) returns a new log; the old one is unchanged."""
    old = step(users(3), memoised)
    before = snapshot_of(old)
    new = step(old.append("system_message", rep(0, 2), at(3)), memoised)
    new.append("user_message", {}, at(4)).derive_indexed()
    assert snapshot_of(old) == before
    assert surface_seqs(new) == [3]


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_appending_twice_to_the_same_version_gives_independent_logs(memoised: bool) -> None:
    """Two appends to one version each see only their own new event."""
    base = step(users(2), memoised)
    a = base.append("system_message", rep(0, 1, "a"), at(2))
    b = base.append("user_message", {"content": "b"}, at(2))
    assert [m.content for m in a.derive_messages()] == ["a"]
    assert [m.content for m in b.derive_messages()] == ["u0", "u1", "b"]
    assert a.events()[:2] == b.events()[:2] == base.events()
    assert a.count() == b.count() == 3


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_branching_from_an_old_version_after_deriving_a_newer_one(memoised: bool) -> None:
    """An old version still branches correctly after a newer one took and updated its fold."""
    old = step(users(3), memoised)
    newer = step(old.append("system_message", rep(0, 1, "s"), at(3)), memoised)
    newest = step(newer.append("user_message", {"content": "n"}, at(4)), memoised)
    assert surface_seqs(newest) == [3, 2, 4]
    branch = step(old.append("user_message", {"content": "b"}, at(3)), memoised)
    assert surface_seqs(branch) == [0, 1, 2, 3]
    assert [m.content for m in branch.derive_messages()] == ["u0", "u1", "u2", "b"]
    assert surface_seqs(old) == [0, 1, 2]
    assert surface_seqs(newest) == [3, 2, 4]
    assert surface_seqs(newer) == [3, 2]


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_old_version_derives_correctly_after_a_newer_took_its_fold(memoised: bool) -> None:
    """Deriving an old version after its successor was derived gives the old surface."""
    old = users(3).materialize()[1]
    new = step(old.append("system_message", rep(0, 2), at(3)), memoised)
    assert surface_seqs(new) == [3]
    assert surface_seqs(old) == [0, 1, 2]
    assert old.derive_messages() == users(3).derive_messages()


def test_snapshot_and_original_evolve_independently() -> None:
    """Appending to a snapshot and to its original keeps both correct."""
    log = users(3).append("system_message", rep(0, 1), at(3)).materialize()[1]
    snap = log.snapshot()
    a = snap.append("system_message", rep(2, 2, "a"), at(4))
    b = log.append("user_message", {"content": "b"}, at(4))
    assert surface_seqs(a) == [3, 4]
    assert surface_seqs(b) == [3, 2, 4]
    assert seqs(b.events()) == [0, 1, 2, 3, 4]
    assert seqs(a.events()) == [2, 3, 4]


def test_branch_from_snapshot_source_after_snapshot_appended() -> None:
    """An event appended to the snapshot never shows up in the original's branches."""
    log = users(2).materialize()[1]
    snap = log.snapshot().append("user_message", {"content": "s"}, at(2))
    branch = log.append("user_message", {"content": "o"}, at(2))
    assert [m.content for m in branch.derive_messages()] == ["u0", "u1", "o"]
    assert [m.content for m in snap.derive_messages()] == ["u0", "u1", "s"]


# -- data frozen on append --------------------------------------------------------------


def test_caller_mutating_its_data_afterwards_changes_nothing() -> None:
    """Mutating the dict (and what it holds) after appending never changes history."""
    calls = [{"id": "c1", "name": "ls", "arguments": "{}"}]
    data: dict[str, Any] = {"content": "c", "tool_calls": calls, "metadata": {"k": [1]}}
    log = Log().append("assistant_message", data, T0)
    before = log.derive_messages()
    data["content"] = "changed"
    data["metadata"]["k"].append(2)
    calls[0]["name"] = "rm"
    calls.append({"id": "c2"})
    assert log.events()[0].data == {
        "content": "c",
        "tool_calls": [{"id": "c1", "name": "ls", "arguments": "{}"}],
        "metadata": {"k": [1]},
    }
    assert log.derive_messages() == before


def test_event_data_cannot_be_mutated() -> None:
    """The data of a stored event refuses mutation."""
    (ev,) = Log().append("user_message", {"metadata": {"k": [1]}}, T0).events()
    with pytest.raises(TypeError):
        ev.data["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        ev.data["metadata"]["k"].append(2)


def test_caller_mutating_a_list_inside_its_frozen_dict_changes_nothing() -> None:
    """A caller-built ``FrozenDict`` holding a plain list does not let history change."""
    inner = [1]
    log = Log().append("user_message", {"metadata": FrozenDict({"k": inner})}, T0)
    inner.append(2)
    assert log.events()[0].data == {"metadata": {"k": [1]}}


# -- equality and pickle ----------------------------------------------------------------


def test_logs_with_the_same_events_are_equal() -> None:
    """Two logs built from the same events compare equal, memoised or not."""
    a = users(3).append("system_message", rep(0, 1), at(3))
    b = users(3).materialize()[1].append("system_message", rep(0, 1), at(3))
    assert a == b


@pytest.mark.parametrize(
    "other",
    [
        users(3).append("system_message", rep(0, 0), at(3)),
        users(3).append("system_message", rep(0, 1), at(4)),
        users(3).append("user_message", rep(0, 1), at(3)),
        users(3).append_at(4, "system_message", rep(0, 1), at(3)),
        users(3),
    ],
    ids=["range", "time", "type", "seq", "shorter"],
)
def test_logs_with_different_events_are_not_equal(other: Log) -> None:
    """Logs differing in any event, or in length, compare unequal."""
    assert users(3).append("system_message", rep(0, 1), at(3)) != other


def test_log_is_not_equal_to_other_types() -> None:
    """A log never equals a list of its events."""
    log = users(1)
    assert log != log.events()


@pytest.mark.parametrize("memoised", [False, True], ids=["lazy", "memoised"])
def test_pickle_roundtrip_keeps_the_log(memoised: bool) -> None:
    """An unpickled log equals the original: events, count (gaps and snapshots) and surface."""
    log = users(3).append("system_message", rep(0, 1), at(3)).append_at(8, "turn_end", {}, T0)
    log = step(log.snapshot(), memoised)
    copy = pickle.loads(pickle.dumps(log))
    assert copy == log
    assert snapshot_of(copy) == snapshot_of(log)


def test_unpickled_log_continues_like_the_original() -> None:
    """Appending to an unpickled log behaves as appending to the original."""
    log = users(3).append("system_message", rep(5, 6), at(3)).materialize()[1]
    copy = pickle.loads(pickle.dumps(log))
    extra = rep(1, 5, "s")
    assert snapshot_of(copy.append("system_message", extra, at(4))) == snapshot_of(
        log.append("system_message", extra, at(4))
    )


# -- documentation examples -------------------------------------------------------------


def test_log_docstring_examples_run() -> None:
    """The examples in ``nous_actor.core.log`` run and give the documented output."""
    result = doctest.testmod(nous_actor.core.log._log, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_compaction_example_from_the_docstring() -> None:
    """Replacing two messages with a summary leaves the summary alone on the surface."""
    log = Log().append("user_message", {"content": "hi"})
    log = log.append("assistant_message", {"content": "hello"})
    log = log.append("system_message", {"content": "greeting", "surface_op": ("replace", 0, 1)})
    assert [m.content for m in log.derive_messages()] == ["greeting"]
    assert (log.count(), len(log.events()), len(log.snapshot().events())) == (3, 3, 1)
