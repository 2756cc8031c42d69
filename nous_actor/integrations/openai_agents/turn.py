"""`RunTurn`: one run of the SDK kept apart from other runs, as a turn of the session."""

from __future__ import annotations

import contextvars
from typing import Any

from nous_actor.integrations.openai_agents.calls import _Calls
from nous_actor.integrations.openai_agents.shared import _IN_TURN, _Shared, _turn_of
from nous_actor.sessions.turn_handle import Turn

__all__ = ["RunTurn"]


class RunTurn:
    """What `NousSession.turn` returns: ``async with`` it around one run.

    Entering opens a turn on the session (waiting, per its policy, for one
    open already) and makes the `NousSession`'s calls in this task (and the
    tasks it starts) go through it; leaving closes it (``how: "failed"`` if
    the block raised). ``turn`` is the `nous_actor.Turn` while open.
    """

    def __init__(
        self,
        calls: _Calls,
        policy: str,
        owner: str | None,
        lease: float,
        timeout: float | None,
        note: str | None,
    ) -> None:
        self._calls = calls
        self._args = (policy, owner, lease, timeout, note)
        self.turn: Turn | None = None
        self._token: contextvars.Token[tuple[tuple[_Shared, Turn], ...]] | None = None

    async def __aenter__(self) -> RunTurn:
        calls = self._calls
        calls.check_open()
        if self.turn is not None:
            raise RuntimeError("a RunTurn is used once: call session.turn() for each run")
        policy, owner, lease, timeout, note = self._args
        shared = calls.shared
        if _turn_of(shared) is not None:
            raise RuntimeError(
                f"this task is in a turn of session {calls.session_id!r} already; "
                "turns do not nest"
            )
        shared.turns = True
        handle = await calls.handle_of()
        turn = handle.turn(policy, owner=owner, lease=lease, timeout=timeout, note=note)  # type: ignore[arg-type]
        await turn.aopen()
        self.turn = turn
        self._token = _IN_TURN.set((*_IN_TURN.get(), (shared, turn)))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        token, self._token = self._token, None
        if token is not None:
            _IN_TURN.reset(token)
        if self.turn is not None:
            await self.turn.__aexit__(exc_type, *exc)
