"""Event, EventType, Replace and InvalidEvent (DESIGN.md §2): validation, order, immutability."""

from __future__ import annotations

import json
import pickle
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from nous_actor import (
    Event,
    EventType,
    FrozenDict,
    FrozenList,
    InvalidEvent,
    Log,
    Replace,
    Session,
)
from nous_actor.core.event import SURFACE_TYPES, check_event, type_text
from nous_actor.testing import event_data

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NAIVE = datetime(2026, 1, 1)

SURFACE = ["system_message", "user_message", "assistant_message", "tool_result"]
BOOKKEEPING = ["tool_call", "turn_start", "turn_end", "step_start", "step_end", "request_header"]


def _reason(seq: Any = 0, etype: Any = "user_message", time: Any = T0, data: Any = None) -> str:
    """Build an event that must be refused and return the InvalidEvent's reason."""
    with pytest.raises(InvalidEvent) as info:
        Event(seq, etype, time, {} if data is None else data)
    return info.value.reason


# -- types ------------------------------------------------------------------------------


def test_event_type_has_exactly_the_ten_types() -> None:
    """EventType is a str enum whose values are the four surface and six bookkeeping types."""
    assert sorted(t.value for t in EventType) == sorted(SURFACE + BOOKKEEPING)
    assert all(isinstance(t, str) for t in EventType)


@pytest.mark.parametrize("etype", SURFACE + BOOKKEEPING)
def test_plain_string_type_becomes_the_enum_member(etype: str) -> None:
    """Each of the ten types is accepted as a plain string and stored as the enum member."""
    assert Event(0, etype, T0, {}).type is EventType(etype)


@pytest.mark.parametrize("etype", SURFACE)
def test_surface_types_are_surface(etype: str) -> None:
    """The four message types report is_surface."""
    assert Event(0, etype, T0, {}).is_surface


@pytest.mark.parametrize("etype", BOOKKEEPING)
def test_bookkeeping_types_are_not_surface(etype: str) -> None:
    """The six bookkeeping types do not report is_surface and project to no message."""
    ev = Event(0, etype, T0, {})
    assert not ev.is_surface
    assert ev.to_message() is None


def test_fields_are_kept() -> None:
    """seq, type, time and data are readable back from the event."""
    ev = Event(7, EventType.TURN_START, T0, {"k": [1]})
    assert (ev.seq, ev.type, ev.time, ev.data) == (7, EventType.TURN_START, T0, {"k": [1]})


def test_none_data_is_an_empty_object() -> None:
    """data=None is accepted and stored as an empty mapping."""
    assert Event(0, "turn_start", T0, None).data == {}  # type: ignore[arg-type]


# -- invalid_event ----------------------------------------------------------------------


@pytest.mark.parametrize("seq", [True, False], ids=repr)
def test_bool_seq_is_invalid_event(seq: bool) -> None:
    """A bool seq is refused with invalid_event (bool is not an int here)."""
    assert _reason(seq=seq) == "invalid_event"


def test_negative_seq_is_invalid_event() -> None:
    """A negative seq is refused with invalid_event."""
    assert _reason(seq=-1) == "invalid_event"


@pytest.mark.parametrize("seq", [1.0, "1", None, 2**0.5], ids=repr)
def test_non_int_seq_is_invalid_event(seq: Any) -> None:
    """A seq that is not an int is refused with invalid_event."""
    assert _reason(seq=seq) == "invalid_event"


def test_invalid_seq_message_says_what_is_expected() -> None:
    """The invalid seq message says an int >= 0 is expected and shows the value."""
    with pytest.raises(InvalidEvent, match=r"seq must be an int >= 0 \(not a bool\), got True"):
        Event(True, "user_message", T0, {})


@pytest.mark.parametrize("data", [[("content", "x")], "content", 5, ("a",)], ids=repr)
def test_non_mapping_data_is_invalid_event(data: Any) -> None:
    """data that is not a mapping is refused with invalid_event."""
    assert _reason(data=data) == "invalid_event"


def test_non_mapping_data_message_suggests_wrapping() -> None:
    """The non-mapping data message says to wrap the value in an object."""
    with pytest.raises(InvalidEvent, match=r"data must be a mapping.*got str.*wrap the value"):
        Event(0, "user_message", T0, "hello")  # type: ignore[arg-type]


def test_naive_time_is_invalid_event() -> None:
    """A naive datetime is refused with invalid_event and a hint to attach a tzinfo."""
    with pytest.raises(InvalidEvent, match=r"naive datetime.*attach a tzinfo") as info:
        Event(0, "user_message", NAIVE, {})
    assert info.value.reason == "invalid_event"


@pytest.mark.parametrize("time", ["2026-01-01T00:00:00+00:00", 0, None], ids=repr)
def test_non_datetime_time_is_invalid_event(time: Any) -> None:
    """A time that is not a datetime is refused with invalid_event."""
    assert _reason(time=time) == "invalid_event"


# -- unknown_event_type -----------------------------------------------------------------


@pytest.mark.parametrize("etype", ["user", "USER_MESSAGE", "", "message", 3, None], ids=repr)
def test_unknown_type_is_unknown_event_type(etype: Any) -> None:
    """A type outside the ten is refused with unknown_event_type."""
    assert _reason(etype=etype) == "unknown_event_type"


