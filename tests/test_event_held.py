"""Events hold their checked JSON text until their data is read.

An event read from a store holds its row's text; an event appended through a session
holds the text its call encoded, once, in the caller's thread (`check_held`), which is
the text the store then writes as it is.

A row is decoded (and so checked) when it is read, but its data is frozen only when
something reads it: a derive decodes each visible surface event's message fields and
nothing of what is shadowed; a session opened to be appended to decodes nothing.
These tests hold a held event to the same meaning as an eagerly decoded one, and
count the work a derive does.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from frozen_alike import frozen_alike
from hypothesis import given, settings
from hypothesis import strategies as st
from spies import spy

from nous_actor import Event, FrozenDict, Log, Replace, Session, SQLiteStore
from nous_actor.core import codec
from nous_actor.core import event as event_module

T0 = datetime(2026, 1, 1, tzinfo=UTC)

_ATOMS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_VALUES = st.recursive(
    _ATOMS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
_FIELD = st.sampled_from(
    ["content", "reasoning_content", "tool_calls", "tool_call_id", "name", "metadata", "other"]
)
_DATA = st.dictionaries(_FIELD | st.text(max_size=5), _VALUES, max_size=6)
_TYPES = st.sampled_from(
    ["user_message", "assistant_message", "tool_result", "system_message", "turn_start"]
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "held.db")
    yield s
    s.close()


def _held(etype: str, data: dict[str, Any], seq: int = 0) -> Event:
    """The event as a store reads it back: from its row."""
    ev = codec.event_from_row(
        seq, etype, codec.format_time(T0), codec.encode_json(Event(seq, etype, T0, data).data)
    )
    return ev


@settings(max_examples=200)
@given(_TYPES, _DATA, st.booleans())
def test_a_held_event_means_what_its_eager_twin_means(
    etype: str, data: dict[str, Any], project_first: bool
) -> None:
    """Equal events, equal data frozen alike, equal messages, whichever is read first."""
    eager = Event(0, etype, T0, data)
    held = _held(etype, data)
    assert isinstance(held._data, str)
    if project_first:
        assert held.to_message() == eager.to_message()
        assert isinstance(held._data, str)  # the message's fields alone were read
    assert frozen_alike(held.data, eager.data)
    assert type(held._data) is FrozenDict  # read once, kept
    assert held == eager
    assert held.to_message() == eager.to_message()
    if eager.is_surface:
        m, e = held.to_message(), eager.to_message()
        assert m is not None
        assert e is not None
        for field in ("content", "reasoning_content", "tool_calls", "tool_call_id", "name"):
            assert frozen_alike(getattr(m, field), getattr(e, field))
        assert frozen_alike(m.metadata, e.metadata)


@given(_TYPES, _DATA)
def test_a_held_event_pickles_as_its_text_and_reads_back_equal(
    etype: str, data: dict[str, Any]
) -> None:
    held = _held(etype, data)
    back = pickle.loads(pickle.dumps(held))
    assert isinstance(back._data, str)
    assert back == Event(0, etype, T0, data)
    assert held.with_seq(7).data == data


def test_a_replace_is_decoded_when_read(store: SQLiteStore) -> None:
    """A row with a surface_op is decoded at once: the fold needs it."""
    ev = codec.event_from_row(
        3, "system_message", codec.format_time(T0), '{"content":"s","surface_op":["replace",0,2]}'
    )
    assert type(ev._data) is FrozenDict
    assert ev.surface_op == Replace(0, 2)


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"data": 0, "fields": 0}
    data, fields = event_module._held_data, event_module._held_fields

    def count_data(text: str, seq: int, tracked: bool) -> FrozenDict:
        counts["data"] += 1
        return data(text, seq, tracked)

    def count_fields(text: str, seq: int, tracked: bool) -> Any:
        counts["fields"] += 1
        return fields(text, seq, tracked)

    monkeypatch.setattr(event_module, "_held_data", count_data)
    monkeypatch.setattr(event_module, "_held_fields", count_fields)
    return counts


def test_a_derive_decodes_the_visible_surface_alone(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 events, a summary replacing the first 190 positions: a derive after recovery
    reads the message fields of the 10 visible events and the summary (a replace,
    decoded at reading), and never the data of anything."""
    log = Log()
    for i in range(200):
        log = log.append("user_message" if i % 3 else "tool_call", {"content": f"m{i}"})
    log = log.append("system_message", {"content": "summary", "surface_op": Replace(0, 189)})
    store.write({"s": list(log.events())})
    counts = _counting(monkeypatch)
    restored = Log.restore(store.load("s"))
    messages = restored.derive_messages()
    assert messages == log.derive_messages()
    visible_held = sum(1 for ev in restored.events()[190:200] if ev.is_surface)
    assert counts == {"data": 0, "fields": visible_held}
    assert sum(isinstance(ev._data, str) for ev in restored.events()) == 200


