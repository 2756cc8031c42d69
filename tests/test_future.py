"""SessionFuture: bounded waits, Pykka compatibility, awaitable without blocking asyncio."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pykka
import pytest
from bounds import BOUND

from nous_actor import CallTimeout, InvalidEvent, Session, SessionFuture
from nous_actor.runtime import DispatchedActor
from nous_actor.sessions.actor import SessionActor


def test_get_returns_the_value_any_number_of_times() -> None:
    """A resolved future returns its value on every get."""
    fut: SessionFuture[int] = SessionFuture("s")
    fut.set(7)
    assert fut.get() == 7
    assert fut.get(timeout=0) == 7
    assert fut.done()


def test_get_raises_the_exception() -> None:
    """A failed future raises its exception on get."""
    fut: SessionFuture[int] = SessionFuture("s")
    fut._fail(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        fut.get()


def test_second_answer_is_refused() -> None:
    """A future is answered once; a later set raises queue.Full and _fail reports False."""
    fut: SessionFuture[int] = SessionFuture("s")
    assert fut._resolve(1)
    with pytest.raises(queue.Full):
        fut.set(2)
    assert not fut._fail(RuntimeError())
    assert fut.get() == 1


def test_get_without_timeout_is_bounded_by_the_default() -> None:
    """get() with no timeout waits the future's own bound, then raises CallTimeout."""
    fut: SessionFuture[int] = SessionFuture("slow", timeout=0.05)
    with pytest.raises(CallTimeout, match="'slow'"):
        fut.get()


def test_get_wakes_when_answered_from_another_thread() -> None:
    """A thread blocked in get() returns once another thread answers."""
    fut: SessionFuture[str] = SessionFuture("s")
    t = threading.Thread(target=fut.set, args=("x",))
    t.start()
    assert fut.get(timeout=BOUND) == "x"
    t.join(BOUND)


def test_every_thread_blocked_on_one_future_wakes_once_it_is_answered() -> None:
    """20 threads block in get() (one of them first times out, then waits again); one
    answer wakes them all. The lock they wait on is made by the first that blocks: a
    future nobody blocks on never makes one."""
    fut: SessionFuture[str] = SessionFuture("s")
    with pytest.raises(CallTimeout):
        fut.get(timeout=0.01)
    assert fut._ready is not None  # made by the get that blocked
    got: list[str] = []
    lock = threading.Lock()
    blocked = threading.Barrier(21)

    def wait() -> None:
        blocked.wait(BOUND)
        value = fut.get(timeout=BOUND)
        with lock:
            got.append(value)

    threads = [threading.Thread(target=wait) for _ in range(20)]
    for t in threads:
        t.start()
    blocked.wait(BOUND)
    fut.set("x")
    for t in threads:
        t.join(BOUND)
        assert not t.is_alive()
    assert got == ["x"] * 20
    answered: SessionFuture[int] = SessionFuture("s")
    answered.set(1)
    assert answered.get(timeout=BOUND) == 1
    assert answered._ready is None


def test_done_callbacks_run_once_answered_or_at_once() -> None:
    """add_done_callback runs the callback when answered, or immediately if already done."""
    fut: SessionFuture[int] = SessionFuture("s")
    calls: list[str] = []
    fut.add_done_callback(lambda: calls.append("early"))
    assert calls == []
    fut.set(1)
    fut.add_done_callback(lambda: calls.append("late"))
    assert calls == ["early", "late"]


@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize("fails", [False, True])
def test_every_done_callback_runs_once_in_the_order_added(count: int, fails: bool) -> None:
    """One callback, or several (kept apart from the first's own way of being held),
    each run once, in the order added, whether the future succeeds or fails; none is
    kept after the answer."""
    fut: SessionFuture[int] = SessionFuture("s")
    calls: list[int] = []
    for i in range(count):
        fut.add_done_callback(lambda i=i: calls.append(i))
    assert calls == []
    if fails:
        fut.set_exception((ValueError, ValueError("no"), None))
    else:
        fut.set(1)
    assert calls == list(range(count))
    assert fut._callbacks is None
    with pytest.raises(queue.Full):  # answered once only: nothing runs again
        fut.set(2)
    assert calls == list(range(count))


def test_pykka_get_all_and_map_work() -> None:
    """SessionFutures work with pykka.get_all and Future.map."""
    s = Session.start("compat", timeout=BOUND)
    futs = [s.append("user_message", {"content": str(i)}) for i in range(3)]
    assert [e.seq for e in pykka.get_all(futs, timeout=BOUND)] == [0, 1, 2]
    assert s.count().map(lambda n: n * 10).get(timeout=BOUND) == 30
    s.stop()


