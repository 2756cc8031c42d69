"""A session or registry used under another host than the one it was made under.

Made before a simulation and called inside it, a handle's actor runs on the real
dispatcher, which the simulation does not control: the call was applied there behind
the simulation's back while the simulated caller waited out a virtual bound
(``CallTimeout`` at once, in real time; a registry's open: "did not answer").
Such a use is refused at once, saying to make it inside the simulation; made inside
and used after the simulation ended, likewise (its actors ran there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

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


_TWO_STORES = """
import json, sys, time
from nous_actor import ConflictError, Sessions, SQLiteStore
from nous_actor.testing.simulation import Simulation

with Simulation(5) as sim:
    a, b = SQLiteStore(sys.argv[1]), SQLiteStore(sys.argv[1])  # two "processes"
    ra, rb = Sessions(a), Sessions(b)
    ra.open("c").append("user_message", {"content": "x"}).get()
    began = sim.now()
    try:
        rb.open("c", wait=10)
        said = "opened"
    except ConflictError as exc:
        said = str(exc)
    waited = sim.now() - began
    ra.close(); rb.close(); a.close(); b.close()
print(json.dumps([said, waited]))
"""


def test_a_hand_off_between_two_sqlite_store_objects_ends_under_a_simulation(
    tmp_path: Any,
) -> None:
    """Two `SQLiteStore` objects on one file stand for two processes, which a simulation
    does not simulate (each follows the file on a thread of its own, in real time); a
    hand-off between them still ends, as on real threads: refused once its wait (on the
    simulation's clock) is over (the wait for the holder's change ran on the real clock,
    past every virtual deadline: the run hung for ever)."""
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_STORES, str(tmp_path / "two.db")],
        capture_output=True,
        text=True,
        timeout=BOUND * 6,
    )
    assert proc.returncode == 0, proc.stderr
    said, waited = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "after waiting 10 s for a hand-off" in said
    assert 10 <= waited < 11  # virtual seconds
