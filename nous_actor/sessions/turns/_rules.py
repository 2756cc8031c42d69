"""What a turn is: its policies and defaults, its request, the table that holds it.

Plain values and functions of a log: nothing here runs on the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, Final, Literal, TypeVar

from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.core.message import tool_call_parts
from nous_actor.runtime import scheduling
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture

Policy = Literal["reject", "enqueue", "interrupt", "rollback"]

POLICIES: Final[tuple[str, ...]] = ("reject", "enqueue", "interrupt", "rollback")
"""What an arriving turn does when another is open (LangGraph's ``multitask_strategy``)."""

DEFAULT_LEASE: Final = 300.0
"""Seconds a turn stays open without a call through it before it ends as expired."""

DEFAULT_ROLLBACK_NOTE: Final = "[an earlier attempt was interrupted and rolled back]"
"""The system note a rollback leaves where the rolled-back turn's messages were."""

DanglingTurns = Literal["keep", "rollback", "close_tool_calls"]

DANGLING_TURNS: Final[tuple[str, ...]] = ("keep", "rollback", "close_tool_calls")
"""What a session does with the half run of a turn whose holder is gone (its process
died, or its lease ran out): ``keep`` it on the surface as it is; ``rollback``, one
replace hiding the turn behind a system note (history kept); ``close_tool_calls``,
answer each tool call it left without a result with a `INTERRUPTED_TOOL_RESULT`."""

DEFAULT_DANGLING_TURNS: Final = "close_tool_calls"
"""The default of ``dangling_turns``: the half run stays, and no tool call is left
without a result (a provider refuses a request holding one)."""

INTERRUPTED_TOOL_RESULT: Final = (
    "[interrupted: the run that made this tool call ended before its result was "
    "recorded; the call may or may not have taken effect]"
)
"""The content of the ``tool_result`` that closes a dangling tool call."""


def check_dangling_turns(value: object) -> str:
    """``value`` if it is one of `DANGLING_TURNS`.

    Raises:
        ValueError: it is not (naming the values to pass).
    """
    if not isinstance(value, str) or value not in DANGLING_TURNS:
        raise ValueError(
            f"dangling_turns must be one of {', '.join(map(repr, DANGLING_TURNS))}, got {value!r}"
        )
    return value


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


# The turns granted by a session of this process and not ended yet, by id: a session
# restarted in this process (its actor crashed, the process did not) finds its open
# turn here while the turn's lease runs, so its holder is alive; a turn not found here
# was held in a process that is gone (or its lease ran out). Kept by the actors, read
# at a restart.
_GRANTED: dict[str, _Open] = {}
_GRANTED_LOCK = threading.Lock()
_prune_at = 1024


def granted(turn: _Open) -> None:
    """Turn ``turn`` was granted by a session of this process."""
    global _prune_at
    with _GRANTED_LOCK:
        _GRANTED[turn.req.turn_id] = turn
        if len(_GRANTED) >= _prune_at:  # turns left open in stopped sessions: their lease ran
            now = scheduling.monotonic()
            for tid in [t for t, o in _GRANTED.items() if o.deadline <= now]:
                del _GRANTED[tid]
            _prune_at = max(1024, 2 * len(_GRANTED))


def ended(turn_id: str) -> None:
    """Turn ``turn_id`` ended (a no-op if it was not granted here)."""
    with _GRANTED_LOCK:
        _GRANTED.pop(turn_id, None)


def holder_alive(turn_id: str, now: float) -> bool:
    """Whether the holder of turn ``turn_id``, left open in a session's log, may still
    be running: this process granted it and its lease has not run out."""
    with _GRANTED_LOCK:
        turn = _GRANTED.get(turn_id)
    return turn is not None and now < turn.deadline


def dangling_calls(
    log: Log, start_seq: int, later: Iterable[Event] = ()
) -> list[tuple[str, str | None]]:
    """``(id, name)`` of each tool call on ``log``'s surface made after ``start_seq``
    (and in ``later``, events appended after ``log``: a session's appends not yet
    committed) that no ``tool_result`` there answers, in the order they were made. A
    call without an id cannot be answered and is not counted. O(the events since
    ``start_seq``)."""
    mine: list[Event] = []
    for ev in reversed(log.surface()):  # position order: stop at the turn's start
        if ev.position < start_seq:
            break
        if ev.seq > start_seq:
            mine.append(ev)
    mine.reverse()
    mine.extend(later)
    calls: dict[str, str | None] = {}
    answered: set[object] = set()
    for ev in mine:
        if ev.type is EventType.TOOL_RESULT:
            answered.add(ev.data.get("tool_call_id"))
        elif ev.type is EventType.ASSISTANT_MESSAGE:
            made = ev.data.get("tool_calls")
            for call in made if isinstance(made, Sequence) else ():
                cid, name, _ = tool_call_parts(call)
                if isinstance(cid, str):
                    calls.setdefault(cid, name if isinstance(name, str) else None)
    return [(cid, name) for cid, name in calls.items() if cid not in answered]


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