def test_unknown_type_message_lists_the_types() -> None:
    """The unknown type message names the bad type and lists the valid ones."""
    with pytest.raises(InvalidEvent, match=r"unknown event type 'user'; use one of: system_m"):
        Event(0, "user", T0, {})


# -- surface_op_on_non_surface_event ----------------------------------------------------


@pytest.mark.parametrize("etype", BOOKKEEPING)
def test_replace_on_bookkeeping_event_is_refused(etype: str) -> None:
    """A bookkeeping event carrying a replace is refused with surface_op_on_non_surface_event."""
    data = {"surface_op": ("replace", 0, 1)}
    assert _reason(etype=etype, data=data) == "surface_op_on_non_surface_event"


def test_append_op_on_bookkeeping_event_is_refused() -> None:
    """A bookkeeping event carrying surface_op="append" (non-None) is refused too."""
    data = {"surface_op": "append"}
    assert _reason(etype="turn_end", data=data) == "surface_op_on_non_surface_event"


@pytest.mark.parametrize("etype", BOOKKEEPING)
def test_none_surface_op_on_bookkeeping_event_is_accepted(etype: str) -> None:
    """A bookkeeping event whose surface_op is None is a valid plain event."""
    assert Event(0, etype, T0, {"surface_op": None}).surface_op is None


def test_surface_op_on_bookkeeping_message_says_to_drop_it() -> None:
    """The message names the event type and says to drop the surface_op key."""
    with pytest.raises(
        InvalidEvent, match=r"a turn_start event cannot carry.*drop the surface_op"
    ):
        Event(0, "turn_start", T0, {"surface_op": ("replace", 0, 1)})


# -- invalid_surface_op -----------------------------------------------------------------

BAD_FORMS: list[Any] = [
    "replace",
    "APPEND",
    "",
    5,
    {"start": 0, "stop": 1},
    ("replace", 0),
    ("replace", 0, 1, 2),
    ("swap", 0, 1),
    ["REPLACE", 0, 1],
    [],
    ("replace",),
    Replace,
]


@pytest.mark.parametrize("op", BAD_FORMS, ids=repr)
def test_unknown_surface_op_form_is_invalid_surface_op(op: Any) -> None:
    """A surface_op that is none of the accepted forms is refused with invalid_surface_op."""
    assert _reason(data={"surface_op": op}) == "invalid_surface_op"


@pytest.mark.parametrize(
    "op",
    [
        ("replace", 1.0, 2),
        ("replace", 0, 2.0),
        ("replace", "0", 2),
        ("replace", 0, None),
        ("replace", True, 2),
        ["replace", 0, False],
    ],
    ids=repr,
)
def test_non_int_start_or_stop_is_invalid_surface_op(op: Any) -> None:
    """A replace whose start or stop is not an int (bool excluded) is invalid_surface_op."""
    assert _reason(data={"surface_op": op}) == "invalid_surface_op"


@pytest.mark.parametrize("op", [("replace", -1, 2), ["replace", -3, -1]], ids=repr)
def test_negative_start_is_invalid_surface_op(op: Any) -> None:
    """A replace with start < 0 is refused with invalid_surface_op."""
    assert _reason(data={"surface_op": op}) == "invalid_surface_op"


@pytest.mark.parametrize("op", [("replace", 3, 2), ["replace", 1, 0]], ids=repr)
def test_stop_before_start_is_invalid_surface_op(op: Any) -> None:
    """A replace with stop < start is refused with invalid_surface_op."""
    assert _reason(data={"surface_op": op}) == "invalid_surface_op"


def test_invalid_surface_op_message_lists_the_accepted_forms() -> None:
    """The invalid_surface_op message states the problem and the forms to use instead."""
    with pytest.raises(
        InvalidEvent, match=re.escape("stop 2 < start 3; use None, 'append', Replace(start, stop)")
    ):
        Event(0, "user_message", T0, {"surface_op": ("replace", 3, 2)})


@pytest.mark.parametrize(
    ("start", "stop"), [(-1, 0), (3, 2), (0.0, 1), (0, "1"), (True, 1)], ids=repr
)
def test_replace_constructor_refuses_bad_ranges(start: Any, stop: Any) -> None:
    """Replace(start, stop) itself raises InvalidEvent(invalid_surface_op) for a bad range."""
    with pytest.raises(InvalidEvent) as info:
        Replace(start, stop)
    assert info.value.reason == "invalid_surface_op"


# -- accepted surface_op forms ----------------------------------------------------------


@pytest.mark.parametrize("etype", SURFACE)
def test_event_without_surface_op_is_a_plain_append(etype: str) -> None:
    """A surface event without surface_op has surface_op None and position == seq."""
    ev = Event(4, etype, T0, {"content": "x"})
    assert ev.surface_op is None
    assert ev.position == 4


@pytest.mark.parametrize("op", [None, "append"], ids=repr)
def test_none_and_append_are_plain_appends(op: Any) -> None:
    """surface_op None or "append" gives a plain event (surface_op None, position == seq)."""
    ev = Event(4, "user_message", T0, {"surface_op": op})
    assert ev.surface_op is None
    assert ev.position == 4


@pytest.mark.parametrize(
    "op", [Replace(1, 3), ("replace", 1, 3), ["replace", 1, 3]], ids=["Replace", "tuple", "list"]
)
def test_replace_forms_all_give_a_replace(op: Any) -> None:
    """Replace, the tuple form and the list form all give surface_op == Replace(1, 3)."""
    ev = Event(5, "system_message", T0, {"surface_op": op})
    assert ev.surface_op == Replace(1, 3)
    assert ev.position == 1


