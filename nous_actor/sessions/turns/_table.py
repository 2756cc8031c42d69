"""`TurnTable`: a session's open turn, its lease, and the calls that wait for it.

The table is a collaborator of the session's actor (`TurnSession`): the actor
runs the turn calls and asks the table what they do; the table appends its
bookkeeping through the actor (``_submit``) and hands back the calls whose wait
is over (``_resume``). Deadlines are kept by `ALARMS`, which only tells a
session to look (``h_turn_tick``).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, Final, Protocol

import pykka

from nous_actor._log import get_logger
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log, _utcnow, new_event
from nous_actor.errors import SessionStopped, TurnBusy, TurnInterrupted
from nous_actor.runtime import scheduling, telemetry
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.turns._blocks import HeldFuture
from nous_actor.sessions.turns._granted import _Open, draining, ended, granted, holder_alive
from nous_actor.sessions.turns._rules import (
    DEFAULT_ROLLBACK_NOTE,
    DEFER,
    INTERRUPTED_TOOL_RESULT,
    TurnRequest,
    _bound,
    _ended,
    dangling_calls,
    open_turn,
)

logger = get_logger("nous_actor.sessions.turns")


class TurnSession(Protocol):
    """What a turn table needs of its session's actor."""

    @property
    def session_id(self) -> str: ...
    @property
    def next_seq(self) -> int: ...
    @property
    def log(self) -> Log: ...
    @property
    def inflight(self) -> Sequence[Event]: ...  # appended, not yet committed (nor in ``log``)
    @property
    def dangling_turns(self) -> str: ...  # what becomes of a gone holder's turn
    @property
    def failed(self) -> object: ...  # a store failure: the session refuses appends
    @property
    def turns(self) -> TurnTable | None: ...
    @property
    def actor_ref(self) -> pykka.ActorRef[Any]: ...

    def _submit(
        self, events: tuple[Event, ...], result: Any, fut: SessionFuture[Any] | None
    ) -> Any: ...
    def _check_writable(self) -> None: ...  # raises the store failure that refuses appends
    def _resume(self, waiter: _Waiter) -> None: ...
    def _keep_turns(self, table: TurnTable | None) -> None: ...
    def h_turn_tick(self) -> None: ...


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


_NOT_HERE: Final[Any] = object()  # `TurnTable.end`: no such turn open or waiting

HOLDER_GONE: Final = "holder_gone"
"""The ``reason`` of a turn ended because the process that opened it through another's
calls is gone (its connection to the holding process closed: `TurnTable.gone`)."""


