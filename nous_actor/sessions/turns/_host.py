"""`TurnHost`: the turn calls a session's actor runs, and its hooks into the actor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nous_actor._log import get_logger
from nous_actor.core.event import EventType
from nous_actor.core.log import new_event
from nous_actor.errors import SessionStopped
from nous_actor.runtime import scheduling
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.turns._rules import (
    _READS,
    DEFER,
    HELD,
    THROUGH,
    HeldFuture,
    TurnRequest,
    TurnTable,
    _bound,
    _Waiter,
    ended,
    holder_alive,
    open_turn,
)
from nous_actor.sessions.turns._table import TurnKeeper

logger = get_logger("nous_actor.sessions.turns")


class TurnHost(TurnKeeper):
    """The turn table of a session's actor: a base class of `SessionActor`.

    Handlers (run by the actor, one at a time, like its others):

    * `h_turn_open`: open a turn, or apply the arriving turn's policy to the
      open one (``reject``: `TurnBusy`; ``enqueue``: wait, first come first
      served, until its ``wait``; ``interrupt``/``rollback``: end the open turn
      and take over).
    * `h_turn_call` / `h_turn_read`: a call through a turn; fails with
      `TurnInterrupted` unless that turn is open; renews its lease.
    * `h_turn_end`: the holder closes its turn (or gives up waiting for it).
    * `h_turn_tick` (`TurnKeeper`'s): the alarm: end an expired turn, fail waiters
      past their bound.

    And the hooks the actor calls: `_turn_holds` (before any call runs: a write
    through the plain handle waits while a turn is open), `_end_orphan_turn`
    (at start: a turn left open ends as interrupted, reason ``restart``),
    `_turns_shut` (on stop: the waiters are answered).

    (No ``__slots__`` here: its attributes are `SessionActor`'s slots.)
    """

    # -- handlers ------------------------------------------------------------------------

    def h_turn_open(self, req: TurnRequest) -> Any:
        """Open turn ``req`` (resolves to its ``turn_start`` event once committed)."""
        self._check_writable()
        now = scheduling.monotonic()
        table = self._current(now)
        if table is None:
            table = TurnTable()
            self._keep_turns(table)
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

    # -- hooks of the actor --------------------------------------------------------------

    def _turn_holds(
        self, handler: Callable[..., Any], args: tuple[Any, ...], fut: SessionFuture[Any] | None
    ) -> bool:
        """Whether this call, a write through the plain handle, must wait for the open
        turn: then it waits in the table (at most its caller's bound less a quarter
        of it, or less 1 s if shorter; then `TurnBusy`) and runs when the turn ends,
        in arrival order. A write from the thread (or asyncio task) inside the open
        turn's block would wait for its own turn: it fails at once with `TurnBusy`."""
        table = self.turns
        if table is None or table.open is None or getattr(handler, "__name__", "") not in HELD:
            return False
        now = scheduling.monotonic()
        table = self._current(now)
        if table is None or table.open is None:
            return False
        if isinstance(fut, HeldFuture) and table.open.req.turn_id in fut.turn_ids:
            where = "asyncio task" if fut.from_task else "thread"
            fut._fail(
                self._busy(
                    table.open,
                    now,
                    f"this write through the plain handle comes from the {where} inside "
                    "that turn's block, and would wait for its own turn to end; nothing "
                    "was applied; write through the turn (turn.append(...))",
                )
            )
            return True
        table.waiting.append(_Waiter(now + _bound(fut), fut, None, handler, args))
        self._arm(table, now)
        return True

    def _end_orphan_turn(self) -> None:
        """At start: a managed turn the log leaves open (the session stopped, crashed or
        moved with it open) ends as interrupted, with ``reason: "restart"``.

        If its holder may still run (this process granted the turn and its lease
        has not run out: the actor crashed or stopped, the process did not), that is
        all: the holder hears `TurnInterrupted` and may open a new turn and go on.
        Otherwise its holder is gone (its process died, or its lease ran out) and
        the session's ``dangling_turns`` says what becomes of its half run."""
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
        turn_id = data.get("turn_id")
        alive = isinstance(turn_id, str) and holder_alive(turn_id, scheduling.monotonic())
        if isinstance(turn_id, str):
            ended(turn_id)
        if alive:
            self._record((new_event(self.next_seq, EventType.TURN_END, data, None),))
        else:
            self._record(self._gone_events(start.seq, data, "restart"))

    def _turns_shut(self, err: SessionStopped) -> None:
        """The session stops: every call waiting for a turn is answered with ``err``."""
        table = self.turns
        if table is None:
            return
        self._keep_turns(None)
        for w in table.waiting:
            if w.fut is not None:
                w.fut._fail(err)
        table.waiting.clear()
