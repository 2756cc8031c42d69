"""The bottom of the store contract suite: the events, logs and times its tests write,
the calls a closed store must refuse, the checks the tests share, and `_at_once`, which
runs one call from several threads released together (the races of the threads tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

from nous_actor.core._frozen import FrozenDict
from nous_actor.core.codec import to_jsonl
from nous_actor.core.event import Event, EventType, Replace, trusted_event
from nous_actor.core.log import Log
from nous_actor.errors import StoreError
from nous_actor.store.base import Store, export_session, import_session
from nous_actor.testing.store_machine import assert_same_events

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

_R = TypeVar("_R")


# -- comparing events strictly -----------------------------------------------------------


def _ev(
    seq: int,
    etype: EventType | str = EventType.USER_MESSAGE,
    data: Mapping[str, Any] | None = None,
    time: datetime = T0,
) -> Event:
    return Event(seq, etype, time, {"content": f"event {seq}"} if data is None else data)


class _Unprintable(datetime):
    """A time whose text form cannot be made (its ``isoformat`` raises)."""

    def isoformat(self, *args: Any, **kwargs: Any) -> str:
        raise ValueError("this time has no text form")


def _poisoned(seq: int, how: str) -> Event:
    """An event past every check of `Event` that a store may be unable to store:
    ``"seq"`` (a seq of 2**63, past SQL's 64-bit integers), ``"data"`` (an object
    JSON cannot encode in its data), ``"int"`` (an int of 5,000 digits, past
    Python's int-to-text limit), ``"time"`` (a time whose text form raises)."""
    data: Any = {"content": f"event {seq}"}
    time: datetime = T0
    if how == "seq":
        seq = 2**63
    elif how == "data":
        data = {"content": object()}
    elif how == "int":
        data = {"content": 10**5000}
    elif how == "time":
        time = _Unprintable(2026, 1, 1, tzinfo=UTC)
    else:  # pragma: no cover - a typo in a test
        raise ValueError(how)
    frozen = dict.__new__(FrozenDict)
    dict.update(frozen, data)  # not through freeze(): these values must reach the store
    return trusted_event(seq, EventType.USER_MESSAGE, time, frozen, None)


POISONS = ("seq", "data", "int", "time")


def _varied_log() -> Log:
    """A log with every event type, tool calls, metadata and a replace (a summary)."""
    t = T0
    step = timedelta(seconds=1, microseconds=1)
    log = Log()
    log = log.append("system_message", {"content": "be brief", "name": None}, t)
    log = log.append("turn_start", {"turn": 1}, t + step)
    log = log.append("request_header", {"model": "m", "temperature": 0.25}, t + 2 * step)
    log = log.append("user_message", {"content": "hi", "metadata": {"lang": "en"}}, t + 3 * step)
    log = log.append("step_start", {}, t + 4 * step)
    call = {"id": "c1", "name": "lookup", "arguments": '{"q": "x"}'}
    log = log.append(
        "assistant_message",
        {"content": None, "tool_calls": [call], "reasoning_content": "think"},
        t + 5 * step,
    )
    log = log.append("tool_call", {"id": "c1", "ok": True}, t + 6 * step)
    log = log.append("tool_result", {"content": "42", "tool_call_id": "c1"}, t + 7 * step)
    log = log.append("step_end", {"tokens": 17}, t + 8 * step)
    log = log.append("assistant_message", {"content": [{"type": "text", "text": "42"}]}, t)
    log = log.append("turn_end", {"turn": 1}, t + 10 * step)
    summary = {"content": "summary of 1..7", "surface_op": Replace(1, 7)}
    log = log.append("system_message", summary, t + 11 * step)
    return log.append("user_message", {"content": "and then?"}, t + 12 * step)


def _odd_times() -> list[datetime]:
    plus_0530 = timezone(timedelta(hours=5, minutes=30))
    return [
        datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 6, 30, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=plus_0530),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 0, 0, 0, 7, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]


