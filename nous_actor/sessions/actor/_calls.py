"""What a call on a session is: the envelope it travels in, and what its handler is.

Every message a session's actor reads is ``(handler, args, future)``: the actor
runs ``handler(actor, *args)`` and answers ``future`` with what it returns. What
a handler *is* (a read that waits for the commits before it, a write that waits
for an open turn, a call a turn may make, a call that answers its future
itself, a call a stopped session still runs, a call a driver in another process may
send) is declared once, where the
handler is defined, with `call`; the actor's loop, its turn hooks and its stop
read the declarations from `TRAITS` (and `WHEN_STOPPED`, `TURN_READS`). A
function sent as a handler without a declaration is a plain call: it runs at
once, in arrival order, and its result answers its future.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeVar

from nous_actor.core._frozen import safe_str
from nous_actor.core.event import EventType
from nous_actor.errors import SessionCrashed

Handler = Callable[..., Any]

EventParts = tuple[EventType, datetime, Any, Any]
"""An event checked, frozen and (a plain one) encoded in the caller's thread; seq to come."""

F = TypeVar("F", bound=Handler)

# -- a handler's traits (bits of an int: read on every call) -----------------------------------

SEES_COMMITS: Final = 1
"""It sees every append made before it: it waits (parked, in arrival order, every call
after it behind it) until their commits are applied. Reads, snapshot, compaction, fork,
the barrier."""

HELD_BY_TURN: Final = 2
"""A write that, sent through the plain handle while a turn is open, waits for the turn
to end (then runs, in arrival order)."""

THROUGH_TURN: Final = 4
"""A call a turn may make (through ``h_turn_call``, or ``h_turn_read`` if it also
`SEES_COMMITS`)."""

ANSWERS: Final = 8
"""It is passed its call's future (``handler(actor, future, *args)``) and may answer it
later: it returns `DEFER` then (an append answered by its commit, a turn that queues)."""

AT_ONCE: Final = 16
"""The actor's own news (the store was read, commits landed): it runs on arrival, never
behind parked calls."""

REMOTE: Final = 32
"""A driver in another process may send it (`nous_actor.cluster.ray`: a shard runs the
calls declared so, and no other): its arguments are plain data that survive the trip."""

TRAITS: Final[dict[Handler, int]] = {}
"""Each declared handler's traits (undeclared: 0)."""

WHEN_STOPPED: Final[dict[Handler, Handler]] = {}
"""What a stopped session does with a call of this handler still in its inbox, in place
of failing its future with `SessionStopped`: ``hook(actor, *args)``."""

TURN_READS: Final[dict[Handler, frozenset[str]]] = {}
"""For a handler whose first argument names what it does: the names a turn may pass."""


def call(
    traits: int = 0,
    *,
    when_stopped: Handler | None = None,
    turn_reads: frozenset[str] | None = None,
) -> Callable[[F], F]:
    """Declare what the decorated handler is (its `TRAITS`, and what a stopped session
    does with it, and what a turn may ask of it)."""

    def declare(fn: F) -> F:
        TRAITS[fn] = traits
        if when_stopped is not None:
            WHEN_STOPPED[fn] = when_stopped
        if turn_reads is not None:
            TURN_READS[fn] = turn_reads
        return fn

    return declare


def handlers_with(trait: int) -> frozenset[Handler]:
    """The declared handlers that have ``trait``."""
    return frozenset(h for h, t in TRAITS.items() if t & trait)


_safe_str = safe_str


def _crashed(session_id: str, exc: BaseException) -> SessionCrashed:
    err = SessionCrashed(session_id, f"crashed with {type(exc).__name__}: {_safe_str(exc)}")
    err.__cause__ = exc
    return err
