"""One implementation for the sync and the async API: each operation of the saver is a
generator that yields what it waits for (an `Effect`) and is sent the result; `run_sync`
waits for each in the calling thread, `run_async` awaits each without blocking the loop.

The effects: a `nous_actor.SessionFuture` (a call of a session or a reader), `Open`
(a session's handle, from the registry), `Stored` (whether a session has stored
events) and `Listing` (the sessions whose ids start with a prefix), both read from
the registry's store (see `Journal`), `OpenTurn` and `CloseTurn`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from nous_actor.errors import SessionStopped, TurnInterrupted
from nous_actor.integrations.langgraph.registries import Journal
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.turn_handle import Turn

__all__ = [
    "CloseTurn",
    "Effect",
    "Listing",
    "Op",
    "Open",
    "OpenTurn",
    "Stored",
    "aclose_quietly",
    "close_quietly",
    "run_async",
    "run_sync",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Open:
    """The handle of session ``key`` (started or found by the registry)."""

    key: str


@dataclass(frozen=True, slots=True)
class Stored:
    """Whether session ``key`` has events in the store (read without opening it)."""

    key: str


@dataclass(frozen=True, slots=True)
class Listing:
    """The ids of the stored sessions whose ids start with ``prefix``."""

    prefix: str


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """Open ``turn`` (waiting, per its policy, for the one open)."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class CloseTurn:
    """Close ``turn`` (as failed, with ``how: "failed"``, when ``failed``); a turn that
    ended already (its session restarted or moved meanwhile) closes quietly."""

    turn: Turn
    failed: bool = False


Effect: TypeAlias = SessionFuture[Any] | Open | Stored | Listing | OpenTurn | CloseTurn
Op: TypeAlias = Generator[Effect, Any, R]


def close_quietly(turn: Turn, failed: bool = False) -> None:
    """Close ``turn`` (as failed when ``failed``); one that ended already closes quietly."""
    if failed:
        turn.__exit__(RuntimeError, None, None)
        return
    try:
        turn.close()
    except (TurnInterrupted, SessionStopped):
        pass  # ended already (taken by another run, expired, a restart, its holder gone)


async def aclose_quietly(turn: Turn, failed: bool = False) -> None:
    """`close_quietly` for asyncio code."""
    if failed:
        await turn.__aexit__(RuntimeError, None, None)
        return
    try:
        await turn.aclose()
    except (TurnInterrupted, SessionStopped):
        pass


def _do(journal: Journal, effect: Effect) -> Any:
    if isinstance(effect, SessionFuture):
        return effect.get()
    if isinstance(effect, Open):
        return journal.registry.open(effect.key)
    if isinstance(effect, Stored):
        return journal.count(effect.key).get() > 0
    if isinstance(effect, Listing):
        return journal.listing(effect.prefix)
    if isinstance(effect, OpenTurn):
        return effect.turn.open()
    return close_quietly(effect.turn, effect.failed)


async def _ado(journal: Journal, effect: Effect) -> Any:
    if isinstance(effect, SessionFuture):
        return await effect
    if isinstance(effect, Open):
        return await journal.registry.aopen(effect.key)
    if isinstance(effect, Stored):
        return await journal.count(effect.key) > 0
    if isinstance(effect, Listing):
        return await asyncio.to_thread(journal.listing, effect.prefix)
    if isinstance(effect, OpenTurn):
        return await effect.turn.aopen()
    return await aclose_quietly(effect.turn, effect.failed)


def run_sync(journal: Journal, op: Op[R]) -> R:
    """Run ``op`` to its end in this thread, waiting for each effect it yields."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = op.throw(error) if error is not None else op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result, error = None, None
        try:
            result = _do(journal, effect)
        except Exception as exc:  # handed to the operation, which decides
            error = exc


async def run_async(journal: Journal, op: Op[R]) -> R:
    """Run ``op`` to its end, awaiting each effect it yields (the loop never blocks)."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            effect = op.throw(error) if error is not None else op.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result, error = None, None
        try:
            result = await _ado(journal, effect)
        except Exception as exc:
            error = exc
