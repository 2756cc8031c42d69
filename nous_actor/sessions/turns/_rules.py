"""What a turn is: its policies and defaults, its request, the table that holds it.

Plain values and functions of a log: nothing here runs on the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final, Literal, TypeVar

from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture

Policy = Literal["reject", "enqueue", "interrupt", "rollback"]

POLICIES: Final[tuple[str, ...]] = ("reject", "enqueue", "interrupt", "rollback")
"""What an arriving turn does when another is open (LangGraph's ``multitask_strategy``)."""

DEFAULT_LEASE: Final = 300.0
"""Seconds a turn stays open without a call through it before it ends as expired."""

DEFAULT_ROLLBACK_NOTE: Final = "[an earlier attempt was interrupted and rolled back]"
"""The system note a rollback leaves where the rolled-back turn's messages were."""

DEFER: Final[Any] = object()
"""A handler's result meaning "the future is answered later" (by a commit, or by the
turn table when the call stops waiting)."""

# What a turn may do (by handler name); the ones that wait for earlier commits go
# through `TurnHost.h_turn_read`, the others through `TurnHost.h_turn_call`.
THROUGH: Final = frozenset(
    {
        "h_append",
        "h_append_many",
        "h_append_at",
        "h_snapshot",
        "h_compact",
        "h_fork",
        "h_read",
        "h_log",
        "h_ping",
    }
)
_READS: Final = frozenset(
    {"derive_messages", "derive_indexed", "surface", "events", "since", "count", "as_of"}
)
_TURN_TYPES: Final = frozenset({EventType.TURN_START, EventType.TURN_END})
# Writes through the plain handle that wait while a turn is open.
HELD: Final = frozenset({"h_append", "h_append_many", "h_append_at", "h_compact"})


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


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRequest:
    """One ``turn_open`` call, checked in the caller's thread."""

    turn_id: str
    owner: str
    policy: str
    lease: float
    wait: float  # seconds an ``enqueue`` turn waits for the open one
    note: str  # the system note a ``rollback`` leaves
    context: object = None  # the caller's trace context, for the turn's span (telemetry)


class _Open:
    """The open turn: its request, where it began, when its lease runs out."""

    __slots__ = ("deadline", "req", "start_seq", "started")

    def __init__(self, req: TurnRequest, start_seq: int, deadline: float) -> None:
        self.req = req
        self.start_seq = start_seq
        self.deadline = deadline
        self.started = time.time_ns()  # for its span (telemetry)


class _Waiter:
    """A call waiting for the open turn to end: a queued turn (``req``) or a held write."""

    __slots__ = ("args", "deadline", "fut", "handler", "req")

    def __init__(
        self,
        deadline: float,
        fut: SessionFuture[Any] | None,
        req: TurnRequest | None = None,
        handler: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        self.deadline = deadline
        self.fut = fut
        self.req = req
        self.handler = handler
        self.args = args


class TurnTable:
    """A session's turns: made by its first turn, dropped when none is open or waiting."""

    __slots__ = ("armed", "open", "waiting")

    def __init__(self) -> None:
        self.open: _Open | None = None
        self.waiting: deque[_Waiter] = deque()
        self.armed: float | None = None  # the earliest alarm asked for


def open_turn(log: Log) -> Event | None:
    """The ``turn_start`` of the managed turn left open in ``log``, or ``None``.

    Managed turns never overlap, so the last managed turn event (one whose data
    has a ``turn_id``) says it: a ``turn_start`` there is still open.
    """
    for ev in reversed(log.events()):
        if ev.type in _TURN_TYPES and "turn_id" in ev.data:
            return ev if ev.type is EventType.TURN_START else None
    return None


def _ended(log: Log, turn_id: str) -> Event | None:
    """The ``turn_end`` of ``turn_id`` in ``log`` (newest first), or ``None``."""
    for ev in reversed(log.events()):
        if ev.type is EventType.TURN_END and ev.data.get("turn_id") == turn_id:
            return ev
    return None


def _bound(fut: SessionFuture[Any] | None) -> float:
    """How long a held write waits: a little less than its caller's bound, so the caller
    hears why (`TurnBusy`) rather than a bare `CallTimeout`."""
    t = DEFAULT_TIMEOUT if fut is None else fut._timeout
    return max(t - min(1.0, t / 4), 0.0)