@pytest.mark.parametrize(
    "op", [Replace(1, 3), ("replace", 1, 3), ["replace", 1, 3]], ids=["Replace", "tuple", "list"]
)
def test_replace_is_stored_in_persisted_form(op: Any) -> None:
    """Every replace form is stored in data as the JSON list ["replace", start, stop]."""
    ev = Event(5, "system_message", T0, {"surface_op": op, "content": "s"})
    assert ev.data == {"surface_op": ["replace", 1, 3], "content": "s"}
    assert type(ev.data["surface_op"]) is FrozenList


def test_single_position_replace_is_valid() -> None:
    """Replace(p, p) (start == stop) is a valid replace of one position."""
    assert Event(3, "tool_result", T0, {"surface_op": ("replace", 2, 2)}).surface_op == Replace(
        2, 2
    )


def test_replace_has_no_upper_bound_on_stop() -> None:
    """Replace(0, 999) is valid whatever the log length: stop has no upper bound."""
    assert Event(10, "system_message", T0, {"surface_op": Replace(0, 999)}).surface_op == (
        Replace(0, 999)
    )


def test_replace_may_start_after_its_own_seq() -> None:
    """A replace whose range begins beyond its own seq is valid, standing at that start."""
    ev = Event(2, "user_message", T0, {"surface_op": ("replace", 50, 60)})
    assert ev.position == 50


def test_replace_compares_and_hashes_by_range() -> None:
    """Replace values are equal, and hash equal, exactly when start and stop are equal."""
    assert Replace(1, 2) == Replace(1, 2)
    assert Replace(1, 2) != Replace(1, 3)
    assert hash(Replace(1, 2)) == hash(Replace(1, 2))


def test_replace_repr_shows_the_range() -> None:
    """repr(Replace) names start and stop."""
    assert repr(Replace(1, 2)) == "Replace(start=1, stop=2)"


def test_replace_is_immutable() -> None:
    """Assigning to a Replace's start raises AttributeError."""
    r = Replace(1, 2)
    with pytest.raises(AttributeError, match="immutable"):
        r.start = 0
    assert r.start == 1


# -- unserializable_event_data ----------------------------------------------------------


def _func() -> None:
    pass


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ({1, 2}, "set"),
        (frozenset({1}), "frozenset"),
        (b"bytes", "bytes"),
        (bytearray(b"x"), "bytearray"),
        (object(), "object"),
        (_func, "function"),
        (lambda: None, "function"),
        (threading.Lock(), "lock"),
        (T0, "datetime"),
        (1 + 2j, "complex"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_non_json_value_is_unserializable(value: Any, kind: str) -> None:
    """A value JSON cannot carry is refused with unserializable_event_data."""
    assert _reason(data={"content": value}) == "unserializable_event_data"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=repr)
def test_non_finite_float_is_unserializable(value: float) -> None:
    """NaN and ±inf are refused with unserializable_event_data."""
    assert _reason(data={"x": value}) == "unserializable_event_data"


@pytest.mark.parametrize("key", [1, None, ("a",), 1.5, b"k"], ids=repr)
def test_non_str_key_is_unserializable(key: Any) -> None:
    """A mapping key that is not a str is refused with unserializable_event_data."""
    assert _reason(data={key: "v"}) == "unserializable_event_data"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"metadata": {"when": T0}}, "data['metadata']['when']"),
        ({"metadata": {"when": float("nan")}}, "data['metadata']['when']"),
        ({"xs": [1, {1, 2}]}, "data['xs'][1]"),
        ({"a": [{"b": [0, float("-inf")]}]}, "data['a'][0]['b'][1]"),
        ({"a": {"b": {7: "x"}}}, "data['a']['b'][7]"),
        ({"tool_calls": [{"id": "c", "arguments": {"f": _func}}]}, "data['tool_calls'][0]"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_unserializable_message_names_the_path(data: dict[str, Any], path: str) -> None:
    """The unserializable_event_data message names the full path of the bad value."""
    with pytest.raises(InvalidEvent, match=re.escape(path)) as info:
        Event(0, "assistant_message", T0, data)
    assert info.value.reason == "unserializable_event_data"


def test_unserializable_message_says_what_to_use() -> None:
    """The unserializable_event_data message says which value types JSON accepts."""
    with pytest.raises(InvalidEvent, match=r"cannot be stored as JSON: set value.*use str, int"):
        Event(0, "user_message", T0, {"x": {1}})


@pytest.mark.parametrize(
    "data",
    [{"x": 1}, {"x": (1, 2)}, {"x": [None, True, 1.5, "s", {"y": []}]}, {"x": -0.0}],
    ids=repr,
)
def test_json_values_are_accepted(data: dict[str, Any]) -> None:
    """Plain JSON values (tuples read as lists) are accepted and stored equal to their input."""
    assert Event(0, "turn_start", T0, data).data == {
        k: list(v) if isinstance(v, tuple) else v for k, v in data.items()
    }


def test_cyclic_data_is_unserializable() -> None:
    """Self-referencing data, which JSON cannot carry, is refused as unserializable_event_data."""
    data: dict[str, Any] = {}
    data["self"] = data
    assert _reason(data=data) == "unserializable_event_data"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"x": {1, 2}}, r"FrozenDict\['x'\]"),
        ({1: "x"}, r"FrozenDict\[1\]"),
        ({"m": {"x": float("nan")}}, r"FrozenDict\['m'\]\['x'\]"),
    ],
    ids=["set", "int_key", "nested_nan"],
)
def test_a_frozen_dict_cannot_hold_non_json(value: dict[Any, Any], path: str) -> None:
    """FrozenDict itself refuses non-JSON contents (so data wrapped in one is valid too)."""
    with pytest.raises(TypeError, match=path):
        FrozenDict(value)


