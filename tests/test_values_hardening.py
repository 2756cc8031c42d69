"""What an append accepts is what is stored, and what is stored every reader reads back.

The value validated is the frozen copy, never the caller's object (read once); keys,
ids and times become exact ``str``/``datetime`` at the call; one depth limit, one
size limit and one int-length limit are checked at the call and at import; a decoder
error is always a typed `CodecError`, whatever the reader's recursion limit.
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import (
    CodecError,
    Event,
    FrozenDict,
    FrozenList,
    InvalidEvent,
    Log,
    MemoryStore,
    Message,
    Replace,
    Session,
    Sessions,
    SQLiteStore,
)
from nous_actor.core import codec, limits
from nous_actor.core.event import check_event
from nous_actor.core.ids import check_session_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@contextmanager
def recursion_limit(n: int) -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(n)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@contextmanager
def max_event_bytes(n: int) -> Iterator[None]:
    old = limits.set_max_event_bytes(n)
    try:
        yield
    finally:
        limits.set_max_event_bytes(old)


def _refused(reason: str, *args: Any) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as info:
        Log().append(*args)
    assert info.value.reason == reason, str(info.value)
    return info.value


def _row(ev: Event) -> tuple[int, str, str, str]:
    return (ev.seq, ev.type.value, codec.format_time(ev.time), codec.encode_data(ev))


def _reopened(ev: Event) -> Event:
    """The event as a store reads it back (its row decoded)."""
    return codec.event_from_row(*_row(ev))


# -- item 2: the value validated is the frozen one ----------------------------------------


class Key(str):
    """A str key whose hash differs from its text's: a plain dict's ``get`` misses it."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)


