"""A registry's sessions and their feeds at the edges: passivation while a session
recovers, closing a feed of a stopped session, subscribing through a closed
registry, the checks of ``subscribe(timeout=)`` on every path, and the recovery
logged after a restart a caller got ahead of.

Every wait is bounded (`BOUND`); the registries' clocks and schedulers are injected
where a test drives them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from bounds import BOUND, wait_until
from fake_clock import FakeClock
from structlog.testing import capture_logs

from nous_actor import (
    Backoff,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    StoreError,
)
from nous_actor.sessions.faults import crash
from nous_actor.store import shared

# A fixed, tiny backoff: every restart goes through the (injected) scheduler.
TICK = Backoff(0.001, 0.001, 0.0)

IDLE = 60.0
"""The registries' idle timeout (their passivator, every 30 s, never runs in a test:
the tests passivate by hand, at the times they choose)."""


class GatedStore(MemoryStore):
    """A store whose loads (a session's recovery) wait for ``gate`` once ``gated`` is set;
    ``loading`` is set when a gated load begins."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.loading = threading.Event()
        self.gated = False

    def load(self, session_id: str) -> list[Any]:
        if self.gated:
            self.loading.set()
            if not self.gate.wait(BOUND):
                raise StoreError("the gate was never opened", session_id=session_id)
        return super().load(session_id)


@dataclass
class Scheduler:
    """An injected ``scheduler(delay, fn)``: records each restart for the test to fire."""

    calls: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)

    def __call__(self, delay: float, fn: Callable[[], None]) -> None:
        self.calls.put(fn)

    def next(self) -> Callable[[], None]:
        return self.calls.get(timeout=BOUND)


@pytest.fixture
def registries() -> Iterator[Callable[..., Sessions]]:
    """Make registries (timeout=BOUND, backoff=TICK); all closed at the end."""
    made: list[Sessions] = []

    def make(store: MemoryStore, **kw: Any) -> Sessions:
        kw.setdefault("timeout", BOUND)
        kw.setdefault("backoff", TICK)
        reg = Sessions(store, **kw)
        made.append(reg)
        return reg

    yield make
    for reg in reversed(made):
        reg.close()


def stored(store: MemoryStore, session_id: str, n: int) -> None:
    """Give ``session_id`` ``n`` events in ``store`` (written by a standalone session)."""
    s = Session.start(session_id, store=store, timeout=BOUND)
    for i in range(n):
        s.append("user_message", {"content": str(i)})
    s.count().get()
    s.stop()


def opened_in_thread(reg: Sessions, session_id: str) -> queue.Queue[Any]:
    """Open ``session_id`` in a thread of its own; its handle (or error) comes in the queue."""
    out: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        try:
            out.put(reg.open(session_id))
        except Exception as exc:
            out.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


# -- A: passivation waits for a session's recovery and its waiting calls --------------------


def test_a_session_recovering_is_not_passivated_and_its_idle_time_counts_from_ready(
    registries: Callable[..., Sessions],
) -> None:
    """A session still recovering from its store (its opener waiting) is never idle:
    passivation leaves it, open() returns a working handle, and its idle time counts
    from when it became ready, not from its start."""
    store = GatedStore()
    stored(store, "big", 3)
    store.gated = True
    clock = FakeClock()
    reg = registries(store, idle_timeout=IDLE, clock=clock)
    opening = opened_in_thread(reg, "big")
    assert store.loading.wait(BOUND)
    assert reg.passivate_idle(now=1000) == []  # recovering: not idle, however long
    clock.now = 1000
    store.gate.set()
    h = opening.get(timeout=BOUND)
    assert isinstance(h, Session), h
    assert h.count().get() == 3
    assert reg.passivate_idle(now=1000 + IDLE - 1) == []  # ready at 1000
    wait_until(
        lambda: reg.passivate_idle(now=1000 + IDLE) == ["big"],
        BOUND,
        "the session passivated once idle for idle_timeout after it became ready",
    )


