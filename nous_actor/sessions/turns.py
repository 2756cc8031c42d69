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
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

import pykka

from nous_actor._log import get_logger
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log, _utcnow, new_event
from nous_actor.errors import SessionStopped, TurnBusy, TurnInterrupted
from nous_actor.runtime import scheduling, telemetry
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_ROLLBACK_NOTE",
    "DEFER",
    "POLICIES",
    "Policy",
    "TurnHost",
    "TurnRequest",
    "open_turn",
]

logger = get_logger(__name__)

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


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRequest:
    """One ``turn_open`` call, checked in the caller's thread."""

    turn_id: str
    owner: str
    policy: str
    lease: float
    wait: float  # seconds an ``enqueue`` turn waits for the open one
    note: str  # the system note a ``rollback`` leaves


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


class _Alarms:
    """One daemon thread for the whole process that tells sessions a deadline passed.

    A session asks to be told at a monotonic time; the thread then sends it an
    ``h_turn_tick`` call, and the session looks at its table. Sessions are held
    weakly: a stopped session is simply not told.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, weakref.ref[Any]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def at(self, when: float, ref: pykka.ActorRef[Any]) -> None:
        if scheduling.host is not None:  # a simulation: its virtual timer
            weak = weakref.ref(ref)
            delay = max(when - scheduling.monotonic(), 0.0)
            scheduling.call_later(delay, lambda: _tell(weak), "nous-turns")
            return
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._order), weakref.ref(ref)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nous-turns", daemon=True)
                self._thread.start()
            elif self._heap[0][0] == when:
                self._cond.notify()

    def _loop(self) -> None:
        while True:
            due: list[weakref.ref[Any]] = []
            with self._cond:
                while not due:
                    now = time.monotonic()
                    heap = self._heap
                    while heap and heap[0][0] <= now:
                        due.append(heapq.heappop(heap)[2])
                    if not due:  # idle: wake at the next deadline (or now and then)
                        self._cond.wait(min(heap[0][0] - now, 60.0) if heap else 60.0)
            for weak in due:
                _tell(weak)


def _tell(weak: weakref.ref[Any]) -> None:
    """Have the session look at its turn table (if it still runs)."""
    ref = weak()
    if ref is None:
        return
    try:
        ref.tell((TurnHost.h_turn_tick, (), None))
    except pykka.ActorDeadError:  # stopped meanwhile: nothing to tell
        pass


ALARMS: Final = _Alarms()


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


class TurnHost:
    """The turn table of a session's actor: a base class of `SessionActor`.

    Handlers (run by the actor, one at a time, like its others):

    * `h_turn_open`: open a turn, or apply the arriving turn's policy to the
      open one (``reject``: `TurnBusy`; ``enqueue``: wait, first come first
      served, until its ``wait``; ``interrupt``/``rollback``: end the open turn
      and take over).
    * `h_turn_call` / `h_turn_read`: a call through a turn; fails with
      `TurnInterrupted` unless that turn is open; renews its lease.
    * `h_turn_end`: the holder closes its turn (or gives up waiting for it).
    * `h_turn_tick`: the alarm: end an expired turn, fail waiters past their bound.

    And the hooks the actor calls: `_turn_holds` (before any call runs: a write
    through the plain handle waits while a turn is open), `_end_orphan_turn`
    (at start: a turn left open ends as interrupted, reason ``restart``),
    `_turns_shut` (on stop: the waiters are answered).

    (No ``__slots__`` here: its attributes are `SessionActor`'s slots.)
    """

    if TYPE_CHECKING:
        session_id: str
        next_seq: int
        log: Log
        turns: TurnTable | None
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

    # -- handlers ------------------------------------------------------------------------

    def h_turn_open(self, req: TurnRequest) -> Any:
        """Open turn ``req`` (resolves to its ``turn_start`` event once committed)."""
        self._check_writable()
        now = scheduling.monotonic()
        table = self._current(now)
        if table is None:
            table = self.turns = TurnTable()
        cur = table.open
        if cur is None:
            return self._grant(table, req, now, ())
        if cur.req.turn_id == req.turn_id:
            raise ValueError(f"turn {req.turn_id!r} is open already")
        if req.policy == "reject":
            raise self._busy(cur, now, "policy 'reject' does not wait")
        if req.policy == "enqueue":
            table.waiting.append(_Waiter(now + req.wait, self._fut, req))
            self._arm(table, now)
            return DEFER
        how = "rolled_back" if req.policy == "rollback" else "interrupted"
        ending = self._end_events(cur, how, req)
        logger.info(
            "session.turn_ended",
            session_id=self.session_id,
            turn_id=cur.req.turn_id,
            owner=cur.req.owner,
            how=how,
            reason=req.policy,
        )
        return self._grant(table, req, now, ending)

    def h_turn_call(self, turn_id: str, name: str, args: tuple[Any, ...]) -> Any:
        """A call made through turn ``turn_id``: run it if that turn is open (renewing
        its lease), else fail with `TurnInterrupted`."""
        now = scheduling.monotonic()
        table = self._current(now)
        cur = None if table is None else table.open
        if cur is None or cur.req.turn_id != turn_id:
            raise self._not_open(turn_id)
        if name not in THROUGH or (name == "h_read" and (not args or args[0] not in _READS)):
            raise ValueError(f"a turn runs no call {name!r}")
        cur.deadline = now + cur.req.lease
        handler: Callable[..., Any] = getattr(type(self), name)
        return handler(self, *args)

    def h_turn_read(self, turn_id: str, name: str, args: tuple[Any, ...]) -> Any:
        """`h_turn_call` for a call that sees every append made before it (a read, a
        compaction, a fork, a snapshot): it waits for their commits first."""
        return self.h_turn_call(turn_id, name, args)

    def h_turn_end(self, turn_id: str, how: str, error: str | None) -> Any:
        """Close turn ``turn_id`` (resolves to its ``turn_end`` event), or stop waiting
        for it (resolves to ``None``)."""
        now = scheduling.monotonic()
        table = self._current(now)
        if table is not None:
            cur = table.open
            if cur is not None and cur.req.turn_id == turn_id:
                data = self._end_data(cur, how)
                if error is not None:
                    data["error"] = error
                table.open = None
                ev = new_event(self.next_seq, EventType.TURN_END, data, None)
                result = self._submit((ev,), ev) if self.failed is None else ev
                self._next(table, now)
                return result
            for w in table.waiting:
                if w.req is not None and w.req.turn_id == turn_id:
                    table.waiting.remove(w)
                    if w.fut is not None:
                        w.fut._fail(self._busy(cur, now, "its opener gave up waiting"))
                    self._drop_if_idle(table)
                    return None
        raise self._not_open(turn_id)

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

    # -- hooks of the actor --------------------------------------------------------------

    def _turn_holds(
        self, handler: Callable[..., Any], args: tuple[Any, ...], fut: SessionFuture[Any] | None
    ) -> bool:
        """Whether this call, a write through the plain handle, must wait for the open
        turn: then it waits in the table (at most its caller's bound less a quarter
        of it, or less 1 s if shorter; then `TurnBusy`) and runs when the turn ends,
        in arrival order."""
        table = self.turns
        if table is None or table.open is None or getattr(handler, "__name__", "") not in HELD:
            return False
        now = scheduling.monotonic()
        table = self._current(now)
        if table is None or table.open is None:
            return False
        table.waiting.append(_Waiter(now + _bound(fut), fut, None, handler, args))
        self._arm(table, now)
        return True

    def _end_orphan_turn(self) -> None:
        """At start: a managed turn the log leaves open (the session stopped, crashed or
        moved with it open) ends as interrupted, with ``reason: "restart"``."""
        start = open_turn(self.log)
        if start is None:
            return
        data = {k: start.data[k] for k in ("turn_id", "owner", "policy") if k in start.data}
        data.update(how="interrupted", reason="restart")
        logger.info(
            "session.turn_ended",
            session_id=self.session_id,
            turn_id=data.get("turn_id"),
            owner=data.get("owner"),
            how="interrupted",
            reason="restart",
        )
        self._record((new_event(self.next_seq, EventType.TURN_END, data, None),))

    def _turns_shut(self, err: SessionStopped) -> None:
        """The session stops: every call waiting for a turn is answered with ``err``."""
        table, self.turns = self.turns, None
        if table is None:
            return
        for w in table.waiting:
            if w.fut is not None:
                w.fut._fail(err)
        table.waiting.clear()

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
        result = self._submit(events, events[-1])
        self._arm(table, now)
        return result

    def _end_data(self, cur: _Open, how: str) -> dict[str, Any]:
        """The ``turn_end`` data of the open turn ``cur``, ending now as ``how``."""
        sink = telemetry.sink
        if sink is not None:
            sink.turn_ended(self.session_id, cur.req.owner, how, cur.started, time.time_ns())
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
        self._record((new_event(self.next_seq, EventType.TURN_END, data, None),))
        self._next(table, now)
        return True

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
                    self._run(TurnHost._h_grant, (w.req,), w.fut)
        finally:
            self._fut = saved
        self._drop_if_idle(table)

    def _h_grant(self, req: TurnRequest) -> Any:
        table = self.turns
        assert table is not None
        return self._grant(table, req, scheduling.monotonic(), ())

    def _drop_if_idle(self, table: TurnTable) -> bool:
        if table.open is None and not table.waiting and self.turns is table:
            self.turns = None  # an idle session keeps no table
            return True
        return False

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
