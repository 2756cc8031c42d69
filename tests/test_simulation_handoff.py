"""Hand-off between two registries on one store, under the simulation: the asker's
wait, the holder's hand-over and the request's lapse all run on the virtual clock,
on the test's thread, and replay from the seed."""

from __future__ import annotations

import threading
import time

import pytest

from nous_actor import ConflictError, Sessions
from nous_actor.store.memory import MemoryStore
from nous_actor.testing.simulation import Simulation


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
