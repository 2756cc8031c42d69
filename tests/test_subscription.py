"""Subscriptions: catch-up then live, exactly once, in seq order, bounded (DESIGN.md §4)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND

from nous_actor import (
    CallTimeout,
    Session,
    SessionCrashed,
    SessionStopped,
    Subscription,
    SubscriptionLagged,
)
from nous_actor.sessions.actor import SessionActor
from nous_actor.store import MemoryStore, SQLiteStore, Store
from nous_actor.testing import DelegatingStore


def _append(s: Session, n: int, start: int = 0) -> None:
    for f in [s.append("user_message", {"content": str(start + i)}) for i in range(n)]:
        f.get()


def _crash_now(actor: SessionActor) -> None:
    raise KeyboardInterrupt("injected")  # a BaseException: the session dies


def _take(sub: Subscription, n: int) -> list[int]:
    return [sub.get(BOUND).seq for _ in range(n)]


def test_catch_up_then_live(chat: Session) -> None:
    """A subscriber first gets the events already in the log, then new ones as they come."""
    _append(chat, 3)
    sub = chat.subscribe(0)
    assert _take(sub, 3) == [0, 1, 2]
    _append(chat, 2, 3)
    assert _take(sub, 2) == [3, 4]
    assert sub.get_nowait() is None


def test_from_seq_skips_earlier_events(chat: Session) -> None:
    """subscribe(from_seq) delivers only events with seq >= from_seq."""
    _append(chat, 5)
    sub = chat.subscribe(3)
    assert _take(sub, 2) == [3, 4]
    assert sub.get_nowait() is None


def test_from_seq_past_the_head_waits_for_it(chat: Session) -> None:
    """A from_seq beyond the head delivers nothing until the log reaches it."""
    _append(chat, 2)
    sub = chat.subscribe(5)
    _append(chat, 3, 2)  # seqs 2, 3, 4
    assert sub.get_nowait() is None
    _append(chat, 2, 5)  # seqs 5, 6
    assert _take(sub, 2) == [5, 6]


def test_exactly_once_in_order_under_concurrent_appenders(chat: Session) -> None:
    """Subscribing while threads append: the feed has every seq exactly once, in order."""
    n, m = 4, 250
    _append(chat, 10)
    barrier = threading.Barrier(n + 1)

    def worker() -> None:
        barrier.wait(BOUND)
        for f in [chat.append("user_message", {"content": "x"}) for _ in range(m)]:
            f.get()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    barrier.wait(BOUND)
    sub = chat.subscribe(0)  # lands somewhere in the middle of the appends
    for t in threads:
        t.join(BOUND * 3)
    assert not any(t.is_alive() for t in threads)
    total = 10 + n * m
    assert _take(sub, total) == list(range(total))
    assert sub.get_nowait() is None


def test_two_subscribers_see_the_same_sequence(chat: Session) -> None:
    """Every subscriber sees the same events in the same order."""
    a = chat.subscribe(0)
    _append(chat, 3)
    b = chat.subscribe(0)
    _append(chat, 3, 3)
    assert _take(a, 6) == _take(b, 6) == list(range(6))


def test_snapshot_gaps_are_not_delivered_in_catch_up(chat: Session) -> None:
    """Catch-up after a snapshot delivers only retained events (dropped seqs are gone)."""
    _append(chat, 3)
    chat.append("system_message", {"content": "s", "surface_op": ("replace", 0, 1)}).get()
    chat.snapshot().get()
    sub = chat.subscribe(0)
    assert _take(sub, 2) == [2, 3]


def test_a_slow_subscriber_never_blocks_appends_and_is_told_it_lagged(chat: Session) -> None:
    """A subscriber that does not read is cut off past its buffer; appends carry on."""
    sub = chat.subscribe(0, buffer=5)
    _append(chat, 20)  # never blocks, although nobody reads
    assert chat.count().get() == 20
    assert _take(sub, 5) == [0, 1, 2, 3, 4]
    with pytest.raises(SubscriptionLagged) as info:
        sub.get(BOUND)
    assert info.value.next_seq == 5
    resumed = [e.seq for e in chat.since(info.value.next_seq).get()]
    assert resumed == list(range(5, 20))


def test_lagged_subscriber_can_resubscribe_from_next_seq(chat: Session) -> None:
    """After lagging, subscribe(from_seq=next_seq) continues without gap or duplicate."""
    sub = chat.subscribe(0, buffer=2)
    _append(chat, 6)
    seen = _take(sub, 2)
    with pytest.raises(SubscriptionLagged) as info:
        sub.get(BOUND)
    again = chat.subscribe(info.value.next_seq)
    seen += _take(again, 6 - len(seen))
    assert seen == list(range(6))


def test_catch_up_does_not_count_against_the_buffer(chat: Session) -> None:
    """A long catch-up is delivered in full even with a small live buffer."""
    _append(chat, 50)
    sub = chat.subscribe(0, buffer=3)
    assert _take(sub, 50) == list(range(50))


def test_get_times_out_with_a_bound(chat: Session) -> None:
    """get(timeout) raises CallTimeout when nothing arrives; the subscription stays usable."""
    sub = chat.subscribe(0)
    with pytest.raises(CallTimeout):
        sub.get(0.05)
    _append(chat, 1)
    assert _take(sub, 1) == [0]


def test_iteration_ends_when_the_session_stops() -> None:
    """for ev in sub ends after the last event once the session stops."""
    s = Session.start("ends", timeout=BOUND)
    sub = s.subscribe(0)
    _append(s, 3)
    s.stop()
    assert [e.seq for e in sub] == [0, 1, 2]


def test_a_crash_ends_the_feed_with_an_error() -> None:
    """When the session crashes, the subscriber gets its pending events, then SessionCrashed."""
    s = Session.start("crash-feed", timeout=BOUND)
    sub = s.subscribe(0)
    _append(s, 2)

    def explode(actor: SessionActor) -> None:
        raise KeyboardInterrupt

    with pytest.raises(SessionCrashed):
        s._call(explode).get()
    assert _take(sub, 2) == [0, 1]
    with pytest.raises(SessionCrashed):
        sub.get(BOUND)


def test_close_stops_delivery(chat: Session) -> None:
    """After close(), no further events are delivered and iteration ends."""
    sub = chat.subscribe(0)
    _append(chat, 1)
    sub.close()
    _append(chat, 2, 1)
    assert [e.seq for e in sub] == [0]
    assert chat.count().get() == 3


def test_context_manager_closes(chat: Session) -> None:
    """Leaving the with-block closes the subscription."""
    with chat.subscribe(0) as sub:
        _append(chat, 1)
        assert _take(sub, 1) == [0]
    with pytest.raises(SessionStopped, match="ended"):
        sub.get(BOUND)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"from_seq": -1}, ValueError, "from_seq"),
        ({"from_seq": "0"}, TypeError, "from_seq"),
        ({"from_seq": True}, TypeError, "from_seq"),
        ({"buffer": 0}, ValueError, "buffer must be an int >= 1"),
    ],
)
def test_bad_arguments_are_refused(
    chat: Session, kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """subscribe() refuses a bad from_seq or buffer with a typed error, registering nothing."""
    with pytest.raises(error, match=match):
        chat.subscribe(**kwargs)  # type: ignore[arg-type]
    _append(chat, 1)
    assert chat.count().get() == 1


def test_subscribe_on_a_stopped_session_fails() -> None:
    """subscribe() on a stopped session raises SessionStopped."""
    s = Session.start("stopped-sub", timeout=BOUND)
    s.stop()
    with pytest.raises(SessionStopped):
        s.subscribe(0)


def test_async_iteration_does_not_block_the_loop(chat: Session) -> None:
    """async for over a subscription yields events while other tasks keep running."""

    async def main() -> tuple[list[int], int]:
        sub = chat.subscribe(0)
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async def feed() -> None:
            for i in range(5):
                await chat.append("user_message", {"content": str(i)})
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        feed_task = asyncio.create_task(feed())
        seen = []
        async for ev in sub:
            seen.append(ev.seq)
            if len(seen) == 5:
                break
        done.set()
        await asyncio.wait_for(asyncio.gather(tick_task, feed_task), BOUND)
        return seen, ticks

    seen, ticks = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert seen == [0, 1, 2, 3, 4]
    assert ticks > 5


def _slow_store(kind: str, tmp_path: Path) -> Store:
    """A store whose writes take a moment, so that a stop finds commits still in flight."""
    inner: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    gate = threading.Event()

    class Slow(DelegatingStore):
        def write(self, batches: Any) -> Any:
            gate.wait(0.01)  # a slow disk: never set, only a bound
            return super().write(batches)

    return Slow(inner)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_every_acknowledged_event_reaches_the_subscriber_before_a_stop_ends_it(
    kind: str, tmp_path: Path
) -> None:
    """Thirty pipelined appends, then stop(): the feed gets all thirty, then ends normally."""
    s = Session.start("sub-stop", store=_slow_store(kind, tmp_path), timeout=BOUND)
    sub = s.subscribe(0)
    futures = [s.append("user_message", {"content": str(i)}) for i in range(30)]
    s.stop(timeout=BOUND)
    assert [f.get().seq for f in futures] == list(range(30))  # all acknowledged
    assert [ev.seq for ev in sub] == list(range(30))  # ... and all delivered, then the end


def test_a_crash_with_commits_in_flight_delivers_them_then_the_error(tmp_path: Path) -> None:
    """A crash after pipelined appends: each acknowledged event is delivered, then the error."""
    s = Session.start("sub-crash", store=_slow_store("sqlite", tmp_path), timeout=BOUND)
    sub = s.subscribe(0)
    futures = [s.append("user_message", {"content": str(i)}) for i in range(20)]
    s._call(_crash_now)
    acked = []
    for f in futures:
        try:
            acked.append(f.get().seq)
        except SessionStopped:
            pass
    got: list[int] = []

    def read_all() -> None:
        got.extend(ev.seq for ev in sub)

    with pytest.raises(SessionCrashed):
        read_all()
    assert got == acked