# (name, call) of every Store method that must refuse to work once the store is closed.
_CALLS_ON_A_CLOSED_STORE: list[tuple[str, Callable[[Store], object]]] = [
    ("load", lambda s: s.load("a")),
    ("write", lambda s: s.write({"a": [_ev(5)]})),
    ("drop", lambda s: s.drop("a", [0])),
    ("sessions", lambda s: s.sessions()),
    ("delete", lambda s: s.delete("a")),
    ("claim", lambda s: s.claim("b")),
    ("export_session", lambda s: export_session(s, "a")),
    (
        "import_session",
        lambda s: import_session(
            s,
            "c",
            '{"seq":0,"type":"turn_start","time":"2026-01-01T00:00:00.000000+00:00","data":{}}\n',
        ),
    ),
]


def _stored_or_store_error(store: Store, session_id: str, events: list[Event]) -> None:
    """Write ``events``: they must load back exactly, or the store must say StoreError
    (raised, or returned as the session's refusal, with none of its events stored)."""
    try:
        refused = store.write({session_id: events})
        if session_id in refused:
            assert isinstance(refused[session_id], StoreError), refused
            raise refused[session_id]
        got = store.load(session_id)
    except StoreError:
        # Refusing is fine; leaving the store unusable or half-written is not.
        assert store.load("contract-ok") == []
        with contextlib.suppress(StoreError):
            assert store.load(session_id) == []
    else:
        assert_same_events(got, events)
    assert store.write({"contract-ok": [_ev(0)]}) == {}
    assert_same_events(store.load("contract-ok"), [_ev(0)])


def _jsonl(events: Sequence[Event]) -> str:
    """``events`` as the JSON Lines that `export_session` writes."""
    log = Log()
    for ev in events:
        log = log.append_event(ev)
    return to_jsonl(log)


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = {"level": i, "inner": [value]}
    return value


# -- racing threads ---------------------------------------------------------------------

_RACE_WAIT_SECONDS = 30.0
"""The bound on every wait of `_at_once`: the threads' meeting at the barrier, and the
whole race. Generous (a loaded CI machine may start threads slowly); a store that keeps
its rules never comes near it, since the waits end as soon as the threads are done."""


def _at_once(threads: int, what: str, call: Callable[[int], _R]) -> list[_R | BaseException]:
    """What ``call(n)`` returned, or the exception it raised, for each ``n`` below
    ``threads``, each run in a thread of its own, all released together by a barrier so
    that the calls overlap as much as the machine allows: a check-then-act race (two
    claims both seeing the session free) shows where calls made in turn never would.

    No timing is assumed, and every wait is bounded: a thread still running after
    `_RACE_WAIT_SECONDS` fails the test, saying ``what`` hung, rather than hanging it."""
    barrier = threading.Barrier(threads)
    results: dict[int, _R | BaseException] = {}

    def run(n: int) -> None:
        try:
            barrier.wait(_RACE_WAIT_SECONDS)
            results[n] = call(n)
        except BaseException as exc:  # reported in the test's thread
            results[n] = exc

    workers = [
        threading.Thread(target=run, args=(n,), name=f"contract-race-{n}", daemon=True)
        for n in range(threads)
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 2 * _RACE_WAIT_SECONDS
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    hung = sum(w.is_alive() for w in workers)
    assert not hung, (
        f"{hung} of {threads} threads calling {what} at once were still running after "
        f"{2 * _RACE_WAIT_SECONDS:.0f} s: the store hangs (a deadlock?) under contention"
    )
    late = [r for r in results.values() if isinstance(r, threading.BrokenBarrierError)]
    assert not late, (
        f"the {threads} threads of the race did not all start within "
        f"{_RACE_WAIT_SECONDS:.0f} s (the machine is overloaded?)"
    )
    return [results[n] for n in range(threads)]
