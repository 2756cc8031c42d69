"""Adversarial tests of the session layer: races, faults and asyncio misuse (DESIGN.md §4)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import pickle
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pykka
import pytest
from bounds import BOUND
from structlog.testing import capture_logs

from nous_actor import (
    CallTimeout,
    Event,
    InvalidEvent,
    Session,
    SessionCrashed,
    SessionError,
    SessionFuture,
    SessionStopped,
    StoreError,
    Subscription,
)
from nous_actor.sessions.actor import SessionActor
from nous_actor.store.memory import MemoryStore

# -- helpers -------------------------------------------------------------------------------


class Meltdown(BaseException):
    """A custom BaseException that is neither an Exception nor a known interpreter signal."""


class Unprintable(BaseException):
    """A BaseException whose ``str()`` itself raises."""

    def __str__(self) -> str:
        raise ValueError("__str__ is broken too")


class BrokenError(Exception):
    """An ordinary exception whose ``str()`` raises and which cannot be pickled."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()  # unpicklable

    def __str__(self) -> str:
        raise ValueError("__str__ is broken")


def _in_actor(s: Session, action: Callable[[], object]) -> SessionFuture[Any]:
    """Run ``action`` inside the session's actor thread, as a call on the session.

    A handler is any callable taking the actor: this is how the tests run code
    (that raises, blocks or calls back) where a buggy handler would run it.
    """
    return s._call(lambda _actor: action())


class Raises(Mapping[str, Any]):
    """Event data whose reading raises ``exc`` (in whichever thread reads it)."""

    def __init__(self, exc: BaseException) -> None:
        self._exc = exc

    def __getitem__(self, key: str) -> Any:
        raise self._exc

    def __iter__(self) -> Iterator[str]:
        raise self._exc

    def __len__(self) -> int:
        return 1

    def get(self, key: str, default: Any = None) -> Any:
        raise self._exc


def _raise(exc: BaseException) -> Callable[[], None]:
    def action() -> None:
        raise exc

    return action


def _start(session_id: str, timeout: float = BOUND) -> tuple[Session, threading.Thread]:
    """Start a pinned session and return it with its thread (to join on its death)."""
    before = set(threading.enumerate())
    s = Session.start(session_id, timeout=timeout, pinned=True)
    (thread,) = _new_actor_threads(before)
    return s, thread


def _new_actor_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("nous-pinned-SessionActor")
    ]


def _block(s: Session, gate: threading.Event) -> SessionFuture[Any]:
    """Occupy the session's actor until ``gate`` is set (bounded)."""
    return s._call(lambda actor: gate.wait(BOUND))


def _error_of(fut: SessionFuture[Any]) -> BaseException | None:
    try:
        fut.get(timeout=0)
    except BaseException as exc:
        return exc
    return None


def _until(pred: Callable[[], bool], thread: threading.Thread) -> None:
    """Wait, bounded, until ``pred()`` holds or ``thread`` (an actor thread) has exited."""
    deadline = time.monotonic() + BOUND
    while not pred() and thread.is_alive():
        assert time.monotonic() < deadline, "neither the condition nor the actor's exit came"
        thread.join(0.005)


def _drain_sub(sub: Subscription) -> list[int]:
    """Every seq left in an ended subscription; fails (bounded) if it never ends."""
    seqs = []
    while True:
        try:
            seqs.append(sub.get(BOUND).seq)
        except SessionStopped:
            return seqs


def _race(a: Callable[[], object], b: Callable[[], object]) -> tuple[object, object]:
    """Run ``a`` in a new thread and ``b`` here, released together; each one's result or
    exception."""
    barrier = threading.Barrier(2)
    out: list[object] = [None, None]

    def run(k: int, fn: Callable[[], object]) -> None:
        barrier.wait(BOUND)
        try:
            out[k] = fn()
        except BaseException as exc:
            out[k] = exc

    t = threading.Thread(target=run, args=(0, a))
    t.start()
    run(1, b)
    t.join(BOUND)
    assert not t.is_alive(), "a racing call hung"
    return out[0], out[1]


