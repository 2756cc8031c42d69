"""A long-running process meets ever new sessions, watches and calls: what it leaves
behind must not grow with how many it met (counted after N cycles and after 2N)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bounds import BOUND
from fake_clock import FakeClock
from freed import Freed

from nous_actor import SessionCrashed, Sessions
from nous_actor.core.event import Event
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.registry import _supervisor
from nous_actor.store import MemoryStore, SQLiteStore, Store
from nous_actor.store.subscription import Subscription
from nous_actor.supervision import RestartIntensity

T = datetime(2026, 1, 1, tzinfo=UTC)


def _alive(kind: type) -> int:
    """How many objects of ``kind`` (or a subclass) are alive, after a collection."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


def _event(seq: int) -> Event:
    return Event(seq, "user_message", T, {"content": str(seq)})


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def watched_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres":
        yield request.getfixturevalue("pg_stores")()  # closed with its schema
        return
    store: Store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")
    yield store
    store.close()


def _abandon_watches(store: Store, first: int, n: int) -> None:
    """Watch ``n`` new sessions (each read once) and drop the watches without closing
    them, as a server's request handler that returned early does."""
    watches = []
    for i in range(first, first + n):
        sid = f"w-{i}"
        store.write({sid: [_event(0)]})
        watches.append(store.watch(sid))
        assert watches[-1].get(BOUND).seq == 0
    freed = Freed(watches.pop() for _ in range(n))
    assert freed.wait(BOUND) == []


def test_abandoned_store_watches_are_freed(watched_store: Store) -> None:
    """A store's watch that nobody holds any more is freed: the store does not keep it
    (and feed it, and follow the file for it) for the rest of the process."""
    held = watched_store.watch("kept")
    _abandon_watches(watched_store, 0, 20)
    after_n = _alive(Subscription)
    _abandon_watches(watched_store, 20, 40)
    after_2n = _alive(Subscription)
    assert after_2n <= after_n
    # The watch still held goes on being fed.
    watched_store.write({"kept": [_event(0)]})
    assert held.get(BOUND).seq == 0
    held.close()


def test_abandoned_watch_of_a_session_written_again_is_freed(watched_store: Store) -> None:
    """Watches of one session dropped while it goes on being written are freed, and a
    new watch of it still gets every event."""
    watched_store.write({"busy": [_event(0)]})

    def cycle(n: int) -> None:
        watches = [watched_store.watch("busy") for _ in range(n)]
        assert [watch.get(BOUND).seq for watch in watches] == [0] * n
        freed = Freed(watches.pop() for _ in range(n))
        assert freed.wait(BOUND) == []

    cycle(20)
    after_n = _alive(Subscription)
    cycle(40)
    after_2n = _alive(Subscription)
    assert after_2n <= after_n
    watched_store.write({"busy": [_event(1)]})
    with watched_store.watch("busy") as watch:
        assert [watch.get(BOUND).seq, watch.get(BOUND).seq] == [0, 1]


# -- sessions that crashed once, long ago ------------------------------------------------------


def _crash(actor: SessionActor) -> None:
    raise KeyboardInterrupt("injected")


def _crash_once_each(sessions: Sessions, clock: FakeClock, first: int, n: int) -> None:
    """Open ``n`` new sessions, crash each once (it restarts), stop it, and let its restart
    window pass: a server whose conversations each met one crash."""
    for i in range(first, first + n):
        handle = sessions.open(f"c-{i}")
        with pytest.raises(SessionCrashed):
            handle._call(_crash).get()
        assert handle.count().get() == 0  # restarted
        assert sessions.restart_count(f"c-{i}") == 1
        handle.stop()
        clock.now += 10.0  # past max_seconds: the crash no longer counts


