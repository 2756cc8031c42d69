"""The work of one append, counted: the Python functions an append to an in-memory
session runs in the caller's thread and in the session's. Each is a cost on every
append of every session (a call is about 60 ns; pipelined, an append costs about 5 us
of both threads together, DESIGN.md §8 G2), so a change that adds one to either side
fails here, naming what runs, and says so by changing the count."""

from __future__ import annotations

import queue
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from nous_actor import Session
from nous_actor.core.clock import utcnow
from nous_actor.core.event import check_held
from nous_actor.runtime import telemetry
from nous_actor.runtime.dispatcher import CallEnvelope
from nous_actor.sessions.actor._session_actor import SessionActor
from nous_actor.sessions.future import SessionFuture

CALLER_CALLS = 10
"""`SessionCalls.append`, the clock, the check and encoding (4), `Session._call`, the
future, the stop flag, the inbox's put."""

SESSION_CALLS = 9
"""`_receive_call`, `_run`, `h_append`, the event, `_submit`, `_apply`, the log's
append (2), the answer."""


def _calls(fn: Callable[[], Any]) -> Counter[str]:
    """The Python functions ``fn()`` runs in this thread, by name (``fn`` itself not
    counted)."""
    seen: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen[frame.f_code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    for name in [n for n in seen if n.endswith("<lambda>")]:
        del seen[name]
    return seen


@pytest.fixture
def session() -> Iterator[Session]:
    old = telemetry.install(None)  # (an installed sink counts each append: one call more)
    s = Session.start("hot-path", timeout=10)
    try:
        s.count().get(timeout=10)
        yield s
    finally:
        s.stop()
        telemetry.install(old)


def test_an_append_runs_so_many_functions_in_the_callers_thread(session: Session) -> None:
    release = threading.Event()
    busy = session._call(lambda actor: release.wait(10))  # the session holds its turn
    try:
        calls = _calls(lambda: session.append("user_message", {"content": "hi"}))
    finally:
        release.set()
    busy.get(timeout=10)
    assert session.count().get(timeout=10) == 1
    assert sum(calls.values()) <= CALLER_CALLS, ", ".join(calls)
    assert calls["SessionFuture.__init__"] == 1
    assert calls["Inbox.put"] == 1


def test_an_append_runs_so_many_functions_in_the_sessions_turn(session: Session) -> None:
    """The session's side, run here while the session is idle: what its turn runs for an
    append that came in a `CallEnvelope`."""
    ref = session._own_ref
    assert ref is not None
    actor = ref._actor_weakref()
    assert isinstance(actor, SessionActor)
    parts = check_held(0, "user_message", utcnow(), {"content": "hi"})
    fut: SessionFuture[Any] = SessionFuture("hot-path", 10)
    calls = _calls(lambda: actor._receive_call(SessionActor.h_append, (parts,), fut))
    assert fut.get(timeout=0).seq == 0
    assert sum(calls.values()) <= SESSION_CALLS, ", ".join(calls)
    assert calls["SessionFuture._resolve"] == 1


RUN_CALLS_PER_APPEND = 2
"""In a run of queued appends (`SessionActor._receive_run`): the event, the answer."""

RUN_CALLS = 4
"""Once per run: `_receive_run`, `_append_run`, the log's extension (2) (the inbox's
``empty`` and ``get_nowait`` are C methods)."""


def test_appends_queued_together_run_so_many_functions_each(session: Session) -> None:
    """The session's side of a run of appends queued behind one another, run here while
    the session is idle: two functions an append, and a few for the run."""
    ref = session._own_ref
    assert ref is not None
    actor = ref._actor_weakref()
    assert isinstance(actor, SessionActor)
    n = 50
    futs: list[SessionFuture[Any]] = [SessionFuture("hot-path", 10) for _ in range(n)]
    calls_in = [(check_held(0, "user_message", utcnow(), {"content": str(k)}),) for k in range(n)]
    for args, fut in zip(calls_in[1:], futs[1:], strict=True):  # queued, not scheduled
        queue.SimpleQueue.put(actor.actor_inbox, CallEnvelope(SessionActor.h_append, args, fut))
    calls = _calls(lambda: actor._receive_run(calls_in[0], futs[0], n))
    assert [f.get(timeout=0).seq for f in futs] == list(range(n))
    assert actor.actor_inbox.empty()
    assert sum(calls.values()) <= RUN_CALLS_PER_APPEND * n + RUN_CALLS, ", ".join(calls)
    assert calls["SessionFuture._resolve"] == n
    assert calls["Log._extend_run"] == 1
