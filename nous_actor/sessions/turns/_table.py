"""The turn table's keeping: grants, ends, expiries, the queue, and the alarm.

`TurnKeeper` is the lower half of `TurnHost`: what the handlers do to the
table. Deadlines are kept by `ALARMS`, one process-wide thread that only tells
a session to look (``h_turn_tick``).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import pykka

from nous_actor._log import get_logger
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log, _utcnow, new_event
from nous_actor.errors import TurnBusy, TurnInterrupted
from nous_actor.runtime import scheduling, telemetry
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.turns._rules import (
    DEFAULT_ROLLBACK_NOTE,
    INTERRUPTED_TOOL_RESULT,
    TurnRequest,
    TurnTable,
    _ended,
    _Open,
    _Waiter,
    dangling_calls,
    ended,
    granted,
)

logger = get_logger("nous_actor.sessions.turns")


class _Alarms:
    """Tells sessions a deadline passed: the host's alarms (one daemon thread for the
    whole process, on real threads).

    A session asks to be told at a monotonic time; it is then sent an
    ``h_turn_tick`` call, and the session looks at its table. Sessions are held
    weakly: a stopped session is simply not told.
    """

    def at(self, when: float, ref: pykka.ActorRef[Any]) -> None:
        scheduling.current().call_at(when, partial(_tell, weakref.ref(ref)), "nous-turns")


def _tell(weak: weakref.ref[Any]) -> None:
    """Have the session look at its turn table (if it still runs)."""
    ref = weak()
    if ref is None:
        return
    try:
        ref.tell((TurnKeeper.h_turn_tick, (), None))
    except pykka.ActorDeadError:  # stopped meanwhile: nothing to tell
        pass


ALARMS: Final = _Alarms()


class TurnKeeper:
    """The turn table's keeping, under `TurnHost`'s handlers (a base class of it).

    (No ``__slots__`` here: its attributes are `SessionActor`'s slots.)
    """

    if TYPE_CHECKING:
        session_id: str
        next_seq: int
        log: Log
        turns: TurnTable | None
        dangling_turns: str  # what becomes of a gone holder's turn (DANGLING_TURNS)
        inflight: deque[Event]  # appended, not yet committed (nor in ``log``)
        failed: Any
        _fut: SessionFuture[Any] | None
        actor_ref: pykka.ActorRef[Any]

        def _submit(self, events: tuple[Event, ...], result: Any) -> Any: ...

        def _run(
            self,
            handler: Callable[..., Any],
            args: tuple[Any, ...],
            fut: SessionFuture[Any] | None,
        ) -> None: ...

        def _check_writable(self) -> None: ...

    # -- the alarm -----------------------------------------------------------------------

    def h_turn_tick(self) -> None:
        """The alarm: a lease or a waiter's bound may have run out."""
        now = scheduling.monotonic()
        table = self.turns
        if table is None:
            return
        if table.armed is not None and table.armed <= now:
            table.armed = None
        table = self._current(now)
        if table is None:
            return
        if table.open is not None and table.waiting:
            keep: deque[_Waiter] = deque()
            for w in table.waiting:
                if w.deadline <= now:
                    self._time_out(w, table.open, now)
                else:
                    keep.append(w)
            table.waiting = keep
        if not self._drop_if_idle(table):
            self._arm(table, now)

    # -- the table -----------------------------------------------------------------------

    def _grant(
        self,
        table: TurnTable,
        req: TurnRequest,
        now: float,
        before: tuple[tuple[EventType, dict[str, Any]], ...],
    ) -> Any:
        seq = self.next_seq
        specs = (
            *before,
            (
                EventType.TURN_START,
                {
                    "turn_id": req.turn_id,
                    "owner": req.owner,
                    "policy": req.policy,
                    "lease": req.lease,
                },
            ),
        )
        t = _utcnow()
        events = tuple(new_event(seq + k, et, d, t) for k, (et, d) in enumerate(specs))
        table.open = _Open(req, events[-1].seq, now + req.lease)
        granted(table.open)
        result = self._submit(events, events[-1])
        self._arm(table, now)
        return result

    def _end_data(self, cur: _Open, how: str) -> dict[str, Any]:
        """The ``turn_end`` data of the open turn ``cur``, ending now as ``how``."""
        ended(cur.req.turn_id)
        sink = telemetry.sink
        if sink is not None:
            sink.turn_ended(
                self.session_id, cur.req.owner, how, cur.started, time.time_ns(), cur.req.context
            )
        return {
            "turn_id": cur.req.turn_id,
            "owner": cur.req.owner,
            "policy": cur.req.policy,
            "how": how,
        }

    def _end_events(
        self, cur: _Open, how: str, by: TurnRequest
    ) -> tuple[tuple[EventType, dict[str, Any]], ...]:
        """The events that end ``cur`` because turn ``by`` takes over (and, for a
        rollback, the one replace that hides it behind a system note)."""
        end_seq = self.next_seq
        data = self._end_data(cur, how)
        data.update(by=by.turn_id, by_owner=by.owner)
        if how != "rolled_back":
            return ((EventType.TURN_END, data),)
        data["note_seq"] = end_seq + 1
        note = {
            "content": by.note,
            "surface_op": ["replace", cur.start_seq, end_seq],
            "rolled_back_turn": cur.req.turn_id,
            "by_turn": by.turn_id,
        }
        return ((EventType.TURN_END, data), (EventType.SYSTEM_MESSAGE, note))

    def _current(self, now: float) -> TurnTable | None:
        """The table, after ending the open turn if its lease ran out."""
        table = self.turns
        if table is not None and self._expire(table, now):
            table = self.turns
        return table

    def _expire(self, table: TurnTable, now: float) -> bool:
        """End the open turn if its lease ran out; ``True`` if it did."""
        cur = table.open
        if cur is None or now < cur.deadline:
            return False
        table.open = None
        logger.warning(
            "session.turn_expired",
            session_id=self.session_id,
            turn_id=cur.req.turn_id,
            owner=cur.req.owner,
            reason="lease",
            lease=cur.req.lease,
        )
        data = self._end_data(cur, "expired")
        data["lease"] = cur.req.lease
        self._record(self._gone_events(cur.start_seq, data, "lease"))
        self._next(table, now)
        return True

    def _gone_events(self, start_seq: int, data: dict[str, Any], reason: str) -> tuple[Event, ...]:
        """The events that end a turn whose holder is gone (``reason``: ``"restart"``,
        its process died; ``"lease"``, its lease ran out), begun at ``start_seq``, with
        ``turn_end`` data ``data``: the session's ``dangling_turns`` says what becomes
        of its half run (``keep``: nothing; ``rollback``: a note replaces it;
        ``close_tool_calls``: a ``tool_result`` answers each call it left open)."""
        seq = self.next_seq
        how = self.dangling_turns
        ending: tuple[Event, ...]
        turn_id = data.get("turn_id")
        if how == "rollback":
            data.update(dangling="rollback", note_seq=seq + 1)
            note = {
                "content": DEFAULT_ROLLBACK_NOTE,
                "surface_op": ["replace", start_seq, seq],
                "rolled_back_turn": turn_id,
                "reason": reason,
            }
            ending = (
                new_event(seq, EventType.TURN_END, data, None),
                new_event(seq + 1, EventType.SYSTEM_MESSAGE, note, None),
            )
        else:
            calls = (
                dangling_calls(self.log, start_seq, self.inflight)
                if how == "close_tool_calls"
                else []
            )
            results = []
            for k, (call_id, name) in enumerate(calls):
                result = {
                    "content": INTERRUPTED_TOOL_RESULT,
                    "tool_call_id": call_id,
                    "name": name,
                    "metadata": {"interrupted": {"turn_id": turn_id, "reason": reason}},
                }
                results.append(new_event(seq + k, EventType.TOOL_RESULT, result, None))
            if calls:
                data.update(dangling="close_tool_calls", closed_calls=[c for c, _ in calls])
            ending = (*results, new_event(seq + len(results), EventType.TURN_END, data, None))
        if "dangling" in data:  # something was done to the half run
            logger.warning(
                "session.dangling_turn",
                session_id=self.session_id,
                turn_id=turn_id,
                owner=data.get("owner"),
                reason=reason,
                dangling=how,
                closed_calls=len(data.get("closed_calls", ())),
            )
        return ending

    def _next(self, table: TurnTable, now: float) -> None:
        """No turn is open: run the waiters in arrival order (held writes run, the
        first queued turn opens and the rest wait for it)."""
        saved = self._fut
        try:
            waiting = table.waiting
            while table.open is None and waiting:
                w = waiting.popleft()
                if w.deadline <= now:
                    self._time_out(w, None, now)
                elif w.req is None:
                    assert w.handler is not None
                    self._run(w.handler, w.args, w.fut)
                else:
                    self._run(TurnKeeper._h_grant, (w.req,), w.fut)
        finally:
            self._fut = saved
        self._drop_if_idle(table)

    def _h_grant(self, req: TurnRequest) -> Any:
        table = self.turns
        assert table is not None
        return self._grant(table, req, scheduling.monotonic(), ())

    def _drop_if_idle(self, table: TurnTable) -> bool:
        if table.open is None and not table.waiting and self.turns is table:
            self._keep_turns(None)  # an idle session keeps no table
            return True
        return False

    def _keep_turns(self, table: TurnTable | None) -> None:
        """Keep ``table`` (``None``: no turn open or waited for), and tell the session's
        ref whether there is one: the registry's passivation reads it (a session in a
        turn is not idle)."""
        self.turns = table
        setattr(self.actor_ref, "in_turn", table is not None)  # noqa: B010

    def _arm(self, table: TurnTable, now: float) -> None:
        """Have the alarm tell this session when the next deadline passes."""
        when = [w.deadline for w in table.waiting]
        if table.open is not None:
            when.append(table.open.deadline)
        if not when:
            return
        first = min(when)
        if table.armed is None or first < table.armed:
            table.armed = first
            ALARMS.at(first, self.actor_ref)

    def _record(self, events: tuple[Event, ...]) -> None:
        """Append bookkeeping of the table's own (no caller is answered by it)."""
        if self.failed is not None:  # the session refuses appends until it restarts
            return
        saved, self._fut = self._fut, None
        try:
            self._submit(events, None)
        finally:
            self._fut = saved

    def _time_out(self, w: _Waiter, cur: _Open | None, now: float) -> None:
        if w.fut is None:
            return
        if w.req is not None:
            why = f"waited {w.req.wait:g} s (policy 'enqueue') and it is still open"
        else:
            why = (
                "this write through the plain handle waited for it to end and it is still "
                "open; write through the turn (with session.turn(...) as turn: "
                "turn.append(...)), or give the turn a shorter lease"
            )
        w.fut._fail(self._busy(cur, now, why))

    def _busy(self, cur: _Open | None, now: float, why: str) -> TurnBusy:
        if cur is None:
            return TurnBusy(
                f"a turn was open; {why}", session_id=self.session_id, holder=None, turn_id=None
            )
        left = max(cur.deadline - now, 0.0)
        return TurnBusy(
            f"turn {cur.req.turn_id!r} of {cur.req.owner!r} is open; {why}",
            session_id=self.session_id,
            holder=cur.req.owner,
            lease_until=_utcnow() + timedelta(seconds=left),
            turn_id=cur.req.turn_id,
        )

    def _not_open(self, turn_id: str) -> TurnInterrupted:
        end = _ended(self.log, turn_id)
        if end is None:
            return TurnInterrupted(
                self.session_id,
                f"turn {turn_id!r} is not open here (the session restarted, or the turn never "
                "opened); nothing was applied; open a new turn to go on",
                turn_id=turn_id,
            )
        how = str(end.data.get("how"))
        by = end.data.get("by")
        who = f" by turn {by!r} of {end.data.get('by_owner')!r}" if by else ""
        why = f", reason {end.data['reason']!r}" if "reason" in end.data else ""
        return TurnInterrupted(
            self.session_id,
            f"turn {turn_id!r} ended ({how}{who}{why}, turn_end at seq {end.seq}); nothing "
            "was applied; its events stay in the log; open a new turn to go on",
            turn_id=turn_id,
            how=how,
        )