def _user(i: int | str = "x") -> dict[str, str]:
    return {"content": str(i)}


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event that blocks an actor; always opened at teardown so no actor thread hangs."""
    ev = threading.Event()
    yield ev
    ev.set()


# -- future: bounded waits ---------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -1.5])
def test_get_with_zero_or_negative_timeout_fails_at_once(
    gate: threading.Event, timeout: float
) -> None:
    """get(timeout<=0) on a pending call raises CallTimeout at once, not after the handle bound."""
    s = Session.start("zero", timeout=BOUND)
    _block(s, gate)
    fut = s.count()
    started = time.monotonic()
    with pytest.raises(CallTimeout, match="'zero'"):
        fut.get(timeout=timeout)
    assert time.monotonic() - started < BOUND / 4
    gate.set()
    assert fut.get(timeout=BOUND) == 0


def test_get_with_an_infinite_timeout_waits_for_the_answer() -> None:
    """get(timeout=inf) on a pending future returns the answer once another thread sets it."""
    fut: SessionFuture[int] = SessionFuture("inf", timeout=BOUND)
    answer = threading.Timer(0.05, fut.set, (7,))
    answer.start()
    try:
        assert fut.get(timeout=math.inf) == 7
    finally:
        answer.join(BOUND)


def test_a_handle_without_a_finite_bound_is_refused() -> None:
    """Session.start(timeout=inf) is refused: every wait must have a bound (DESIGN §4)."""
    with pytest.raises(ValueError, match="timeout"):
        Session.start("unbounded", timeout=math.inf)


def test_repeated_get_of_a_failed_future_does_not_grow_its_traceback() -> None:
    """Polling a failed future many times leaves its exception's traceback the same length."""
    fut: SessionFuture[int] = SessionFuture("tb")
    fut._fail(ValueError("bad"))
    lengths = []
    for _ in range(20):
        try:
            fut.get()
        except ValueError as exc:
            lengths.append(len(traceback.extract_tb(exc.__traceback__)))
    assert lengths[-1] == lengths[0]


def test_timeout_of_pykka_get_all_is_a_pykka_timeout() -> None:
    """pykka.get_all over a pending SessionFuture times out with pykka.Timeout, as in Pykka."""
    fut: SessionFuture[int] = SessionFuture("compat")
    with pytest.raises(pykka.Timeout):
        pykka.get_all([fut], timeout=0)


def test_a_handler_error_with_a_broken_str_reaches_the_caller_as_is() -> None:
    """An unpicklable exception whose str() raises is delivered as the same object; the
    session runs on."""
    s = Session.start("broken-str", timeout=BOUND)
    err = BrokenError()
    with pytest.raises(BrokenError) as info:
        _in_actor(s, _raise(err)).get()
    assert info.value is err
    assert s.append("user_message", _user()).get().seq == 0


# -- future: done callbacks run in the actor thread --------------------------------------


def test_a_raising_done_callback_does_not_kill_the_session(gate: threading.Event) -> None:
    """A done callback that raises does not stop the session nor strand the calls behind it."""
    s, thread = _start("callback")
    _block(s, gate)
    fut = s.count()
    fut.add_done_callback(_raise(RuntimeError("a bug in user code")))
    queued = s.count()
    gate.set()
    assert fut.get(timeout=BOUND) == 0
    _until(queued.done, thread)
    assert queued.get(timeout=0) == 0
    assert s.is_alive()


def test_a_base_exception_in_a_done_callback_stops_no_other_session(
    gate: threading.Event,
) -> None:
    """A done callback raising a BaseException never stops a bystander session."""
    bystander = Session.start("bystander", timeout=BOUND)
    victim, thread = _start("victim")
    _block(victim, gate)
    fut = victim.count()
    fut.add_done_callback(_raise(Meltdown("in a callback")))
    queued = victim.count()
    gate.set()
    _until(lambda: queued.done() and _error_of(queued) is None, thread)
    assert bystander.is_alive()
    assert bystander.count().get(timeout=BOUND) == 0


def test_a_raising_done_callback_does_not_starve_an_asyncio_awaiter() -> None:
    """An await on a future still wakes when an earlier done callback of it raised."""
    fut: SessionFuture[int] = SessionFuture("starved", timeout=BOUND)
    fut.add_done_callback(_raise(RuntimeError("a bug in user code")))

    async def main() -> int:
        task = asyncio.ensure_future(fut)
        await asyncio.sleep(0)  # the task parks on the future
        assert not task.done()
        with contextlib.suppress(RuntimeError):
            fut.set(5)
        return await asyncio.wait_for(task, 0.5)

    assert asyncio.run(main()) == 5


# -- with a store, done callbacks of appends run in the store's committer thread ----------