def test_a_call_waiting_for_a_reopen_is_delivered_not_refused_by_a_passivation(
    registries: Callable[..., Sessions],
) -> None:
    """A call that reopens a passivated session waits for its recovery; a passivation
    meanwhile leaves the session alone, and the call is applied, in order."""
    store = GatedStore()
    clock = FakeClock()
    reg = registries(store, idle_timeout=IDLE, clock=clock)
    h = reg.open("chat")
    h.append("user_message", {"content": "0"}).get()
    assert reg.passivate_idle(now=1000) == ["chat"]
    store.gated = True
    pending = h.append("user_message", {"content": "1"})  # reopens it: held meanwhile
    assert store.loading.wait(BOUND)
    assert reg.passivate_idle(now=5000) == []
    store.gate.set()
    assert pending.get().seq == 1
    assert [ev.data["content"] for ev in h.events().get()] == ["0", "1"]


# -- B: closing a feed is not a call ---------------------------------------------------------


def test_closing_a_feed_after_stop_does_not_reopen_the_session(
    registries: Callable[..., Sessions],
) -> None:
    """After stop(), closing a registry handle's subscription sends nothing through the
    session's route: the session is not reopened and its writer claim stays free."""
    store = MemoryStore()
    reg = registries(store)
    h = reg.open("a")
    h.append("user_message", {"content": "x"}).get()
    sub = h.subscribe()
    assert sub.get(timeout=BOUND).seq == 0
    h.stop()
    route = h._route
    assert route is not None
    moves = route.moves
    sub.close()
    assert route.moves == moves  # nothing was sent: no move, no reopen
    assert reg.open("b").count().get() == 0
    assert reg.live() == ["b"]
    assert store.held_by("a") is None


def test_closing_a_feed_of_a_running_session_stops_its_delivery(
    registries: Callable[..., Sessions],
) -> None:
    """Closing a subscription of a running session unsubscribes it there: later events
    reach an open subscription, not the closed one."""
    reg = registries(MemoryStore())
    h = reg.open("a")
    closed, kept = h.subscribe(), h.subscribe()
    closed.close()
    h.append("user_message", {"content": "x"}).get()
    assert kept.get(timeout=BOUND).seq == 0
    with pytest.raises(SessionStopped, match="the subscription has ended"):
        closed.get(timeout=0)
    kept.close()


# -- C: subscribing through a closed registry -------------------------------------------------


def test_subscribe_after_the_registry_closed_raises_session_stopped(
    registries: Callable[..., Sessions],
) -> None:
    """subscribe() through a handle of a closed registry raises SessionStopped, as every
    other call does, rather than handing back an ended subscription."""
    reg = registries(MemoryStore())
    q = reg.open("q")
    q.append("user_message", {"content": "1"}).get()
    reg.close()
    with pytest.raises(SessionStopped, match="the registry is closed") as other:
        q.count().get()
    with pytest.raises(SessionStopped, match="the registry is closed") as sub:
        q.subscribe()
    assert str(sub.value) == str(other.value)


# -- D: subscribe(timeout=) checked on every path ---------------------------------------------

BAD_TIMEOUTS = [
    ("soon", TypeError, r"subscribe\(timeout\) must be a number of seconds"),
    (True, TypeError, r"subscribe\(timeout\) must be a number of seconds"),
    (float("nan"), ValueError, r"subscribe\(timeout\) must be a number of seconds, got NaN"),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_TIMEOUTS)
def test_subscribe_refuses_a_bad_timeout_where_another_registry_holds_the_session(
    registries: Callable[..., Sessions], bad: object, error: type[Exception], message: str
) -> None:
    """Held by another registry (or process), subscribe(timeout=) is checked as where the
    session runs here: TypeError or ValueError up front, nothing made."""
    store = MemoryStore()
    holder, other = registries(store), registries(store)
    holder.open("s").append("user_message", {"content": "x"}).get()
    h = other.open("s")
    assert other.live() == []  # held by the other registry
    with pytest.raises(error, match=message):
        h.subscribe(timeout=bad)  # type: ignore[arg-type]


def test_a_feed_of_a_session_held_elsewhere_waits_the_handles_bound(
    registries: Callable[..., Sessions],
) -> None:
    """subscribe(timeout=) bounds the subscribing, not each get(): a feed of a session held
    by another registry waits the handle's bound, as one made where it runs."""
    store = MemoryStore()
    holder, other = registries(store), registries(store)
    holder.open("s")
    h = other.open("s")
    with h.subscribe(timeout=-3) as sub:
        assert sub.timeout == h.timeout
        h.append("user_message", {"content": "x"}).get()
        assert sub.get().seq == 0


