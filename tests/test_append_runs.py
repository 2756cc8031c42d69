"""Appends queued together run together: a session takes the plain appends waiting in
its inbox as one run (`SessionActor._receive_run`): their events made in seq order, the
log extended once, each future answered in order. What a run does must be exactly what
the same calls one by one would have done, whatever else is queued between them, with
or without a store or a subscriber; a crash in the middle of one stops only the
session, answers every call, and under a registry loses nothing acknowledged.

Each test queues its calls while the session is held busy (one call blocks its turn),
then lets it go: the queued calls reach the session together, as a pipelining caller's
or many callers' do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import MemoryStore, Session, Sessions
from nous_actor.core.event import Event, InvalidEvent
from nous_actor.core.log import Log
from nous_actor.errors import SessionCrashed, SessionStopped, StoreError
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.actor._session_actor import _CommittedRun
from nous_actor.sessions.future import SessionFuture
from nous_actor.store.committer import Committer, committer_for


class Boom(BaseException):
    """Raised inside a run (not an `Exception`: it crashes the session)."""


@contextmanager
def held(handle: Any) -> Iterator[None]:
    """The session runs nothing else until the block ends: what the block sends queues."""
    entered, release = threading.Event(), threading.Event()

    def hold(actor: SessionActor) -> None:
        entered.set()
        release.wait(BOUND)

    busy = handle._call(hold)
    assert entered.wait(BOUND)
    try:
        yield
    finally:
        release.set()
        busy.get(timeout=BOUND)


def _answer(fut: SessionFuture[Any]) -> Any:
    """What a call came to: its value, or its error's type."""
    try:
        return fut.get(timeout=BOUND)
    except Exception as exc:
        return type(exc)


# -- model against the session: any mix of calls queued at once ---------------------------

Op = tuple[Any, ...]


def _expand(ops: list[Op]) -> list[Op]:
    """``("appends", k)`` is ``k`` plain appends in a row (a pipelining caller's)."""
    out: list[Op] = []
    for op in ops:
        if op[0] == "appends":
            out += [("append", f"{op[1]}.{k}") for k in range(op[1])]
        else:
            out.append(op)
    return out


_OPS = st.one_of(
    st.tuples(st.just("append"), st.text(max_size=6)),
    st.tuples(st.just("appends"), st.integers(2, 70)),
    st.tuples(st.just("replace"), st.integers(0, 12), st.integers(0, 12), st.text(max_size=4)),
    st.tuples(st.just("append_many"), st.integers(0, 3)),
    st.tuples(st.just("step_end")),
    st.tuples(st.just("count")),
    st.tuples(st.just("derive")),
)


def _send(s: Session, op: Op) -> SessionFuture[Any]:
    kind = op[0]
    if kind == "append":
        return s.append("user_message", {"content": op[1]})
    if kind == "replace":
        lo, hi = sorted(op[1:3])
        return s.append("system_message", {"content": op[3], "surface_op": ("replace", lo, hi)})
    if kind == "append_many":
        return s.append_many([("assistant_message", {"content": f"a{k}"}) for k in range(op[1])])
    if kind == "step_end":
        return s.append("step_end", {})
    if kind == "count":
        return s.count()
    return s.derive_messages()


def _model(ops: list[Op]) -> list[Any]:
    """What each call answers, made one by one on a `Log` (seqs; counts; contents)."""
    log, out = Log(), []
    for op in ops:
        kind = op[0]
        try:
            if kind == "append":
                log = log.append("user_message", {"content": op[1]})
                out.append(log.count() - 1)
            elif kind == "replace":
                lo, hi = sorted(op[1:3])
                data = {"content": op[3], "surface_op": ("replace", lo, hi)}
                log = log.append("system_message", data)
                out.append(log.count() - 1)
            elif kind == "append_many":
                first = log.count()
                for k in range(op[1]):
                    log = log.append("assistant_message", {"content": f"a{k}"})
                out.append(list(range(first, log.count())))
            elif kind == "step_end":
                log = log.append("step_end", {})
                out.append(log.count() - 1)
            elif kind == "count":
                out.append(log.count())
            else:
                out.append([m.content for m in log.derive_messages()])
        except InvalidEvent:
            out.append(InvalidEvent)
    return out


def _seen(op: Op, got: Any) -> Any:
    """A session's answer in the model's terms."""
    if isinstance(got, type):
        return got
    if op[0] in ("append", "replace", "step_end"):
        assert isinstance(got, Event)
        return got.seq
    if op[0] == "append_many":
        return [e.seq for e in got]
    if op[0] == "count":
        return got
    return [m.content for m in got]