class GatedStore(MemoryStore):
    """A MemoryStore whose first write waits for ``gate``, so later appends queue behind it."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.writing = threading.Event()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        if not self.writing.is_set():
            self.writing.set()
            self.gate.wait(BOUND)
        return super().write(appends)


def test_with_a_store_a_raising_done_callback_does_not_wedge_the_session(
    gate: threading.Event,
) -> None:
    """On a store, a raising done callback of an append leaves the session readable."""
    store = GatedStore(gate)
    s = Session.start("wedge", store=store, timeout=BOUND)
    fut = s.append("user_message", _user())
    assert store.writing.wait(BOUND)
    fut.add_done_callback(_raise(RuntimeError("a bug in user code")))
    with capture_logs():
        gate.set()
        assert fut.get().seq == 0
        assert s.count().get(timeout=0.5) == 1


def test_with_a_shared_store_a_base_exception_in_a_callback_spares_other_sessions(
    gate: threading.Event,
) -> None:
    """A BaseException in one session's done callback never fails another session's append."""
    store = GatedStore(gate)
    first = Session.start("first", store=store, timeout=BOUND)
    victim = Session.start("victim", store=store, timeout=BOUND)
    bystander = Session.start("bystander", store=store, timeout=BOUND)
    first.append("user_message", _user())
    assert store.writing.wait(BOUND)  # the writer is busy: the next two share one batch
    doomed = victim.append("user_message", _user())
    doomed.add_done_callback(_raise(Meltdown("in a callback")))
    victim._call(SessionActor.h_ping).get()  # the append was handed to the writer
    spared = bystander.append("user_message", _user())
    bystander._call(SessionActor.h_ping).get()
    with capture_logs():
        gate.set()
        assert doomed.get().seq == 0
        assert spared.get().seq == 0
    assert [e.seq for e in store.load("bystander")] == [0]
    assert bystander.append("user_message", _user()).get().seq == 1


# -- future: asyncio -----------------------------------------------------------------------


def test_a_cancelled_await_still_applies_the_call(gate: threading.Event) -> None:
    """Cancelling the task awaiting an append does not undo it; the session runs on."""
    s = Session.start("cancel", timeout=BOUND)
    _block(s, gate)
    fut = s.append("user_message", _user("kept"))

    async def main() -> int:
        task = asyncio.ensure_future(fut)
        await asyncio.sleep(0)  # the task parks on the future
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        gate.set()
        return await s.count()

    with capture_logs() as logs:
        assert asyncio.run(asyncio.wait_for(main(), BOUND)) == 1
    assert fut.get(timeout=BOUND).seq == 0
    assert s.is_alive()
    assert [e for e in logs if e["log_level"] == "error"] == []


def test_one_future_awaited_from_two_loops_in_two_threads(gate: threading.Event) -> None:
    """Two event loops in two threads awaiting the same pending call both get its answer."""
    s = Session.start("two-loops", timeout=BOUND)
    _block(s, gate)
    fut = s.append("user_message", _user())
    parked = [threading.Event(), threading.Event()]
    results: list[object] = [None, None]

    async def wait(k: int) -> Event:
        asyncio.get_running_loop().call_soon(parked[k].set)  # runs once we are parked
        return await fut

    def run(k: int) -> None:
        try:
            results[k] = asyncio.run(asyncio.wait_for(wait(k), BOUND))
        except BaseException as exc:
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    assert all(p.wait(BOUND) for p in parked)
    gate.set()
    for t in threads:
        t.join(BOUND)
    assert not any(t.is_alive() for t in threads)
    ev = fut.get(timeout=BOUND)
    assert results == [ev, ev]


def test_one_future_awaited_by_two_tasks_of_one_loop(gate: threading.Event) -> None:
    """Two tasks of one loop awaiting the same pending call both get its answer."""
    s = Session.start("two-tasks", timeout=BOUND)
    _block(s, gate)
    fut = s.count()

    async def main() -> list[int]:
        a, b = asyncio.ensure_future(fut), asyncio.ensure_future(fut)
        await asyncio.sleep(0)
        assert not a.done()
        assert not b.done()
        gate.set()
        return list(await asyncio.gather(a, b))

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [0, 0]


def test_an_answer_after_the_awaiting_loop_closed_is_harmless(gate: threading.Event) -> None:
    """Answering a call whose awaiting loop was closed raises nothing in the actor thread."""
    s = Session.start("closed-loop", timeout=BOUND)
    _block(s, gate)
    fut = s.count()
    loop = asyncio.new_event_loop()

    async def abandon() -> None:
        task = asyncio.ensure_future(fut)
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    loop.run_until_complete(abandon())
    loop.close()
    gate.set()
    assert fut.get(timeout=BOUND) == 0
    assert s.append("user_message", _user()).get().seq == 0
    assert s.is_alive()


def test_awaiting_a_mapped_future_resolves() -> None:
    """await on session.count().map(f) resolves to f(count), like get() does."""
    s = Session.start("mapped", timeout=BOUND)
    assert s.count().get() == 0

    async def main() -> int:
        return await asyncio.wait_for(s.count().map(lambda n: n + 1), BOUND)

    assert asyncio.run(main()) == 1


# -- calls from inside the actor thread ----------------------------------------------------


def test_a_call_waited_on_from_the_actor_thread_is_bounded() -> None:
    """A session waiting on itself from its own thread gets CallTimeout, then runs on."""
    s = Session.start("self-call", timeout=0.2)
    inner: list[int] = []
    started = time.monotonic()
    with pytest.raises(CallTimeout):
        _in_actor(s, lambda: inner.append(s.count().get())).get(timeout=BOUND)
    assert time.monotonic() - started < BOUND
    assert inner == []
    assert s.count().get(timeout=BOUND) == 0
    assert s.is_alive()


def test_stop_called_from_the_actor_thread_is_bounded() -> None:
    """stop() from the session's own thread times out in bound instead of deadlocking;
    the session then stops."""
    s, thread = _start("self-stop", timeout=0.2)
    with pytest.raises(CallTimeout):
        _in_actor(s, s.stop).get(timeout=BOUND)
    thread.join(BOUND)
    assert not thread.is_alive()
    with pytest.raises(SessionStopped):
        s.count().get(timeout=0)


# -- BaseException containment -------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        SystemExit(3),
        KeyboardInterrupt(),
        GeneratorExit(),
        asyncio.CancelledError(),
        Meltdown("custom"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_base_exception_from_caller_data_stops_only_that_session_under_load(
    exc: BaseException,
) -> None:
    """A BaseException raised by caller data crashes only its session; loaded bystanders
    answer every call."""
    victim = Session.start("victim", timeout=BOUND)
    bystanders = [Session.start(f"bystander-{k}", timeout=BOUND) for k in range(2)]
    barrier = threading.Barrier(len(bystanders) + 1)
    seqs: list[list[int]] = [[] for _ in bystanders]

    def load(k: int) -> None:
        barrier.wait(BOUND)
        futs = [bystanders[k].append("user_message", _user(i)) for i in range(300)]
        seqs[k] = [f.get().seq for f in futs]

    threads = [threading.Thread(target=load, args=(k,)) for k in range(len(bystanders))]
    for t in threads:
        t.start()
    barrier.wait(BOUND)
    with capture_logs() as logs, pytest.raises(SessionCrashed) as info:
        _in_actor(victim, _raise(exc)).get()
    for t in threads:
        t.join(BOUND)
    assert info.value.__cause__ is exc
    assert not victim.is_alive()
    assert all(b.is_alive() for b in bystanders)
    assert seqs == [list(range(300))] * len(bystanders)
    assert [e["session_id"] for e in logs if e["event"] == "session.crashed"] == ["victim"]


def test_a_crash_with_an_unprintable_base_exception_answers_the_call() -> None:
    """A BaseException whose str() raises still fails its call with SessionCrashed."""
    s, thread = _start("unprintable")
    with capture_logs():
        fut = _in_actor(s, _raise(Unprintable()))
        thread.join(BOUND)
    assert not thread.is_alive()
    with pytest.raises(SessionCrashed):
        fut.get(timeout=0)


def test_a_crash_with_an_unprintable_base_exception_ends_subscriptions() -> None:
    """A subscriber of a session that died of an unprintable BaseException sees its feed end."""
    s, thread = _start("unprintable-sub")
    sub = s.subscribe(0)
    with capture_logs():
        _in_actor(s, _raise(Unprintable()))
        thread.join(BOUND)
    assert not thread.is_alive()
    with pytest.raises(SessionStopped):
        sub.get(timeout=0)


def test_calls_queued_behind_a_crash_are_reported_as_not_applied(
    gate: threading.Event,
) -> None:
    """A call queued behind a crash fails with plain SessionStopped, not SessionCrashed."""
    s, thread = _start("queued-crash")

    def crash_later() -> None:
        gate.wait(BOUND)
        raise Meltdown("later")

    with capture_logs():
        crashing = _in_actor(s, crash_later)
        queued = s.append("user_message", _user())
        gate.set()
        thread.join(BOUND)
    assert isinstance(_error_of(crashing), SessionCrashed)
    err = _error_of(queued)
    assert isinstance(err, SessionStopped)
    assert not isinstance(err, SessionCrashed)


# -- stopping ------------------------------------------------------------------------------


def test_stop_waits_for_a_long_handler_and_the_calls_before_it(gate: threading.Event) -> None:
    """stop() during a long handler returns after it and the calls queued before the stop."""
    s = Session.start("long", timeout=BOUND)
    sub = s.subscribe(0)
    blocker = _block(s, gate)
    queued = s.append("user_message", _user())
    stopper = threading.Thread(target=s.stop)
    stopper.start()
    gate.set()
    stopper.join(BOUND)
    assert not stopper.is_alive()
    assert blocker.get(timeout=0) is True
    assert queued.get(timeout=0).seq == 0
    assert not s.is_alive()
    assert _drain_sub(sub) == [0]


def test_stop_timing_out_raises_call_timeout(gate: threading.Event) -> None:
    """stop(timeout) that cannot finish in time raises CallTimeout, not Pykka's Timeout."""
    s = Session.start("stop-timeout", timeout=BOUND)
    _block(s, gate)
    with pytest.raises(CallTimeout):
        s.stop(timeout=0.05)


