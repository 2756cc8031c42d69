"""The session registry (DESIGN.md §5): Sessions on MemoryStore and SQLiteStore.

Crashes here are real: a ``BaseException`` raised inside a session's handler,
or a store failure injected through :class:`FaultyStore`. Restarts are
observed through an injected scheduler (the registry calls it after deciding
to restart), never by sleeping; every wait is bounded.

"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
import pytest
from bounds import BOUND
from crashes import crash_behind
from fake_clock import FakeClock
from structlog.testing import capture_logs

from nous_actor import (
    Backoff,
    CallTimeout,
    Event,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    SQLiteStore,
    Store,
    StoreError,
    TooManySessions,
)
from nous_actor.sessions.actor import SessionActor, session_cell
from nous_actor.sessions.registry import DEFAULT_BACKOFF, _supervisor
from nous_actor.sessions.registry._passivation import Passivation
from nous_actor.supervision import _timer, cell_of

# A fixed, tiny backoff: every restart goes through the (injected) scheduler.
TICK = Backoff(0.001, 0.001, 0.0)


class Boom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


# -- test doubles ----------------------------------------------------------------------------


class FaultyStore:
    """A Store wrapping another one, with failures and pauses injected on demand."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.fail_loads = 0  # the next n loads raise StoreError (-1: all of them)
        self.fail_writes = 0  # the next n writes raise StoreError
        self.write_delay = 0.0  # a slow commit (seconds), e.g. an fsync under load
        self.writing = threading.Event()  # set when a write has begun
        self.release_delay = 0.0  # a slow release of a writer claim (seconds)
        self.releasing = threading.Event()

    def _take(self, attr: str) -> bool:
        with self.lock:
            left = getattr(self, attr)
            if left:
                setattr(self, attr, left - 1 if left > 0 else left)
            return bool(left)

    def load(self, session_id: str) -> list[Event]:
        if self._take("fail_loads"):
            raise StoreError("injected load failure", session_id=session_id)
        return self.inner.load(session_id)

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.writing.set()
        if self.write_delay:
            threading.Event().wait(self.write_delay)  # a slow store, not a settle-sleep
        if self._take("fail_writes"):
            raise StoreError("injected write failure")
        return self.inner.write(appends)

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        self.inner.drop(session_id, seqs)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def delete(self, session_id: str) -> None:
        self.inner.delete(session_id)

    def claim(self, session_id: str) -> str:
        return self.inner.claim(session_id)

    def release(self, session_id: str, token: str) -> None:
        self.releasing.set()
        if self.release_delay:
            threading.Event().wait(self.release_delay)  # a slow store, not a settle-sleep
        self.inner.release(session_id, token)

    def close(self) -> None:
        self.inner.close()


@dataclass
class Scheduler:
    """An injected ``scheduler(delay, fn)``.

    ``auto``: run ``fn`` (the restart) at once, then record the delay, so a
    test that sees the record knows the restart is done. Otherwise record
    ``(delay, fn)`` for the test to fire by hand.
    """

    auto: bool = True
    calls: queue.Queue[tuple[float, Callable[[], None] | None]] = field(
        default_factory=queue.Queue
    )

    def __call__(self, delay: float, fn: Callable[[], None]) -> None:
        if self.auto:
            fn()
            self.calls.put((delay, None))
        else:
            self.calls.put((delay, fn))

    def next(self) -> tuple[float, Callable[[], None] | None]:
        return self.calls.get(timeout=BOUND)


@dataclass
class Timeline:
    """One queue of what the registry did: restarts it scheduled and events it logged.

    Use ``scheduler`` as the registry's scheduler and ``processor`` in
    ``capture_logs(processors=[...])``; then wait on either, in order.
    """

    items: queue.Queue[tuple[str, Any]] = field(default_factory=queue.Queue)

    def scheduler(self, delay: float, fn: Callable[[], None]) -> None:
        self.items.put(("scheduled", fn))

    def processor(self, logger: Any, method: str, event_dict: Any) -> Any:
        self.items.put(("logged", event_dict["event"]))
        return event_dict

    def fire_until(self, event: str) -> int:
        """Fire each scheduled restart until ``event`` is logged; return how many were fired."""
        fired = 0
        while True:
            kind, what = self.items.get(timeout=BOUND)
            if kind == "logged" and what == event:
                return fired
            if kind == "scheduled":
                what()
                fired += 1


# -- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every backend: a MemoryStore, and an SQLiteStore on a temporary file."""
    s: Store = (
        MemoryStore()
        if request.param == "memory"
        else SQLiteStore(tmp_path / "sessions.db", durability="normal")
    )
    yield s
    s.close()


