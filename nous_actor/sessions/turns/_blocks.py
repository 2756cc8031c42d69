"""The turn blocks a caller is inside: a plain write from one must not wait for its own turn.

Kept per thread and per asyncio task (a context variable), on the caller's side:
`entered` and `left` by `nous_actor.sessions.turn_handle.Turn`, read by the
handle when it sends a write (`held_future`).
"""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar
from typing import Any, TypeVar

from nous_actor.sessions.future import SessionFuture

T = TypeVar("T")

# The turns whose ``with``/``async with`` block the caller is in, each with who entered
# it (the asyncio task, or the thread outside a loop): a plain write from there would
# wait for its own turn to end. A context variable, so every thread and every task sees
# its own (a task started inside the block inherits the entries, and is told apart by
# `caller`).
_ENTERED: ContextVar[tuple[tuple[str, object], ...]] = ContextVar(
    "nous_actor_entered_turns", default=()
)


def caller() -> object:
    """Who is calling: the running asyncio task, else the thread (its ident)."""
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return threading.get_ident() if task is None else task


def entered(turn_id: str) -> None:
    """The caller entered turn ``turn_id``'s block."""
    _ENTERED.set((*_ENTERED.get(), (turn_id, caller())))


def left(turn_id: str) -> None:
    """The caller left turn ``turn_id``'s block (a no-op where it was not entered)."""
    now = _ENTERED.get()
    if now:
        _ENTERED.set(tuple(e for e in now if e[0] != turn_id))


def held_future(session_id: str, timeout: float) -> HeldFuture[Any] | None:
    """The future of a plain write made from inside turn blocks (naming those turns), or
    ``None`` if the caller is in none (the common case: one context-variable read)."""
    now = _ENTERED.get()
    if not now:
        return None
    me = caller()
    ids = frozenset(t for t, who in now if who == me)
    if not ids:
        return None
    return HeldFuture(session_id, timeout, ids, not isinstance(me, int))


class HeldFuture(SessionFuture[T]):
    """The future of a plain write made from inside turn blocks: it names them
    (``turn_ids``), so that the session fails it at once if one of them is the open
    turn, instead of having it wait for that turn to end."""

    __slots__ = ("from_task", "turn_ids")

    def __init__(
        self, session_id: str, timeout: float, turn_ids: frozenset[str], from_task: bool
    ) -> None:
        super().__init__(session_id, timeout)
        self.turn_ids = turn_ids
        self.from_task = from_task  # made by an asyncio task (else by a thread)