def test_stop_from_two_threads_at_once() -> None:
    """Two threads stopping one session at the same time both return, and it is stopped."""
    for round_ in range(10):
        s, thread = _start(f"double-stop-{round_}")
        assert _race(s.stop, s.stop) == (None, None)
        thread.join(BOUND)
        assert not thread.is_alive()
        assert not s.is_alive()


def _replay_stop_race(monkeypatch: pytest.MonkeyPatch, ref: pykka.ActorRef[Any]) -> None:
    """Replay Pykka's stop race on an actor that has already exited: every liveness check
    made before the next message is put sees it alive, as if it had exited in between."""
    real_stopped, real_inbox = ref.actor_stopped, ref.actor_inbox
    landed = threading.Event()

    class Stopped:
        def is_set(self) -> bool:
            return landed.is_set() and real_stopped.is_set()

        def wait(self, timeout: float | None = None) -> bool:
            return real_stopped.wait(timeout)

    class Inbox:
        def put(self, item: Any) -> None:
            real_inbox.put(item)
            landed.set()

        def __getattr__(self, name: str) -> Any:
            return getattr(real_inbox, name)

    monkeypatch.setattr(ref, "actor_stopped", Stopped())
    monkeypatch.setattr(ref, "actor_inbox", Inbox())


def test_a_call_landing_after_the_actor_exited_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pykka's stop race for a call: checked alive, put after the actor exited: SessionStopped."""
    s, thread = _start("late-call")
    ref = s._actor()
    assert ref is not None
    s.stop()
    thread.join(BOUND)
    _replay_stop_race(monkeypatch, ref)
    with pytest.raises(SessionStopped):
        s.count().get(timeout=0)


