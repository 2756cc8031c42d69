"""What a retained event costs the cyclic garbage collector: frozen data, events and
their projected messages are trees nothing points back into, so CPython's collector
does not track them (a full collection never walks a long session's history)."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nous_actor import Event, FrozenDict, FrozenList, Log, Replace
from nous_actor.core import _frozen, codec

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="untracking is a CPython optimisation"
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _nested(i: int) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": f"part {i}"}],
        "tool_calls": [{"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}],
        "metadata": {"tags": ["a", "b"], "n": i, "x": 0.5},
    }


def _containers(value: Any) -> list[Any]:
    """``value`` and every dict and list inside it."""
    out = [value]
    if isinstance(value, dict):
        for v in value.values():
            out += _containers(v) if isinstance(v, (dict, list)) else []
    elif isinstance(value, list):
        for v in value:
            out += _containers(v) if isinstance(v, (dict, list)) else []
    return out


def _assert_untracked(ev: Event) -> None:
    assert not gc.is_tracked(ev)
    inner = _containers(ev.data)
    assert len(inner) > 1
    assert [x for x in inner if gc.is_tracked(x)] == []


def _tracked_count() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_frozen_containers_are_not_tracked() -> None:
    """FrozenDict and FrozenList, built any way, are invisible to the cyclic collector."""
    values = [
        FrozenDict({"a": [1, {"b": 2}]}),
        FrozenList([{"a": 1}, [2]]),
        _frozen.freeze({"a": [[1], {"b": []}]}),
    ]
    for v in values:
        assert [x for x in _containers(v) if gc.is_tracked(x)] == []


def test_appended_events_and_their_data_are_not_tracked() -> None:
    """An event made by Log.append or Event(...) and its frozen data are not tracked."""
    log = Log().append("assistant_message", _nested(0))
    _assert_untracked(log.events()[0])
    _assert_untracked(Event(0, "assistant_message", T0, _nested(1)))


def test_a_replace_and_its_event_are_not_tracked() -> None:
    """A replace's `Replace` and its event are not tracked."""
    ev = Event(3, "system_message", T0, {"content": "s", "surface_op": ("replace", 0, 2)})
    assert not gc.is_tracked(ev)
    assert isinstance(ev.surface_op, Replace)
    assert not gc.is_tracked(ev.surface_op)


def test_decoded_events_are_not_tracked() -> None:
    """Events decoded from a stored row, a JSON line or a pickle are not tracked."""
    ev = Event(5, "assistant_message", T0, _nested(5))
    row = (5, "assistant_message", codec.format_time(T0), codec.encode_data(ev))
    for got in (
        codec.event_from_row(*row),
        codec.loads_event(codec.dumps_event(ev)),
        pickle.loads(pickle.dumps(ev)),
    ):
        assert got == ev
        _assert_untracked(got)


def test_projected_messages_are_not_tracked() -> None:
    """The message an event projects to is not tracked."""
    log = Log().append("assistant_message", _nested(0))
    (m,) = log.derive_messages()
    assert m.tool_calls
    assert not gc.is_tracked(m)


def test_a_long_log_adds_no_tracked_object_per_event() -> None:
    """Holding 2,000 appended, folded and derived events adds only a fixed few tracked
    objects (the log's own lists), not one or more per event."""
    datas = [_nested(i) for i in range(2_000)]
    before = _tracked_count()
    log = Log()
    for d in datas:
        log = log.append("assistant_message", d)
    msgs, log = log.materialize()
    grown = _tracked_count() - before
    assert len(msgs) == 2_000
    assert grown < 50, grown