def test_deeply_nested_data_is_unserializable_not_a_recursion_error() -> None:
    """Data nested past the walkable depth is refused with unserializable_event_data."""
    data: Any = []
    for _ in range(5000):
        data = [data]
    assert _reason(data={"x": data}) == "unserializable_event_data"


# -- order of checks --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"seq": -1, "etype": "nope"}, "invalid_event"),
        ({"time": NAIVE, "etype": "nope"}, "invalid_event"),
        ({"seq": True, "data": {"x": {1}}}, "invalid_event"),
        ({"etype": "nope", "data": {"surface_op": "bogus"}}, "unknown_event_type"),
        ({"etype": "nope", "data": {"x": {1}}}, "unknown_event_type"),
        (
            {"etype": "turn_start", "data": {"surface_op": "bogus"}},
            "surface_op_on_non_surface_event",
        ),
        (
            {"etype": "turn_start", "data": {"surface_op": "append", "x": {1}}},
            "surface_op_on_non_surface_event",
        ),
        ({"data": {"surface_op": ("replace", 2, 1), "x": {1}}}, "invalid_surface_op"),
        ({"data": {"surface_op": ("replace", 0, 1), 3: "x"}}, "unserializable_event_data"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_first_failing_rule_is_reported(kwargs: dict[str, Any], reason: str) -> None:
    """An event breaking two rules is refused with the reason of the earlier rule in §2 order."""
    assert _reason(**kwargs) == reason


# -- freezing, immutability, equality, pickling -----------------------------------------


def test_caller_mutation_after_construction_does_not_change_event() -> None:
    """Mutating the caller's dict and nested values afterwards never changes the event."""
    tags = ["a"]
    meta: dict[str, Any] = {"tags": tags}
    data: dict[str, Any] = {"content": "hi", "metadata": meta}
    ev = Event(0, "user_message", T0, data)
    data["content"] = "changed"
    meta["new"] = 1
    tags.append("b")
    assert ev.data == {"content": "hi", "metadata": {"tags": ["a"]}}


def test_caller_mutation_inside_a_frozen_dict_does_not_change_event() -> None:
    """A list inside a caller-built FrozenDict is copied, so mutating it changes nothing."""
    inner = [1]
    ev = Event(0, "user_message", T0, FrozenDict({"content": inner}))
    inner.append(2)
    assert ev.data == {"content": [1]}


def test_event_data_refuses_mutation() -> None:
    """event.data and its nested values raise TypeError on mutation."""
    ev = Event(0, "user_message", T0, {"metadata": {"tags": ["a"]}})
    with pytest.raises(TypeError, match="immutable"):
        ev.data["content"] = "x"
    with pytest.raises(TypeError, match="immutable"):
        ev.data["metadata"]["tags"].append("b")
    assert ev.data == {"metadata": {"tags": ["a"]}}


@pytest.mark.parametrize("attr", ["seq", "type", "time", "data", "surface_op", "position"])
def test_event_attributes_cannot_be_assigned(attr: str) -> None:
    """Assigning any attribute of an Event raises AttributeError."""
    ev = Event(0, "user_message", T0, {})
    with pytest.raises(AttributeError):
        setattr(ev, attr, None)
    assert ev.seq == 0


def test_event_attributes_cannot_be_deleted() -> None:
    """Deleting an attribute of an Event raises AttributeError."""
    ev = Event(0, "user_message", T0, {})
    with pytest.raises(AttributeError):
        del ev.seq
    assert ev.seq == 0


def test_time_is_normalised_to_utc() -> None:
    """An aware time in another zone is stored as the same instant in UTC."""
    local = datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2)))
    ev = Event(0, "user_message", local, {})
    assert ev.time.tzinfo is UTC
    assert ev.time == T0


def test_equal_events_are_equal_and_hash_equal() -> None:
    """Events with the same seq, type, instant and data are equal with equal hashes."""
    local = T0.astimezone(timezone(timedelta(hours=-5)))
    a = Event(1, "user_message", T0, {"content": "x"})
    b = Event(1, EventType.USER_MESSAGE, local, {"content": "x"})
    assert a == b
    assert hash(a) == hash(b)


@pytest.mark.parametrize(
    "other",
    [
        Event(2, "user_message", T0, {"content": "x"}),
        Event(1, "system_message", T0, {"content": "x"}),
        Event(1, "user_message", T0 + timedelta(microseconds=1), {"content": "x"}),
        Event(1, "user_message", T0, {"content": "y"}),
    ],
    ids=["seq", "type", "time", "data"],
)
def test_events_differing_in_one_field_are_unequal(other: Event) -> None:
    """Changing seq, type, time or data makes events unequal."""
    assert Event(1, "user_message", T0, {"content": "x"}) != other


_types = st.sampled_from(list(EventType))