@pytest.mark.parametrize("kind", ["memory", "store", "subscribed"])
@settings(max_examples=40, deadline=None)
@given(
    before=st.lists(_OPS, max_size=4).map(_expand),
    queued=st.lists(_OPS, min_size=1, max_size=12).map(_expand),
)
def test_calls_queued_together_answer_as_one_by_one(
    kind: str, before: list[Op], queued: list[Op]
) -> None:
    store = MemoryStore() if kind == "store" else None
    s = Session.start("runs", store=store, timeout=BOUND)
    feed = s.subscribe() if kind == "subscribed" else None
    try:
        got = [_answer(_send(s, op)) for op in before]  # one by one
        with held(s):
            futs = [_send(s, op) for op in queued]
        got += [_answer(f) for f in futs]
        assert [_seen(op, g) for op, g in zip(before + queued, got, strict=True)] == _model(
            before + queued
        )
        events = s.events().get(timeout=BOUND)
        assert [e.seq for e in events] == list(range(len(events)))
        if store is not None:
            assert store.load("runs") == events  # every acknowledged append is stored
        if feed is not None:
            fed = [feed.get(timeout=BOUND) for _ in events]
            assert fed == events  # each once, in order
    finally:
        if feed is not None:
            feed.close()
        s.stop()


def test_a_run_ends_at_a_call_that_must_wait_and_goes_on_after_it(chat: Session) -> None:
    """A read queued between appends sees exactly the appends before it."""
    with held(chat):
        first = [chat.append("user_message", {"content": str(k)}) for k in range(5)]
        counted = chat.count()
        later = [chat.append("user_message", {"content": str(k)}) for k in range(5, 9)]
    assert [f.get(timeout=BOUND).seq for f in first] == list(range(5))
    assert counted.get(timeout=BOUND) == 5
    assert [f.get(timeout=BOUND).seq for f in later] == list(range(5, 9))


def test_appends_held_by_an_open_turn_wait_for_it(chat: Session) -> None:
    """With a turn open, appends queued together through the plain handle wait for the
    turn to end, then run in the order sent: no run goes past the turn."""
    box: list[SessionFuture[Event]] = []

    def send() -> None:  # (another thread: a plain write inside the turn's block fails)
        with held(chat):
            box.extend(chat.append("user_message", {"content": str(k)}) for k in range(4))

    with chat.turn() as turn:
        turn.append("assistant_message", {"content": "first"}).get(timeout=BOUND)
        sender = threading.Thread(target=send)
        sender.start()
        sender.join(BOUND)
        assert len(box) == 4
        last = turn.append("assistant_message", {"content": "last"}).get(timeout=BOUND)
        assert not any(f.done() for f in box)
    # turn_start, first, last, turn_end; then the plain appends, in the order sent
    assert [f.get(timeout=BOUND).seq for f in box] == list(range(last.seq + 2, last.seq + 6))


# -- crashes in a run ------------------------------------------------------------------------


def _raise_at(
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    at: int,
    exc: BaseException | None = None,
) -> None:
    """``owner.name`` raises ``exc`` (default: `Boom`, which crashes a session) on its
    call number ``at`` (from 0), once."""
    real = getattr(owner, name)
    seen = [0]

    def patched(*args: Any, **kwargs: Any) -> Any:
        k = seen[0]
        seen[0] += 1
        if k == at:
            raise exc if exc is not None else Boom("in the middle of a run")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, patched)


def test_a_crash_in_a_run_stops_the_session_and_answers_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = Session.start("crashing-run", timeout=BOUND)
    other = Session.start("bystander", timeout=BOUND)
    try:
        s.append("user_message", {"content": "before"}).get(timeout=BOUND)
        _raise_at(monkeypatch, Log, "_extend_run", 0)
        with held(s):
            appends = [s.append("user_message", {"content": str(k)}) for k in range(6)]
            counted = s.count()
        answers = [_answer(f) for f in [*appends, counted]]
        # The run's first call is told it crashed the session; nothing of the run was
        # applied, and the calls after it hear the session stopped before them.
        assert answers == [SessionCrashed] + [SessionStopped] * 6, answers
        assert not s.is_alive()
        assert other.append("user_message", {"content": "fine"}).get(timeout=BOUND).seq == 0
    finally:
        s.stop()
        other.stop()


