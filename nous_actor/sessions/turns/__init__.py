"""Turns: one run at a time writes a session (DESIGN.md §11), kept by the session's actor.

A *turn* is a run of an agent on a session: opened by ``session.turn(...)``
(the caller's side is `nous_actor.sessions.turn_handle.Turn`), written
through, closed. The actor already runs its calls one at a time, so the turn
table lives in it (`TurnHost`, a base of `SessionActor`): the open turn, its
lease, and the calls that wait for it (turns that queued, writes through the
plain handle). Nothing here blocks and nothing here owns a thread: deadlines
(a lease running out, a waiter's bound) are kept by one process-wide alarm
thread that only tells the session to look (`h_turn_tick`); every call that
touches the table looks too.

A turn is recorded by the seed's bookkeeping events (DESIGN.md §2):
``turn_start`` ``{"turn_id", "owner", "policy", "lease"}`` and ``turn_end``
``{"turn_id", "owner", "policy", "how", ...}``, where ``how`` is ``closed``,
``failed`` (its ``with`` block raised; ``error`` names the exception's type),
``interrupted`` (``by``: the turn that took over; or ``reason: "restart"``),
``rolled_back`` (``by``, and ``note_seq``: the replace that hides it),
``expired`` (its lease ran out) or ``abandoned`` (its opener gave up waiting).
A raw ``append("turn_start")`` is just an event: it opens no managed turn.

The package's modules, each importing only those above it: ``_rules`` (the
policies, the request, the table), ``_table`` (`TurnKeeper`: the table's
keeping, and the alarm thread) and ``_host`` (`TurnHost`: the turn calls and
the actor's hooks).
"""

from __future__ import annotations

from nous_actor.sessions.turns._host import TurnHost as TurnHost
from nous_actor.sessions.turns._rules import DANGLING_TURNS as DANGLING_TURNS
from nous_actor.sessions.turns._rules import DEFAULT_DANGLING_TURNS as DEFAULT_DANGLING_TURNS
from nous_actor.sessions.turns._rules import DEFAULT_LEASE as DEFAULT_LEASE
from nous_actor.sessions.turns._rules import DEFAULT_ROLLBACK_NOTE as DEFAULT_ROLLBACK_NOTE
from nous_actor.sessions.turns._rules import DEFER as DEFER
from nous_actor.sessions.turns._rules import HELD as HELD
from nous_actor.sessions.turns._rules import INTERRUPTED_TOOL_RESULT as INTERRUPTED_TOOL_RESULT
from nous_actor.sessions.turns._rules import POLICIES as POLICIES
from nous_actor.sessions.turns._rules import THROUGH as THROUGH
from nous_actor.sessions.turns._rules import DanglingTurns as DanglingTurns
from nous_actor.sessions.turns._rules import Policy as Policy
from nous_actor.sessions.turns._rules import TurnRequest as TurnRequest
from nous_actor.sessions.turns._rules import TurnTable as TurnTable
from nous_actor.sessions.turns._rules import check_dangling_turns as check_dangling_turns
from nous_actor.sessions.turns._rules import open_turn as open_turn
from nous_actor.sessions.turns._table import ALARMS as ALARMS
from nous_actor.sessions.turns._table import TurnKeeper as TurnKeeper

__all__ = [
    "DANGLING_TURNS",
    "DEFAULT_DANGLING_TURNS",
    "DEFAULT_LEASE",
    "DEFAULT_ROLLBACK_NOTE",
    "DEFER",
    "INTERRUPTED_TOOL_RESULT",
    "DanglingTurns",
    "POLICIES",
    "Policy",
    "TurnHost",
    "TurnRequest",
    "open_turn",
]

# The public classes are named by this package, where users import them from.
TurnHost.__module__ = __name__
TurnRequest.__module__ = __name__