@pytest.fixture
def registries() -> Iterator[Callable[..., Sessions]]:
    """Make registries (timeout=BOUND, backoff=TICK, auto scheduler); all closed at the end."""
    made: list[Sessions] = []

    def make(store: Store | None = None, **kw: Any) -> Sessions:
        kw.setdefault("timeout", BOUND)
        kw.setdefault("backoff", TICK)
        kw.setdefault("scheduler", Scheduler())
        reg = Sessions(store, **kw)
        made.append(reg)
        return reg

    yield make
    for reg in reversed(made):
        reg.close()


def boom(exc: BaseException) -> Callable[[SessionActor], None]:
    def handler(actor: SessionActor) -> None:
        raise exc

    return handler


def crash(handle: Session, exc: BaseException | None = None) -> None:
    """Crash the session behind ``handle`` with a BaseException raised in a handler, and
    wait until the registry has been told of the exit.

    The call fails with SessionCrashed.
    """
    if exc is None:  # the generator-throw form: SystemExit from inside a lambda
        fut = handle._call(lambda actor: (_ for _ in ()).throw(SystemExit()))
    else:
        fut = handle._call(boom(exc))
    ref = handle._ref
    with pytest.raises(SessionCrashed):
        fut.get()
    if ref is not None:
        assert cell_of(ref).finished.wait(BOUND)


def append(handle: Session, text: str) -> Event:
    return handle.append("user_message", {"content": text}).get()


def contents(handle: Session) -> list[str]:
    return [ev.data["content"] for ev in handle.events().get()]


def urn(handle: Session) -> str:
    ref = handle._actor()
    assert ref is not None
    return str(ref.actor_urn)