def test_a_stop_landing_after_the_actor_exited_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pykka's stop race for stop(): checked alive, put after the actor exited: it returns."""
    s, thread = _start("late-stop", timeout=0.3)
    ref = s._actor()
    assert ref is not None
    pykka.ActorRegistry.stop_all(block=True, timeout=BOUND)  # someone else stops it
    thread.join(BOUND)
    _replay_stop_race(monkeypatch, ref)
    s.stop()


def test_stop_racing_subscribe_never_hangs() -> None:
    """subscribe() racing stop() either raises SessionStopped or returns a feed that ends."""
    for round_ in range(30):
        s = Session.start(f"sub-race-{round_}", timeout=BOUND)
        result, stopped = _race(lambda s=s: s.subscribe(0), s.stop)
        assert stopped is None
        if isinstance(result, Subscription):
            assert _drain_sub(result) == []
        else:
            assert type(result) is SessionStopped, repr(result)


def test_close_racing_stop_raises_nothing() -> None:
    """close() and stop() at the same time both return; the feed ends after its events."""
    for round_ in range(10):
        s = Session.start(f"close-race-{round_}", timeout=BOUND)
        sub = s.subscribe(0)
        s.append("user_message", _user()).get()
        assert _race(sub.close, s.stop) == (None, None)
        assert _drain_sub(sub) == [0]