def test_restored_events_add_no_tracked_object_per_event() -> None:
    """2,000 events decoded from stored rows and restored add only a fixed few tracked
    objects."""
    source = Log()
    for i in range(2_000):
        source = source.append("assistant_message", _nested(i))
    rows = [
        (ev.seq, ev.type.value, codec.format_time(ev.time), codec.encode_data(ev))
        for ev in source.events()
    ]
    del source
    before = _tracked_count()
    log = Log.restore([codec.event_from_row(*r) for r in rows])
    log.derive_messages()
    grown = _tracked_count() - before
    assert log.count() == 2_000
    assert grown < 50, grown


class _Tagged(FrozenDict):
    """A subclass with a ``__dict__``: it can be on a cycle, so it stays tracked."""


def test_only_the_registered_types_leave_the_collector() -> None:
    """`untrack` takes out instances of exactly the registered immutable types; a
    subclass of one (which can hold a cycle through its ``__dict__``), a plain list or
    dict, and any other object are left as they are."""
    tagged = _Tagged({"a": 1})
    tagged.me = tagged  # type: ignore[attr-defined]  # a cycle through its __dict__
    plain_list, plain_dict, other = [[1]], {"a": [1]}, _Tagged
    for value in (tagged, plain_list, plain_dict, other):
        assert gc.is_tracked(value)
        _frozen.untrack(value)
        assert gc.is_tracked(value), value
    frozen = FrozenDict({"a": 1})
    assert not gc.is_tracked(frozen)
    ref = weakref.ref(tagged)
    del tagged
    gc.collect()
    assert ref() is None  # the subclass's cycle was collected


def test_objects_the_collector_does_not_know_are_left_alone() -> None:
    """Handed objects without the collector's header (ints, strings, floats, None, a
    bytes), the untracker does nothing (CPython's function would write into memory
    before them); a process that gives it many of them and collects runs on."""
    code = (
        "import gc\n"
        "from nous_actor.core._frozen import untrack\n"
        "for i in range(100_000):\n"
        "    for v in (i, 2**70 + i, str(i), float(i), None, bytes(i % 7), (i,)):\n"
        "        untrack(v)\n"
        "    if i % 10_000 == 0:\n"
        "        gc.collect()\n"
        "print('ran on')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ran on"


def test_elsewhere_values_stay_tracked(monkeypatch: pytest.MonkeyPatch) -> None:
    """On another Python implementation the untracker leaves values as they are."""
    monkeypatch.setattr(sys.implementation, "name", "pypy")
    for keep in _frozen._gc_untrackers():  # `untrack` and `_untrack_exact`
        value = [1]
        keep(value)
        assert gc.is_tracked(value)


def test_a_session_recovered_from_sqlite_adds_no_tracked_object_per_event(
    tmp_path: Path,
) -> None:
    """Recovering 2,000 stored events (load, restore, fold, derive) leaves only a fixed few
    new tracked objects: the collector's work does not grow with the history."""
    from nous_actor import SQLiteStore

    source = Log()
    for i in range(2_000):
        source = source.append("assistant_message" if i % 2 else "user_message", _nested(i))
    store = SQLiteStore(tmp_path / "gc.db")
    try:
        assert not store.write({"s": source.events()})
        del source
        before = _tracked_count()
        log = Log.restore(store.load("s"))
        msgs = log.derive_messages()
        grown = _tracked_count() - before
    finally:
        store.close()
    assert (log.count(), len(msgs)) == (2_000, 2_000)
    assert grown < 50, grown


def test_a_live_session_adds_no_tracked_object_per_event() -> None:
    """2,000 appends through an in-memory session, then a derive, leave only a fixed few
    new tracked objects in the process."""
    from nous_actor import Session

    datas = [_nested(i) for i in range(2_000)]
    s = Session.start("gc-live")
    try:
        s.count().get(timeout=30)
        before = _tracked_count()
        futs = [s.append("user_message", d) for d in datas]
        futs[-1].get(timeout=30)
        del futs
        msgs = s.derive_messages().get(timeout=30)
        grown = _tracked_count() - before
    finally:
        s.stop()
    assert len(msgs) == 2_000
    assert grown < 100, grown