def test_a_crash_mid_run_with_a_subscriber_answers_each_call_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a subscriber, a run applies its appends one by one: a crash at the fourth
    leaves the three before it applied and answered, tells the fourth it crashed the
    session, and the rest that they were not applied."""
    s = Session.start("crashing-subscribed", timeout=BOUND)
    feed = s.subscribe()
    try:
        _raise_at(monkeypatch, SessionActor, "_apply", 3)
        with held(s):
            appends = [s.append("user_message", {"content": str(k)}) for k in range(6)]
        answers = [_answer(f) for f in appends]
        assert [a.seq for a in answers[:3]] == [0, 1, 2]
        assert answers[3:] == [SessionCrashed, SessionStopped, SessionStopped], answers
        assert [feed.get(timeout=BOUND).seq for _ in range(3)] == [0, 1, 2]
    finally:
        feed.close()
        s.stop()


@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_crash_mid_run_under_a_registry_loses_nothing_acknowledged(
    monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    """A run of 40 appends on a store goes to the committer a share (16) at a time; the
    hand-over of share ``at`` fails with a `BaseException`, which crashes the session:
    the shares before it commit and are answered, the first call of that share is told
    it crashed the session, and the calls after it (none of them sent) go back to the
    registry's route, which delivers them to the restarted session: every call is
    answered, none is refused, what was acknowledged is stored once, in order, and the
    crashed actor lets go of the store at once (nothing it sent is left in flight)."""
    store = MemoryStore()
    with Sessions(store, timeout=BOUND, backoff=None) as reg:
        chat = reg.open("routed")
        chat.append("user_message", {"content": "before"}).get(timeout=BOUND)
        assert committer_for(store).share == 16
        _raise_at(monkeypatch, Committer, "submit_write", at)
        with held(chat):
            futs = [chat.append("user_message", {"content": str(k)}) for k in range(40)]
        answers = [_answer(f) for f in futs]
        crashed = [16 * at]
        assert [k for k, a in enumerate(answers) if a is SessionCrashed] == crashed
        acked = [a for a in answers if isinstance(a, Event)]
        assert len(acked) == 40 - len(crashed)  # every other call applied: none refused
        assert [a.data["content"] for a in acked] == [
            str(k) for k in range(40) if k not in crashed
        ]
        stored = store.load("routed")
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert [e.data["content"] for e in stored] == ["before"] + [
            a.data["content"] for a in acked
        ]
        assert reg.restart_count("routed") == 1


def test_an_append_the_committer_cannot_take_fails_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handing an append to the committer fails (an `Exception`): that call fails with it
    and nothing of it is kept; the session goes on with the next seq (in a run, the
    calls after it are made again one by one), and when it stops it lets go of the store
    at once (nothing is left in flight)."""
    store = MemoryStore()
    reg = Sessions(store, timeout=BOUND)
    try:
        chat = reg.open("handed")
        first = chat.append("user_message", {"content": "before"}).get(timeout=BOUND)
        broken = RuntimeError("the committer's queue is broken")
        _raise_at(monkeypatch, Committer, "submit_write", 2, broken)  # the third hand-over
        one_by_one = [_answer(chat.append("user_message", {"content": f"a{k}"})) for k in range(4)]
        monkeypatch.undo()
        _raise_at(monkeypatch, Committer, "submit_write", 0, broken)  # the run's first share
        with held(chat):
            queued = [chat.append("user_message", {"content": f"b{k}"}) for k in range(20)]
        answers = [_answer(f) for f in queued]
        monkeypatch.undo()
        assert [k for k, a in enumerate(one_by_one) if a is RuntimeError] == [2]
        assert [k for k, a in enumerate(answers) if a is RuntimeError] == [0]
        kept = [a for a in one_by_one + answers if isinstance(a, Event)]
        assert [a.seq for a in kept] == list(range(1, 1 + len(kept)))
        assert store.load("handed") == [first, *kept]
    finally:
        reg.close(timeout=BOUND)
    assert store.held_by("handed") is None


class _FailingOnce(MemoryStore):
    """A store whose next write, once armed, fails as a whole."""

    armed = False

    def write(self, appends: Any, calls: Any = None) -> dict[str, StoreError]:
        if self.armed:
            self.armed = False
            raise StoreError("the disk is full (once)")
        return super().write(appends, calls)


def test_a_write_that_fails_mid_run_stops_the_run_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first share of a run is written and fails before the run hands over the next:
    its calls fail with the store's error, and the rest of the run goes on as single
    calls would have, behind the failure: the session stops (a failed write), and they
    go back to the registry's route, which delivers them to the restarted session. None
    is refused, and what was acknowledged is stored once, in order."""
    store = _FailingOnce()
    with Sessions(store, timeout=BOUND, backoff=None) as reg:
        chat = reg.open("failing")
        chat.append("user_message", {"content": "before"}).get(timeout=BOUND)
        real = Committer.submit_write
        waited: list[Any] = []

        def submit(committer: Committer, write: Any) -> None:
            real(committer, write)
            if isinstance(write, _CommittedRun) and not waited:
                waited.append(write)  # the first share: wait until its write is answered
                write.futs[0]._acquire(BOUND)

        monkeypatch.setattr(Committer, "submit_write", submit)
        with held(chat):
            store.armed = True
            futs = [chat.append("user_message", {"content": str(k)}) for k in range(40)]
        answers = [_answer(f) for f in futs]
        assert waited, "no run was handed over"
        assert answers[:16] == [StoreError] * 16
        assert all(isinstance(a, Event) for a in answers[16:]), answers[16:]
        stored = store.load("failing")
        assert [e.data["content"] for e in stored] == ["before"] + [str(k) for k in range(16, 40)]
        assert [e.seq for e in stored] == list(range(len(stored)))
        assert reg.restart_count("failing") == 1
