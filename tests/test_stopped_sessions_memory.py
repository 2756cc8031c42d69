"""What a session that stopped leaves in memory, counted.

A long-running process opens far more sessions over its life than it holds at
once: the idle ones are passivated, and a registry that closes lets all of them
go. None of that may keep a stopped session's actor or its log (its events)
alive: not the registry's route of the session, not a handle the application
keeps, not a closed registry the application still refers to. These tests count
the objects left after a collection, so a reference that pins a stopped session
fails here, not in a memory profile a week into production.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from bounds import BOUND, wait_until
from fake_clock import FakeClock
from freed import Freed

from nous_actor import MemoryStore, Sessions, SessionStopped, SQLiteStore, Store
from nous_actor.sessions.actor import session_cell
from nous_actor.store.sqlite import store as sqlite_store

SESSIONS = 200
KINDS = ("SessionActor", "Log", "Route", "Session")


def _census() -> Counter[str]:
    gc.collect()
    return Counter(name for o in gc.get_objects() if (name := type(o).__qualname__) in KINDS)


@pytest.fixture
def store(each_store: Store) -> Store:
    return each_store


def _actors(reg: Sessions, ids: list[str]) -> Iterator[object]:
    """The running actors of ``ids`` (for `Freed`, which keeps none of them alive)."""
    for sid in ids:
        ref = reg._live_ref(sid, BOUND)
        assert ref is not None, sid
        yield ref.actor_inbox._actor  # type: ignore[attr-defined]


def _filled(reg: Sessions) -> list[str]:
    ids = [f"s-{i}" for i in range(SESSIONS)]
    for sid in ids:
        h = reg.open(sid)
        h.append_many([("user_message", {"content": f"hello {k}"}) for k in range(10)]).get(
            timeout=BOUND
        )
    return ids


def test_passivated_sessions_leave_nothing_behind(store: Store) -> None:
    """Passivating sessions nobody holds a handle to frees their actors, logs and routes."""
    clock = FakeClock()
    base = _census()
    reg = Sessions(store, idle_timeout=30, clock=clock, timeout=BOUND)
    try:
        ids = _filled(reg)
        during = _census() - base
        assert during["SessionActor"] == SESSIONS
        assert during["Log"] == SESSIONS
        freed = Freed(_actors(reg, ids))
        clock.now = 60
        assert sorted(reg.passivate_idle()) == sorted(ids)
        assert freed.wait(BOUND) == []
        left = _census() - base
        assert left == Counter(), f"left behind by {SESSIONS} passivated sessions: {left}"
        # And they reopen from the store, whole.
        assert reg.open(ids[7]).count().get(timeout=BOUND) == 10
    finally:
        reg.close(timeout=BOUND)


def test_a_kept_handle_does_not_keep_its_passivated_session(store: Store) -> None:
    """An application that keeps its handles (a dict of conversations) keeps their routes,
    not the stopped actors and their logs; each handle's next call reopens its session."""
    clock = FakeClock()
    base = _census()
    reg = Sessions(store, idle_timeout=30, clock=clock, timeout=BOUND)
    try:
        ids = _filled(reg)
        handles = {sid: reg.open(sid) for sid in ids}
        freed = Freed(_actors(reg, ids))
        clock.now = 60
        assert len(reg.passivate_idle()) == SESSIONS
        assert freed.wait(BOUND) == []
        left = _census() - base
        assert left == Counter({"Route": SESSIONS, "Session": SESSIONS}), left
        assert (
            handles[ids[3]].append("user_message", {"content": "back"}).get(timeout=BOUND).seq
            == 10
        )
        assert (_census() - base)["Log"] == 1
    finally:
        reg.close(timeout=BOUND)