@given(
    st.integers(0, 10**9),
    _types.flatmap(lambda t: st.tuples(st.just(t), event_data(t))),
    st.sampled_from([None, Replace(0, 3), ("replace", 2, 10**6)]),
)
def test_pickle_round_trip(seq: int, typed: tuple[EventType, dict[str, Any]], op: Any) -> None:
    """A pickled event unpickles equal, with the same surface_op and frozen data."""
    etype, data = typed
    if op is not None and etype.value in SURFACE:
        data = {**data, "surface_op": op}
    ev = Event(seq, etype, T0, data)
    back = pickle.loads(pickle.dumps(ev))
    assert back == ev
    assert back.surface_op == ev.surface_op
    assert back.position == ev.position
    assert type(back.data) is FrozenDict


def test_pickled_replace_round_trips() -> None:
    """A pickled Replace unpickles equal."""
    assert pickle.loads(pickle.dumps(Replace(3, 9))) == Replace(3, 9)


def test_invalid_event_is_a_value_error() -> None:
    """InvalidEvent is a ValueError, so generic handlers catch it."""
    with pytest.raises(ValueError, match="unknown event type"):
        Event(0, "nope", T0, {})


def test_invalid_event_pickles_with_its_reason() -> None:
    """A pickled InvalidEvent keeps its reason and message (e.g. across processes)."""
    exc = InvalidEvent("invalid_surface_op", "bad op")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.reason, str(back)) == ("invalid_surface_op", "bad op")


def test_with_seq_keeps_everything_but_the_seq() -> None:
    """with_seq copies an event under another seq, keeping type, time, data and op."""
    ev = Event(2, "system_message", T0, {"surface_op": ("replace", 0, 1), "content": "s"})
    moved = ev.with_seq(9)
    assert (moved.seq, moved.type, moved.time, moved.data) == (9, ev.type, ev.time, ev.data)
    assert moved.surface_op == Replace(0, 1)
    assert moved.position == 0


# -- caller data that fails when read (every entry point) --------------------------------
#
# Whatever the caller's objects raise while the event is read is refused as
# InvalidEvent, never let through: unreadable data is data JSON cannot carry
# (unserializable_event_data, naming the path), an unreadable surface_op is
# invalid_surface_op, an unreadable type unknown_event_type, an unreadable seq
# or time invalid_event.

_ARMED = [False]


@contextmanager
def _armed() -> Iterator[None]:
    """Hostile objects below behave until armed (so that they can be built into dicts)."""
    _ARMED[0] = True
    try:
        yield
    finally:
        _ARMED[0] = False


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


_EXCS: dict[str, Callable[[], BaseException]] = {
    "ValueError": lambda: ValueError("boom"),
    "KeyError": lambda: KeyError("k"),
    "TypeError": lambda: TypeError("t"),
    "RuntimeError": lambda: RuntimeError("r"),
    "AttributeError": lambda: AttributeError("a"),
    "StopIteration": StopIteration,
    "RecursionError": lambda: RecursionError("deep"),
    "Unprintable": Unprintable,
}


def _trip(where: str, fail: str, exc: str) -> None:
    if _ARMED[0] and where == fail:
        raise _EXCS[exc]()


class HostileMapping(Mapping[Any, Any]):
    """A Mapping whose method ``fail`` raises ``exc`` once armed."""

    def __init__(self, items: dict[Any, Any], fail: str = "__iter__", exc: str = "ValueError"):
        self._items, self._fail, self._exc = items, fail, exc

    def __getitem__(self, key: Any) -> Any:
        _trip("__getitem__", self._fail, self._exc)
        return self._items[key]

    def __iter__(self) -> Iterator[Any]:
        _trip("__iter__", self._fail, self._exc)
        return iter(self._items)

    def __len__(self) -> int:
        _trip("__len__", self._fail, self._exc)
        return len(self._items)

    def items(self) -> Any:
        _trip("items", self._fail, self._exc)
        return super().items()

    def get(self, key: Any, default: Any = None) -> Any:
        _trip("get", self._fail, self._exc)
        return super().get(key, default)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        _trip("__class__", self._fail, self._exc)
        return HostileMapping


class HostileDict(dict[Any, Any]):
    """A dict subclass whose method ``fail`` raises ``exc`` once armed."""

    def __init__(self, items: dict[Any, Any], fail: str = "items", exc: str = "ValueError"):
        super().__init__(items)
        self._fail, self._exc = fail, exc

    def items(self) -> Any:
        _trip("items", self._fail, self._exc)
        return super().items()

    def get(self, key: Any, default: Any = None) -> Any:
        _trip("get", self._fail, self._exc)
        return super().get(key, default)

    def keys(self) -> Any:
        _trip("keys", self._fail, self._exc)
        return super().keys()

    def __getitem__(self, key: Any) -> Any:
        _trip("__getitem__", self._fail, self._exc)
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[Any]:
        _trip("__iter__", self._fail, self._exc)
        return super().__iter__()

    def __len__(self) -> int:
        _trip("__len__", self._fail, self._exc)
        return super().__len__()


class HostileList(list[Any]):
    def __init__(self, items: list[Any], fail: str = "__iter__", exc: str = "ValueError"):
        super().__init__(items)
        self._fail, self._exc = fail, exc

    def __iter__(self) -> Iterator[Any]:
        _trip("__iter__", self._fail, self._exc)
        return super().__iter__()

    def __len__(self) -> int:
        _trip("__len__", self._fail, self._exc)
        return super().__len__()

    def __getitem__(self, i: Any) -> Any:
        _trip("__getitem__", self._fail, self._exc)
        return super().__getitem__(i)


