"""Turns through a `RaySession`: the session's shard keeps the turn, as a local session does.

Runs on the local Ray cluster of tests/ray_cluster.py (skips without Ray, except
under CI).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pytest

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")

from nous_actor import Compactor, MemoryStore, TurnBusy, TurnInterrupted  # noqa: E402
from nous_actor.cluster.ray import RaySessions  # noqa: E402
from nous_actor.core.history import turns  # noqa: E402
from nous_actor.sessions.turns import DEFAULT_ROLLBACK_NOTE  # noqa: E402


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any) -> Iterator[RaySessions]:
    sessions = RaySessions(MemoryStore, shards=1, timeout=20)
    try:
        yield sessions
    finally:
        sessions.shutdown()


def _sid() -> str:
    return f"turn-{uuid.uuid4().hex[:10]}"


def test_a_turn_through_a_ray_handle_holds_back_plain_writes(cluster: RaySessions) -> None:
    """Writes through the turn answer while a plain write of the same process waits for
    the turn; reject names the holder across the process boundary."""
    h = cluster.open(_sid())
    with h.turn(owner="run-1") as turn:
        turn.append("user_message", {"content": "a"}).get()
        plain = h.append("user_message", {"content": "plain"})
        turn.append("assistant_message", {"content": "b"}).get()
        with pytest.raises(TurnBusy, match="'run-1'") as caught:
            h.turn(policy="reject").open()
        assert caught.value.holder == "run-1"
        assert not plain.done()
    assert plain.get().seq == 4
    assert [m.content for m in h.derive_messages().get()] == ["a", "b", "plain"]


def test_rollback_through_a_ray_handle(cluster: RaySessions) -> None:
    """A rollback hides the interrupted turn; its holder hears TurnInterrupted."""
    h = cluster.open(_sid())
    old = h.turn(owner="run-1").open()
    old.append("assistant_message", {"content": "half"}).get()

    async def take_over() -> None:
        async with h.turn(policy="rollback", owner="run-2") as new:
            await new.append("assistant_message", {"content": "whole"})

    asyncio.run(take_over())
    with pytest.raises(TurnInterrupted, match="rolled_back"):
        old.append("assistant_message", {"content": "late"}).get()
    assert [m.content for m in h.derive_messages().get()] == [DEFAULT_ROLLBACK_NOTE, "whole"]
    assert [t["how"] for t in turns(h.log().get())] == ["rolled_back", "closed"]


def test_a_turn_through_a_ray_handle_compacts_in_the_shard(cluster: RaySessions) -> None:
    """A run compacts through its turn on a remote session as on a local one: the
    compactor travels to the shard and runs there, inside the turn; a plain compaction
    waits for the turn, as a plain write does."""

    def summarise(messages: Any) -> str:  # (a closure: pickled by value for the shard)
        return f"summary of {len(messages)}"

    h = cluster.open(_sid())
    with h.turn(owner="run-1") as turn:
        for i in range(6):
            turn.append("user_message", {"content": f"message {i} " * 20}).get()
        result = turn.compact(Compactor(budget=1, keep_recent=2, summarise=summarise)).get()
        assert result.summary_seq is not None
        plain = h.compact(Compactor(budget=1, keep_recent=1, summarise=summarise))
        turn.append("assistant_message", {"content": "after"}).get()
        assert not plain.done()
    assert plain.get().summary_seq is not None
    log = h.log().get()
    assert [t["how"] for t in turns(log)] == ["closed"]
    assert h.derive_messages().get()[-1].content == "after"
    starts = [e.seq for e in log.events() if e.type == "turn_start"]
    ends = [e.seq for e in log.events() if e.type == "turn_end"]
    replaces = [e.seq for e in log.events() if e.surface_op is not None]
    assert starts[0] < replaces[0] < ends[0] < replaces[1]  # one inside the turn, one after


CALLS: Final = {
    "content": None,
    "tool_calls": [
        {"id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"id": "c2", "name": "time", "arguments": "{}"},
    ],
}


def test_the_shards_end_a_gone_holder_s_turn_as_dangling_turns_says(ray_cluster: Any) -> None:
    """``dangling_turns`` is handed to every shard's registry: a holder silent past its
    lease leaves a half run that the shard rolls back when told to (the default would
    close the tool call left without its result)."""
    with RaySessions(MemoryStore, shards=1, timeout=20, dangling_turns="rollback") as cluster:
        h = cluster.open(_sid())
        h.append("user_message", {"content": "before the run"}).get()
        gone = h.turn(owner="silent", lease=0.2).open()
        gone.append("user_message", {"content": "weather and time in Oslo?"}).get()
        gone.append("assistant_message", CALLS).get()
        result = {"content": "-3 C", "tool_call_id": "c1", "name": "weather"}
        gone.append("tool_result", result).get()
        h.append("user_message", {"content": "after"}).get()  # waits for the lease to run out
        (end,) = turns(h.log().get())
        assert (end["owner"], end["how"], end["dangling"]) == ("silent", "expired", "rollback")
        contents = [m.content for m in h.derive_messages().get()]
        assert contents == ["before the run", DEFAULT_ROLLBACK_NOTE, "after"]


@pytest.mark.parametrize("bad", ["drop", "", None, 1])
def test_a_bad_dangling_turns_is_refused_before_anything_starts(bad: object) -> None:
    with pytest.raises(ValueError, match="'keep', 'rollback', 'close_tool_calls'"):
        RaySessions(MemoryStore, dangling_turns=bad)  # type: ignore[arg-type]