def test_copying_held_events_to_another_store_decodes_nothing(
    store: SQLiteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored text is written as it was read: a copy never decodes the data."""
    events = [
        Event(i, "tool_result", T0 + timedelta(seconds=i), {"content": f"r{i}", "x": [i]})
        for i in range(50)
    ]
    store.write({"s": events})
    held = store.load("s")
    counts = _counting(monkeypatch)
    other = SQLiteStore(tmp_path / "other.db")
    try:
        other.write({"s": held})
        assert counts == {"data": 0, "fields": 0}
        assert other.load("s") == events
    finally:
        other.close()


def test_threads_reading_one_held_event_at_once_read_equal_data() -> None:
    held = _held("user_message", {"content": "x", "tool_calls": [{"id": "a"}]})
    start = threading.Barrier(8, timeout=10)
    seen: list[Any] = []

    def read() -> None:
        start.wait()
        seen.append(held.data)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == 8
    assert all(d == {"content": "x", "tool_calls": [{"id": "a"}]} for d in seen)
    assert held.data is held.data  # the last decode stays


def test_a_projection_msgspec_refuses_reads_the_whole_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Should msgspec refuse the held text when the message is made (a thread with a
    lower recursion limit than the reader's), the message comes from the whole data."""
    held = _held("assistant_message", {"content": "x", "tool_calls": [{"id": "a"}]})

    def refuse(text: str) -> Any:
        raise RecursionError("too deep for this thread")

    monkeypatch.setattr(codec, "_FIELDS_DECODE", refuse)
    message = held.to_message()
    assert message is not None
    assert message == Event(0, "assistant_message", T0, held.data).to_message()
    assert type(held._data) is FrozenDict  # the whole data was read


# -- appended events: encoded once, at the call --------------------------------------------


@settings(max_examples=200)
@given(_TYPES, _DATA)
def test_an_appended_event_holds_the_text_a_store_writes(etype: str, data: dict[str, Any]) -> None:
    """What the call checked and encoded is what the event means: the same data, frozen
    alike, the same message, and the text is what the store would have written."""
    live = Event._trusted(0, *event_module.check_held(0, etype, T0, data))
    eager = Event(0, etype, T0, data)
    assert isinstance(live._data, str)
    assert live._data == codec.encode_json(eager.data)
    assert live == eager
    assert live.to_message() == eager.to_message()
    assert frozen_alike(live.data, eager.data)


def test_an_appended_replace_keeps_its_frozen_data() -> None:
    """A replace's surface_op is kept outside the text, so a replace is not held."""
    parts = event_module.check_held(
        3, "system_message", T0, {"content": "s", "surface_op": ("replace", 0, 2)}
    )
    assert type(parts[2]) is FrozenDict
    assert parts[3] == Replace(0, 2)


def test_a_session_encodes_each_event_once(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends through a session: the committer writes the text each call made (the
    codec encodes nothing), a derive reads the messages' fields alone, and the store
    holds the events as they were given."""
    encoded = spy(monkeypatch, codec, "encode_json")
    data = [{"content": f"m{i}", "n": [i, {"k": str(i)}]} for i in range(40)]
    s = Session.start("once", store=store, timeout=10)
    try:
        live = [s.append("user_message", d).get(timeout=10) for d in data]
        live += s.append_many([("assistant_message", {"content": "a"}), ("turn_start", {})]).get(
            timeout=10
        )
        assert all(type(ev._data) is str for ev in live)
        counts = _counting(monkeypatch)
        messages = s.derive_messages().get(timeout=10)
        assert [m.content for m in messages] == [d["content"] for d in data] + ["a"]
        assert counts == {"data": 0, "fields": 41}
    finally:
        s.stop()
    assert encoded == []
    stored = store.load("once")
    assert [ev.data for ev in stored[:40]] == data
    assert stored == live


class _Key(str):
    """A str subclass: frozen (and encoded) as the plain str it spells."""


_BAD_ATOMS = (
    _ATOMS
    | st.just(float("nan"))
    | st.just(float("inf"))
    | st.builds(set)
    | st.binary(max_size=3)
    | st.just("\ud800")  # a lone surrogate
    | st.integers(min_value=2**64, max_value=2**80)
)
_ANY_VALUES = st.recursive(
    _BAD_ATOMS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(
            st.text(max_size=4) | st.builds(_Key, st.text(max_size=3)), inner, max_size=3
        )
        | st.dictionaries(st.integers(0, 3), inner, max_size=2)
    ),
    max_leaves=10,
)
_ANY_DATA = st.dictionaries(_FIELD | st.text(max_size=5), _ANY_VALUES, max_size=5) | st.builds(
    lambda d, op: {**d, "surface_op": op},
    st.dictionaries(_FIELD, _ATOMS, max_size=2),
    st.sampled_from([("replace", 0, 0), ["replace", 0, 3], ("replace", 2, 1), "replace", None]),
)


@settings(max_examples=400)
@given(_TYPES, _ANY_DATA)
def test_check_held_refuses_and_accepts_what_check_event_does(
    etype: str, data: dict[Any, Any]
) -> None:
    """Whatever the data (bad values, str subclass keys, tuples, replaces): the same
    error, or the same event, its text decoding to the data `check_event` froze."""
    try:
        expected = event_module.check_event(3, etype, T0, data)
    except event_module.InvalidEvent as exc:
        with pytest.raises(event_module.InvalidEvent) as got:
            event_module.check_held(3, etype, T0, data)
        assert (got.value.reason, str(got.value)) == (exc.reason, str(exc))
        return
    held = event_module.check_held(3, etype, T0, data)
    assert held[0] is expected[0]
    assert held[1] == expected[1]
    assert held[3] == expected[3]
    if expected[3] is None:
        assert isinstance(held[2], str)
        assert frozen_alike(Event._trusted(3, *held).data, expected[2])
    else:
        assert frozen_alike(held[2], expected[2])


def test_a_plain_append_makes_no_frozen_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case checks the data into a plain copy and encodes that: nothing is
    frozen (and so nothing taken out of the collector) for a value dropped at once."""
    from nous_actor.core import _frozen

    untracked: list[object] = []
    monkeypatch.setattr(_frozen, "untrack", untracked.append)
    data = {"content": "hi", "tool_calls": [{"id": "c", "arguments": {"x": [1, 2.5, None]}}]}
    text = event_module.check_held(0, "assistant_message", T0, data)[2]
    assert untracked == []
    assert text == codec.encode_json(Event(0, "assistant_message", T0, data).data)


def test_large_data_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data whose size must be measured (its estimate is near the limit) is encoded once:
    the text measured is the text held; over the limit it is refused, unchanged."""
    from nous_actor.core import limits

    encoded = spy(monkeypatch, event_module, "encode_plain")
    old = limits.set_max_event_bytes(1000)
    try:
        data = {"content": "x" * 400, "note": "y" * 100}
        parts = event_module.check_held(0, "user_message", T0, data)
        assert len(encoded) == 1
        assert parts[2] == codec.encode_json(Event(0, "user_message", T0, data).data)
        with pytest.raises(event_module.InvalidEvent, match="over the event size limit"):
            event_module.check_held(0, "user_message", T0, {"content": "x" * 1200})
    finally:
        limits.set_max_event_bytes(old)
