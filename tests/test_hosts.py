"""A session or registry used under another host than the one it was made under.

Made before a simulation and called inside it, a handle's actor runs on the real
dispatcher, which the simulation does not control: the call was applied there behind
the simulation's back while the simulated caller waited out a virtual bound
(``CallTimeout`` at once, in real time; a registry's open: "did not answer").
Such a use is refused at once, saying to make it inside the simulation; made inside
and used after the simulation ended, likewise (its actors ran there).
"""

from __future__ import annotations

import pytest
from bounds import BOUND

from nous_actor import MemoryStore, Session, Sessions
from nous_actor.testing.simulation import Simulation


def test_a_handle_and_a_registry_made_before_a_simulation_are_refused_inside_it() -> None:
    registry = Sessions(MemoryStore(), timeout=BOUND)
    try:
        chat = registry.open("x")
        chat.append("user_message", {"content": "before"}).get(timeout=BOUND)
        standalone = Session.start("standalone", timeout=BOUND)
        try:
            with Simulation(1):
                for handle in (chat, standalone):
                    fut = handle.append("user_message", {"content": "inside"})
                    with pytest.raises(RuntimeError, match="made before this simulation began"):
                        fut.get()
                with pytest.raises(RuntimeError, match="made before this simulation began"):
                    registry.open("y")
            # Nothing was applied behind the simulation's back; both work on after it.
            assert [e.data["content"] for e in chat.events().get(timeout=BOUND)] == ["before"]
            assert standalone.count().get(timeout=BOUND) == 0
            assert registry.open("y").count().get(timeout=BOUND) == 0
        finally:
            standalone.stop(timeout=BOUND)
    finally:
        registry.close()


def test_a_handle_made_inside_a_simulation_is_refused_after_it() -> None:
    with Simulation(2):
        made = Session.start("inside")
        assert made.append("user_message", {"content": "in"}).get().seq == 0
        kept = made
    with pytest.raises(RuntimeError, match="made inside a simulation, which has ended"):
        kept.count().get(timeout=BOUND)
