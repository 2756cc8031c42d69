"""The turns a session of this process granted and that have not ended, by id.

A session restarted in this process (its actor crashed, the process did not) finds
its open turn here while the turn's lease runs, so its holder is alive; so does a
session that moved here while a caller of this process runs a turn of it (`running`:
the turn was granted where the session was held then). A turn found in neither was
held in a process that is gone (or its lease ran out). Kept by the sessions' turn
tables and the turns' handles, read at a restart.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from nous_actor.runtime import forks, scheduling
from nous_actor.sessions.turns._rules import TurnRequest


class _Open:
    """The open turn: its request, where it began, when its lease runs out, and how
    many summaries of compactions made through it are being written (its lease does
    not run out meanwhile: its holder waits for the session's own work)."""

    __slots__ = ("deadline", "req", "start_seq", "started", "summaries")

    def __init__(self, req: TurnRequest, start_seq: int, deadline: float) -> None:
        self.req = req
        self.start_seq = start_seq
        self.deadline = deadline
        self.started = time.time_ns()  # for its span (telemetry)
        self.summaries = 0


_GRANTED: dict[str, _Open] = {}
_GRANTED_LOCK = forks.lock()
_ENDED = threading.Condition(_GRANTED_LOCK)  # notified when a granted turn ends
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
        if _GRANTED.pop(turn_id, None) is not None:
            _ENDED.notify_all()


_DRAINING: dict[str, float] = {}
"""The sessions whose registry is closing and lets other processes' turns on them end
first (`let_turns_end`), each until when at most (`time.monotonic`): a turn that asks
to open on one of them meanwhile is not granted here; it waits, and follows the
session where it is next."""


def draining(session_id: str) -> bool:
    """Whether turns asking to open on ``session_id`` wait for it to move (see above)."""
    until = _DRAINING.get(session_id)
    return until is not None and time.monotonic() < until


def let_turns_end(
    session_ids: Iterable[str],
    turn_ids: Callable[[], Iterable[str]],
    until: float,
    stopped: float,
) -> bool:
    """(A closing registry.) Wait until none of the turns ``turn_ids()`` names is open
    here any more (ended, or its lease ran out), or until ``until`` (`time.monotonic`),
    no turn being granted on ``session_ids`` meanwhile nor after, until `stop_draining`
    (or ``stopped``, at the latest); ``True`` if none is open."""
    with _GRANTED_LOCK:
        for session_id in session_ids:
            _DRAINING[session_id] = stopped
        while True:
            now = scheduling.monotonic()
            leases = [
                turn.deadline
                for turn in (_GRANTED.get(t) for t in turn_ids())
                if turn is not None and now < turn.deadline
            ]
            if not leases:
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            _ENDED.wait(min(left, max(min(leases) - now, 0.001)))


def stop_draining(session_ids: Iterable[str]) -> None:
    """The registry closed: ``session_ids`` no longer hold back their turns' grants."""
    with _GRANTED_LOCK:
        for session_id in session_ids:
            _DRAINING.pop(session_id, None)


_RUNNING: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
"""The turns a caller of this process holds open, by id (the `Turn` objects), wherever
they were granted: a turn opened through another process's session (forwarded there)
is run here, and a session that moves here finds its holder alive."""


def running(turn_id: str, turn: Any) -> None:
    """A caller of this process opened turn ``turn_id`` (``turn``: its `Turn`)."""
    with _GRANTED_LOCK:
        _RUNNING[turn_id] = turn


def not_running(turn_id: str) -> None:
    """The caller's turn ``turn_id`` ended (or was given up)."""
    with _GRANTED_LOCK:
        _RUNNING.pop(turn_id, None)


def holder_alive(turn_id: str, now: float) -> bool:
    """Whether the holder of turn ``turn_id``, left open in a session's log, may still
    be running, its lease not run out: this process granted it, or a caller of this
    process holds it open (it opened it through the process that held the session
    then; ``_until``: its lease's end as the caller renews it)."""
    with _GRANTED_LOCK:
        turn = _GRANTED.get(turn_id)
        runner = _RUNNING.get(turn_id)
    if runner is not None and now < runner._until:
        return True
    return turn is not None and now < turn.deadline