def test_stop_all_with_calls_in_flight_answers_every_call() -> None:
    """stop_all while threads pipeline appends: each call is acknowledged or SessionStopped,
    and each feed holds exactly the acknowledged events."""
    n = 3
    sessions = [Session.start(f"fleet-{k}", timeout=BOUND) for k in range(n)]
    subs = [s.subscribe(0, buffer=10**7) for s in sessions]
    barrier = threading.Barrier(n + 1)
    warmed = [threading.Event() for _ in range(n)]
    acked: list[list[int]] = [[] for _ in range(n)]
    refused = [0] * n
    hung = [0] * n

    def caller(k: int) -> None:
        barrier.wait(BOUND)
        futs = []
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            fut = sessions[k].append("user_message", _user())
            futs.append(fut)
            if len(futs) % 50 == 0:  # keep the inbox short: at most 50 calls in flight
                with contextlib.suppress(SessionStopped):
                    fut.get()
                warmed[k].set()
            if fut.done() and isinstance(_error_of(fut), SessionStopped):
                break
        for f in futs:
            try:
                acked[k].append(f.get().seq)
            except SessionStopped:
                refused[k] += 1
            except CallTimeout:
                hung[k] += 1

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    barrier.wait(BOUND)
    assert all(w.wait(BOUND) for w in warmed)
    pykka.ActorRegistry.stop_all(block=True, timeout=BOUND)
    for t in threads:
        t.join(BOUND * 2)
    assert not any(t.is_alive() for t in threads)
    assert hung == [0] * n
    assert all(refused)
    for k in range(n):
        assert acked[k] == list(range(len(acked[k])))
        assert _drain_sub(subs[k]) == acked[k]


def test_calls_made_after_a_stop_request_are_never_applied(gate: threading.Event) -> None:
    """Calls queued behind a stop request fail with SessionStopped; those before it apply."""
    s = Session.start("behind-stop", timeout=BOUND)
    _block(s, gate)
    before = [s.append("user_message", _user(i)) for i in range(5)]
    stopping = pykka.ActorRegistry.stop_all(block=False)
    after = [s.append("user_message", _user(i)) for i in range(5)]
    gate.set()
    pykka.get_all(stopping, timeout=BOUND)
    assert [f.get(timeout=0).seq for f in before] == list(range(5))
    for f in after:
        with pytest.raises(SessionStopped):
            f.get(timeout=0)


def test_a_handle_after_stop_all_fails_promptly_everywhere() -> None:
    """After ActorRegistry.stop_all, calls and subscribe fail at once, stop() is a no-op."""
    s = Session.start("after-stop-all", timeout=BOUND)
    sub = s.subscribe(0)
    s.append("user_message", _user()).get()
    pykka.ActorRegistry.stop_all(block=True, timeout=BOUND)
    started = time.monotonic()
    with pytest.raises(SessionStopped):
        s.append("user_message", _user()).get(timeout=BOUND)
    with pytest.raises(SessionStopped):
        s.subscribe(0)
    s.stop()
    assert time.monotonic() - started < BOUND / 4
    assert not s.is_alive()
    assert _drain_sub(sub) == [0]


def test_many_sessions_leave_no_thread_behind() -> None:
    """Starting, using, crashing and stopping many pinned sessions (a thread each) leaves
    none of the threads they started alive. (Threads are compared as a set, not counted:
    a thread an earlier test left to finish may end meanwhile.)"""
    before = set(threading.enumerate())
    started: set[threading.Thread] = set()

    async def await_count(s: Session) -> int:
        return await s.count()

    with capture_logs():
        for i in range(40):
            s = Session.start(f"leak-{i}", timeout=BOUND, pinned=True)
            started.update(t for t in threading.enumerate() if t not in before)
            sub = s.subscribe(0)
            s.append("user_message", _user(i)).get()
            assert asyncio.run(await_count(s)) == 1
            if i % 4 == 0:
                with pytest.raises(SessionCrashed):
                    _in_actor(s, _raise(Meltdown())).get()
            else:
                s.stop()
            assert _drain_sub(sub) == [0]  # a crash ends the feed with SessionCrashed
    assert len(started) >= 40  # a thread of its own per pinned session
    leftovers = [t for t in threading.enumerate() if t not in before]
    for t in leftovers:
        t.join(BOUND)
    assert [t.name for t in leftovers if t.is_alive()] == []


# -- subscriptions -------------------------------------------------------------------------