class TwoFaced(Mapping[str, Any]):
    """A mapping whose ``get`` says one thing and whose ``items`` another."""

    def __init__(self, items: dict[str, Any], get: dict[str, Any]) -> None:
        self._items, self._get = items, get

    def __getitem__(self, key: str) -> Any:
        return self._get[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._get.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> Any:
        return self._items.items()


def test_a_str_subclass_surface_op_key_on_a_bookkeeping_event_is_refused() -> None:
    """A ``surface_op`` key the caller's dict hides from ``get`` is seen in the frozen
    value: on a bookkeeping event it is refused at the call, not stored unreadable."""
    data = {Key("surface_op"): ["replace", 0, 0], "n": 1}
    _refused("surface_op_on_non_surface_event", "turn_start", data)


def test_a_mapping_whose_get_lies_cannot_smuggle_a_surface_op() -> None:
    """A mapping whose ``get`` hides the ``surface_op`` its ``items`` hold is judged by
    what it holds."""
    sneaky = TwoFaced({"surface_op": ["replace", 0, 0]}, {})
    _refused("surface_op_on_non_surface_event", "turn_start", sneaky)
    # The other way round: get() claims a replace, items() holds none: a plain append.
    honest_items = TwoFaced({"content": "x"}, {"surface_op": ["replace", 0, 0]})
    ev = Log().append("user_message", honest_items).events()[0]
    assert ev.surface_op is None
    assert dict(ev.data) == {"content": "x"}


@pytest.mark.parametrize(
    "data",
    [
        {Key("surface_op"): ["replace", 0, 0], "content": "summary"},
        TwoFaced({"surface_op": ("replace", 0, 0), "content": "summary"}, {}),
        TwoFaced({"content": "summary"}, {"surface_op": Replace(0, 0)}),
    ],
)
def test_the_live_surface_is_the_surface_after_reopening(data: Any) -> None:
    """Whatever the caller's object claims, the event's surface_op is its data's, so the
    surface a session shows is the surface it shows after a restart."""
    log = Log().append("user_message", {"content": "a"}).append("user_message", data)
    ev = log.events()[1]
    again = _reopened(ev)
    assert again == ev
    assert again.surface_op == ev.surface_op
    assert Log.restore([_reopened(e) for e in log.events()]).derive_messages() == (
        log.derive_messages()
    )


class LyingTime(datetime):
    """A UTC datetime whose text drops its offset, and whose conversion lies."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return "2026-01-01T00:00:00"

    def astimezone(self, tz: Any = None) -> datetime:
        return datetime(1999, 1, 1)

    def utcoffset(self) -> timedelta | None:
        return None


class SneakyOffset(timedelta):
    """A timedelta subclass whose fields could be overridden."""


@pytest.mark.parametrize(
    "time",
    [
        LyingTime(2026, 1, 1, 12, 30, tzinfo=UTC),
        LyingTime(2026, 1, 1, 14, 30, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_a_datetime_subclass_becomes_an_exact_utc_datetime(time: datetime) -> None:
    """A datetime subclass is read once, through datetime's own fields, and kept as an
    exact UTC ``datetime``: its own isoformat/astimezone/utcoffset are never trusted,
    and what is acknowledged is read back."""
    for ev in (Log().append("user_message", {"content": "x"}, time).events()[0],):
        assert type(ev.time) is datetime
        assert ev.time.tzinfo is UTC
        assert ev.time == datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
        assert _reopened(ev) == ev
    _, t, _, _ = check_event(0, "user_message", time, None)
    assert type(t) is datetime


def test_an_event_built_directly_keeps_an_exact_time() -> None:
    ev = Event(0, "user_message", LyingTime(2026, 1, 1, tzinfo=UTC), {"content": "x"})
    assert type(ev.time) is datetime
    assert codec.loads_event(codec.dumps_event(ev)) == ev


def test_a_datetime_subclass_through_a_store_reopens(tmp_path: Path) -> None:
    """The trial's case: acknowledged through a session on SQLite, then reopened."""
    store = SQLiteStore(tmp_path / "t.db")
    try:
        s = Session.start("t", store=store)
        s.append("user_message", {"content": "x"}, LyingTime(2026, 1, 1, tzinfo=UTC)).get(
            timeout=10
        )
        s.stop()
        s = Session.start("t", store=store)
        assert s.count().get(timeout=10) == 1
        s.stop()
    finally:
        store.close()


def test_keys_are_exact_str_in_the_stored_value() -> None:
    ev = Log().append("user_message", {Key("content"): "x"}).events()[0]
    (k,) = ev.data.keys()
    assert type(k) is str


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), json_value, max_size=5),
    st.sampled_from(["user_message", "turn_start", "tool_call", "assistant_message"]),
    st.booleans(),
)
def test_what_is_acknowledged_is_what_reopens(
    data: dict[str, Any], etype: str, wrap: bool
) -> None:
    """Property: an accepted event, however its keys were spelled (str subclasses with
    their own hash), decodes from its stored row to the same event."""
    given_data: Any = {Key(k) if wrap else k: v for k, v in data.items()}
    try:
        ev = Log().append(etype, given_data, T0).events()[0]
    except InvalidEvent as exc:
        assert exc.reason in {"unserializable_event_data", "invalid_surface_op"}
        return
    assert _reopened(ev) == ev
    assert codec.loads_event(codec.dumps_event(ev)) == ev


# -- item 3: one depth limit --------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    """A dict ``depth`` containers deep (the dict itself included)."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _nested_list(depth: int) -> Any:
    value: Any = [1]
    for _ in range(depth - 2):
        value = [value]
    return {"a": value}


def test_the_depth_limit_is_documented_and_accepted_up_to_it() -> None:
    """``data`` nested exactly MAX_DATA_DEPTH containers deep is accepted and reads back."""
    assert limits.MAX_DATA_DEPTH == 100
    for data in (_nested(limits.MAX_DATA_DEPTH), _nested_list(limits.MAX_DATA_DEPTH)):
        ev = Log().append("tool_result", data).events()[0]
        assert _reopened(ev) == ev
        assert codec.loads_event(codec.dumps_event(ev)) == ev


@pytest.mark.parametrize("make", [_nested, _nested_list])
def test_one_level_deeper_is_refused_at_the_call_naming_the_path_and_limit(make: Any) -> None:
    exc = _refused("unserializable_event_data", "tool_result", make(limits.MAX_DATA_DEPTH + 1))
    assert "data['a']" in str(exc)
    assert str(limits.MAX_DATA_DEPTH) in str(exc)


def test_a_raised_recursion_limit_does_not_raise_the_depth_limit() -> None:
    """A writer with a raised recursion limit cannot acknowledge what a default reader
    cannot read."""
    with recursion_limit(20_000):
        _refused("unserializable_event_data", "tool_result", _nested(2_000))
        _refused("unserializable_event_data", "tool_result", _nested(limits.MAX_DATA_DEPTH + 1))


