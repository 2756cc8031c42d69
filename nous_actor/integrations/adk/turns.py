"""The turns of runs: `_RunTurns`, which run of a service holds a turn of which session
(and which turns are being opened), and the writes, each through its run's turn when
one is open, a run's turn opened again when a restart ended it."""

from __future__ import annotations

import asyncio
from datetime import datetime
from functools import partial
from typing import Any, Final, cast

from nous_actor.core.event import Event, EventType
from nous_actor.errors import TurnInterrupted
from nous_actor.integrations._once import append_once
from nous_actor.integrations.adk.logs import _Logs
from nous_actor.sessions.turn_handle import Turn
from nous_actor.sessions.turns import Policy

MAX_ATTEMPTS: Final = 5
"""How often a run's write is tried through its turn: a write the run's turn refused
because a restart of the session ended that turn (nothing was applied) is written through
the turn opened again, and one through another run's turn that ended meanwhile is written
again, each at most this many times in all."""


class _RunTurns:
    """The open turns of a service's runs, by (session key, invocation id), and the turns
    asked for and not open yet, by session key; every write goes through here.

    A run's turn is in ``_turns`` from the moment it is open until `close`; a turn
    being opened is in ``_opening`` until its open ends (opened or refused).
    """

    def __init__(self, logs: _Logs) -> None:
        self._logs = logs
        self._turns: dict[tuple[str, str], Turn] = {}
        self._opening: dict[str, list[asyncio.Future[Any]]] = {}

    def holds(self, key: str, invocation: str | None) -> bool:
        """Whether run ``invocation`` holds an open turn of session ``key``."""
        return invocation is not None and (key, invocation) in self._turns

    async def open(
        self, key: str, invocation: str, policy: Policy, owner: str, lease: float, wait: float
    ) -> None:
        """Open a turn of session ``key`` for run ``invocation``: its writes go through it."""
        handle = await self._logs.handle(key)
        turn = handle.turn(policy, owner=owner, lease=lease, timeout=wait)
        opening = asyncio.ensure_future(turn.aopen())
        waiting = self._opening.setdefault(key, [])
        waiting.append(opening)
        try:
            await opening
            self._turns[(key, invocation)] = turn
        finally:
            waiting.remove(opening)
            if not waiting and self._opening.get(key) is waiting:
                del self._opening[key]

    async def close(self, key: str, invocation: str, failed: bool) -> None:
        """Close run ``invocation``'s turn of session ``key`` (as failed: ``how:
        "failed"``); a run without an open turn closes nothing."""
        turn = self._turns.pop((key, invocation), None)
        if turn is None:
            return
        if failed:
            await turn.__aexit__(RuntimeError, None, None)
            return
        try:
            await turn.aclose()
        except TurnInterrupted:
            pass  # ended already (a restart, an expired lease): nothing left to close

    async def write(
        self,
        key: str,
        items: list[tuple[EventType, dict[str, Any], datetime]],
        invocation_id: str | None = None,
        any_turn: bool = False,
    ) -> list[Event]:
        """Append ``items`` as one batch: through the run's turn when one is open; with
        ``any_turn`` (a write that may land inside whichever run holds the session, as a
        compaction's replace of earlier events may), through the turn of the run of this
        service that holds the session or is being given it, instead of waiting for it."""
        for attempt in range(MAX_ATTEMPTS):
            turn = self._turns.get((key, invocation_id)) if invocation_id else None
            borrowed = False
            if turn is None and any_turn:
                turn = await self._turn_on(key)
                borrowed = turn is not None
            if turn is not None:
                try:
                    return await append_once(
                        await self._logs.handle(key), partial(turn.append_many, items)
                    )
                except (TurnInterrupted, RuntimeError) as exc:
                    if borrowed and attempt < MAX_ATTEMPTS - 1:
                        continue  # that run's turn ended meanwhile: write again
                    if not isinstance(exc, TurnInterrupted):
                        raise
                    if attempt == MAX_ATTEMPTS - 1 or not await self._ended_by_restart(key, exc):
                        raise
                    await self.open(
                        key,
                        cast(str, invocation_id),
                        cast(Policy, turn.policy),
                        turn.owner,
                        turn.lease,
                        turn.wait,
                    )
                    continue
            handle = await self._logs.handle(key)
            return await append_once(handle, partial(handle.append_many, items))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ended_by_restart(self, key: str, exc: TurnInterrupted) -> bool:
        """Whether the turn ``exc`` names ended because its session restarted (not because
        another run took the session)."""
        log = await self._logs.log(key)
        for ev in reversed(log.since(max(0, log.count() - 4096))):
            if ev.type is EventType.TURN_END and ev.data.get("turn_id") == exc.turn_id:
                return ev.data.get("reason") == "restart"
        return exc.how is None  # "not open here": the session restarted

    async def _turn_on(self, key: str) -> Turn | None:
        """The open turn of a run of this service on session ``key``; else, if one is being
        opened, that one once it is open (the session may have given it already); else
        ``None``."""
        for _ in range(MAX_ATTEMPTS):
            for (k, _run), turn in reversed(self._turns.items()):
                if k == key:
                    return turn
            waiting = self._opening.get(key)
            if not waiting:
                return None
            await asyncio.wait([waiting[0]])  # bounded: an open waits at most its `wait`
        return None