class TurnTable:
    """A session's turns: made by its first turn, dropped when none is open or waiting.

    Invariants: at most one turn is ``open``; it ends (closed, failed, interrupted,
    rolled back, expired) with one ``turn_end`` appended; ``waiting`` holds, in
    arrival order, the turns that queued for it and the plain writes held by it,
    each answered once (run, granted, timed out or failed at the stop); ``armed``
    is the earliest deadline the alarm was asked for (a lease, a waiter's bound).
    """

    __slots__ = ("armed", "open", "session", "waiting")

    def __init__(self, session: TurnSession) -> None:
        self.session = session
        self.open: _Open | None = None
        self.waiting: deque[_Waiter] = deque()
        self.armed: float | None = None  # the earliest alarm asked for

    # -- the turn calls --------------------------------------------------------------------

    def arrive(self, req: TurnRequest, fut: SessionFuture[Any] | None, now: float) -> Any:
        """Turn ``req`` asks to open: grant it, or apply its policy to the open one."""
        cur = self.open
        if cur is None and draining(self.session.session_id):
            # Its registry closes and lets other processes' turns end first: the turn
            # waits, and opens where the session is next (the stop hands it on).
            self.waiting.append(_Waiter(now + req.wait, fut, req))
            self.arm(now)
            return DEFER
        if cur is None:
            return self.grant(req, now, (), fut)
        if cur.req.turn_id == req.turn_id:
            raise ValueError(f"turn {req.turn_id!r} is open already")
        if req.policy == "reject":
            raise self.busy(cur, now, "policy 'reject' does not wait")
        if req.policy == "enqueue":
            self.waiting.append(_Waiter(now + req.wait, fut, req))
            self.arm(now)
            return DEFER
        how = "rolled_back" if req.policy == "rollback" else "interrupted"
        ending = self._end_events(cur, how, req)
        logger.info(
            "session.turn_ended",
            session_id=self.session.session_id,
            turn_id=cur.req.turn_id,
            owner=cur.req.owner,
            how=how,
            reason=req.policy,
        )
        return self.grant(req, now, ending, fut)

    def end(
        self, turn_id: str, how: str, error: str | None, fut: SessionFuture[Any] | None, now: float
    ) -> Any:
        """Close turn ``turn_id`` (its ``turn_end`` event, once committed), or stop its
        waiting (``None``); `_NOT_HERE` if it is neither open nor waiting."""
        s = self.session
        cur = self.open
        if cur is not None and cur.req.turn_id == turn_id:
            data = self._end_data(cur, how)
            if error is not None:
                data["error"] = error
            self.open = None
            if s.failed is not None:  # nothing can be stored: no turn_end to resolve to
                self.next(now)
                s._check_writable()
            ev = new_event(s.next_seq, EventType.TURN_END, data, None)
            result = s._submit((ev,), ev, fut)
            self.next(now)
            return result
        if self._stop_waiting(turn_id, now, "its opener gave up waiting"):
            return None
        return _NOT_HERE

    def _stop_waiting(self, turn_id: str, now: float, why: str) -> bool:
        """Take turn ``turn_id`` out of the queue (its opener hears `TurnBusy`: ``why``);
        whether it was waiting."""
        for w in self.waiting:
            if w.req is not None and w.req.turn_id == turn_id:
                self.waiting.remove(w)
                if w.fut is not None:
                    w.fut._fail(self.busy(self.open, now, why))
                self.drop_if_idle()
                return True
        return False

    def renew(self, turn_id: str, now: float) -> bool:
        """A call through turn ``turn_id``: renew its lease; ``False`` if it is not open."""
        cur = self.open
        if cur is None or cur.req.turn_id != turn_id:
            return False
        cur.deadline = now + cur.req.lease
        return True

    def summarising(self, turn_id: str, now: float, delta: int) -> None:
        """A summary of a compaction made through turn ``turn_id`` is being written
        (``delta`` 1) or came back (-1, renewing the lease): while one is, the lease
        does not run out (`expire`). Nothing if that turn is not open."""
        cur = self.open
        if cur is None or cur.req.turn_id != turn_id:
            return
        cur.summaries = max(cur.summaries + delta, 0)
        cur.deadline = now + cur.req.lease

    def tick(self, now: float) -> None:
        """The alarm: end an expired turn, fail the waiters past their bound."""
        if self.armed is not None and self.armed <= now:
            self.armed = None
        self.expire(now)
        if self.session.turns is not self:
            return
        if self.waiting:  # (with none open: held back while the session is drained)
            keep: deque[_Waiter] = deque()
            for w in self.waiting:
                if w.deadline <= now:
                    self._time_out(w, self.open, now)
                else:
                    keep.append(w)
            self.waiting = keep
        if not self.drop_if_idle():
            self.arm(now)

    def hold(
        self,
        handler: Callable[..., Any],
        args: tuple[Any, ...],
        fut: SessionFuture[Any] | None,
        now: float,
    ) -> bool:
        """Whether a write through the plain handle must wait for the open turn: then it
        waits here (at most its caller's bound less a quarter of it, or less 1 s if
        shorter; then `TurnBusy`) and runs when the turn ends, in arrival order. A
        write from the thread (or asyncio task) inside the open turn's block would
        wait for its own turn: it fails at once with `TurnBusy`."""
        cur = self.open
        if cur is None:
            return False
        if isinstance(fut, HeldFuture) and cur.req.turn_id in fut.turn_ids:
            where = "asyncio task" if fut.from_task else "thread"
            fut._fail(
                self.busy(
                    cur,
                    now,
                    f"this write through the plain handle comes from the {where} inside "
                    "that turn's block, and would wait for its own turn to end; nothing "
                    "was applied; write through the turn (turn.append(...))",
                )
            )
            return True
        self.waiting.append(_Waiter(now + _bound(fut), fut, None, handler, args))
        self.arm(now)
        return True

    def take_waiting(self, open_handler: Callable[..., Any]) -> list[tuple[Any, ...]]:
        """The calls waiting for a turn, in the order they came, as calls to send again
        (a queued turn as ``open_handler(req)``, a held write as itself), taken out of
        the table: the session stops under a registry's route, which delivers them where
        the session is next (a restart), as the calls of its inbox."""
        out: list[tuple[Any, ...]] = []
        for w in self.waiting:
            if w.fut is None:
                continue
            if w.req is not None:
                out.append((open_handler, (w.req,), w.fut))
            elif w.handler is not None:
                out.append((w.handler, w.args, w.fut))
        self.waiting.clear()
        return out

    def hand_back(self, which: Callable[[SessionFuture[Any]], bool], err: SessionStopped) -> int:
        """The calls waiting for a turn whose future ``which`` picks are answered with
        ``err`` (not applied) and taken out of the table (the others keep their
        places); how many."""
        picked = [w for w in self.waiting if w.fut is not None and which(w.fut)]
        for w in picked:
            self.waiting.remove(w)
            assert w.fut is not None
            w.fut._fail(err)
        if picked:
            self.drop_if_idle()
        return len(picked)

    def stop(self, err: SessionStopped) -> None:
        """The session stops: every call waiting for a turn is answered with ``err``."""
        for w in self.waiting:
            if w.fut is not None:
                w.fut._fail(err)
        self.waiting.clear()

    # -- the table's keeping ---------------------------------------------------------------

    def grant(
        self,
        req: TurnRequest,
        now: float,
        before: tuple[tuple[EventType, dict[str, Any]], ...],
        fut: SessionFuture[Any] | None,
    ) -> Any:
        """Open turn ``req`` (after the events ``before``, ending the one it takes over)."""
        s = self.session
        seq = s.next_seq
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
        self.open = _Open(req, events[-1].seq, now + req.lease)
        granted(self.open)
        result = s._submit(events, events[-1], fut)
        self.arm(now)
        return result

    def _end_data(self, cur: _Open, how: str) -> dict[str, Any]:
        """The ``turn_end`` data of the open turn ``cur``, ending now as ``how``."""
        return end_data(self.session.session_id, cur, how)

    def _end_events(
        self, cur: _Open, how: str, by: TurnRequest
    ) -> tuple[tuple[EventType, dict[str, Any]], ...]:
        """The events that end ``cur`` because turn ``by`` takes over (and, for a
        rollback, the one replace that hides it behind a system note)."""
        end_seq = self.session.next_seq
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

    def gone(self, turn_id: str, now: float) -> None:
        """The process that opened turn ``turn_id`` through another process's call (it
        forwarded its calls here) is gone: its connection closed. An open turn ends as
        a gone holder's does (``reason: "holder_gone"``, then ``dangling_turns``); a
        waiting one stops waiting. (Nothing if it is neither: it ended already.)"""
        cur = self.open
        if cur is None or cur.req.turn_id != turn_id:
            self._stop_waiting(turn_id, now, "its opener's process is gone")
            return
        s = self.session
        self.open = None
        logger.info(
            "session.turn_ended",
            session_id=s.session_id,
            turn_id=turn_id,
            owner=cur.req.owner,
            how="interrupted",
            reason=HOLDER_GONE,
        )
        data = self._end_data(cur, "interrupted")
        data["reason"] = HOLDER_GONE
        record(s, gone_events(s, cur.start_seq, data, HOLDER_GONE))
        self.next(now)

    def expire(self, now: float) -> bool:
        """End the open turn if its lease ran out; ``True`` if it did. A lease does not
        run out while a compaction made through the turn has its summary written (the
        holder waits for it): it is renewed instead."""
        cur = self.open
        if cur is None or now < cur.deadline:
            return False
        if cur.summaries:
            cur.deadline = now + cur.req.lease
            self.arm(now)
            return False
        s = self.session
        self.open = None
        logger.warning(
            "session.turn_expired",
            session_id=s.session_id,
            turn_id=cur.req.turn_id,
            owner=cur.req.owner,
            reason="lease",
            lease=cur.req.lease,
        )
        data = self._end_data(cur, "expired")
        data["lease"] = cur.req.lease
        record(s, gone_events(s, cur.start_seq, data, "lease"))
        self.next(now)
        return True

    def next(self, now: float) -> None:
        """No turn is open: run the waiters in arrival order (held writes run, the
        first queued turn opens and the rest wait for it)."""
        waiting = self.waiting
        held_back = draining(self.session.session_id)  # (see `arrive`)
        while self.open is None and waiting:
            if held_back and waiting[0].req is not None:
                break  # it, and what came after it, wait for the session to move
            w = waiting.popleft()
            if w.deadline <= now:
                self._time_out(w, None, now)
            else:
                self.session._resume(w)
        self.drop_if_idle()

    def drop_if_idle(self) -> bool:
        """Have the session drop this table if no turn is open or waiting (an idle
        session keeps no table); ``True`` if it did."""
        s = self.session
        if self.open is None and not self.waiting and s.turns is self:
            s._keep_turns(None)
            return True
        return False

    def arm(self, now: float) -> None:
        """Have the alarm tell the session when the next deadline passes."""
        when = [w.deadline for w in self.waiting]
        if self.open is not None:
            when.append(self.open.deadline)
        if not when:
            return
        first = min(when)
        if self.armed is None or first < self.armed:
            self.armed = first
            ALARMS.at(first, self.session.actor_ref, type(self.session).h_turn_tick)

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
        w.fut._fail(self.busy(cur, now, why))

    def busy(self, cur: _Open | None, now: float, why: str) -> TurnBusy:
        """`TurnBusy` for a call refused or timed out because ``cur`` is open."""
        sid = self.session.session_id
        if cur is None:
            return TurnBusy(f"a turn was open; {why}", session_id=sid, holder=None, turn_id=None)
        left = max(cur.deadline - now, 0.0)
        return TurnBusy(
            f"turn {cur.req.turn_id!r} of {cur.req.owner!r} is open; {why}",
            session_id=sid,
            holder=cur.req.owner,
            lease_until=_utcnow() + timedelta(seconds=left),
            turn_id=cur.req.turn_id,
        )