def test_frozen_values_count_toward_the_depth_of_where_they_are_put() -> None:
    """A FrozenDict within the limit on its own is too deep below another 60 levels."""
    inner = FrozenDict(_nested(60))
    outer: Any = inner
    for _ in range(60):
        outer = {"b": outer}
    _refused("unserializable_event_data", "tool_result", outer)
    deep_content = Message.user([_nested(60)])  # frozen on construction
    outer2: Any = {"c": list(deep_content.content or [])}
    for _ in range(45):
        outer2 = {"b": outer2}
    _refused("unserializable_event_data", "tool_result", outer2)


@pytest.mark.parametrize("limit", [150, 300, 1000, 5000])
def test_every_reader_reads_the_deepest_accepted_value_whatever_its_recursion_limit(
    limit: int,
) -> None:
    """A stored row at the depth limit decodes under a low (or high) recursion limit."""
    ev = Log().append("tool_result", _nested(limits.MAX_DATA_DEPTH)).events()[0]
    row = _row(ev)
    line = codec.dumps_event(ev)
    with recursion_limit(limit):
        assert codec.event_from_row(*row) == ev
        assert codec.passing_event_from_row(*row) == ev
        assert codec.loads_event(line) == ev


@pytest.mark.parametrize("limit", [150, 1000, 5000])
@pytest.mark.parametrize("depth", [980, 984, 990, 3000, 100_000])
def test_a_deep_row_decodes_or_is_a_codec_error_never_an_argument_error(
    limit: int, depth: int
) -> None:
    """A stored row deeper than the C scanner can read under the reader's recursion limit
    (the trial's 984 deep under the default limit raised ``ctypes.ArgumentError``) is
    read without recursion; a malformed one is a `CodecError`; an import of one deeper
    than an append accepts is refused as the append would be."""
    text = '{"a":' * depth + "1" + "}" * depth
    time = codec.format_time(T0)
    with recursion_limit(limit):
        for decode in (codec.event_from_row, codec.passing_event_from_row):
            ev = decode(7, "tool_result", time, text)
            assert (ev.seq, list(ev.data)) == (7, ["a"])
            with pytest.raises(CodecError, match="not valid JSON"):
                decode(7, "tool_result", time, text[:-1])
            with pytest.raises(CodecError, match="not valid JSON"):
                decode(7, "tool_result", time, text[:-1] + "]")
        line = '{"seq":0,"type":"tool_result","time":"2026-01-01T00:00:00+00:00","data":'
        with pytest.raises(CodecError) as info:
            codec.loads_event(line + text + "}")
        assert info.value.reason == "unserializable_event_data"
        with pytest.raises(CodecError, match="not valid JSON"):
            codec.loads_event(line + text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":[1,2.5,-3e2,true,false,null,"x\\u00e9",{},[]],"b":{"c":"d"}}',
        '{ "a" : [ 1 , { "b" : [ ] } ] , "c" : "\\ud83d\\ude00" }',
        '{"a":1,"a":2}',
    ],
)
def test_the_decoder_without_recursion_reads_as_the_scanner_does(text: str) -> None:
    """The fallback reads every value exactly as the C scanner does."""
    assert codec._scan_flat(text, 0, codec._frozen_object)[0] == json.loads(text)
    deep = '{"w":' * 3000 + text + "}" * 3000
    with recursion_limit(200):
        ev = codec.event_from_row(0, "tool_result", codec.format_time(T0), deep)
    value: Any = ev.data
    for _ in range(3000):
        value = value["w"]
    assert value == json.loads(text)


@pytest.mark.parametrize(
    "bad", ["[1,]", '{"a":1,}', '{"a" 1}', "[NaN]", "[-Infinity]", "[1e999]", '["\x01"]', "[01]"]
)
def test_the_decoder_without_recursion_refuses_what_the_scanner_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match=r"Expecting|not valid|overflows|JSON|Invalid"):
        codec._scan_flat(bad, 0, codec._frozen_object)
    with pytest.raises(CodecError), recursion_limit(200):
        codec.event_from_row(
            0, "tool_result", codec.format_time(T0), '{"w":' * 300 + bad + "}" * 300
        )


def test_encoding_an_accepted_value_works_under_a_low_recursion_limit() -> None:
    """The committer encodes what the call accepted, whatever the recursion limit."""
    ev = Log().append("tool_result", _nested(limits.MAX_DATA_DEPTH)).events()[0]
    expected = json.dumps(ev.data, separators=(",", ":"), ensure_ascii=False)
    with recursion_limit(120):
        assert codec.encode_data(ev) == expected
        line = codec.dumps_event(ev)
    assert codec.loads_event(line) == ev


