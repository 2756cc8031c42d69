"""Hand-off between two registries on one store, under the simulation: the asker's
wait, the holder's hand-over and the request's lapse all run on the virtual clock,
on the test's thread, and replay from the seed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from nous_actor import ConflictError, Sessions, SessionStopped
from nous_actor.store import shared
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.simulation import FaultRates, Simulation, explore


def _hand_off(seed: int) -> tuple[float, list[str], str]:
    with Simulation(seed) as sim:
        store = MemoryStore()
        holder, asker = Sessions(store), Sessions(store)
        holder.open("chat").append("user_message", {"content": "one"}).get()
        t0 = sim.now()
        chat = asker.open("chat", wait=30)  # the holder hands it over when it looks
        took = sim.now() - t0
        chat.append("user_message", {"content": "two"}).get()
        texts = [m.content for m in chat.derive_messages().get()]
        live = holder.live()
        asker.close()
        holder.close()
        return took, texts, f"{live}:{sim.digest()}"


def test_an_asker_gets_the_session_from_the_holder_in_virtual_time() -> None:
    """No wall time passes for the wait; the holder let go; nothing is lost; and the
    same seed gives the same run."""
    before = set(threading.enumerate())
    t0 = time.perf_counter()
    took, texts, digest = _hand_off(3)
    assert time.perf_counter() - t0 < 5.0
    assert 0 < took <= 1.0  # the holder looks every 0.25 virtual seconds
    assert texts == ["one", "two"]
    assert digest.startswith("[]:")  # the holder holds nothing now
    assert _hand_off(3) == (took, texts, digest)
    assert set(threading.enumerate()) - before == set()


def test_a_busy_holder_keeps_the_session_until_the_askers_bound_in_virtual_time() -> None:
    """While the holder's turn is open it keeps the session: the asker's bound runs
    out on the virtual clock (ConflictError naming the holder), in no wall time."""
    t0 = time.perf_counter()
    with Simulation(1) as sim:
        store = MemoryStore()
        holder, asker = Sessions(store), Sessions(store)
        chat = holder.open("chat")
        turn = chat.turn(owner="run-1").open()
        turn.append("user_message", {"content": "one"}).get()
        start = sim.now()
        with pytest.raises(ConflictError, match="still held"):
            asker.open("chat", wait=20)
        assert sim.now() - start == pytest.approx(20, abs=1.0)
        turn.close()
        again = asker.open("chat", wait=20)  # the turn ended: the holder lets go
        assert [m.content for m in again.derive_messages().get()] == ["one"]
        asker.close()
        holder.close()
    assert time.perf_counter() - t0 < 5.0


def test_a_reader_that_never_takes_the_session_runs_under_the_simulation() -> None:
    """`Sessions.read` of a session another registry holds: counts, a subscription fed
    by the holder's commits, and an awaited read from a coroutine, all on the test's
    thread (no thread started), the session staying with its holder."""
    before = set(threading.enumerate())
    with Simulation(2) as sim:
        store = MemoryStore()
        holder, other = Sessions(store), Sessions(store)
        reader = other.read("chat")
        chat = holder.open("chat")
        with reader.subscribe() as sub:
            chat.append("user_message", {"content": "a"}).get()
            assert reader.count().get() == 1
            assert sub.get(timeout=5).seq == 0

            async def read() -> list[str]:
                return [m.content for m in await reader.derive_messages()]

            task = sim.go(read())
            sim.run()
            assert task is not None
            assert task.result() == ["a"]
        assert holder.live() == ["chat"]
        assert other.live() == []
        holder.close()
        other.close()
    assert set(threading.enumerate()) - before == set()


# -- forwarding: calls go to the holder, under the simulation ---------------------------------


def _forwarding_scenario(sim: Simulation) -> None:
    """Two registries on one store stand for two processes. A caller in ``b`` pipelines
    appends to a session ``a`` holds (opened there first) while the schedule crashes and
    stops actors; every append acknowledged is stored once, in the order sent, and no
    append is refused except as a crash storm outlasts its bound (then it was not
    applied: checked)."""
    store = MemoryStore()
    a, b = Sessions(store, max_restarts=10_000), Sessions(store, max_restarts=10_000)
    a.open("chat")
    in_b = b.open("chat")
    acked: list[int] = []

    def collect(fut: Any) -> None:
        try:
            acked.append(fut.get().seq)
        except SessionStopped as exc:
            assert "not applied" in str(exc) or "stopped" in str(exc), exc

    futs = []
    for i in range(16):  # pipelined, with a wait now and then: moves land among them
        futs.append(in_b.append("user_message", {"content": f"m{i}"}))
        if i % 4 == 3:
            collect(futs[i - 3])
    for i, fut in enumerate(futs):
        if i % 4:
            collect(fut)
    sim.run()
    sim.end_faults()
    sent = [e.data["content"] for e in shared.load_since(store, "chat")]
    assert sent == sorted(sent, key=lambda c: int(c[1:])), "forwarded appends reordered"
    assert len(set(sent)) == len(sent), "a forwarded append was applied twice"
    assert len(acked) <= len(sent)
    assert sorted(acked) == sorted(set(acked))
    b.close()
    a.close()


def test_forwarded_calls_keep_their_order_through_crashes_and_stops() -> None:
    """Explored over seeds with crashes and stops of actors at random steps: forwarded
    pipelined appends are never reordered nor applied twice."""
    rates = FaultRates(crash=0.1, stop=0.1)
    assert explore(_forwarding_scenario, range(40), rates=rates) == 40


def test_forwarding_runs_on_the_virtual_clock_with_no_thread() -> None:
    """A forwarded call under the simulation starts no thread of its own and replays
    the same from the same seed."""
    before = set(threading.enumerate())

    def run(seed: int) -> tuple[list[str], str]:
        with Simulation(seed) as sim:
            store = MemoryStore()
            a, b = Sessions(store), Sessions(store)
            a.open("chat").append("user_message", {"content": "a"}).get()
            chat = b.open("chat")
            chat.append("user_message", {"content": "b"}).get()
            texts = [m.content for m in chat.derive_messages().get()]
            live = (a.live(), b.live())
            b.close()
            a.close()
            return texts, f"{live}:{sim.digest()}"

    texts, digest = run(5)
    assert texts == ["a", "b"]
    assert digest.startswith("(['chat'], []):")
    assert run(5) == (texts, digest)
    assert set(threading.enumerate()) - before == set()


def _followed(seed: int) -> tuple[list[tuple[int, str]], str]:
    with Simulation(seed) as sim:
        store = MemoryStore()
        holder, asker = Sessions(store), Sessions(store)
        at_holder = holder.open("chat")
        at_holder.append("user_message", {"content": "one"}).get()
        sub = at_holder.subscribe()
        chat = asker.open("chat", wait=30)  # the holder hands it over; sub follows on
        chat.append("user_message", {"content": "two"}).get()
        chat.append("user_message", {"content": "three"}).get()
        got = [(ev.seq, ev.data["content"]) for ev in (sub.get(timeout=5) for _ in range(3))]
        sub.close()
        asker.close()
        holder.close()
        return got, sim.digest()


def test_a_subscription_follows_a_handed_over_session_in_virtual_time() -> None:
    """The holder's subscriber goes on with the store's feed once the session is handed
    over (made on a reader, which the simulation runs too): every event once, in order,
    no thread of the process left, and the same seed gives the same run."""
    before = set(threading.enumerate())
    got, digest = _followed(5)
    assert got == [(0, "one"), (1, "two"), (2, "three")]
    assert _followed(5) == (got, digest)
    assert set(threading.enumerate()) - before == set()