def end_data(session_id: str, cur: _Open, how: str) -> dict[str, Any]:
    """The ``turn_end`` data of open turn ``cur``, ending now as ``how`` (it is no longer
    granted here; its span ends)."""
    ended(cur.req.turn_id)
    sink = telemetry.sink
    if sink is not None:
        sink.turn_ended(
            session_id, cur.req.owner, how, cur.started, time.time_ns(), cur.req.context
        )
    return {
        "turn_id": cur.req.turn_id,
        "owner": cur.req.owner,
        "policy": cur.req.policy,
        "how": how,
    }


def record(s: TurnSession, events: tuple[Event, ...]) -> None:
    """Append bookkeeping of the turns' own (no caller is answered by it)."""
    if s.failed is None:  # else the session refuses appends until it restarts
        s._submit(events, None, None)


def gone_events(
    s: TurnSession, start_seq: int, data: dict[str, Any], reason: str
) -> tuple[Event, ...]:
    """The events that end a turn whose holder is gone (``reason``: ``"restart"``, its
    process died; ``"lease"``, its lease ran out; ``"holder_gone"``, the process that
    opened it through forwarded calls closed its connection), begun at ``start_seq``, with
    ``turn_end`` data ``data``: the session's ``dangling_turns`` says what becomes of
    its half run (``keep``: nothing; ``rollback``: a note replaces it;
    ``close_tool_calls``: a ``tool_result`` answers each call it left open)."""
    seq = s.next_seq
    how = s.dangling_turns
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
        calls = dangling_calls(s.log, start_seq, s.inflight) if how == "close_tool_calls" else []
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
            session_id=s.session_id,
            turn_id=turn_id,
            owner=data.get("owner"),
            reason=reason,
            dangling=how,
            closed_calls=len(data.get("closed_calls", ())),
        )
    return ending