# -- item 4 (at the call): ints, times, seqs ---------------------------------------------


def test_an_int_over_the_digit_limit_is_refused_at_the_call() -> None:
    big = 10**limits.MAX_INT_DIGITS  # 4301 digits
    for data in ({"n": big}, {"n": [big]}, {"n": {"m": -big}}, {"n": [[True, big]]}):
        exc = _refused("unserializable_event_data", "tool_result", data)
        assert "data['n']" in str(exc)
        assert str(limits.MAX_INT_DIGITS) in str(exc)
    fine = 10**limits.MAX_INT_DIGITS - 1  # 4300 digits
    ev = Log().append("tool_result", {"n": fine, "m": [-fine]}).events()[0]
    assert _reopened(ev) == ev


def test_the_int_limit_holds_whatever_the_writers_own_setting() -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        _refused("unserializable_event_data", "tool_result", {"n": 10**5000})

        class Big(int):
            pass

        _refused("unserializable_event_data", "tool_result", {"n": Big(10**5000)})
    finally:
        sys.set_int_max_str_digits(old)


def test_a_seq_past_a_64_bit_store_is_refused_at_the_call() -> None:
    """seq >= 2**63 cannot be bound by any store: ``invalid_event`` at the call."""
    assert limits.MAX_SEQ == 2**63 - 1
    with pytest.raises(InvalidEvent) as info:
        Log().append_at(2**63, "user_message", {"content": "x"})
    assert info.value.reason == "invalid_event"
    assert "2**63" in str(info.value) or str(2**63) in str(info.value)
    last = Log().append_at(limits.MAX_SEQ, "user_message", {"content": "x"})
    with pytest.raises(InvalidEvent) as info:
        last.append("user_message", {"content": "y"})
    assert info.value.reason == "invalid_event"
    with pytest.raises(InvalidEvent):
        Event(2**63, "user_message", T0, {})


def test_a_session_refuses_them_at_the_call() -> None:
    s = Session.start("poison", store=MemoryStore())
    try:
        for args in (
            ("tool_result", {"n": 10**5000}),
            ("tool_result", _nested(limits.MAX_DATA_DEPTH + 1)),
        ):
            old = sys.get_int_max_str_digits()
            sys.set_int_max_str_digits(0)
            try:
                fut = s.append(*args)
            finally:
                sys.set_int_max_str_digits(old)
            with pytest.raises(InvalidEvent) as info:
                fut.get(timeout=10)
            assert info.value.reason == "unserializable_event_data"
        with pytest.raises(InvalidEvent) as info:
            s.append_at(2**63, "user_message", {"content": "x"}).get(timeout=10)
        assert info.value.reason == "invalid_event"
        sys.set_int_max_str_digits(0)
        try:
            dropped = s.append_or_log("tool_result", {"n": 10**5000})
        finally:
            sys.set_int_max_str_digits(4300)
        assert dropped.get(timeout=10) is None
        assert s.count().get(timeout=10) == 0
    finally:
        s.stop()


def test_a_session_at_the_last_seq_refuses_the_next_append_at_the_call() -> None:
    s = Session.start("last-seq", store=MemoryStore())
    try:
        s.append_at(limits.MAX_SEQ, "user_message", {"content": "x"}).get(timeout=10)
        with pytest.raises(InvalidEvent) as info:
            s.append("user_message", {"content": "y"}).get(timeout=10)
        assert info.value.reason == "invalid_event"
        with pytest.raises(InvalidEvent):
            s.append_many([("user_message", {"content": "y"})]).get(timeout=10)
        assert s.count().get(timeout=10) == 2**63
    finally:
        s.stop()


def _line(seq: int, data_text: str) -> str:
    return (
        f'{{"seq":{seq},"type":"tool_result","time":"2026-01-01T00:00:00.000000+00:00",'
        f'"data":{data_text}}}'
    )