def test_a_closed_registry_keeps_no_session(store: Store) -> None:
    """A closed registry the application still refers to (and the handles it gave out)
    hold none of its sessions' actors or logs."""
    base = _census()
    reg = Sessions(store, timeout=BOUND)
    ids = _filled(reg)
    kept = [reg.open(sid) for sid in ids[:10]]
    freed = Freed(_actors(reg, ids))
    reg.close(timeout=BOUND)
    assert freed.wait(BOUND) == []
    left = _census() - base
    assert left == Counter({"Route": 10, "Session": 10}), left
    with pytest.raises(SessionStopped, match="closed"):
        kept[0].count().get(timeout=BOUND)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_passivated_sessions_do_not_add_up(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that keeps opening new sessions and passivating them keeps no memory per
    session it ever had: a round of new sessions, opened then passivated, adds next to
    nothing to what the rounds before it left (once the tables they share found their
    size), while each round held several KB a session while open (before the fix, each
    round left about 4 KB a session). The one thing each
    session would add is its number in the store's cache of session numbers, bounded
    on its own (`NUMBERS_KEPT`, made small here so that it does not count)."""
    monkeypatch.setattr(sqlite_store, "NUMBERS_KEPT", 10)
    # (On PostgreSQL a lease longer than the test: a renewal under way holds the claims
    # of its round, those of sessions passivated meanwhile included, until it is done.)
    store: Store = (
        request.getfixturevalue("pg_stores")(lease=600.0)
        if kind == "postgres"
        else SQLiteStore(tmp_path / "m.db")
    )
    clock = FakeClock()
    reg = Sessions(store, idle_timeout=30, clock=clock, timeout=BOUND)
    try:
        reg.open("warm").count().get(timeout=BOUND)

        def round_(k: int) -> tuple[int, int]:
            base = tracemalloc.get_traced_memory()[0]
            ids = [f"r{k}-{i}" for i in range(SESSIONS)]
            handles = [reg.open(sid) for sid in ids]
            # Sent to every session before any answer is waited for: their commits are
            # shared (one at a time, each its own fsync, made the test slow, not truer).
            sent = [
                h.append_many([("user_message", {"content": f"hi {j}"}) for j in range(10)])
                for h in handles
            ]
            for f in sent:
                f.get(timeout=BOUND)
            del sent, f
            # Each session's end, as its registry handled it (its exit is news the
            # registry takes after the stop returned), and its actor freed: waited for
            # before measuring.
            ends = [session_cell(h._ref).finished for h in handles if h._ref is not None]
            assert len(ends) == SESSIONS
            del handles
            freed = Freed(_actors(reg, ids))
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            clock.now += 60
            assert set(ids) <= set(reg.passivate_idle())
            assert all(end.wait(BOUND) for end in ends)
            del ends
            assert freed.wait(BOUND) == []
            del freed
            gc.collect()
            return held, tracemalloc.get_traced_memory()[0]

        gc.collect()
        tracemalloc.start()
        try:
            for k in range(3):  # (the tables the rounds share find their size)
                _, after = round_(k)
            # Three rounds measured: what one leaves is the least of them (a round
            # may also count what another thread of the process holds meanwhile; a
            # session that leaves something leaves it in every round).
            added: list[float] = []
            for k in range(3, 6):
                held, last = round_(k)
                added.append((last - after) / SESSIONS)
                after = last
        finally:
            tracemalloc.stop()
        per_open = held / SESSIONS
        assert per_open > 2_000, per_open  # the rounds hold something while open
        assert min(added) < 100, (
            f"{min(added):.0f} B a passivated session at least (rounds: "
            f"{', '.join(f'{a:.0f}' for a in added)} B; open: {per_open:.0f} B)"
        )
    finally:
        reg.close(timeout=BOUND)
        store.close()


def test_a_ray_shard_keeps_the_handles_of_live_sessions_only() -> None:
    """A Ray shard (driven here in this process, without a cluster) that serves ever new
    sessions, passivated as they go idle, keeps a handle only for those still running
    once its table has grown past a sweep; a batch's handles stay its own meanwhile."""
    pytest.importorskip("ray")
    import asyncio

    from nous_actor.cluster.ray._protocol import CALL, OPEN
    from nous_actor.cluster.ray._shard import _HANDLES_SWEEP, _Shard

    clock = FakeClock()
    shard = _Shard(MemoryStore, 0, 1, {"idle_timeout": 30, "clock": clock, "timeout": BOUND})
    assert shard.sessions is not None
    try:

        async def serve(first: int, count: int) -> None:
            ops = [(OPEN, f"s-{i}", "", ()) for i in range(first, first + count)]
            handles, refused = await shard._open(ops)
            assert not refused
            assert sorted(handles) == sorted(op[1] for op in ops)

        async def main() -> None:
            total = 0
            for _ in range(3):
                await serve(total, _HANDLES_SWEEP)
                total += _HANDLES_SWEEP
                # (The registry has taken the news of their recoveries, which it sent
                # itself as they ended: an idle time counts from a session's being ready,
                # read on the registry's clock when it takes that news.)
                shard.sessions.live()  # type: ignore[union-attr]
                clock.now += 60
                shard.sessions.passivate_idle()  # type: ignore[union-attr]
            # Past the sweep: the handles of passivated sessions are gone.
            await serve(total, 10)
            assert len(shard.handles) <= _HANDLES_SWEEP + 10
            # A batch that names a passivated session reopens it (a new handle), and the
            # call goes through.
            op = (CALL, "s-3", "h_read", ("count",))
            handles, refused = await shard._open([op])
            assert not refused
            _, count = shard._start(op, handles)
            assert await count == 0

        asyncio.run(main())
        live = set(shard.sessions.live())
        assert set(shard.handles) >= {"s-3"}
        assert len(shard.handles) <= len(live) + _HANDLES_SWEEP
    finally:
        shard.sessions.close(timeout=BOUND)


def test_a_holder_forgets_the_sessions_it_handed_over_long_ago(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry remembers each session it handed to an asker for `GIVEN_FOR` seconds (its
    own next call then goes to the asker); past that, the ones never asked about again
    are let go as the table grows, not kept for the life of the process."""
    from nous_actor.sessions import handoff

    monkeypatch.setattr(handoff, "GRACE_FOR", 0.0)  # a session is offered at the first look
    monkeypatch.setattr(handoff, "GIVEN_FOR", 0.0)  # and is "long ago" at once
    store = MemoryStore()
    a, b = Sessions(store, timeout=BOUND), Sessions(store, timeout=BOUND)
    try:
        count = 3 * handoff._GIVEN_SWEEP
        for i in range(count):
            a.open(f"s-{i}").append("user_message", {"content": "x"}).get(timeout=BOUND)
        for i in range(count):
            assert b.open(f"s-{i}", wait=BOUND).count().get(timeout=BOUND) == 1
        # The actor lets go of its claim before the hand-over thread hears so and counts
        # it: the asker's last open can return first.
        wait_until(lambda: a._handover.handed >= count, BOUND, "every hand-over counted")
        assert a._handover.handed == count
        assert len(a._handover._given) < 2 * handoff._GIVEN_SWEEP
    finally:
        b.close(timeout=BOUND)
        a.close(timeout=BOUND)
