"""NousSession.turn(): runs of the Agents SDK kept apart by turns of the session."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from typing import Any

import pytest
from agents import Agent, Runner
from bounds import run
from test_openai_agents import ScriptedModel, add, user

from nous_actor import MemoryStore, Sessions, TurnInterrupted
from nous_actor.core.history import turns
from nous_actor.integrations.openai_agents import NousSession, RunTurn


@pytest.fixture
def sessions() -> Iterator[Sessions]:
    registry = Sessions(MemoryStore(), timeout=5)
    yield registry
    registry.close()


def _texts(items: list[Any]) -> list[Any]:
    return [it.get("content") for it in items]


def test_runs_in_turns_never_interleave(sessions: Sessions) -> None:
    """Concurrent Runner.run calls, each in a turn, store each run's items contiguously."""

    async def main() -> list[Any]:
        model = ScriptedModel()
        agent = Agent(name="adder", model=model, tools=[add], instructions="Add.")
        nous = NousSession("runs", sessions)

        async def one(i: int) -> Any:
            async with nous.turn(owner=f"run-{i}"):
                return await Runner.run(agent, f"add {i} 10", session=nous)

        results = await asyncio.gather(*(one(i) for i in range(3)))
        assert sorted(r.final_output for r in results) == [
            f"The sum is {i + 10}." for i in range(3)
        ]
        return await nous.get_items()

    items = run(main())
    assert len(items) == 15
    for k in range(3):  # each run: its question, reasoning, call, output, answer
        block = items[5 * k : 5 * k + 5]
        i = int(str(block[0]["content"]).split()[1])
        assert [it.get("type", "message") for it in block] == [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message",
        ]
        assert block[3]["output"] == str(i + 10)
    assert [t["how"] for t in turns(sessions.open("runs").log().get())] == ["closed"] * 3


def test_a_call_outside_any_turn_waits_without_holding_up_the_turn(sessions: Sessions) -> None:
    """add_items outside any turn waits for the open turn to end, and the turn's own calls
    meanwhile go on (the outside call does not hold the session's lock while it waits)."""

    async def main() -> list[Any]:
        nous = NousSession("mixed", sessions)
        plain = NousSession("mixed", sessions)
        await plain.open()  # its handle is ready: its next call sends at once
        outside = contextvars.copy_context()  # a task started in it is in no turn
        async with nous.turn(owner="run-a"):
            await nous.add_items([user("a1")])
            waiting = asyncio.create_task(plain.add_items([user("b")]), context=outside)
            await asyncio.sleep(0)  # it sends its wait for the turn
            await nous.add_items([user("a2")])
            assert await nous.get_items() == [user("a1"), user("a2")]
            assert not waiting.done()
        await waiting
        return await nous.get_items()

    assert _texts(run(main())) == ["a1", "a2", "b"]


def test_a_rolled_back_run_hears_turn_interrupted(sessions: Sessions) -> None:
    """A run rolled back by another's turn fails its next call; its items are hidden
    behind one system note, and the new run's items follow."""

    async def main() -> list[Any]:
        nous = NousSession("rollback", sessions)
        outside = contextvars.copy_context()
        entered = nous.turn(owner="run-a")
        await entered.__aenter__()
        await nous.add_items([user("half")])

        async def take_over() -> None:
            async with nous.turn(policy="rollback", owner="run-b"):
                await nous.add_items([user("whole")])

        await asyncio.create_task(take_over(), context=outside)
        with pytest.raises(TurnInterrupted, match="rolled_back"):
            await nous.add_items([user("late")])
        await entered.__aexit__(TurnInterrupted, None, None)
        return await nous.get_items()

    items = run(main())
    assert items[0]["role"] == "system"
    assert items[1:] == [user("whole")]


def test_turn_arguments_are_checked_and_turns_do_not_nest(sessions: Sessions) -> None:
    """Bad arguments fail at the call; a turn inside a turn of the same session fails."""
    nous = NousSession("args", sessions)
    with pytest.raises(ValueError, match="policy must be one of"):
        nous.turn(policy="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease must be"):
        nous.turn(lease=-1)

    async def nested() -> None:
        async with nous.turn():
            with pytest.raises(RuntimeError, match="do not nest"):
                async with nous.turn():
                    pass

    run(nested())
    assert isinstance(nous.turn(), RunTurn)