def test_import_refuses_the_same() -> None:
    """JSON Lines import refuses what an append refuses, with the same reason."""
    with pytest.raises(CodecError, match="invalid_event"):
        codec.from_jsonl(_line(2**63, "{}"))
    deep = json.dumps(_nested(limits.MAX_DATA_DEPTH + 1))
    with pytest.raises(CodecError, match=r"unserializable_event_data.*100"):
        codec.from_jsonl(_line(0, deep))
    with pytest.raises(CodecError):
        codec.from_jsonl(_line(0, '{"n":' + "9" * 5000 + "}"))
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(CodecError, match="unserializable_event_data"):
            codec.from_jsonl(_line(0, '{"n":' + "9" * 5000 + "}"))
    finally:
        sys.set_int_max_str_digits(old)
    with max_event_bytes(1000), pytest.raises(CodecError, match="unserializable_event_data"):
        codec.from_jsonl(_line(0, json.dumps({"content": "x" * 2000})))
    ok = codec.from_jsonl(_line(limits.MAX_SEQ, json.dumps(_nested(limits.MAX_DATA_DEPTH))))
    assert ok.count() == 2**63


# -- item 5: one size limit ---------------------------------------------------------------


def _encoded_size(data: Any) -> int:
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def test_the_default_size_limit_is_16_mib() -> None:
    assert limits.DEFAULT_MAX_EVENT_BYTES == 16 * 1024 * 1024
    assert limits.max_event_bytes() == limits.DEFAULT_MAX_EVENT_BYTES


def test_an_event_over_the_default_size_is_refused_without_being_stored() -> None:
    big = "x" * (limits.DEFAULT_MAX_EVENT_BYTES + 1)
    exc = _refused("unserializable_event_data", "tool_result", {"content": big})
    assert "16 MiB" in str(exc) or str(limits.DEFAULT_MAX_EVENT_BYTES) in str(exc)
    assert "set_max_event_bytes" in str(exc)


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(['"', "\\", "\x01", "\n", "a", "é", "日", "\U0001f600"])),
    st.integers(min_value=-3, max_value=3),
)
def test_the_size_is_the_encoded_json_exactly(text: str, shift: int) -> None:
    """Property: the limit applies to the UTF-8 bytes of ``data``'s compact JSON, to the
    byte (escapes, multi-byte characters and nesting counted as stored)."""
    data = {"content": text, "m": {"k": [text, 1, 2.5, None, True]}}
    size = _encoded_size(data)
    limit = max(size + shift, 1)
    with max_event_bytes(limit):
        if size <= limit:
            Log().append("tool_result", data)
        else:
            _refused("unserializable_event_data", "tool_result", data)


def test_the_limit_is_set_process_wide_and_applies_to_sessions() -> None:
    with max_event_bytes(100):
        _refused("unserializable_event_data", "tool_result", {"content": "x" * 200})
        s = Session.start("sized")
        try:
            with pytest.raises(InvalidEvent) as info:
                s.append("tool_result", {"content": "x" * 200}).get(timeout=10)
            assert info.value.reason == "unserializable_event_data"
            assert "100" in str(info.value)
            with pytest.raises(InvalidEvent):
                s.append_message(Message.user([{"type": "text", "text": "x" * 200}])).get(
                    timeout=10
                )
            with pytest.raises(InvalidEvent):
                s.append_many([("user_message", {"content": "x" * 200})]).get(timeout=10)
            assert s.count().get(timeout=10) == 0
        finally:
            s.stop()


def test_frozen_parts_count_toward_the_size() -> None:
    """A Message's frozen content counts as much as a plain one."""
    m = Message.user([{"type": "text", "text": "x" * 500}])
    with max_event_bytes(300):
        with pytest.raises(InvalidEvent) as info:
            Log().append_message(m)
        assert info.value.reason == "unserializable_event_data"
        with pytest.raises(InvalidEvent):
            Log().append("tool_result", {"c": FrozenList(["x" * 500])})


def test_set_max_event_bytes_checks_its_argument() -> None:
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises((TypeError, ValueError)):
            limits.set_max_event_bytes(bad)  # type: ignore[arg-type]
    assert limits.max_event_bytes() == limits.DEFAULT_MAX_EVENT_BYTES


# -- item 7: ids are plain str ------------------------------------------------------------


class SessionId(str):
    def __hash__(self) -> int:
        return 11

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)