class HostileStr(str):
    """A str whose __str__, __repr__, __hash__ and __eq__ raise once armed."""

    _exc: str

    def __new__(cls, text: str, exc: str = "ValueError") -> HostileStr:
        self = super().__new__(cls, text)
        self._exc = exc
        return self

    def _check(self) -> None:
        _trip("any", "any", self._exc)

    def __str__(self) -> str:
        self._check()
        return str.__str__(self)

    def __repr__(self) -> str:
        self._check()
        return str.__repr__(self)

    def __hash__(self) -> int:
        self._check()
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        self._check()
        return str.__eq__(self, other)


class HostileInt(int):
    def __lt__(self, other: object) -> bool:
        _trip("any", "any", "ValueError")
        return int.__lt__(self, other)  # type: ignore[operator]

    def __int__(self) -> int:
        _trip("any", "any", "ValueError")
        return int.__int__(self)

    def __repr__(self) -> str:
        _trip("any", "any", "ValueError")
        return int.__repr__(self)


class HostileKey:
    """A non-str key whose __hash__, __eq__ and __repr__ raise once armed."""

    def __hash__(self) -> int:
        _trip("any", "any", "ValueError")
        return 1

    def __eq__(self, other: object) -> bool:
        _trip("any", "any", "ValueError")
        return self is other

    def __repr__(self) -> str:
        _trip("any", "any", "ValueError")
        return "HostileKey()"


class HostileTZ(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        _trip("any", "any", "ValueError")
        return timedelta(hours=1)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "hostile"


def _log_append(etype: Any, data: Any, time: Any) -> Any:
    return Log().append(etype, data, time)


def _event(etype: Any, data: Any, time: Any) -> Any:
    return Event(0, etype, time, data)


def _log_append_at(etype: Any, data: Any, time: Any) -> Any:
    return Log().append_at(3, etype, data, time)


_STRICT = {"Log.append": _log_append, "Log.append_at": _log_append_at, "Event": _event}

HOSTILE: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    # (id, make the append's arguments, reason, text the message must hold)
    (
        "mapping_iter_raises",
        lambda: {"data": HostileMapping({"content": "x"}, "__iter__")},
        "unserializable_event_data",
        "data cannot be stored as JSON: HostileMapping raised ValueError: boom when read",
    ),
    (
        "mapping_items_raises",
        lambda: {"data": HostileMapping({"content": "x"}, "items")},
        "unserializable_event_data",
        "data cannot be stored as JSON",
    ),
    (
        "mapping_getitem_raises",
        lambda: {"data": HostileMapping({"content": "x"}, "__getitem__")},
        "unserializable_event_data",
        "raised ValueError: boom",
    ),
    (
        "mapping_class_raises",
        lambda: {"data": HostileMapping({"content": "x"}, "__class__", "RuntimeError")},
        "unserializable_event_data",
        "raised RuntimeError",
    ),
    (
        "nested_mapping_raises",
        lambda: {"data": {"metadata": {"m": HostileMapping({"a": 1}, "__iter__", "KeyError")}}},
        "unserializable_event_data",
        "data['metadata']['m'] cannot be stored as JSON: HostileMapping raised KeyError",
    ),
    (
        "dict_subclass_items_raises",
        lambda: {"data": {"metadata": HostileDict({"a": 1}, "items", "TypeError")}},
        "unserializable_event_data",
        "data['metadata'] cannot be stored as JSON: HostileDict raised TypeError: t",
    ),
    (
        "list_iter_raises",
        lambda: {"data": {"content": [{"type": "text"}, HostileList([1], "__iter__")]}},
        "unserializable_event_data",
        "data['content'][1] cannot be stored as JSON: HostileList raised ValueError",
    ),
    (
        "exception_with_a_broken_str",
        lambda: {"data": HostileMapping({"content": "x"}, "__iter__", "Unprintable")},
        "unserializable_event_data",
        "Unprintable (unprintable)",
    ),
    (
        "recursion_error_while_reading",
        lambda: {"data": {"x": HostileMapping({"a": 1}, "__iter__", "RecursionError")}},
        "unserializable_event_data",
        "recursed without end",
    ),
    (
        "stop_iteration_while_reading",
        lambda: {"data": {"x": HostileList([1], "__iter__", "StopIteration")}},
        "unserializable_event_data",
        "data['x'] cannot be stored as JSON: HostileList raised StopIteration",
    ),
    (
        "non_str_key_with_broken_hash_and_repr",
        lambda: {"data": {"metadata": {HostileKey(): 1}}},
        "unserializable_event_data",
        "of type HostileKey is not a string",
    ),
    (
        "surface_op_list_iter_raises",
        lambda: {"data": {"surface_op": HostileList(["replace", 0, 1], "__iter__")}},
        "invalid_surface_op",
        "HostileList raised ValueError: boom",
    ),
    (
        "type_str_hash_raises_on_unknown_text",
        lambda: {"etype": HostileStr("nope")},
        "unknown_event_type",
        "unknown event type",
    ),
    (
        "type_object_class_raises",
        lambda: {"etype": HostileMapping({}, "__class__")},
        "unknown_event_type",
        "the event type could not be read: it raised ValueError: boom",
    ),
    (
        "time_utcoffset_raises",
        lambda: {"time": datetime(2026, 1, 1, tzinfo=HostileTZ())},
        "invalid_event",
        "time could not be read: it raised ValueError: boom",
    ),
]