@pytest.mark.parametrize(("bad", "error", "message"), BAD_TIMEOUTS)
def test_a_readers_subscribe_refuses_a_bad_timeout(
    registries: Callable[..., Sessions], bad: object, error: type[Exception], message: str
) -> None:
    """Sessions.read(id).subscribe(timeout=) is checked as a handle's is."""
    reg = registries(MemoryStore())
    reg.open("a").append("user_message", {"content": "x"}).get()
    with pytest.raises(error, match=message):
        reg.read("a").subscribe(timeout=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bad", "error"), [("soon", TypeError), (float("nan"), ValueError)])
def test_the_shared_watch_refuses_a_bad_timeout(bad: object, error: type[Exception]) -> None:
    """nous_actor.store.shared.watch checks its timeout before any store's watch is asked."""
    store = MemoryStore()
    try:
        with pytest.raises(error, match=r"watch\(timeout\) must be a number of seconds"):
            shared.watch(store, "a", timeout=bad)  # type: ignore[arg-type]
    finally:
        store.close()


@pytest.mark.parametrize(("bad", "error", "message"), BAD_TIMEOUTS)
def test_subscribe_through_a_closed_registry_checks_its_timeout_first(
    registries: Callable[..., Sessions], bad: object, error: type[Exception], message: str
) -> None:
    """A bad timeout is refused as such (TypeError, ValueError) before the registry's
    state is looked at, as for every other call."""
    reg = registries(MemoryStore())
    q = reg.open("q")
    reg.close()
    with pytest.raises(error, match=message):
        q.subscribe(timeout=bad)  # type: ignore[arg-type]


# -- E: the recovery after a crash is logged when a caller got ahead of the restart ----------


class _Logs:
    """Structlog events as they come (a processor), waited for with a bound."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[MutableMapping[str, Any]] = []

    def __call__(self, logger: Any, method: str, event_dict: Any) -> Any:
        with self.cond:
            self.seen.append(dict(event_dict))
            self.cond.notify_all()
        return event_dict

    def named(self, event: str) -> list[MutableMapping[str, Any]]:
        with self.cond:
            return [e for e in self.seen if e["event"] == event]

    def wait_for(self, event: str) -> MutableMapping[str, Any]:
        with self.cond:
            assert self.cond.wait_for(lambda: self.named(event), BOUND), f"no {event}"
        return self.named(event)[0]


def test_recovered_after_crash_is_logged_when_a_caller_reopened_it_first(
    registries: Callable[..., Sessions],
) -> None:
    """A caller whose call reopens a crashed session before its restart's backoff ran:
    the restart finds it running and logs session.recovered_after_crash for it."""
    sched = Scheduler()
    logs = _Logs()
    with capture_logs(processors=[logs]):
        reg = registries(MemoryStore(), scheduler=sched)
        h = reg.open("c")
        h.append("user_message", {"content": "a"}).get()
        with pytest.raises(SessionCrashed):
            crash(h).get()
        restart = sched.next()
        assert h.append("user_message", {"content": "b"}).get().seq == 1  # reopened
        restart()
        recovered = logs.wait_for("session.recovered_after_crash")
    [crashed] = logs.named("session.restart")
    assert recovered["session_id"] == "c"
    assert recovered["reason"] == crashed["reason"]
    assert recovered["restart_count"] == 1 == reg.restart_count("c")
    assert len(logs.named("session.recovered_after_crash")) == 1


def test_recovered_after_crash_waits_for_the_recovery_a_caller_began(
    registries: Callable[..., Sessions],
) -> None:
    """Reopened by a caller and still recovering when the restart runs: the event is
    logged once that recovery is done, not before."""
    store = GatedStore()
    sched = Scheduler()
    logs = _Logs()
    with capture_logs(processors=[logs]):
        reg = registries(store, scheduler=sched)
        h = reg.open("c")
        h.append("user_message", {"content": "a"}).get()
        with pytest.raises(SessionCrashed):
            crash(h).get()
        restart = sched.next()
        store.gated = True
        pending = h.append("user_message", {"content": "b"})  # reopens it: recovering
        assert store.loading.wait(BOUND)
        restart()
        assert logs.named("session.recovered_after_crash") == []
        store.gate.set()
        assert pending.get().seq == 1
        recovered = logs.wait_for("session.recovered_after_crash")
    assert (recovered["session_id"], recovered["restart_count"]) == ("c", 1)
    assert len(logs.named("session.recovered_after_crash")) == 1