def test_check_session_id_returns_a_plain_str() -> None:
    got = check_session_id(SessionId("x"))
    assert type(got) is str
    assert got == "x"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_str_subclass_id_is_the_same_session_as_its_text(kind: str, tmp_path: Path) -> None:
    store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "ids.db")
    try:
        reg = Sessions(store)
        try:
            a = reg.open(SessionId("x"))
            a.append("user_message", {"content": "1"}).get(timeout=10)
            b = reg.open("x")
            b.append("user_message", {"content": "2"}).get(timeout=10)
            assert a.count().get(timeout=10) == 2
            assert type(a.session_id) is str
        finally:
            reg.close()
        assert store.sessions() == ["x"]
        assert [type(s) for s in store.sessions()] == [str]
        assert len(store.load("x")) == 2
        assert len(store.load(SessionId("x"))) == 2
    finally:
        store.close()


def test_a_memory_store_written_with_a_str_subclass_id_keeps_one_session() -> None:
    store = MemoryStore()
    e0 = Event(0, "user_message", T0, {"content": "a"})
    e1 = Event(1, "user_message", T0, {"content": "b"})
    assert not store.write({SessionId("x"): [e0]})
    refused = store.write({"x": [e0.with_seq(0)]})
    assert "x" in refused  # the same session: seq 0 is taken
    assert not store.write({"x": [e1]})
    assert store.sessions() == ["x"]
    assert len(store.load(SessionId("x"))) == 2


# -- item 8: frozen values stay frozen and collectable ------------------------------------


def test_calling_init_again_is_refused() -> None:
    ev = Log().append("user_message", {"content": "a"}).events()[0]
    with pytest.raises(TypeError, match="immutable"):
        ev.__init__(5, "turn_start", T0, {"x": 1})  # type: ignore[misc]
    assert (ev.seq, ev.type.value, dict(ev.data)) == (0, "user_message", {"content": "a"})
    built = Event(0, "user_message", T0, {"content": "a"})
    with pytest.raises(TypeError, match="immutable"):
        built.__init__(1, "user_message", T0, {})  # type: ignore[misc]
    assert built.seq == 0
    r = Replace(1, 2)
    with pytest.raises(TypeError, match="immutable"):
        r.__init__(5, 9)  # type: ignore[misc]
    assert (r.start, r.stop) == (1, 2)
    fd = FrozenDict({"a": 1})
    with pytest.raises(TypeError, match="immutable"):
        fd.__init__({"b": 2})  # type: ignore[misc]
    assert fd == {"a": 1}
    fl = FrozenList([1])
    with pytest.raises(TypeError, match="immutable"):
        fl.__init__([2])  # type: ignore[misc]
    assert fl == [1]


def test_construction_still_works_every_way() -> None:
    import copy
    import pickle

    fd = FrozenDict({"a": [1]}, b=2)
    assert fd == {"a": [1], "b": 2}
    assert FrozenList((1, 2)) == [1, 2]
    assert pickle.loads(pickle.dumps(fd)) == fd
    assert copy.deepcopy(FrozenList([fd])) == [fd]


def _collected(make: Any) -> bool:
    gc.collect()
    obj = make()
    obj.__dict__["me"] = obj  # a cycle through the subclass's __dict__
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    return ref() is None


def test_subclasses_with_a_dict_stay_collectable() -> None:
    class MyDict(FrozenDict):
        pass

    class MyList(FrozenList):
        pass

    class MyEvent(Event):
        pass

    class MyReplace(Replace):
        pass

    assert _collected(lambda: MyDict({"a": 1}))
    assert _collected(lambda: MyList([1]))
    assert _collected(lambda: MyEvent(0, "user_message", T0, {"content": "x"}))
    assert _collected(lambda: MyReplace(0, 1))


def test_no_depth_at_any_stack_height_escapes_as_another_error() -> None:
    """The trial's failure: at some depths near the recursion limit (which depend on how
    deep the reader's own stack is) the scanner ran out of recursion inside its hook,
    and ``ctypes.ArgumentError`` escaped the decoder. Swept over depths and stack heights,
    each row decodes."""
    outcomes: set[str] = set()

    def at_height(n: int) -> None:
        if n:
            return at_height(n - 1)
        for depth in range(960, 1000):
            text = '{"a":' * depth + "1" + "}" * depth
            try:
                codec.event_from_row(0, "tool_result", codec.format_time(T0), text)
                outcomes.add("decoded")
            except CodecError:
                outcomes.add("CodecError")
        return None

    for height in range(0, 40, 3):
        at_height(height)
    assert outcomes == {"decoded"}