@pytest.mark.parametrize("entry", sorted(_STRICT))
@pytest.mark.parametrize(
    ("make", "reason", "text"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_caller_objects_that_raise_when_read_are_invalid_events(
    entry: str, make: Callable[[], dict[str, Any]], reason: str, text: str
) -> None:
    """Log.append, Log.append_at and Event refuse caller objects that raise when read with
    InvalidEvent (the reason that fits, the message naming what could not be read)."""
    kwargs: dict[str, Any] = {"etype": "user_message", "data": None, "time": T0, **make()}
    with _armed(), pytest.raises(InvalidEvent, match=re.escape(text)) as info:
        _STRICT[entry](kwargs["etype"], kwargs["data"], kwargs["time"])
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("data", "stored", "op"),
    [
        pytest.param(
            lambda: HostileMapping({"content": "x"}, "get", "RuntimeError"),
            {"content": "x"},
            None,
            id="mapping_get_raises",
        ),
        pytest.param(
            lambda: {"surface_op": HostileList(["replace", 0, 1], "__len__")},
            {"surface_op": ["replace", 0, 1]},
            Replace(0, 1),
            id="surface_op_list_len_raises",
        ),
        pytest.param(
            lambda: {"surface_op": HostileStr("append")},
            {"surface_op": "append"},
            None,
            id="surface_op_str_eq_raises",
        ),
    ],
)
@pytest.mark.parametrize("entry", sorted(_STRICT))
def test_caller_objects_are_read_once_by_their_content(
    entry: str, data: Callable[[], Any], stored: dict[str, Any], op: Replace | None
) -> None:
    """The caller's data is read once, by its content (a mapping's ``items``, a list's
    items, a str's text), and every rule is checked on that frozen copy: a method the
    reading never calls (``get``, ``__len__``, ``__eq__``) cannot refuse it, nor make
    the event differ from what is stored."""
    with _armed():
        got = _STRICT[entry]("user_message", data(), T0)
    ev = got if isinstance(got, Event) else got.events()[0]
    assert dict(ev.data) == stored
    assert ev.surface_op == op


@pytest.mark.parametrize(("make", "reason"), [pytest.param(h[1], h[2], id=h[0]) for h in HOSTILE])
def test_append_or_log_drops_caller_objects_that_raise_when_read(
    make: Callable[[], dict[str, Any]], reason: str
) -> None:
    """Log.append_or_log never raises for them: it logs log.event_dropped and changes nothing."""
    kwargs: dict[str, Any] = {"etype": "user_message", "data": None, "time": T0, **make()}
    base = Log().append("user_message", {"content": "before"}, T0)
    with _armed(), capture_logs() as logs:
        after = base.append_or_log(kwargs["etype"], kwargs["data"], kwargs["time"])
    assert after is base
    assert [(e["event"], e["log_level"], e["reason"]) for e in logs] == [
        ("log.event_dropped", "warning", reason)
    ]


def test_a_str_subclass_type_with_broken_methods_is_read_by_its_text() -> None:
    """An event type given as a str subclass is looked up by its plain text, never hashed."""
    with _armed():
        kind, _, _, _ = check_event(0, HostileStr("user_message"), T0, {})
    assert kind is EventType.USER_MESSAGE


def test_a_seq_of_an_int_subclass_is_stored_as_a_plain_int() -> None:
    """An int-subclass seq is read with int's own methods and stored as a plain int."""
    with _armed():
        ev = Event(HostileInt(4), "user_message", T0, {})
    assert type(ev.seq) is int
    assert ev.seq == 4


def test_a_replace_of_int_subclasses_holds_plain_ints() -> None:
    """Replace(start, stop) of int subclasses holds plain ints; their methods never run."""
    with _armed():
        op = Replace(HostileInt(1), HostileInt(2))
    assert (type(op.start), type(op.stop)) == (int, int)
    assert op == Replace(1, 2)


def test_session_entry_points_refuse_caller_data_that_raises_when_read() -> None:
    """Session.append fails with InvalidEvent and Session.append_or_log resolves to None
    (logging the drop) for a mapping that raises when read; the session runs on."""
    session = Session.start("hostile", timeout=10.0)
    try:
        with _armed(), capture_logs() as logs:
            bad = session.append("user_message", HostileMapping({"content": "x"}))
            dropped = session.append_or_log("user_message", HostileMapping({"content": "x"}))
            with pytest.raises(InvalidEvent, match="raised ValueError: boom") as info:
                bad.get()
            assert info.value.reason == "unserializable_event_data"
            assert dropped.get() is None
        drops = [e for e in logs if e["event"] == "log.event_dropped"]
        assert [(e["session_id"], e["reason"]) for e in drops] == [
            ("hostile", "unserializable_event_data")
        ]
        assert session.append("user_message", {"content": "ok"}).get().seq == 0
    finally:
        session.stop()


# -- the property: nothing the caller passes makes append_or_log raise -------------------

_EXC_NAMES = sorted(_EXCS)
_plain_leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=5)