def end_orphan_turn(s: TurnSession) -> None:
    """At start: a managed turn the log leaves open (the session stopped, crashed or
    moved with it open) ends as interrupted, with ``reason: "restart"``.

    If its holder may still run (this process granted the turn and its lease has
    not run out: the actor crashed or stopped, the process did not), that is all:
    the holder hears `TurnInterrupted` and may open a new turn and go on.
    Otherwise its holder is gone (its process died, or its lease ran out) and the
    session's ``dangling_turns`` says what becomes of its half run."""
    start = open_turn(s.log)
    if start is None:
        return
    data = {k: start.data[k] for k in ("turn_id", "owner", "policy") if k in start.data}
    data.update(how="interrupted", reason="restart")
    logger.info(
        "session.turn_ended",
        session_id=s.session_id,
        turn_id=data.get("turn_id"),
        owner=data.get("owner"),
        how="interrupted",
        reason="restart",
    )
    turn_id = data.get("turn_id")
    alive = isinstance(turn_id, str) and holder_alive(turn_id, scheduling.monotonic())
    if isinstance(turn_id, str):
        ended(turn_id)
    if alive:
        record(s, (new_event(s.next_seq, EventType.TURN_END, data, None),))
    else:
        record(s, gone_events(s, start.seq, data, "restart"))