def test_close_from_another_thread_ends_a_blocked_iteration() -> None:
    """A thread blocked in `for ev in sub` finishes once another thread closes the feed."""
    s = Session.start("close-iter", timeout=BOUND)
    sub = s.subscribe(0)
    seen: list[int] = []
    got_two = threading.Event()

    def read() -> None:
        for ev in sub:
            seen.append(ev.seq)
            if len(seen) == 2:
                got_two.set()

    reader = threading.Thread(target=read)
    reader.start()
    s.append("user_message", _user(0)).get()
    s.append("user_message", _user(1)).get()
    assert got_two.wait(BOUND)
    sub.close()
    reader.join(BOUND)
    assert not reader.is_alive()
    assert seen == [0, 1]
    assert s.append("user_message", _user(2)).get().seq == 2


def test_close_from_another_thread_ends_async_iteration() -> None:
    """An `async for` parked on the feed ends once another thread closes it."""
    s = Session.start("close-aiter", timeout=BOUND)
    sub = s.subscribe(0)
    s.append("user_message", _user()).get()

    async def main() -> list[int]:
        seen = []
        closer = threading.Thread(target=sub.close)
        async for ev in sub:
            seen.append(ev.seq)
            closer.start()  # the next __anext__ parks, then the close wakes it
        closer.join(BOUND)
        return seen

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [0]


def test_a_cancelled_async_read_loses_no_event() -> None:
    """Cancelling a task parked in `async for` loses no event for the next reader."""
    s = Session.start("cancel-aiter", timeout=BOUND)
    sub = s.subscribe(0)

    async def main() -> list[int]:
        task = asyncio.ensure_future(sub.__anext__())
        await asyncio.sleep(0)  # the task parks on the feed
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for i in range(3):
            await s.append("user_message", _user(i))
        return [(await sub.__anext__()).seq for _ in range(3)]

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [0, 1, 2]


def test_a_feed_whose_async_reader_loop_closed_keeps_the_session_running() -> None:
    """Events pushed to a feed parked on a closed event loop raise nothing in the actor."""
    s = Session.start("closed-loop-feed", timeout=BOUND)
    sub = s.subscribe(0)
    loop = asyncio.new_event_loop()

    async def abandon() -> None:
        task = asyncio.ensure_future(sub.__anext__())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    loop.run_until_complete(abandon())
    loop.close()
    assert s.append("user_message", _user()).get().seq == 0
    assert s.append("user_message", _user()).get().seq == 1
    assert [sub.get(BOUND).seq for _ in range(2)] == [0, 1]


def test_async_iteration_ends_when_the_session_stops_from_another_thread() -> None:
    """An `async for` parked on the feed ends after every event once the session stops."""
    s = Session.start("stop-aiter", timeout=BOUND)
    sub = s.subscribe(0)
    for i in range(3):
        s.append("user_message", _user(i)).get()

    async def main() -> list[int]:
        seen = []
        stopper = threading.Thread(target=s.stop)
        async for ev in sub:
            seen.append(ev.seq)
            if len(seen) == 3:
                stopper.start()
        stopper.join(BOUND)
        return seen

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [0, 1, 2]


def test_an_unread_unclosed_subscriber_is_bounded_and_released() -> None:
    """A subscriber nobody reads holds at most its buffer and is dropped once it lags."""
    s = Session.start("unread", timeout=BOUND)
    sub = s.subscribe(0, buffer=8)
    ref = weakref.ref(sub)
    futs = [s.append("user_message", _user(i)) for i in range(200)]
    futs[-1].get()
    assert sub.pending() == 8
    del sub
    gc.collect()
    assert ref() is None, "the session still holds a cut-off subscriber"


def test_a_closed_subscriber_is_released_without_further_events() -> None:
    """After close(), the session lets go of the subscriber even if nothing is appended."""
    s = Session.start("closed", timeout=BOUND)
    sub = s.subscribe(0)
    ref = weakref.ref(sub)
    sub.close()
    assert s.count().get() == 0  # the unsubscribe was queued before this
    del sub
    gc.collect()
    assert ref() is None


def test_a_subscribe_that_timed_out_leaves_no_subscriber(gate: threading.Event) -> None:
    """subscribe(timeout=...) that times out registers no subscriber in the session."""
    s = Session.start("orphan", timeout=BOUND)
    _block(s, gate)
    with pytest.raises(CallTimeout):
        s.subscribe(0, timeout=0)
    gate.set()
    s.append("user_message", _user()).get()
    gc.collect()
    orphans = [o for o in gc.get_objects() if type(o) is Subscription and o.session_id == "orphan"]
    assert orphans == []