def _hostile_mappings(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=3) | st.builds(
        HostileStr, st.text(max_size=3), st.sampled_from(_EXC_NAMES)
    )
    items = st.dictionaries(st.text(max_size=3), children, max_size=3)
    return st.one_of(
        items,
        st.dictionaries(keys, children, max_size=3),
        st.builds(
            HostileMapping,
            items,
            st.sampled_from(
                ["__iter__", "__getitem__", "__len__", "items", "get", "__class__", "-"]
            ),
            st.sampled_from(_EXC_NAMES),
        ),
        st.builds(
            HostileDict,
            items,
            st.sampled_from(["items", "keys", "__iter__", "__getitem__", "__len__", "get", "-"]),
            st.sampled_from(_EXC_NAMES),
        ),
        st.builds(lambda: {HostileKey(): 1}),
    )


def _hostile_tree(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3),
        st.builds(
            HostileList,
            st.lists(children, max_size=3),
            st.sampled_from(["__iter__", "__len__", "__getitem__", "-"]),
            st.sampled_from(_EXC_NAMES),
        ),
        _hostile_mappings(children),
    )


_hostile_values = st.recursive(
    _plain_leaves
    | st.builds(HostileStr, st.text(max_size=5), st.sampled_from(_EXC_NAMES))
    | st.builds(HostileInt, st.integers()),
    _hostile_tree,
    max_leaves=8,
)
_surface_ops = st.one_of(
    st.just(None),
    st.builds(HostileStr, st.just("append"), st.sampled_from(_EXC_NAMES)),
    st.builds(
        HostileList,
        st.just(["replace", 0, 1]),
        st.sampled_from(["__iter__", "__len__", "__getitem__", "-"]),
        st.sampled_from(_EXC_NAMES),
    ),
    st.builds(
        lambda a, b: ["replace", HostileInt(a), HostileInt(b)],
        st.integers(0, 3),
        st.integers(0, 3),
    ),
)


@st.composite
def _hostile_appends(draw: st.DrawFn) -> tuple[EventType, Any, datetime]:
    etype = draw(st.sampled_from(list(EventType)))
    top = draw(_hostile_mappings(_hostile_values))
    if isinstance(top, dict) and etype in SURFACE_TYPES and draw(st.booleans()):
        dict.__setitem__(top, "surface_op", draw(_surface_ops))
    time = draw(st.sampled_from([T0] * 7 + [datetime(2026, 1, 1, tzinfo=HostileTZ())]))
    return etype, top, time


_REASONS = {
    "invalid_event",
    "unserializable_event_data",
    "invalid_surface_op",
    "surface_op_on_non_surface_event",
}


@settings(max_examples=300, deadline=None)
@given(_hostile_appends())
def test_append_or_log_never_raises_for_hostile_containers(
    args: tuple[EventType, Any, datetime],
) -> None:
    """Whatever hostile containers the data holds, Log.append_or_log never raises and never
    drops silently: it appends a JSON-clean event, or returns the log unchanged and logs one
    log.event_dropped warning; Log.append agrees, failing only with InvalidEvent."""
    etype, data, time = args
    base = Log()
    with _armed():
        with capture_logs() as logs:
            after = base.append_or_log(etype, data, time)
        try:
            strict: Log | InvalidEvent = base.append(etype, data, time)
        except InvalidEvent as exc:
            strict = exc
    drops = [e for e in logs if e["event"] == "log.event_dropped"]
    if after is base:
        assert [(e["log_level"], e["type"]) for e in drops] == [("warning", etype.value)]
        assert drops[0]["reason"] in _REASONS
        assert isinstance(strict, InvalidEvent)
        assert strict.reason == drops[0]["reason"]
    else:
        assert drops == []
        assert after.count() == 1
        assert isinstance(strict, Log)
        (ev,) = after.events()
        json.dumps(ev.data, allow_nan=False)  # what was stored is plain JSON
        assert strict.events()[0].data == ev.data


def test_type_text_shows_any_caller_type_without_running_its_code() -> None:
    """type_text (for log lines such as log.event_dropped) never raises, whatever the type."""
    with _armed():
        assert type_text(HostileStr("nope")) == "nope"
        assert type_text(HostileMapping({}, "__class__")).startswith("<unreadable")
        assert type_text(HostileKey()) == "<HostileKey>"
    assert type_text(EventType.USER_MESSAGE) == "user_message"
    assert type_text(None) == "None"


# -- comparison ---------------------------------------------------------------------


@settings(max_examples=50)
@given(
    seq=st.integers(0, 2**63 - 1),
    typed=st.sampled_from(list(EventType)).flatmap(lambda t: st.tuples(st.just(t), event_data(t))),
    other_seq=st.integers(0, 2**63 - 1),
)
def test_not_equal_is_the_negation_of_equal(
    seq: int, typed: tuple[EventType, dict[str, Any]], other_seq: int
) -> None:
    """``!=`` answers as ``==`` does, negated, for equal events made apart and for
    different ones (it answered by identity: two equal events were both ``==`` and
    ``!=``)."""
    etype, data = typed
    a, b = Event(seq, etype, T0, data), Event(seq, etype, T0, data)
    assert a == b
    assert (a != b) is False
    c = Event(other_seq, etype, T0, data)
    assert (a == c) is (seq == other_seq)
    assert (a != c) is (seq != other_seq)
    assert a != "not an event"
    assert (a == "not an event") is False