def logged(logs: Sequence[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


# -- open: start or find ---------------------------------------------------------------------


def test_open_starts_a_session_and_finds_it_again(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """open(id) twice gives handles to the same actor; writes through one are read by the other."""
    reg = registries(store)
    first = reg.open("chat")
    second = reg.open("chat")
    assert urn(first) == urn(second)
    append(first, "hi")
    assert contents(second) == ["hi"]
    assert reg.live() == ["chat"]


def test_open_recovers_a_session_from_the_store(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A session written by one registry is recovered by the next one on the same store."""
    with Sessions(store, timeout=BOUND) as first:
        h = first.open("chat")
        for t in ("a", "b", "c"):
            append(h, t)
    h = registries(store).open("chat")
    assert contents(h) == ["a", "b", "c"]
    assert append(h, "d").seq == 3


def test_open_rejects_a_bad_session_id(registries: Callable[..., Sessions]) -> None:
    """open() with an invalid id raises ValueError (TypeError for a non-str), naming the
    rule, and starts nothing."""
    reg = registries()
    for bad in ("", " chat", "a\nb", "x" * 257):
        with pytest.raises(ValueError, match="not a valid session id"):
            reg.open(bad)
    for wrong in (None, 42):
        with pytest.raises(TypeError, match="session_id must be a str"):
            reg.open(wrong)  # type: ignore[arg-type]
    assert reg.live() == []


# -- crash and restart -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [None, SystemExit("bye"), KeyboardInterrupt("ki"), Boom("custom")],
    ids=["generator-throw", "SystemExit", "KeyboardInterrupt", "custom"],
)
def test_handle_keeps_working_across_a_crash(
    store: Store, registries: Callable[..., Sessions], exc: BaseException | None
) -> None:
    """After a crash the registry restarts the session from the store; old handles reach it."""
    sched = Scheduler()
    reg = registries(store, scheduler=sched)
    h = reg.open("chat")
    acked = [append(h, f"m{i}").data["content"] for i in range(3)]
    before = urn(h)
    crash(h, exc)
    sched.next()  # the restart has run
    assert reg.live() == ["chat"]
    assert contents(h) == acked
    assert urn(h) != before
    assert append(h, "after").seq == 3
    assert reg.restart_count("chat") == 1


def until_logged(reg: Sessions, logs: list[dict[str, Any]], event: str, n: int) -> None:
    """Until ``event`` was logged ``n`` times: a recovery runs off the registry and logs
    once the session has its log back. Each round is a trip through the registry's
    inbox (not a sleep), at most 10,000."""
    for _ in range(10_000):
        if len(logged(logs, event)) >= n:
            return
        reg.live()


def test_restart_is_logged_with_session_id_reason_and_count(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Each restart emits session.restart with session_id, reason and restart_count."""
    sched = Scheduler()
    reg = registries(store, scheduler=sched)
    h = reg.open("chat")
    with capture_logs() as logs:
        crash(h, Boom("first"))
        sched.next()
        crash(h, KeyboardInterrupt("second"))
        sched.next()
        until_logged(reg, logs, "session.recovered_after_crash", 2)
    got = [
        (e["session_id"], e["reason"], e["restart_count"], e["log_level"])
        for e in logged(logs, "session.restart")
    ]
    assert got == [
        ("chat", "Boom: first", 1, "warning"),
        ("chat", "KeyboardInterrupt: second", 2, "warning"),
    ]
    assert [e["restart_count"] for e in logged(logs, "session.recovered_after_crash")] == [1, 2]


def test_recovery_after_a_crash_is_logged_with_the_reason_it_recovered_from(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """session.recovered_after_crash carries session_id and the reason of the crash it
    recovered from (the reason session.restart logged), beside the restart count."""
    sched = Scheduler()
    reg = registries(store, scheduler=sched)
    h = reg.open("chat")
    append(h, "kept")
    with capture_logs() as logs:
        crash(h, Boom("first"))
        sched.next()
        crash(h, KeyboardInterrupt("second"))
        sched.next()
        until_logged(reg, logs, "session.recovered_after_crash", 2)
    got = [
        (e["session_id"], e["reason"], e["restart_count"], e["log_level"])
        for e in logged(logs, "session.recovered_after_crash")
    ]
    assert got == [
        ("chat", "Boom: first", 1, "info"),
        ("chat", "KeyboardInterrupt: second", 2, "info"),
    ]
    assert [e["reason"] for e in logged(logs, "session.restart")] == [r for _, r, _, _ in got]


def test_a_recovery_after_a_failed_restart_names_the_failure(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """When the first reload fails and the next one works, the recovery's reason is the
    failure it recovered from."""
    faulty = FaultyStore(store)
    timeline = Timeline()
    reg = registries(faulty, scheduler=timeline.scheduler, max_restarts=5, max_seconds=60)
    h = reg.open("chat")
    append(h, "kept")
    faulty.fail_loads = 1
    with capture_logs(processors=[timeline.processor]) as logs:
        crash(h, Boom("first crash"))
        assert timeline.fire_until("session.recovered_after_crash") == 2
    [recovered] = logged(logs, "session.recovered_after_crash")
    assert recovered["session_id"] == "chat"
    assert recovered["reason"] == (
        "restart failed: StoreError: session 'chat': injected load failure"
    )
    assert recovered["restart_count"] == 2
    assert contents(h) == ["kept"]


def test_store_failure_crashes_the_session_and_it_recovers_the_acknowledged_appends(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A failed commit crashes the session; the restart reloads exactly the acknowledged ones."""
    faulty = FaultyStore(store)
    sched = Scheduler()
    reg = registries(faulty, scheduler=sched)
    h = reg.open("chat")
    append(h, "kept")
    faulty.fail_writes = 1
    with capture_logs() as logs:
        with pytest.raises(StoreError, match="injected write failure"):
            append(h, "lost")
        sched.next()
    assert contents(h) == ["kept"]
    assert append(h, "next").seq == 1
    assert contents(h) == ["kept", "next"]
    [restart] = logged(logs, "session.restart")
    assert restart["session_id"] == "chat"
    assert "StoreError" in restart["reason"]
    assert "injected write failure" in restart["reason"]


def test_calls_queued_at_a_crash_reach_the_restarted_session_in_order(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Calls queued behind the crashing one were not applied: the registry's route holds
    them and delivers them, in the order sent, to the session once it is back (none is
    refused because the session restarted), within their bound."""
    reg = registries(store)
    h = reg.open("chat")
    ref = h._actor()
    crashing, (queued, counted) = crash_behind(
        h,
        lambda: ([h.append("user_message", {"content": f"m{i}"}) for i in range(5)], h.count()),
        Boom("crash with calls queued"),
    )
    with pytest.raises(SessionCrashed, match="Boom"):
        crashing.get()
    assert [fut.get().seq for fut in queued] == [0, 1, 2, 3, 4]
    assert counted.get() == 5
    assert contents(h) == [f"m{i}" for i in range(5)]
    assert ref is not None
    assert not ref.is_alive()
    assert h._route is not None
    assert h._route.moves >= 1


def test_crash_mid_stream_keeps_exactly_the_acknowledged_appends(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Concurrent appenders and a crash mid-stream: the log is exactly the acknowledged appends."""
    reg = registries(store, max_restarts=50, backoff=DEFAULT_BACKOFF, scheduler=_timer)
    handles = [reg.open("chat") for _ in range(4)]
    per_thread, burst = 40, 4
    acked: list[tuple[int, Event]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    halfway = threading.Barrier(len(handles) + 1, timeout=BOUND)

    def appender(t: int) -> None:
        h = handles[t]
        for start in range(0, per_thread, burst):
            if start == per_thread // 2:
                halfway.wait()
            futs = [
                (i, h.append("user_message", {"content": f"{t}-{i}"}))
                for i in range(start, start + burst)
            ]
            for _, fut in futs:
                try:
                    ev = fut.get(timeout=BOUND)
                except Exception as exc:
                    with lock:
                        failures.append(exc)
                else:
                    with lock:
                        acked.append((t, ev))

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(len(handles))]
    for th in threads:
        th.start()
    halfway.wait()  # every appender is half done and about to send its next burst
    try:
        handles[0]._call(boom(Boom("mid-stream"))).get()
    except SessionStopped:  # crashed it, or landed on an actor already gone
        pass
    for th in threads:
        th.join(BOUND * 3)
        assert not th.is_alive(), "an appender hung"
    assert not [f for f in failures if isinstance(f, CallTimeout)]
    assert all(isinstance(f, (SessionStopped, StoreError)) for f in failures), failures
    events = handles[1].events().get()
    assert sorted(ev.data["content"] for ev in events) == sorted(
        ev.data["content"] for _, ev in acked
    )
    assert sorted(ev.seq for ev in events) == sorted(ev.seq for _, ev in acked)
    for t in range(len(handles)):  # each appender's acknowledged events keep their order
        mine = [ev.data["content"] for ev in events if ev.data["content"].startswith(f"{t}-")]
        assert mine == [
            ev.data["content"] for u, ev in sorted(acked, key=lambda p: p[1].seq) if u == t
        ]


def test_restart_waits_for_commits_in_flight_at_the_crash(store: Store) -> None:
    """A crash during a slow commit restarts the session with that append once it lands."""
    faulty = FaultyStore(store)
    with Sessions(faulty, timeout=BOUND, backoff=None) as reg:  # restart at once
        h = reg.open("chat")
        append(h, "before")
        faulty.write_delay = 0.5
        faulty.writing.clear()
        in_flight = h.append("user_message", {"content": "in flight"})
        assert faulty.writing.wait(BOUND)  # the committer is writing it
        with capture_logs() as logs:
            crash(h, Boom("crash during a commit"))
            assert in_flight.get().seq == 1  # acknowledged after the crash
            faulty.write_delay = 0.0
            assert contents(h) == ["before", "in flight"]
        assert not logged(logs, "session.gave_up")
        assert [e["restart_count"] for e in logged(logs, "session.restart")] == [1]
        assert reg.restart_count("chat") == 1


def test_reopen_after_passivation_waits_for_commits_in_flight_at_the_stop(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A call right after passivation, during a slow commit, reopens the session with it."""
    faulty = FaultyStore(store)
    clock = FakeClock()
    reg = registries(faulty, idle_timeout=60, clock=clock)
    h = reg.open("chat")
    faulty.write_delay = 0.5
    in_flight = h.append("user_message", {"content": "in flight"})
    assert faulty.writing.wait(BOUND)
    assert reg.passivate_idle(now=clock.now + 60) == ["chat"]
    count = h.count()  # reopens the session from the store
    assert in_flight.get().seq == 0
    assert count.get() == 1


class _DescheduledAfterPut:
    """A session's ref as a handle sees it, where the caller's thread is descheduled right
    after putting its call into the inbox, until the actor has stopped (white box:
    Session._call reads ``actor_stopped`` before and after ``actor_inbox.put``)."""

    def __init__(self, ref: Any) -> None:
        outer = self
        self.put_done = False

        class Inbox:
            def put(self, item: Any) -> None:
                ref.actor_inbox.put(item)
                outer.put_done = True

        class Stopped:
            def is_set(self) -> bool:
                if outer.put_done:
                    ref.actor_stopped.wait(BOUND)
                return bool(ref.actor_stopped.is_set())

        self.actor_inbox = Inbox()
        self.actor_stopped = Stopped()


def test_the_call_that_crashes_a_session_fails_with_session_crashed() -> None:
    """The call whose handler raises a BaseException always fails with SessionCrashed."""
    store = FaultyStore(MemoryStore())
    store.release_delay = 0.5  # the actor answers the call only after releasing its claim
    real = Session.start("chat", store=store, timeout=BOUND)
    ref = real._actor()
    slow: Any = _DescheduledAfterPut(ref)
    h = Session("chat", lambda: slow, timeout=BOUND)
    with pytest.raises(SessionCrashed):
        h._call(boom(Boom("crash"))).get()


def test_call_during_crash_teardown_reaches_the_restarted_session(
    registries: Callable[..., Sessions],
) -> None:
    """A call made while a crashed session is still releasing its claim waits for the restart."""
    faulty = FaultyStore(MemoryStore())
    sched = Scheduler()
    reg = registries(faulty, scheduler=sched)
    h = reg.open("chat")
    append(h, "a")
    faulty.release_delay = 0.5
    faulty.releasing.clear()
    old = h._ref
    crashing = h._call(boom(Boom("crash")))
    assert faulty.releasing.wait(BOUND)  # the dead actor is releasing its claim
    try:
        assert h.count().get() == 1
    finally:
        with pytest.raises(SessionCrashed):
            crashing.get()
    assert cell_of(old).finished.wait(BOUND)  # its exit is reported
    assert reg.restart_count("chat") == 1


def test_base_exception_in_one_session_leaves_the_others_answering(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A BaseException in one session stops only it: other sessions keep answering at once."""
    sched = Scheduler(auto=False)  # keep the crashed one down while we look
    reg = registries(store, scheduler=sched)
    a, b, c = (reg.open(sid) for sid in "abc")
    for h in (a, b, c):
        append(h, f"{h.session_id}0")
    crash(b, KeyboardInterrupt("only b"))
    sched.next()
    assert reg.live() == ["a", "c"]
    assert contents(a) == ["a0"]
    assert append(c, "c1").seq == 1


# -- giving up -------------------------------------------------------------------------------


def test_store_failing_on_load_exhausts_the_intensity_and_gives_up(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Failed reloads count as crashes; beyond the intensity the session is given up and logged."""
    faulty = FaultyStore(store)
    timeline = Timeline()
    reg = registries(faulty, scheduler=timeline.scheduler, max_restarts=2, max_seconds=60)
    h = reg.open("chat")
    append(h, "kept")
    faulty.fail_loads = -1
    with capture_logs(processors=[timeline.processor]) as logs:
        crash(h, Boom("first crash"))
        assert timeline.fire_until("session.gave_up") >= 1
    restarts = logged(logs, "session.restart")
    assert (restarts[0]["reason"], restarts[0]["restart_count"]) == ("Boom: first crash", 1)
    failed_load = "StoreError: session 'chat': injected load failure"
    assert any(failed_load in e["reason"] for e in restarts)  # a failed reload is a crash too
    [gave_up] = logged(logs, "session.gave_up")
    assert gave_up["session_id"] == "chat"
    assert "injected load failure" in gave_up["reason"]
    assert gave_up["log_level"] == "error"
    assert reg.live() == []
    with pytest.raises(
        SessionStopped,
        match=r"gave up after \d+ restarts \(.*injected load failure\); "
        r"open\(\) it again to retry",
    ):
        h.count().get()


def test_a_failed_restart_is_counted_once(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A crash and one failing reload are two restarts: logged, counted and given up as such."""
    faulty = FaultyStore(store)
    timeline = Timeline()
    reg = registries(faulty, scheduler=timeline.scheduler, max_restarts=2, max_seconds=60)
    h = reg.open("chat")
    faulty.fail_loads = -1
    with capture_logs(processors=[timeline.processor]) as logs:
        crash(h, Boom("first crash"))
        timeline.fire_until("session.gave_up")
    reasons = [(e["reason"], e["restart_count"]) for e in logged(logs, "session.restart")]
    assert reasons == [
        ("Boom: first crash", 1),
        ("restart failed: StoreError: session 'chat': injected load failure", 2),
    ]
    [gave_up] = logged(logs, "session.gave_up")
    assert gave_up["restart_count"] == 2
    assert reg.restart_count("chat") == 2


def test_open_after_giving_up_retries_the_session(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """open() on a given-up session tries again: failing while the store fails, then recovering."""
    faulty = FaultyStore(store)
    sched = Scheduler()
    reg = registries(faulty, scheduler=sched, max_restarts=1, max_seconds=60)
    h = reg.open("chat")
    append(h, "kept")
    faulty.fail_loads = -1
    crash(h)
    sched.next()
    with pytest.raises(SessionStopped, match=r"open\(\) it again"):
        h.count().get()
    with pytest.raises(StoreError, match="injected load failure"):
        reg.open("chat")
    faulty.fail_loads = 0
    again = reg.open("chat")
    assert contents(again) == ["kept"]
    assert contents(h) == ["kept"]  # the old handle works again too
    assert reg.live() == ["chat"]


def test_open_of_a_running_session_keeps_its_restart_intensity(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Finding a live session with open() does not reset its restart intensity."""
    reg = registries(store, max_restarts=1, max_seconds=60)
    h = reg.open("chat")
    crash(h)
    reg.scheduler.next()  # type: ignore[attr-defined]
    reg.open("chat")  # find it
    with capture_logs() as logs:
        crash(h)
    assert logged(logs, "session.gave_up")


# -- the cap ---------------------------------------------------------------------------------


def test_max_sessions_refuses_one_more_and_changes_nothing(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Opening past max_sessions raises TooManySessions saying what to do; nothing else changes."""
    reg = registries(store, max_sessions=2)
    a, _ = reg.open("a"), reg.open("b")
    append(a, "a0")
    actors = len(pykka.ActorRegistry.get_all())
    with pytest.raises(
        TooManySessions,
        match=r"cannot open session 'c': 2 sessions are live \(max_sessions=2\); "
        r"close or passivate some \(idle_timeout=\), or raise max_sessions",
    ):
        reg.open("c")
    assert reg.live() == ["a", "b"]
    assert len(pykka.ActorRegistry.get_all()) == actors
    assert store.load("c") == []
    store.release("c", store.claim("c"))  # no writer claim was left behind
    assert reg.open("a") is not None  # finding a live one is fine at the cap
    assert contents(a) == ["a0"]


def test_a_passivated_session_frees_a_place_under_the_cap(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """After passivation another session opens; the passivated one's handle then hits the cap."""
    clock = FakeClock()
    reg = registries(store, max_sessions=1, idle_timeout=60, clock=clock)
    a = reg.open("a")
    append(a, "a0")
    assert reg.passivate_idle(now=60) == ["a"]
    b = reg.open("b")
    with pytest.raises(TooManySessions):
        a.count().get()
    assert reg.live() == ["b"]
    assert append(b, "b0").seq == 0


def test_bad_registry_arguments_are_refused() -> None:
    """Bad max_sessions, idle_timeout or intensity raise ValueError with the value."""
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1, got 0"):
        Sessions(max_sessions=0)
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1, got True"):
        Sessions(max_sessions=True)
    with pytest.raises(ValueError, match="idle_timeout must be None or > 0 seconds, got 0"):
        Sessions(idle_timeout=0)
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        Sessions(max_restarts=-1)


# -- passivation -----------------------------------------------------------------------------


def test_passivate_idle_stops_only_sessions_idle_for_the_timeout(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """With an injected clock, passivate_idle(now) stops exactly the sessions idle long enough."""
    clock = FakeClock()
    reg = registries(store, idle_timeout=60, clock=clock)
    a, b = reg.open("a"), reg.open("b")
    append(a, "a0")
    clock.now = 30
    append(b, "b0")  # b was used at 30
    assert reg.passivate_idle(now=59) == []
    with capture_logs() as logs:
        assert reg.passivate_idle(now=60) == ["a"]
    assert reg.live() == ["b"]
    [log] = logged(logs, "session.passivated")
    assert (log["session_id"], log["reason"]) == ("a", "idle")
    assert reg.passivate_idle(now=90) == ["b"]
    assert reg.live() == []


def test_passivated_session_reopens_from_the_store_on_the_next_call(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """The next call through an old handle reopens a passivated session with all its events."""
    clock = FakeClock()
    reg = registries(store, idle_timeout=60, clock=clock)
    h = reg.open("chat")
    for i in range(5):
        append(h, f"m{i}")
    before = urn(h)
    assert reg.passivate_idle(now=1000) == ["chat"]
    assert not h.is_alive()
    assert contents(h) == [f"m{i}" for i in range(5)]
    assert reg.live() == ["chat"]
    assert urn(h) != before
    assert append(h, "m5").seq == 5
    assert reg.restart_count("chat") == 0  # a reopen is not a restart


def test_a_failing_passivation_round_is_logged_with_a_reason(
    registries: Callable[..., Sessions],
) -> None:
    """When the idle reaper fails a round, session.passivation_failed says why; it goes on."""
    broken = threading.Event()
    seen: queue.Queue[Any] = queue.Queue()

    def clock() -> float:
        if broken.is_set():
            raise RuntimeError("clock went away")
        return 0.0

    def watch(logger: Any, method: str, event_dict: Any) -> Any:
        if event_dict["event"] == "session.passivation_failed":
            seen.put({**event_dict, "log_level": method})
        return event_dict

    with capture_logs(processors=[watch]):
        registries(idle_timeout=0.01, clock=clock)
        broken.set()
        first = seen.get(timeout=BOUND)
        second = seen.get(timeout=BOUND)  # the reaper kept going
    assert (first["reason"], first["error"], first["log_level"]) == (
        "RuntimeError",
        "clock went away",
        "error",
    )
    assert second["reason"] == "RuntimeError"


def test_passivate_idle_without_idle_timeout_does_nothing(
    registries: Callable[..., Sessions],
) -> None:
    """Without idle_timeout, passivate_idle() never stops a session."""
    reg = registries()
    reg.open("chat")
    assert reg.passivate_idle(now=1e12) == []
    assert reg.live() == ["chat"]


# -- close -----------------------------------------------------------------------------------


def test_close_asks_every_session_to_stop_before_it_waits_for_any(
    monkeypatch: pytest.MonkeyPatch, registries: Callable[..., Sessions]
) -> None:
    """close() asks all sessions to stop before it waits for one: three sessions each
    busy in a call are all asked while the calls still run (one by one, the first would
    hold back the others until it stopped)."""
    reg = registries()
    handles = [reg.open(sid) for sid in ("a", "b", "c")]
    asked: list[str] = []
    all_asked, release = threading.Event(), threading.Event()
    stop = _supervisor._ask_stop

    def counted_stop(ref: pykka.ActorRef[Any]) -> None:
        asked.append(ref.actor_urn)
        if len(asked) == len(handles):
            all_asked.set()
        stop(ref)

    monkeypatch.setattr(_supervisor, "_ask_stop", counted_stop)
    busy = [h._call(lambda actor: release.wait(BOUND)) for h in handles]
    closing = threading.Thread(target=reg.close, daemon=True)
    closing.start()
    try:
        assert all_asked.wait(BOUND), f"only {len(asked)} of 3 asked while the calls ran"
        assert not any(f.done() for f in busy)
    finally:
        release.set()
    closing.join(BOUND)
    assert not closing.is_alive()
    assert all(f.get(timeout=BOUND) for f in busy)
    assert reg.live() == []


def test_close_makes_no_future_to_stop_a_session(
    monkeypatch: pytest.MonkeyPatch, registries: Callable[..., Sessions], tmp_path: Path
) -> None:
    """close() tells each session to stop and waits for its ``actor_stopped``: no future
    is made for a stop (Pykka's ``ActorRef.stop`` makes two a session, each a
    ``queue.Queue`` with three ``Condition`` objects: most of what closing 10,000 sessions
    cost). The sessions stop all the same, and their claims are given up."""
    from nous_actor.runtime.dispatcher import DispatchedActor

    store = SQLiteStore(tmp_path / "s.db", durability="normal")
    reg = registries(store)
    ids = [f"s{i}" for i in range(20)]
    handles = [reg.open(sid) for sid in ids]
    for h in handles:
        h.append("user_message", {"content": "hi"}).get(timeout=BOUND)
    refs = [h._actor() for h in handles]
    made: list[object] = []
    make = DispatchedActor._create_future

    def counted() -> pykka.Future[Any]:
        future = make()
        made.append(future)
        return future

    monkeypatch.setattr(DispatchedActor, "_create_future", staticmethod(counted))
    reg.close()
    assert made == []
    assert all(ref is not None and ref.actor_stopped.is_set() for ref in refs)
    assert all(session_cell(ref).released.is_set() for ref in refs if ref is not None)
    store.close()
    other = SQLiteStore(tmp_path / "s.db", durability="normal")
    try:  # every claim was given up: another store claims them all
        assert all(type(token) is str for token in other.claim_many(ids))
    finally:
        other.close()


class _CountedReleases(SQLiteStore):
    """An SQLiteStore that counts how claims are given up."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, durability="normal")
        self.one_by_one: list[str] = []
        self.together: list[list[str]] = []

    def release(self, session_id: str, token: str) -> None:
        self.one_by_one.append(session_id)
        super().release(session_id, token)

    def release_many(self, claims: Sequence[tuple[str, str]]) -> None:
        self.together.append([sid for sid, _ in claims])
        super().release_many(claims)


def test_close_gives_up_every_claim_in_one_transaction(
    tmp_path: Path, registries: Callable[..., Sessions]
) -> None:
    """close() gives its sessions' claims up together once they all stopped (one
    transaction, not one a session), and before it returns: another process could
    claim each at once."""
    store = _CountedReleases(tmp_path / "s.db")
    try:
        reg = registries(store)
        ids = [f"s{i}" for i in range(20)]
        for sid in ids:
            reg.open(sid).append("user_message", {"content": sid}).get(timeout=BOUND)
        assert all(store.held_by(sid) is not None for sid in ids)
        reg.close()
        assert store.one_by_one == []
        assert [sorted(batch) for batch in store.together] == [sorted(ids)]
        assert [store.held_by(sid) for sid in ids] == [None] * len(ids)
        # A session stopped on its own (not by a close) still gives its claim up itself.
        again = registries(store)
        again.open("s0").stop(timeout=BOUND)
        assert store.one_by_one == ["s0"]
        assert store.held_by("s0") is None
    finally:
        store.close()


def test_close_stops_every_session_and_later_calls_fail(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """close() stops all sessions; later calls and opens fail with SessionStopped."""
    reg = registries(store)
    handles = [reg.open(sid) for sid in ("a", "b", "c")]
    for h in handles:
        append(h, "x")
    with capture_logs() as logs:
        reg.close()
    assert reg.live() == []
    # Asked at once, in the order they started; waited for (and logged) in that order.
    assert [e["session_id"] for e in logged(logs, "session.stopped")] == ["a", "b", "c"]
    assert pykka.ActorRegistry.get_by_class(SessionActor) == []
    for h in handles:
        with pytest.raises(SessionStopped, match="the registry is closed"):
            h.count().get()
    with pytest.raises(SessionStopped, match="the registry is closed"):
        reg.open("d")
    reg.close()  # idempotent
    assert [ev.data["content"] for ev in store.load("a")] == ["x"]


def test_leaving_the_with_block_closes_the_registry(store: Store) -> None:
    """Sessions as a context manager closes on exit."""
    with Sessions(store, timeout=BOUND) as reg:
        h = reg.open("chat")
        append(h, "x")
    with pytest.raises(SessionStopped, match="the registry is closed"):
        h.count().get()
    assert pykka.ActorRegistry.get_all() == []


def test_close_cancels_a_pending_restart(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A restart scheduled before close() does nothing when it fires after."""
    sched = Scheduler(auto=False)
    reg = registries(store, scheduler=sched)
    h = reg.open("chat")
    crash(h)
    _, fire = sched.next()
    reg.close()
    assert fire is not None
    fire()
    assert reg.live() == []
    assert pykka.ActorRegistry.get_all() == []


# -- backoff ---------------------------------------------------------------------------------


def test_restart_backoff_goes_through_the_injected_scheduler(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """Restart delays double up to the cap; the session stays down until the scheduler fires."""
    sched = Scheduler(auto=False)
    reg = registries(
        store,
        scheduler=sched,
        backoff=Backoff(min=0.1, max=0.3, jitter=0.0),
        max_restarts=10,
        clock=FakeClock(),
    )
    h = reg.open("chat")
    append(h, "kept")
    delays = []
    with capture_logs() as logs:
        for _ in range(4):
            crash(h)
            delay, fire = sched.next()
            delays.append(delay)
            assert reg.live() == []  # down until the scheduler fires
            assert fire is not None
            fire()
            assert reg.live() == ["chat"]
    assert delays == pytest.approx([0.1, 0.2, 0.3, 0.3])
    assert [e["delay"] for e in logged(logs, "session.restart")] == pytest.approx(delays)
    assert contents(h) == ["kept"]


def test_a_call_during_the_backoff_reopens_the_session_and_the_late_restart_is_a_no_op(
    store: Store, registries: Callable[..., Sessions]
) -> None:
    """A call before the scheduled restart reopens at once; the restart then changes nothing."""
    sched = Scheduler(auto=False)
    reg = registries(store, scheduler=sched, backoff=Backoff(1.0, 1.0, 0.0))
    h = reg.open("chat")
    append(h, "kept")
    crash(h)
    _, fire = sched.next()
    assert contents(h) == ["kept"]
    reopened = urn(h)
    assert fire is not None
    fire()
    assert urn(h) == reopened
    assert reg.live() == ["chat"]
    assert append(h, "more").seq == 1


def test_a_recovery_told_late_counts_idle_from_when_it_ended() -> None:
    """The registry hears that a session recovered after the fact (one message per
    burst): its idle time counts from when the recovery ended, on the registry's
    clock, not from when the news was taken (a clock that moved meanwhile made a
    session idle for 1,000 s look just used, and passivation passed it by), and a use
    noted since is kept."""
    clock = FakeClock()
    told: list[Any] = []
    news = _supervisor._Started(type("Registry", (), {"tell": told.append})(), clock)
    idle = Passivation(60, clock)
    news.add("chat", "urn:1")
    clock.now += 1_000
    ((sid, urn, ready_at),) = news.take()
    assert (sid, urn, told) == ("chat", "urn:1", [("started",)])
    idle.touch(sid, ready_at)
    assert idle.idle_for("chat") == 1_000
    idle.touch("chat")  # a call now
    idle.touch("chat", ready_at)  # older news: the call stays the last use
    assert idle.idle_for("chat") == 0
