"""What a turn is: its policies and defaults, its request, and what a log says of turns.

Plain values and functions of a log: nothing here runs on the actor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

from nous_actor.core.event import Event, EventType, has_key
from nous_actor.core.log import Log
from nous_actor.core.message import tool_call_parts
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

_TURN_TYPES: Final = frozenset({EventType.TURN_START, EventType.TURN_END})


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


def last_turn_event(log: Log) -> Event | None:
    """The newest managed turn event of ``log`` (a ``turn_start`` or ``turn_end`` whose
    data has a ``turn_id`` and a ``policy``), or ``None``: what `open_turn` reads, and
    what a session's snapshot keeps, so that a snapshot never changes whether a turn
    is open (a summary that shadows the ``turn_end`` of a closed turn and not its
    ``turn_start`` would otherwise leave that turn open to the next restart)."""
    for ev in reversed(log.events()):
        if ev.type in _TURN_TYPES and has_key(ev, "turn_id") and has_key(ev, "policy"):
            return ev
    return None


def open_turn(log: Log) -> Event | None:
    """The ``turn_start`` of the managed turn left open in ``log``, or ``None``.

    Managed turns never overlap, so the last managed turn event (one whose data
    has a ``turn_id`` and a ``policy``, as every managed turn's ``turn_start`` and
    ``turn_end`` have) says it: a ``turn_start`` there is still open. A raw turn event
    of the application's own (a ``turn_id`` of its bookkeeping, no ``policy``) opens
    and ends no managed turn (DESIGN.md §11). (An event read from a store whose text
    has no ``turn_id`` is passed over undecoded: a recovered history of unmanaged
    turns is not decoded to find none.)
    """
    ev = last_turn_event(log)
    return ev if ev is not None and ev.type is EventType.TURN_START else None


def _ended(events: Sequence[Event], turn_id: str) -> Event | None:
    """The ``turn_end`` of ``turn_id`` among ``events`` (newest first), or ``None``."""
    for ev in reversed(events):
        if ev.type is EventType.TURN_END and ev.data.get("turn_id") == turn_id:
            return ev
    return None


def _bound(fut: SessionFuture[Any] | None) -> float:
    """How long a held write waits: a little less than its caller's bound, so the caller
    hears why (`TurnBusy`) rather than a bare `CallTimeout`."""
    t = DEFAULT_TIMEOUT if fut is None else fut._timeout
    return max(t - min(1.0, t / 4), 0.0)
