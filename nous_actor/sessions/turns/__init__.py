"""Turns: one run at a time writes a session (DESIGN.md §11), kept by the session's actor.

A *turn* is a run of an agent on a session: opened by ``session.turn(...)``
(the caller's side is `nous_actor.sessions.turn_handle.Turn`), written
through, closed. The actor already runs its calls one at a time, so the turn
table lives in it (`TurnTable`, one of its collaborators): the open turn, its
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

The actor keeps a table only while a turn is open or waited for; it runs the
turn calls (``h_turn_open``, ``h_turn_call``, ``h_turn_read``, ``h_turn_end``,
``h_turn_tick``) and reads from each handler's own declaration whether a plain
write waits for the open turn and what a turn may call
(`nous_actor.sessions.actor`).

The package's modules, each importing only those before it: ``_rules`` (the
policies, the request, what a log says of its turns), ``_blocks`` (the turn
blocks a caller is inside), ``_granted`` (the turns this process granted) and
``_table`` (`TurnTable`, and the alarm).
"""

from __future__ import annotations

from nous_actor.sessions.turns._granted import let_turns_end as let_turns_end
from nous_actor.sessions.turns._granted import stop_draining as stop_draining
from nous_actor.sessions.turns._rules import DANGLING_TURNS as DANGLING_TURNS
from nous_actor.sessions.turns._rules import DEFAULT_DANGLING_TURNS as DEFAULT_DANGLING_TURNS
from nous_actor.sessions.turns._rules import DEFAULT_LEASE as DEFAULT_LEASE
from nous_actor.sessions.turns._rules import DEFAULT_ROLLBACK_NOTE as DEFAULT_ROLLBACK_NOTE
from nous_actor.sessions.turns._rules import DEFER as DEFER
from nous_actor.sessions.turns._rules import INTERRUPTED_TOOL_RESULT as INTERRUPTED_TOOL_RESULT
from nous_actor.sessions.turns._rules import POLICIES as POLICIES
from nous_actor.sessions.turns._rules import DanglingTurns as DanglingTurns
from nous_actor.sessions.turns._rules import Policy as Policy
from nous_actor.sessions.turns._rules import TurnRequest as TurnRequest
from nous_actor.sessions.turns._rules import check_dangling_turns as check_dangling_turns
from nous_actor.sessions.turns._rules import open_turn as open_turn
from nous_actor.sessions.turns._table import ALARMS as ALARMS
from nous_actor.sessions.turns._table import TurnTable as TurnTable

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
    "TurnTable",
    "let_turns_end",
    "stop_draining",
    "TurnRequest",
    "open_turn",
]

# The public classes are named by this package, where users import them from.
TurnTable.__module__ = __name__
TurnRequest.__module__ = __name__