def test_restart_windows_of_stopped_sessions_are_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry forgets the restarts of a session that no longer runs once they have left
    its restart window: what it keeps does not grow with every session that ever crashed."""
    monkeypatch.setattr(_supervisor, "_RESTARTS_SWEEP", 8, raising=False)
    clock = FakeClock()
    with Sessions(MemoryStore(), backoff=None, clock=clock, max_seconds=5.0) as sessions:
        _crash_once_each(sessions, clock, 0, 20)
        after_n = _alive(RestartIntensity)
        _crash_once_each(sessions, clock, 20, 40)
        after_2n = _alive(RestartIntensity)
        assert after_2n <= after_n
        # A live session's restarts are kept, whatever the table's size.
        live = sessions.open("live")
        with pytest.raises(SessionCrashed):
            live._call(_crash).get()
        clock.now += 10.0
        _crash_once_each(sessions, clock, 60, 40)
        assert sessions.restart_count("live") == 1


def test_follower_stops_following_for_a_freed_watch(tmp_path: Path) -> None:
    """Once the only watch of a SQLite store is dropped (its session never written again),
    the store's follower has nothing left to follow: it stops looking at the file every
    few milliseconds for it."""
    from nous_actor.store.sqlite.follower import follower_of

    store = SQLiteStore(tmp_path / "s.db")
    try:
        store.write({"quiet": [_event(0)]})
        watches = [store.watch("quiet")]
        assert watches[0].get(BOUND).seq == 0
        freed = Freed(watches.pop() for _ in range(1))
        assert freed.wait(BOUND) == []
        follower = follower_of(store._connection)
        with follower._cond:
            assert follower._cond.wait_for(lambda: not follower._watches, BOUND)
    finally:
        store.close()


# -- a session's subscriptions dropped without close() -----------------------------------------


def test_abandoned_session_subscriptions_are_freed() -> None:
    """A subscription its reader dropped without closing it is freed: a session subscribed
    to over and over (a web worker streaming each request's events) does not keep them."""
    with Sessions(MemoryStore()) as sessions:
        handle = sessions.open("chat")
        handle.append("user_message", {"content": "hi"}, T).get()

        def cycle(n: int) -> None:
            for _ in range(n):
                sub = handle.subscribe()
                assert sub.get(BOUND).seq == 0
                del sub

        cycle(20)
        after_n = _alive(Subscription)
        cycle(40)
        after_2n = _alive(Subscription)
        assert after_2n <= after_n
        # A subscription still held goes on being fed.
        with handle.subscribe(from_seq=1) as held:
            handle.append("user_message", {"content": "again"}, T).get()
            assert held.get(BOUND).seq == 1


# -- appends counted by a thread that ended ----------------------------------------------------


def test_append_counts_of_ended_threads_are_folded() -> None:
    """The OpenTelemetry sink counts appends in a cell per thread: a pinned session's
    thread that ended leaves no cell behind (a server that pins a session per conversation
    would keep one per conversation), and the count of its appends stays in the total."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from nous_actor import Session
    from nous_actor.runtime import telemetry
    from nous_actor.runtime.otel import OpenTelemetrySink

    reader = InMemoryMetricReader()
    sink = OpenTelemetrySink(MeterProvider(metric_readers=[reader]))
    old = telemetry.install(sink)

    def pinned_sessions(first: int, n: int) -> None:
        before = set(threading.enumerate())
        for i in range(first, first + n):
            session = Session.start(f"pinned-{i}", pinned=True, timeout=BOUND)
            session.append("user_message", {"content": "hi"}, T).get()
            session.stop()
        # Their threads end once their last turn has returned (within a bound).
        for thread in set(threading.enumerate()) - before:
            if not thread.name.startswith("nous-pinned-"):
                continue
            thread.join(BOUND)
            assert not thread.is_alive()

    def appends() -> float:
        data = reader.get_metrics_data()
        assert data is not None
        return sum(
            point.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == "nous_actor.session.appends"
            for point in metric.data.data_points
        )

    try:
        pinned_sessions(0, 20)
        after_n = len(sink._cells)
        pinned_sessions(20, 40)
        after_2n = len(sink._cells)
    finally:
        telemetry.install(old)
    assert after_2n <= after_n
    assert appends() == 60
