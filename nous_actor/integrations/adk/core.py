"""`_ServiceCore`, the plumbing under `NousSessionService`: its caches and its writes.

It keeps a handle per session and the folds of their logs (least recently
used first out), reads a log again after a session stopped, and writes a
batch through the run's turn when one is open, sending it again when a
session refused it (and opening a run's turn again when a restart ended it).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime
from typing import Any, TypeVar, cast

from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.errors import SessionStopped, TurnInterrupted
from nous_actor.integrations._resend import refused, resend
from nous_actor.integrations.adk.base import CACHE_SIZE, MAX_ATTEMPTS, BaseSessionService
from nous_actor.integrations.adk.folds import _StateView, _View
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn
from nous_actor.sessions.turns import Policy
from nous_actor.store.sqlite import SQLiteStore

F = TypeVar("F", _View, _StateView)


class _ServiceCore(BaseSessionService):
    """The plumbing of `NousSessionService`: what its API, its state and its runs use."""

    def __init__(self, sessions: Sessions) -> None:
        if not isinstance(sessions, Sessions):
            raise TypeError(
                "NousSessionService takes a nous_actor.Sessions registry, got "
                f"{type(sessions).__name__}; or use NousSessionService.sqlite(path)"
            )
        self.sessions = sessions
        self._owned: SQLiteStore | None = None
        self._handles: OrderedDict[str, Session] = OrderedDict()
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._states: OrderedDict[str, _StateView] = OrderedDict()
        self._turns: dict[tuple[str, str], Turn] = {}

    async def _handle(self, key: str) -> Session:
        handle = self._handles.get(key)
        if handle is None:
            handle = await self.sessions.aopen(key)
            self._handles[key] = handle
            if len(self._handles) > 4 * CACHE_SIZE:
                self._handles.popitem(last=False)
        else:
            self._handles.move_to_end(key)
        return handle

    async def _let_go(self, key: str) -> None:
        """Stop the session ``key`` this service opened only to find it empty (a lookup of
        an id never created), so that lookups of unknown ids leave nothing running."""
        self._views.pop(key, None)
        handle = self._handles.pop(key, None)
        if handle is not None:
            await handle.astop()

    async def _log(self, key: str) -> Log:
        return await resend(lambda: self._handle(key), lambda h: h.log(), MAX_ATTEMPTS)

    async def _view(self, key: str) -> _View:
        return await self._fold(self._views, key, _View)

    async def _state(self, key: str) -> _StateView:
        return await self._fold(self._states, key, _StateView)

    async def _fold(self, cache: OrderedDict[str, F], key: str, new: type[F]) -> F:
        """The fold of session ``key`` kept in ``cache`` (a ``new`` one if it has none, the
        least recently used one let go past `CACHE_SIZE`), caught up with the log."""
        view = cache.get(key)
        if view is None:
            view = cache[key] = new()
            if len(cache) > CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        view.catch_up(await self._log(key))
        return view

    async def _write(
        self,
        key: str,
        items: list[tuple[EventType, dict[str, Any], datetime]],
        invocation_id: str | None = None,
    ) -> list[Event]:
        """Append ``items`` as one batch: through the run's turn when one is open."""
        for attempt in range(MAX_ATTEMPTS):
            turn = self._turns.get((key, invocation_id)) if invocation_id else None
            if turn is not None:
                try:
                    return await turn.append_many(items)
                except TurnInterrupted as exc:
                    if attempt == MAX_ATTEMPTS - 1 or not await self._ended_by_restart(key, exc):
                        raise
                    await self._open_turn(
                        key,
                        cast(str, invocation_id),
                        cast(Policy, turn.policy),
                        turn.owner,
                        turn.lease,
                        turn.wait,
                    )
                    continue
                except SessionStopped as exc:
                    if not refused(exc) or attempt == MAX_ATTEMPTS - 1:
                        raise
                    continue
            handle = await self._handle(key)
            try:
                return await handle.append_many(items)
            except SessionStopped as exc:
                if not refused(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ended_by_restart(self, key: str, exc: TurnInterrupted) -> bool:
        """Whether the turn ``exc`` names ended because its session restarted (not because
        another run took the session)."""
        log = await self._log(key)
        for ev in reversed(log.since(max(0, log.count() - 4096))):
            if ev.type is EventType.TURN_END and ev.data.get("turn_id") == exc.turn_id:
                return ev.data.get("reason") == "restart"
        return exc.how is None  # "not open here": the session restarted

    async def _open_turn(
        self, key: str, invocation: str, policy: Policy, owner: str, lease: float, wait: float
    ) -> None:
        """Open a turn of session ``key`` for run ``invocation``: its writes go through it."""
        handle = await self._handle(key)
        turn = handle.turn(policy, owner=owner, lease=lease, timeout=wait)
        await turn.aopen()
        self._turns[(key, invocation)] = turn