def test_await_does_not_block_the_event_loop() -> None:
    """While one call is awaited for ~0.3 s, a ticker task keeps running."""
    s = Session.start("async", timeout=BOUND)
    gate = threading.Event()

    async def main() -> tuple[bool, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, gate.set)
        result = await s._call(lambda actor: gate.wait(BOUND))
        stop.set()
        await task
        return result, ticks

    started = time.monotonic()
    result, ticks = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert result is True
    assert time.monotonic() - started >= 0.3
    assert ticks >= 10, f"the loop ran only {ticks} ticks during a 0.3 s await"
    s.stop()


def test_await_raises_the_calls_exception() -> None:
    """Awaiting a failed call raises its exception inside the coroutine."""
    s = Session.start("async-bad", timeout=BOUND)

    async def main() -> None:
        await s.append("bogus", {})

    with pytest.raises(InvalidEvent):
        asyncio.run(main())
    s.stop()


def test_await_is_bounded() -> None:
    """Awaiting a call that never answers raises CallTimeout after the handle's bound."""
    s = Session.start("async-slow", timeout=0.1)
    gate = threading.Event()

    async def main() -> None:
        await s._call(lambda actor: gate.wait(BOUND))

    with pytest.raises(CallTimeout):
        asyncio.run(main())
    gate.set()
    s.stop()


def test_awaits_cancelled_timed_out_and_answered_leave_the_loops_waker_empty() -> None:
    """A task awaits the future itself (no wrapper of ours): its value, its error, a bound
    that runs out and a cancelled task each end its wait, and nothing is left watched
    on the loop (no entry, no timer) once they are over."""
    from nous_actor.sessions import future as future_module

    async def main() -> None:
        waker = future_module._waker()[1]
        ok: SessionFuture[int] = SessionFuture("ok", timeout=BOUND)
        bad: SessionFuture[int] = SessionFuture("bad", timeout=BOUND)
        slow: SessionFuture[int] = SessionFuture("slow", timeout=0.05)
        dropped: SessionFuture[int] = SessionFuture("dropped", timeout=BOUND)
        both: SessionFuture[int] = SessionFuture("both", timeout=BOUND)

        async def wait(f: SessionFuture[int]) -> int:
            return await f

        tasks = [asyncio.ensure_future(wait(f)) for f in (ok, bad, slow, dropped, both, both)]
        await asyncio.sleep(0)  # every task awaits now
        assert len(waker.watched) == 6
        tasks[3].cancel()
        threading.Thread(target=ok.set, args=(1,)).start()
        threading.Thread(target=bad._fail, args=(ValueError("no"),)).start()
        threading.Thread(target=both.set, args=(2,)).start()
        done, _ = await asyncio.wait(tasks, timeout=BOUND)
        assert len(done) == 6
        assert tasks[0].result() == 1
        assert isinstance(tasks[1].exception(), ValueError)
        assert isinstance(tasks[2].exception(), CallTimeout)
        assert tasks[3].cancelled()
        assert tasks[4].result() == tasks[5].result() == 2
        dropped.set(3)  # answered after its awaiter went away
        await asyncio.sleep(0.01)
        assert waker.watched == {}
        assert waker.buckets == {}
        assert waker.timer is None

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_await_an_already_answered_future() -> None:
    """Awaiting a future that is already done returns at once."""
    fut: SessionFuture[int] = SessionFuture("s")
    fut.set(5)

    async def main() -> int:
        return await fut

    assert asyncio.run(main()) == 5


def test_many_concurrent_awaits() -> None:
    """Hundreds of concurrent awaits on one session all resolve, in a consistent order."""
    s = Session.start("gather", timeout=BOUND)

    async def main() -> list[int]:
        evs = await asyncio.gather(
            *(s.append("user_message", {"content": str(i)}) for i in range(300))
        )
        return [e.seq for e in evs]

    assert sorted(asyncio.run(asyncio.wait_for(main(), BOUND))) == list(range(300))
    s.stop()


def test_session_actor_is_a_pykka_actor_on_a_dispatcher() -> None:
    """The session is a Pykka actor, run by a shared dispatcher (no thread of its own)."""
    assert issubclass(SessionActor, pykka.Actor)
    assert issubclass(SessionActor, DispatchedActor)
    assert not issubclass(SessionActor, pykka.ThreadingActor)