def not_open(
    session_id: str, log: Log, turn_id: str, pending: Sequence[Event] = ()
) -> TurnInterrupted:
    """`TurnInterrupted` for a call through turn ``turn_id``, which is not open; its
    ``turn_end`` is looked for in ``pending`` (events on their way to the store, not in
    the log yet: the end another turn or a restart just made) first, then in ``log``.
    The message names the ``turn_end``'s seq only once it is stored: a pending one may
    never be (its commit can fail, and the seq is then given to another event)."""
    end = _ended(pending, turn_id)
    stored = end is None
    if end is None:
        end = _ended(log.events(), turn_id)
    if end is None:
        return TurnInterrupted(
            session_id,
            f"turn {turn_id!r} is not open here (the session restarted, or the turn never "
            "opened); nothing was applied; open a new turn to go on",
            turn_id=turn_id,
        )
    how = str(end.data.get("how"))
    by = end.data.get("by")
    who = f" by turn {by!r} of {end.data.get('by_owner')!r}" if by else ""
    why = f", reason {end.data['reason']!r}" if "reason" in end.data else ""
    where = f"turn_end at seq {end.seq}" if stored else "its turn_end not stored yet"
    return TurnInterrupted(
        session_id,
        f"turn {turn_id!r} ended ({how}{who}{why}, {where}); nothing "
        "was applied; its events stay in the log; open a new turn to go on",
        turn_id=turn_id,
        how=how,
    )


class _Alarms:
    """Tells sessions a deadline passed: the host's alarms (one daemon thread for the
    whole process, on real threads).

    A session asks to be told at a monotonic time; it is then sent an
    ``h_turn_tick`` call, and the session looks at its table. Sessions are held
    weakly: a stopped session is simply not told.
    """

    def at(self, when: float, ref: pykka.ActorRef[Any], tick: Callable[..., Any]) -> None:
        scheduling.current().call_at(when, partial(_tell, weakref.ref(ref), tick), "nous-turns")


def _tell(weak: weakref.ref[Any], tick: Callable[..., Any]) -> None:
    """Have the session look at its turn table (if it still runs)."""
    ref = weak()
    if ref is None:
        return
    try:
        ref.tell((tick, (), None))
    except pykka.ActorDeadError:  # stopped meanwhile: nothing to tell
        pass


ALARMS: Final = _Alarms()