def test_subscription_get_with_an_infinite_timeout_waits_for_the_event() -> None:
    """sub.get(timeout=inf) returns the next event once it is appended."""
    s = Session.start("sub-inf", timeout=BOUND)
    sub = s.subscribe(0)
    appender = threading.Timer(0.05, lambda: s.append("user_message", _user()).get())
    appender.start()
    try:
        assert sub.get(math.inf).seq == 0
    finally:
        appender.join(BOUND)


# -- data ----------------------------------------------------------------------------------


def test_huge_data_round_trips_and_reaches_subscribers() -> None:
    """An 8 MB event with a 200k-item list is appended, read back and delivered intact."""
    s = Session.start("huge", timeout=BOUND)
    sub = s.subscribe(0)
    content = "x" * (8 << 20)
    ev = s.append("user_message", {"content": content, "items": list(range(200_000))}).get()
    assert ev.data["content"] == content
    assert len(ev.data["items"]) == 200_000
    assert sub.get(BOUND) == ev
    assert s.events().get() == [ev]


def test_deeply_nested_data_is_refused_and_the_session_runs_on() -> None:
    """Data nested 100k levels deep fails with InvalidEvent; the session keeps answering."""
    s = Session.start("deep", timeout=BOUND)
    data: dict[str, Any] = {}
    cur = data
    for _ in range(100_000):
        cur["k"] = {}
        cur = cur["k"]
    with pytest.raises(InvalidEvent) as info:
        s.append("user_message", data).get()
    assert info.value.reason == "unserializable_event_data"
    assert s.append("user_message", _user()).get().seq == 0


# -- errors --------------------------------------------------------------------------------


def test_session_errors_pickle_round_trip_with_any_session_id() -> None:
    """A SessionStopped for session 'a: b' keeps its message through pickle."""
    err = SessionStopped("a: b", "gone")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.session_id, str(back)) == (SessionStopped, "a: b", str(err))


@pytest.mark.parametrize(
    "err",
    [
        SessionStopped("s", "gone"),
        SessionCrashed("s", "crashed with Meltdown: x"),
        CallTimeout("s", "no answer within 1 s"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_session_errors_pickle_round_trip(err: SessionError) -> None:
    """Session errors keep their type, session id and message through pickle."""
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.session_id, str(back)) == (type(err), err.session_id, str(err))


# -- caller data is read in the caller's thread, at the call ------------------------------


@pytest.mark.parametrize(
    "exc", [SystemExit(3), KeyboardInterrupt(), Meltdown("custom")], ids=lambda e: type(e).__name__
)
def test_a_base_exception_from_caller_data_is_raised_in_the_callers_thread(
    exc: BaseException,
) -> None:
    """Data is read at the call, so a BaseException it raises reaches its own caller; the
    session never sees it and runs on."""
    s = Session.start("reader", timeout=BOUND)
    with pytest.raises(type(exc)):
        s.append("user_message", Raises(exc))
    assert s.is_alive()
    assert s.append("user_message", _user()).get().seq == 0


def test_data_mutated_after_append_returned_is_not_what_is_stored() -> None:
    """Pipelined appends of one reused dict store what it held at each call, not later."""
    s = Session.start("reuse", timeout=BOUND)
    data: dict[str, Any] = {"content": "", "metadata": {"n": -1}}
    futs = []
    for i in range(2000):
        data["content"] = f"m{i}"
        data["metadata"]["n"] = i
        futs.append(s.append("user_message", data))
    data["content"] = "changed after the last call"
    assert [f.get().data["content"] for f in futs] == [f"m{i}" for i in range(2000)]
    assert [m.metadata["n"] for m in s.derive_messages().get()] == list(range(2000))


def test_append_or_log_drops_bad_input_at_the_call_with_the_session_id() -> None:
    """A refused append_or_log resolves to None at once and logs the drop with session_id."""
    s = Session.start("drops", timeout=BOUND)
    with capture_logs() as logs:
        fut = s.append_or_log("no_such_type", {"content": "x"})
        assert fut.done()
        assert fut.get() is None
    assert [(e["event"], e["session_id"], e["reason"]) for e in logs] == [
        ("log.event_dropped", "drops", "unknown_event_type")
    ]
    assert s.count().get() == 0
