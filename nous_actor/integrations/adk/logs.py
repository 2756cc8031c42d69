"""The logs under `NousSessionService` (`_ServiceCore`): a handle per session, the
cached folds of their logs, and the writes to them.

It keeps a handle per session and the folds of their logs (least recently
used first out), reads a log again after a session stopped, and writes a
batch through the run's turn when one is open, sending it again when a
session refused it (and opening a run's turn again when a restart ended it).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, TypeVar, cast

from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.errors import SessionStopped, TurnInterrupted
from nous_actor.integrations._resend import refused, resend
from nous_actor.integrations.adk.folds import _StateView, _View
from nous_actor.integrations.adk.framework import AdkSession, BaseSessionService
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn
from nous_actor.sessions.turns import Policy
from nous_actor.store.sqlite import SQLiteStore

MAX_ATTEMPTS: Final = 5
"""How often a write is sent again when its session stopped (or restarted) before
applying it."""

CACHE_SIZE: Final = 1024
"""How many sessions' decoded views a service keeps (least recently used first out)."""

F = TypeVar("F", _View, _StateView)

Scope = Literal["session", "user", "app"]


@dataclass
class _Load:
    """What a `Session` object this service returned has seen of the logs it reads: each
    log's count when it was loaded (``seen``), the seq of the first event it was given
    (``first``), and the keys it wrote since, each with the count after its write."""

    seen: dict[Scope, int]
    first: int
    own: dict[tuple[Scope, str], int] = field(default_factory=dict)
    ref: weakref.ref[AdkSession] | None = None

    def since(self, scope: Scope, key: str) -> int:
        """The first seq of ``scope``'s log whose write of ``key`` this object has not seen."""
        return self.own.get((scope, key), self.seen[scope])


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
        self._opening: dict[str, list[asyncio.Future[Any]]] = {}  # turns asked for, not open
        self._loads: dict[int, _Load] = {}  # by id() of the Session objects returned
        self._guards: dict[str, tuple[asyncio.Lock, int]] = {}

    def _remember(self, session: AdkSession, load: _Load) -> None:
        """Keep what ``session`` (an object returned to a caller) has seen, for as long as
        it lives."""
        key = id(session)
        known = self._loads.get(key)
        if known is not None and known.ref is not None and known.ref() is session:
            load.ref = known.ref
        else:
            loads = self._loads

            def forget(_: object) -> None:
                loads.pop(key, None)

            load.ref = weakref.ref(session, forget)
        self._loads[key] = load

    def _load_of(self, session: AdkSession) -> _Load | None:
        load = self._loads.get(id(session))
        if load is None or load.ref is None or load.ref() is not session:
            return None
        return load

    @contextlib.asynccontextmanager
    async def _guard(self, names: list[str]) -> AsyncIterator[None]:
        """Hold the service's locks named ``names`` (in that order), each made when first
        asked for and let go when nobody holds or waits for it."""
        counted: list[str] = []
        acquired: list[asyncio.Lock] = []
        try:
            for name in names:
                lock, users = self._guards.get(name) or (asyncio.Lock(), 0)
                self._guards[name] = (lock, users + 1)
                counted.append(name)
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for name in counted:
                lock, users = self._guards[name]
                if users == 1:
                    del self._guards[name]
                else:
                    self._guards[name] = (lock, users - 1)

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
                    return await turn.append_many(items)
                except (TurnInterrupted, RuntimeError) as exc:
                    if borrowed and attempt < MAX_ATTEMPTS - 1:
                        continue  # that run's turn ended meanwhile: write again
                    if not isinstance(exc, TurnInterrupted):
                        raise
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
