"""A registry handle's subscription outlives its session's stops.

A registry stops a session that went idle (passivation) or that another process
asked for (a hand-off); the session lives on in the store and wherever it is
opened next. A subscription made through the registry's handle goes on with it,
through the store: every event exactly once, in seq order, whoever writes it and
whenever. It ends as before when it is closed, when the session is stopped for
good (`stop()`, the registry closed), or with `SessionCrashed`; a standalone
session's subscription still ends when its session stops.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from bounds import BOUND
from fake_clock import FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_actor import (
    Event,
    MemoryStore,
    Session,
    SessionCrashed,
    Sessions,
    SessionStopped,
    Store,
)
from nous_actor.testing.races import crash_session


@pytest.fixture
def store(each_store: Store) -> Store:
    return each_store


def _say(h: Session, text: str) -> int:
    return h.append("user_message", {"content": text}).get(timeout=BOUND).seq


def _passivate(reg: Sessions, clock: FakeClock, sid: str) -> None:
    clock.now += 1_000
    assert reg.passivate_idle() == [sid]
    assert reg.live() == []


def test_it_follows_its_session_through_passivations(store: Store) -> None:
    clock = FakeClock()
    reg = Sessions(store, idle_timeout=60, clock=clock, timeout=BOUND)
    try:
        chat = reg.open("chat")
        _say(chat, "m0")
        sub = chat.subscribe()
        assert sub.get(timeout=BOUND).data["content"] == "m0"  # catch-up
        _say(chat, "m1")
        _passivate(reg, clock, "chat")
        assert sub.get(timeout=BOUND).data["content"] == "m1"  # sent before the stop
        for round_ in range(3):  # reopened by the next call, passivated again
            text = f"after {round_}"
            assert _say(chat, text) == 2 + round_
            ev = sub.get(timeout=BOUND)
            assert (ev.seq, ev.data["content"]) == (2 + round_, text)
            _passivate(reg, clock, "chat")
        assert sub.get_nowait() is None
        assert sub.pending() == 0
        sub.close()
        assert reg.live() == []  # closing it called no passivated session back
        with pytest.raises(SessionStopped, match="ended"):
            sub.get(timeout=0)
    finally:
        reg.close()


def test_iteration_and_asyncio_go_on_across_a_passivation(store: Store) -> None:
    clock = FakeClock()
    reg = Sessions(store, idle_timeout=60, clock=clock, timeout=BOUND)
    try:
        chat = reg.open("chat")
        it = chat.subscribe()
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.extend(ev.seq for ev in it), daemon=True)
        reader.start()

        async def main() -> list[str]:
            got: list[str] = []
            async with await chat.asubscribe() as sub:
                for i in range(4):
                    await chat.append("user_message", {"content": f"m{i}"})
                    if i == 1:
                        _passivate(reg, clock, "chat")
                    got.append((await sub.aget(BOUND)).data["content"])
                # a reader waiting when the session stops is woken by the store's feed
                waiting = asyncio.ensure_future(sub.aget(BOUND))
                await asyncio.sleep(0)
                _passivate(reg, clock, "chat")
                await chat.append("user_message", {"content": "m4"})
                got.append((await asyncio.wait_for(waiting, BOUND)).data["content"])
                await chat.append("user_message", {"content": "m5"})
                async for ev in sub:
                    got.append(ev.data["content"])
                    break
            return got

        assert asyncio.run(main()) == ["m0", "m1", "m2", "m3", "m4", "m5"]
        it.close()
        reader.join(BOUND)
        assert not reader.is_alive()
        assert seen == list(range(len(seen)))
        assert len(seen) >= 5
    finally:
        reg.close()


def test_it_follows_a_session_handed_over_to_another_process() -> None:
    """Two registries on one `MemoryStore` stand for two processes: one asks for the
    session (``open(id, wait=...)``), the holder hands it over, and the holder's
    subscribers go on following what the asker writes."""
    store = MemoryStore()
    a, b = Sessions(store, timeout=BOUND), Sessions(store, timeout=BOUND)
    try:
        in_a = a.open("chat")
        _say(in_a, "a0")
        sub = in_a.subscribe()
        in_b = b.open("chat", wait=BOUND)
        assert (a.live(), b.live()) == ([], ["chat"])
        _say(in_b, "b1")
        _say(in_b, "b2")
        got = [sub.get(timeout=BOUND) for _ in range(3)]
        assert [(ev.seq, ev.data["content"]) for ev in got] == [(0, "a0"), (1, "b1"), (2, "b2")]
        assert a.live() == []  # following reopened nothing here
    finally:
        b.close()
        a.close()


def test_one_made_where_the_session_is_held_elsewhere_ends_with_its_registry() -> None:
    """Through a handle whose session another process holds, a subscription follows the
    store from the start; it too ends when its own registry closes."""
    store = MemoryStore()
    holder, other = Sessions(store, timeout=BOUND), Sessions(store, timeout=BOUND)
    try:
        at_holder = holder.open("chat")
        _say(at_holder, "h0")
        sub = other.open("chat").subscribe()
        assert other.live() == []
        _say(at_holder, "h1")
        assert [sub.get(timeout=BOUND).seq for _ in range(2)] == [0, 1]
        rest: list[int] = []
        reader = threading.Thread(target=lambda: rest.extend(ev.seq for ev in sub))
        reader.start()
        other.close()
        reader.join(BOUND)
        assert not reader.is_alive(), "its iteration did not end with its registry"
        assert rest == []
    finally:
        other.close()
        holder.close()


def test_it_ends_when_its_registry_closes_also_while_following_the_store(
    store: Store,
) -> None:
    clock = FakeClock()
    reg = Sessions(store, idle_timeout=60, clock=clock, timeout=BOUND)
    chat = reg.open("chat")
    _say(chat, "m0")
    live, following = chat.subscribe(), chat.subscribe()
    _passivate(reg, clock, "chat")
    _say(chat, "m1")
    assert [following.get(timeout=BOUND).seq for _ in range(2)] == [0, 1]
    live_done: list[int] = []
    reader = threading.Thread(target=lambda: live_done.extend(ev.seq for ev in live))
    reader.start()
    waiting = threading.Thread(target=lambda: live_done.extend(ev.seq for ev in following))
    waiting.start()
    reg.close()
    for t in (reader, waiting):
        t.join(BOUND)
        assert not t.is_alive(), "a subscriber's iteration did not end with its registry"
    assert sorted(live_done) == [0, 1]  # the one that had not read its events yet
    with pytest.raises(SessionStopped, match="ended"):
        following.get(timeout=0)


def test_a_stop_on_purpose_ends_it() -> None:
    reg = Sessions(MemoryStore(), timeout=BOUND)
    try:
        chat = reg.open("chat")
        _say(chat, "m0")
        sub = chat.subscribe()
        chat.stop()
        assert [ev.seq for ev in sub] == [0]  # ends, as after any stop for good
    finally:
        reg.close()


def test_a_crash_still_ends_it_with_session_crashed() -> None:
    reg = Sessions(MemoryStore(), timeout=BOUND)
    try:
        chat = reg.open("chat")
        _say(chat, "m0")
        sub = chat.subscribe()
        assert sub.get(timeout=BOUND).seq == 0
        crash_session(chat)
        with pytest.raises(SessionCrashed):
            sub.get(timeout=BOUND)
    finally:
        reg.close()


def test_a_standalone_sessions_subscription_still_ends_with_it() -> None:
    s = Session.start("alone", timeout=BOUND)
    _say(s, "m0")
    sub = s.subscribe()
    s.stop()
    assert [ev.seq for ev in sub] == [0]


Step = tuple[str, int]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 3)),
            st.tuples(st.just("passivate"), st.just(0)),
            st.tuples(st.just("read"), st.integers(0, 4)),
            st.tuples(st.just("move"), st.just(0)),
        ),
        max_size=14,
    ),
    from_seq=st.integers(0, 2),
)
def test_whatever_happens_it_gets_every_event_once_in_order(
    steps: list[Step], from_seq: int
) -> None:
    """Appends, passivations, moves between two registries (two processes on one
    `MemoryStore`) and reads of the subscription in any order: what it delivers is
    every event from ``from_seq`` on, exactly once, in seq order, equal to the stored
    ones."""
    store = MemoryStore()
    clock = FakeClock()
    regs = [Sessions(store, idle_timeout=60, clock=clock, timeout=BOUND) for _ in range(2)]
    try:
        holder = 0
        handles = [r.open("chat") for r in regs]
        sub = handles[0].subscribe(from_seq)
        appended = 0
        read: list[Event] = []
        for kind, n in steps:
            if kind == "append":
                for _ in range(n):
                    _say(handles[holder], f"e{appended}")
                    appended += 1
            elif kind == "passivate":
                clock.now += 1_000
                for r in regs:
                    r.passivate_idle()
            elif kind == "move":
                holder = 1 - holder
                handles[holder] = regs[holder].open("chat", wait=BOUND)
            else:
                for _ in range(min(n, max(appended - from_seq, 0) - len(read))):
                    read.append(sub.get(timeout=BOUND))
        while len(read) < max(appended - from_seq, 0):
            read.append(sub.get(timeout=BOUND))
        assert sub.get_nowait() is None
        stored = list(store.load("chat")) if appended else []
        assert [(ev.seq, ev.data) for ev in read] == [
            (ev.seq, ev.data) for ev in stored if ev.seq >= from_seq
        ]
        sub.close()
    finally:
        for r in regs:
            r.close()
