"""The bottom of the store contract suite: the events, logs and times its tests write,
the calls a closed store must refuse, the checks the tests share, and `_at_once`, which
runs one call from several threads released together (the races of the threads tests)."""

from __future__ import annotations

import contextlib
import inspect
import reprlib
import sys
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


# -- checks that stay under python -O -------------------------------------------------------


def _rule() -> str:
    """The rule of the contract test running on this thread: its name and docstring,
    found by walking up the calling frames (``""`` outside a test, e.g. in a worker
    thread of one)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_name
        owner = frame.f_locals.get("self")
        if name.startswith("test_") and owner is not None:
            doc = inspect.getdoc(getattr(type(owner), name, None)) or ""
            text = " ".join(doc.split())
            return f"the store breaks the rule of {name}" + (f" ({text})" if text else "")
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def _short(value: object) -> str:
    """``repr(value)``, cut to a readable length (stored events may hold megabytes)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 300
_REPR.maxlist = _REPR.maxdict = 20


def _expect(ok: object, check: str) -> None:
    """Fail the test unless ``ok``, saying the rule of the running test (its
    docstring) and the ``check`` that failed (an ``assert`` would vanish under
    ``python -O``, and pytest does not rewrite the asserts of an installed module,
    so a failing one said nothing)."""
    if not ok:
        raise AssertionError(f"{_rule() or 'a contract check failed'}: `{check}` failed")


def _expect_equal(got: object, want: object, check: str) -> None:
    """Fail the test unless ``got == want``, saying the rule of the running test, the
    ``check`` that failed and both values."""
    if not got == want:
        raise AssertionError(
            f"{_rule() or 'a contract check failed'}: `{check}` failed: got {_short(got)}, "
            f"expected {_short(want)}"
        )


def _check(ok: object, message: str) -> None:
    """Fail the test with ``message`` (which says the rule broken and how to keep it)
    unless ``ok``: an ``assert`` would vanish under ``python -O``, and pytest does not
    rewrite the asserts of an installed module, so a failing one said nothing."""
    if not ok:
        raise AssertionError(message)


def _same(got: object, want: object, message: str) -> None:
    """Fail the test unless ``got == want``, saying ``message`` and both values."""
    if not got == want:
        raise AssertionError(f"{message}: got {_short(got)}, expected {_short(want)}")


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
            _check(
                isinstance(refused[session_id], StoreError),
                f"write() returns a StoreError for each session it refuses, got {refused!r}",
            )
            raise refused[session_id]
        got = store.load(session_id)
    except StoreError:
        # Refusing is fine; leaving the store unusable or half-written is not.
        _same(
            store.load("contract-ok"),
            [],
            "a refused write leaves the store as it was: another session's load",
        )
        with contextlib.suppress(StoreError):
            _same(
                store.load(session_id),
                [],
                f"a refused write of {session_id!r} stores none of its events",
            )
    else:
        assert_same_events(got, events)
    _same(
        store.write({"contract-ok": [_ev(0)]}),
        {},
        f"the store must take more writes after a write of {session_id!r} (stored or refused)",
    )
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
    _check(
        not hung,
        f"{hung} of {threads} threads calling {what} at once were still running after "
        f"{2 * _RACE_WAIT_SECONDS:.0f} s: the store hangs (a deadlock?) under contention",
    )
    late = [r for r in results.values() if isinstance(r, threading.BrokenBarrierError)]
    _check(
        not late,
        f"the {threads} threads of the race did not all start within "
        f"{_RACE_WAIT_SECONDS:.0f} s (the machine is overloaded?)",
    )
    return [results[n] for n in range(threads)]
