"""`SessionActor`: one session's log, the loop that runs its calls, and the calls.

One class, holding collaborators that each own their state and its
invariants: the `CommitLedger` (what it shares with its store's committer
thread), the `TurnTable` (while a turn is open or waited for), the
`Compactions` (once it compacted) and the `Feeds` (while it has a
subscriber). Each handler declares what it is (`_calls.call`) where it is
defined; the loop reads the declarations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import pykka

from nous_actor._log import get_logger
from nous_actor.core.compaction import (
    CompactionError,
    CompactionResult,
    Compactor,
    Plan,
    log_compacted,
    run_summariser,
)
from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.core.limits import MAX_SEQ
from nous_actor.core.log import Log, _behind_head, _utcnow, new_event
from nous_actor.errors import ConflictError, FencedError, SessionStopped, StoreError
from nous_actor.runtime import forks, scheduling, telemetry
from nous_actor.runtime.dispatcher import CallEnvelope, Dispatcher, receive_one
from nous_actor.runtime.flag import Flag
from nous_actor.sessions.actor._calls import (
    ANSWERS,
    AT_ONCE,
    HELD_BY_TURN,
    REMOTE,
    SEES_COMMITS,
    THROUGH_TURN,
    TRAITS,
    TURN_READS,
    WHEN_STOPPED,
    EventParts,
    Handler,
    _crashed,
    _safe_str,
    call,
    handlers_with,
)
from nous_actor.sessions.actor._compactions import MAX_COMPACTION_RETRIES, Compactions
from nous_actor.sessions.actor._feeds import Feeds
from nous_actor.sessions.actor._ledger import CommitLedger
from nous_actor.sessions.actor._summary import _Compaction, _is_async, _run_awaitable
from nous_actor.sessions.future import ForwardedFuture, SessionFuture
from nous_actor.sessions.recovery import EAGER_FOLD, recover, release
from nous_actor.sessions.turns import DEFAULT_DANGLING_TURNS, DEFER, TurnRequest, TurnTable
from nous_actor.sessions.turns._rules import last_turn_event
from nous_actor.sessions.turns._table import _NOT_HERE, _Waiter, end_orphan_turn, not_open
from nous_actor.store import shared
from nous_actor.store.base import Store
from nous_actor.store.committer import Committer, Write, committer_for
from nous_actor.store.subscription import MOVED, Subscription
from nous_actor.supervision import Cell, DispatchedSupervisedActor, cell_of

logger = get_logger("nous_actor.sessions.actor")

_DEFER: Any = DEFER  # a handler's result meaning "the future is answered later"
_NONE: Any = deque(maxlen=0)  # "no queue": shared by every session until one needs its own
_RECOVERING: Log = Log()._view()  # every stored session's log until its recovery's arrives

Parked = tuple[Handler, tuple[Any, ...], "SessionFuture[Any] | None"]

LOG_READS = frozenset(
    {"derive_messages", "derive_indexed", "surface", "events", "since", "count", "as_of"}
)
"""The reads of the log (``h_read``'s first argument) a turn may make."""


class SessionCell(Cell):
    """Ours, beside a session actor's Pykka ref: its `Cell` (``started``, ``finished``,
    where its exit goes) and what the registry and the handle read of the session
    without asking it: ``released`` (its `CommitLedger`'s: set once its writer claim is
    let go, which a successor waits for) and ``in_turn`` (a turn is open or waited
    for: the passivation leaves it alone), and ``reroute``: the registry's route of the
    session, which takes back the calls a stopped session did not apply (``None``:
    they fail with `SessionStopped`), and ``release_to``: the `Releases` its claim goes
    to when it stops (``None``: it gives the claim up itself), and ``follow``: set
    by whoever stops a session that lives on (a passivation, a hand-off), whose
    subscriptions then end with `MOVED` (a registry handle's follows the session
    through the store). Reach it with `session_cell`."""

    __slots__ = ("follow", "in_turn", "release_to", "released", "reroute")

    def __init__(self, urn: str) -> None:
        super().__init__(urn)
        self.released = Flag()
        self.in_turn = False
        self.reroute: Any = None
        self.release_to: Releases | None = None
        self.follow = False


class Releases:
    """The claims of sessions that stop together (their registry closes), given up in
    one store transaction (`shared.release_many`) once they all stopped, instead of a
    transaction each: 10,000 SQLite sessions closed in 2.3 s, 2.1 s of it releases.

    A session that stops after `flush` (it missed its registry's bound) gives its
    claim up itself."""

    __slots__ = ("_claims", "_flushed", "_lock", "_store")

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._claims: list[tuple[str, str]] = []
        self._flushed = False

    def add(self, session_id: str, token: str) -> bool:
        """Take ``session_id``'s claim to give up at `flush`; ``False`` once flushed."""
        with self._lock:
            if self._flushed:
                return False
            self._claims.append((session_id, token))
            return True

    def flush(self) -> None:
        """Give up every claim taken, in one transaction (a failure is logged: those
        claims then lapse as a dead holder's do)."""
        with self._lock:
            self._flushed = True
            claims, self._claims = self._claims, []
        if not claims:
            return
        try:
            shared.release_many(self._store, claims)
        except Exception as exc:
            logger.warning(
                "session.release_failed",
                sessions=len(claims),
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )


def session_cell(ref: pykka.ActorRef[Any]) -> SessionCell:
    """The `SessionCell` of a session actor's ref.

    Raises:
        TypeError: ``ref`` is not the ref of a `SessionActor`.
    """
    cell = cell_of(ref)
    if not isinstance(cell, SessionCell):
        raise TypeError(
            f"{ref!r} is not the ref of a SessionActor: ask a Session handle (or the "
            "Sessions registry) for a session instead"
        )
    return cell


class _Committed(Write):
    """A batch of appends on its way to the store, and what the committer calls once it
    is stored or failed: the actor's `SessionActor._on_commit` with the batch. One object
    per batch in flight (the committer's item is its own notice)."""

    __slots__ = ("actor", "fut", "result")

    def __init__(
        self,
        actor: SessionActor,
        events: tuple[Event, ...],
        fut: SessionFuture[Any] | None,
        result: Any,
        call: str | None,
    ) -> None:
        super().__init__(actor.session_id, events, call)
        self.actor = actor
        self.fut = fut
        self.result = result

    def done(self, err: StoreError | None) -> None:
        self.actor._on_commit(self.events, ((self.fut, self.result),), err)  # type: ignore[arg-type]


class _CommittedRun(Write):
    """Appends of a run (`SessionActor._receive_run`) on their way to the store as one
    item: each call's event, and its future, answered with it once stored. No more events
    than the committer's ``share``, so that the item never goes alone; no forwarded call
    (each of those is recorded under its own id, in an item of its own)."""

    __slots__ = ("actor", "futs")

    def __init__(
        self,
        actor: SessionActor,
        events: tuple[Event, ...],
        futs: list[SessionFuture[Any] | None],
    ) -> None:
        super().__init__(actor.session_id, events)
        self.actor = actor
        self.futs = futs

    def done(self, err: StoreError | None) -> None:
        answers = zip(self.futs, self.events, strict=True)
        self.actor._on_commit(self.events, answers, err)  # type: ignore[arg-type]


class SessionActor(DispatchedSupervisedActor):
    """The actor that owns one session's log. Use it through `Session`.

    Every message is ``(handler, args, future)``: the actor runs
    ``handler(self, *args)`` and answers ``future`` itself, so nothing it
    raises ever reaches Pykka's failure handling.

    With a store, an append is validated and given its seq at once, handed to
    the store's committer, and acknowledged (its future resolved) only once it
    is committed. Reads and snapshots wait until every append made before
    them is committed, so a caller always reads its own acknowledged writes
    and never an event the store does not hold.

    It runs on a shared `Dispatcher` (``dispatcher``, default: the process's)
    or, with ``pinned=True``, on a thread of its own. Nothing it runs blocks:
    the store is read by the `recovery.READERS` pool at start (calls made meanwhile wait
    for the recovered log) and written by the store's committer.

    Its collaborators: ``ledger`` (`CommitLedger`: what it shares with the
    committer's thread), ``turns`` (`TurnTable`, while a turn is open or waited
    for), ``compactions`` (`Compactions`, once it compacted) and ``feeds``
    (`Feeds`, while it has a subscriber).
    """

    cell_type = SessionCell
    cell: SessionCell

    # Slots: an idle session stays small (an instance dict is not shared).
    __slots__ = (
        "_loading",
        "_ready",
        "_trace_links",
        "born",
        "claim_token",
        "committer",
        "compactions",
        "crash",
        "crash_on_store_failure",
        "dangling_turns",
        "failed",
        "feeds",
        "inflight",
        "ledger",
        "log",
        "next_seq",
        "parked",
        "session_id",
        "store",
        "turns",
    )

    def __init__(
        self,
        session_id: str,
        log: Log | None = None,
        store: Store | None = None,
        ready: SessionFuture[Any] | None = None,
        *,
        crash_on_store_failure: bool = False,
        dispatcher: Dispatcher | None = None,
        pinned: bool = False,
        trace_links: Iterable[object] | None = None,
        dangling_turns: str = DEFAULT_DANGLING_TURNS,
    ) -> None:
        super().__init__()
        telemetry.probe()
        if dispatcher is not None:
            self._use_dispatcher = dispatcher
        self._pin = pinned
        self.crash_on_store_failure = crash_on_store_failure
        self.dangling_turns = dangling_turns  # a gone holder's turn (sessions.turns)
        self.session_id = session_id
        self.exit_key = session_id  # its exit says which session ended (one monitor for all)
        self.born = forks.born()  # a forked child's copy runs in its parent (exit skips it)
        # A stored session's log is the one its recovery reads: until then, one shared
        # empty log that is never appended to (a view) stands in.
        self.log = (_RECOVERING if store is not None else Log()) if log is None else log
        self.store = store
        self.committer: Committer | None = None
        self.claim_token: str | None = None
        self.next_seq = self.log.count()
        self.inflight: deque[Event] = _NONE  # submitted to the store, not yet applied
        # Calls waiting for earlier commits (or the recovered log); made when first
        # needed (most sessions never park a call: an idle session stays small).
        self.parked: deque[Parked] = _NONE
        self.failed: StoreError | None = None
        self.crash: BaseException | None = None
        self._ready = ready
        # The trace contexts of the callers waiting for the recovery (telemetry), read
        # once the store is read; more may join (from the registry's thread) until then.
        self._trace_links = trace_links
        self._loading = False  # the store is being read: calls wait in ``parked``
        # A successor waits for ``released`` (read off the cell) before it claims the session.
        self.ledger = CommitLedger(self.cell.released)
        self.turns: TurnTable | None = None  # made by the first turn
        self.compactions: Compactions | None = None  # made by the first compaction
        self.feeds: Feeds | None = None  # made by the first subscriber

    # -- the loop --------------------------------------------------------------------------

    def on_start(self) -> None:
        if self.store is None:
            self._adopted(self.log)
            return
        # Claim and read the store off the dispatcher; the log arrives as h_adopt.
        self._loading = True
        self.ledger.begin()  # a stop meanwhile keeps the claim until this is back
        recover(self.store, self)  # queued as it is: no callback object while it waits

    def deliver_recovery(self, result: Any) -> None:
        """(On the reader that recovered the session.) Its result goes to the inbox, as
        ``h_adopt``."""
        self.actor_inbox.put(CallEnvelope(SessionActor.h_adopt, result, None))

    def _handle_receive(self, message: Any) -> Any:
        # Our calls first, before Pykka's chain of isinstance checks.
        if type(message) is tuple and len(message) == 3:
            self._receive_call(*message)
            return None
        return super()._handle_receive(message)

    def _receive_call(
        self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any] | None
    ) -> None:
        # A call: from a `CallEnvelope` (every call of a handle), or a message
        # ``(handler, args, future)`` put as it is (`_handle_receive`, `on_receive`).
        try:
            if self.ledger.done and not self._absorb():  # died of a store failure
                if fut is not None:
                    fut._fail(
                        SessionStopped(self.session_id, "the session crashed before this call")
                    )
                return
            # Calls run in arrival order. One that must see every earlier append
            # (a read, snapshot, compact, fork) waits for their commits, and every
            # call after it waits behind it.
            traits = TRAITS.get(handler, 0)
            if not traits & AT_ONCE and (
                self.parked or self._loading or (self.inflight and traits & SEES_COMMITS)
            ):
                self._park().append((handler, args, fut))
            else:
                self._run(handler, args, fut, traits)
            if bool(self.parked or self.feeds) is not self.ledger.want:
                self._sync_wake()
        except BaseException as exc:  # never let anything reach Pykka's handling
            if not self.actor_stopped.is_set():
                self._die(exc)

    def on_receive(self, message: Any) -> Any:
        if type(message) is not tuple or len(message) != 3:
            return super().on_receive(message)
        handler, args, fut = message
        self._receive_call(handler, args, fut)
        return None

    def _receive_run(
        self, args: tuple[Any, ...], fut: SessionFuture[Any] | None, quota: int
    ) -> int:
        # An append, and the appends queued right behind it: a caller that pipelines
        # (or many callers at once) queue them by the thousand. Where each would run
        # alone exactly as this runs them (nothing parked, no open turn, no failure, no
        # replace, the log current), they run as one: their events made in seq order, the
        # log extended once, each future answered in order, the session's checks made
        # once. Anything else queued goes as it would have, right after them, in order.
        parts: EventParts = args[0]
        turns = self.turns
        q = self.actor_inbox
        if (
            q.empty()  # (alone: as a single call)
            or parts[3] is not None
            or self.parked
            or self._loading
            or self.failed is not None
            or self.ledger.done
            or (turns is not None and turns.open is not None)
            or self.next_seq + quota > MAX_SEQ
        ):
            self._receive_call(SessionActor.h_append, args, fut)
            return quota - 1
        empty, get = q.empty, q.get_nowait
        first = self.next_seq
        calls: list[tuple[Any, ...]] = [args]
        futs = [fut]
        quota -= 1
        after: Any = None  # the envelope behind the run, if one ended it
        at = [0, 0]  # the call being applied, and how many calls' events are applied
        try:
            trusted = Event._trusted
            events = [trusted(first, *parts)]
            while quota > 0 and not empty():
                envelope = get()
                quota -= 1
                if type(envelope) is CallEnvelope and envelope.handler is SessionActor.h_append:
                    args = envelope.args
                    if args[0][3] is None:
                        events.append(trusted(first + len(calls), *args[0]))
                        calls.append(args)
                        futs.append(envelope.future)
                        continue
                after = envelope
                break
            envelope = None  # (not held while the calls run)
            self._append_run(events, calls, futs, at)
        except BaseException as exc:  # as `_run`: only this session stops
            self._run_crashed(exc, at, calls, futs, after)
            return quota
        if after is not None:
            if type(after) is CallEnvelope:
                handler, args, fut = after.handler, after.args, after.future
                del after
                self._receive_call(handler, args, fut)
            else:
                receive_one(self, after)
        elif bool(self.parked or self.feeds) is not self.ledger.want:
            self._sync_wake()
        return quota

    def _run_crashed(
        self,
        exc: BaseException,
        at: list[int],
        calls: list[tuple[Any, ...]],
        futs: list[SessionFuture[Any] | None],
        after: Any,
    ) -> None:
        """A run of appends raised ``exc`` (a `BaseException`) while applying its call
        ``at[0]``, its first ``at[1]`` calls' events applied: the session stops, as when
        one call crashes it. The calls before that one are answered as they would have
        been (those handed to the committer by their commit); that one, and any other
        whose event was applied but not answered, is told it crashed the session; those
        it had not reached, and the envelope behind them, go where the calls still
        queued go (back to the session's route, else refused as not applied)."""
        crashing, applied = at
        reached = max(crashing + 1, applied)
        waiting: list[Parked] = [
            (SessionActor.h_append, calls[i], futs[i]) for i in range(reached, len(calls))
        ]
        if type(after) is CallEnvelope:
            waiting.append((after.handler, after.args, after.future))
            after = None
        if not self.actor_stopped.is_set():
            self._park().extend(waiting)  # (empty when the run began)
            self._die(exc)
        else:
            stopped = SessionStopped(self.session_id, "the session stopped before this call")
            for _, _, f in waiting:
                if f is not None:
                    f._fail(stopped)
        for f in futs[crashing:reached]:
            if f is not None:
                f._fail(_crashed(self.session_id, exc))
        if after is not None:
            self._answer_stopped(
                [after], SessionStopped(self.session_id, "the session stopped before this call")
            )

    def _append_run(
        self,
        events: list[Event],
        calls: list[tuple[Any, ...]],
        futs: list[SessionFuture[Any] | None],
        at: list[int],
    ) -> None:
        """`h_append` of each of ``events`` in turn (made for the calls ``futs`` answer),
        where nothing parks and no check refuses one (see `_receive_run`): what each
        call would have done alone, in order. An in-memory session with no subscriber
        and no compaction extends its log once, all or nothing. ``at``: the call being
        applied, and how many calls' events are (kept up to date for `_run_crashed`)."""
        sink = telemetry.sink
        if self.committer is None and self.feeds is None and self.compactions is None:
            if sink is not None:
                sink.appended(len(events))
            try:
                self.log = self.log._extend_run(events)
            except Exception as exc:  # nothing changed: each call fails with it
                for f in futs:
                    if f is not None:
                        f._fail(exc)
                return
            self.next_seq = events[-1].seq + 1
            at[1] = len(events)
            for i, (f, ev) in enumerate(zip(futs, events, strict=True)):
                at[0] = i
                if f is not None:
                    f._resolve(ev)
            return
        committer = self.committer
        if committer is not None and not any(type(f) is ForwardedFuture for f in futs):
            # Handed to the committer a share at a time, one item each: every call of an
            # item counts as reached before it goes (should this stop half way, they are
            # told it crashed the session, never applied twice).
            inflight = self._in_flight()
            ledger, submit, share = self.ledger, committer.submit_write, max(committer.share, 1)
            for lo in range(0, len(events), share):
                if lo and _failed_commit(ledger):
                    # A write of this session failed meanwhile: the rest one by one, as
                    # they would have gone (the failure is met first: the session stops,
                    # and they go where its queued calls go).
                    at[0] = at[1] = len(events)
                    self._one_by_one(calls[lo:], futs[lo:])
                    return
                hi = min(lo + share, len(events))
                chunk = tuple(events[lo:hi])
                self.next_seq = chunk[-1].seq + 1
                inflight.extend(chunk)
                at[0], at[1] = lo, hi
                ledger.begin()
                try:
                    submit(_CommittedRun(self, chunk, futs[lo:hi]))
                except Exception as exc:  # not sent
                    # As one by one: its first call fails with it, the rest go again.
                    self._unsent(chunk)
                    at[1] = len(events)
                    failed = futs[lo]
                    if failed is not None:
                        failed._fail(exc)
                    self._one_by_one(calls[lo + 1 :], futs[lo + 1 :])
                    return
                except BaseException:  # not sent: its first call crashed the session
                    self._unsent(chunk)
                    at[1] = lo  # (the rest go where queued calls go)
                    raise
                if sink is not None:
                    sink.appended(len(chunk))
            return
        for i, (f, ev) in enumerate(zip(futs, events, strict=True)):
            at[0] = i
            try:
                result = self._submit((ev,), ev, f)
            except Exception as exc:  # as `_run`: this call fails, the others go on
                if f is not None:
                    f._fail(exc)
                if self.next_seq != ev.seq + 1:  # its seq is free again: the rest anew
                    at[1] = len(events)
                    self._one_by_one(calls[i + 1 :], futs[i + 1 :])
                    return
                continue
            at[1] = i + 1
            if f is not None and result is not _DEFER:
                f._resolve(result)

    def _one_by_one(
        self, calls: list[tuple[Any, ...]], futs: list[SessionFuture[Any] | None]
    ) -> None:
        """The rest of a run, as single calls: parked (before whatever is queued, which
        parks behind them), then run in order as parked calls are (`h_committed`, asked
        for now), which first meets a failed commit, if one came back, as any call would
        (the session stops; they go where its queued calls go)."""
        self._park().extend(
            (SessionActor.h_append, args, f) for args, f in zip(calls, futs, strict=True)
        )
        try:
            self.actor_ref.tell((SessionActor.h_committed, (), None))
        except pykka.ActorDeadError:  # (stopped: its teardown answers what is parked)
            pass

    def _run(
        self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any] | None, traits: int
    ) -> None:
        if (
            traits & HELD_BY_TURN
            and self.turns is not None
            and self._turn_holds(handler, args, fut)
        ):
            return  # a write waiting for the open turn: run when it ends
        try:
            result = handler(self, fut, *args) if traits & ANSWERS else handler(self, *args)
        except Exception as exc:
            if fut is not None:
                fut._fail(exc)
        except BaseException as exc:  # contain it: only this session stops
            # Stopped first, then this call is told it crashed it: a caller who saw
            # SessionCrashed and calls again reaches the restarted session, never this one.
            self._die(exc)
            if fut is not None:
                fut._fail(_crashed(self.session_id, exc))
        else:
            if fut is not None and result is not _DEFER:
                fut._resolve(result)

    def _park(self) -> deque[Parked]:
        parked = self.parked
        if parked is _NONE:
            parked = self.parked = deque()
        return parked

    def _sync_wake(self) -> None:
        """Tell the committer whether to wake this actor on commit (someone waits)."""
        if self.ledger.wanted(bool(self.parked or self.feeds)):
            self.actor_ref.tell((SessionActor.h_committed, (), None))

    # -- start -----------------------------------------------------------------------------

    def _adopt_stopped(
        self, token: str | None, log: Log | None, exc: BaseException | None, took: float
    ) -> None:
        """The store was read for a session that stopped meanwhile: let go of it."""
        if token is not None and self.store is not None:
            release(self.store, self.session_id, token)
        self._loading = False
        self._store_op_done()

    @call(AT_ONCE, when_stopped=_adopt_stopped)
    def h_adopt(
        self, token: str | None, log: Log | None, exc: BaseException | None, took: float
    ) -> None:
        """The store was read (by `READERS`): take the claim and the log, or fail to start."""
        self._loading = False
        self._store_op_done()
        retained = 0 if log is None else len(log.events())
        sink = telemetry.sink
        if sink is not None:
            end = time.time_ns()
            outcome = "failed" if log is None else "recovered" if log.count() else "new"
            links = () if self._trace_links is None else tuple(self._trace_links)
            sink.recovered(self.session_id, outcome, retained, end - int(took * 1e9), end, links)
        self._trace_links = None
        if exc is not None:
            self._start_failed(exc)
            return
        assert self.store is not None
        assert log is not None
        self.claim_token = token
        self.committer = committer_for(self.store)
        self.committer.reset(self.session_id)
        if log.count():
            logger.info(
                "session.recovered",
                session_id=self.session_id,
                reason="loaded_from_store",
                events=retained,
                count=log.count(),
                seconds=round(took, 6),
            )
        self._adopted(log)
        self.h_committed()  # the calls that waited for the log

    def _adopted(self, log: Log) -> None:
        # A long log is folded once (messages are projected on the first read), so
        # that every later append keeps the surface current and the first derive
        # costs no fold. A short or empty one is folded by its first derive, if one
        # comes: a session only appended to keeps no fold, nor pays to keep it current.
        if log.count() > EAGER_FOLD:
            log._folded()
        self.log = log
        self.next_seq = log.count()
        end_orphan_turn(self)
        ready, self._ready = self._ready, None  # answered: not kept by an idle session
        if ready is not None:
            ready._resolve(self.actor_ref)

    def _start_failed(self, exc: BaseException) -> None:
        # A refusal the caller is told of (another writer holds it) is not an error
        # of this process: logged quietly. Anything else is. The openers are told
        # after the session is marked stopped (a retry starts a fresh one).
        ready, self._ready = self._ready, None
        if isinstance(exc, ConflictError):
            logger.info(
                "session.start_refused",
                session_id=self.session_id,
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )
            self._die(exc, log=False)
        else:
            self._die(exc, "session.start_failed")
        if ready is not None:
            ready._fail(exc)

    # -- writes ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise StoreError(
                f"refuses appends after a store failure ({self.failed}); "
                "restart the session to reload it from the store",
                session_id=self.session_id,
            )

    @call(ANSWERS | HELD_BY_TURN | THROUGH_TURN | REMOTE)
    def h_append(self, fut: SessionFuture[Any] | None, parts: EventParts) -> Any:
        """Append an event the caller's thread already checked and froze."""
        if self.failed is not None:  # (`_check_writable`'s test, inline: every append)
            self._check_writable()
        if self.next_seq > MAX_SEQ:
            raise _past_last_seq(self.next_seq)
        ev = Event._trusted(self.next_seq, *parts)
        return self._submit((ev,), ev, fut)

    _RUNS = h_append  # appends queued together run together (`_receive_run`)

    @call(ANSWERS | HELD_BY_TURN | THROUGH_TURN | REMOTE)
    def h_append_many(self, fut: SessionFuture[Any] | None, batch: tuple[EventParts, ...]) -> Any:
        """Append several checked events under consecutive seqs, as one atomic commit."""
        self._check_writable()
        if not batch:
            return []
        first = self.next_seq
        if first + len(batch) - 1 > MAX_SEQ:
            raise _past_last_seq(first + len(batch) - 1)
        events = tuple(Event._trusted(first + k, *parts) for k, parts in enumerate(batch))
        return self._submit(events, list(events), fut)

    @call(ANSWERS | HELD_BY_TURN | THROUGH_TURN | REMOTE)
    def h_append_at(self, fut: SessionFuture[Any] | None, seq: int, parts: EventParts) -> Any:
        self._check_writable()
        if seq < self.next_seq:
            raise _behind_head(seq, self.next_seq)
        ev = Event._trusted(seq, *parts)
        return self._submit((ev,), ev, fut)

    @call(ANSWERS | SEES_COMMITS | THROUGH_TURN | REMOTE)
    def h_snapshot(self, fut: SessionFuture[Any] | None) -> Any:
        before = self.log.events()
        # The newest managed turn event stays, even if shadowed: what the log says of
        # its open turn is unchanged (an open turn's turn_start, which a restart ends
        # the turn by; a closed turn's turn_end, without which a restart would take the
        # turn for open). Bookkeeping: the surface is that of Log.snapshot.
        last = last_turn_event(self.log)
        self.log = self.log._snapshot_keeping(None if last is None else last.seq)
        kept = {ev.seq for ev in self.log.events()}
        dropped = [ev.seq for ev in before if ev.seq not in kept]
        if self.committer is None or not dropped:
            return len(dropped)

        def done(err: StoreError | None) -> None:
            self._store_op_done()
            if fut is not None:
                if err is None:
                    fut._resolve(len(dropped))
                else:
                    fut._fail(err)

        self.ledger.begin()
        self.committer.submit_drop(self.session_id, dropped, done)
        return _DEFER

    @call(SEES_COMMITS | THROUGH_TURN | REMOTE)
    def h_fork(self, through_seq: int, new_id: str | None) -> Log:
        prefix = self.log.fork(through_seq)
        if self.store is None or new_id is None:
            return prefix
        if new_id == self.session_id:
            raise ValueError("fork into a new session id, not the session's own")
        token = self.store.claim(new_id)  # no live session may hold the new id
        try:
            return self._write_fork(prefix, through_seq, new_id)
        finally:
            self.store.release(new_id, token)

    def _write_fork(self, prefix: Log, through_seq: int, new_id: str) -> Log:
        assert self.store is not None
        record = new_event(
            prefix.count(),
            "request_header",
            {"forked_from": {"session_id": self.session_id, "through_seq": through_seq}},
            None,
        )
        forked = prefix.append_event(record)
        if self.store.load(new_id):
            raise ConflictError(
                "already has events; fork into a new session id", session_id=new_id
            )
        refused = self.store.write({new_id: forked.events()})
        if new_id in refused:
            raise refused[new_id]
        logger.info(
            "session.forked", session_id=self.session_id, fork_id=new_id, through_seq=through_seq
        )
        return forked

    # -- commits ---------------------------------------------------------------------------

    def _submit(
        self, events: tuple[Event, ...], result: Any, fut: SessionFuture[Any] | None
    ) -> Any:
        """Commit ``events`` (one atomic batch); ``fut`` is answered with ``result`` once
        they are committed (`DEFER`), or at once (``result``) with no store."""
        self.next_seq = events[-1].seq + 1
        sink = telemetry.sink
        if sink is not None:
            sink.appended(len(events))
        committer = self.committer
        if committer is None:
            for ev in events:
                self._apply(ev)
            return result
        self._in_flight().extend(events)
        self.ledger.begin()
        # A call another process sent: its id is recorded with its events (its caller
        # can ask whether it was applied if the answer never reaches it).
        call = fut.call_id if type(fut) is ForwardedFuture else None
        try:
            committer.submit_write(_Committed(self, events, fut, result, call))
        except BaseException:
            self._unsent(events)
            raise
        return _DEFER

    def _in_flight(self) -> deque[Event]:
        """The events handed to the committer and not yet back (made with the first)."""
        inflight = self.inflight
        if inflight is _NONE:
            inflight = self.inflight = deque()
        return inflight

    def _unsent(self, events: Sequence[Event]) -> None:
        """``events`` (the last ones made) never reached the committer: as if they had
        never been made (out of flight, their seqs free again), their operation ended."""
        inflight = self.inflight
        for _ in events:
            inflight.pop()
        self.next_seq = events[0].seq
        if self.ledger.cancel():
            self._last_op_done()

    def _on_commit(
        self,
        events: tuple[Event, ...],
        answers: Iterable[tuple[SessionFuture[Any] | None, Any]],
        err: StoreError | None,
    ) -> None:
        """An item came back from the committer: ``events`` stored (``err``: or not), each
        ``(future, result)`` of ``answers`` to be answered, in order."""
        # In the committer's thread. Order matters:
        # 1. record the commit for the actor, which applies it when it next runs;
        # 2. if the session stopped meanwhile and this was its last append in
        #    flight, give up the writer claim *before* acknowledging, so that
        #    whoever saw the acknowledgement can reopen the session at once;
        # 3. acknowledge; 4. wake the actor only if something waits for the
        #    commit (a parked read, a subscriber) or the write failed.
        last, wake = self.ledger.committed(events, err)
        try:
            if last:
                self._last_op_done()
            for fut, result in answers:
                if fut is not None:
                    if err is None:
                        fut._resolve(result)
                    else:
                        fut._fail(err)
        finally:
            if wake:
                try:
                    self.actor_ref.tell((SessionActor.h_committed, (), None))
                except pykka.ActorDeadError:
                    pass

    def _apply(self, ev: Event) -> None:
        self.log = self.log.append_event(ev)
        feeds = self.feeds
        if feeds is not None and not feeds.push(ev):
            self.feeds = None
        compactions = self.compactions
        if compactions is not None:
            if ev.type is EventType.STEP_END:
                compactions.applied(ev)
            elif compactions.running:  # (a replace is kept while a summary is written)
                compactions.saw(ev)

    def _absorb(self) -> bool:
        """Apply the commits that landed; ``False`` if a failed one stopped the session."""
        for events, err in self.ledger.take():
            for ev in events:
                head = self.inflight.popleft()
                assert head is ev, "commits came back out of order"
                if err is None:
                    self._apply(ev)
            if err is not None and self.failed is None:
                self.failed = err
                self.next_seq = self.log.count()
                if isinstance(err, FencedError):  # not a crash: another writer took over
                    self._fenced(err)
                    return False
                if self.crash_on_store_failure:  # a supervisor restarts it from the store
                    self._die(err)
                    return False
        if not self.inflight:
            self.inflight = _NONE  # an idle session keeps no queue
        return True

    def _fenced(self, err: FencedError) -> None:
        """Another writer holds the session now: stop once, normally (no restart); the
        next call through a registry reopens it if the store allows."""
        logger.warning(
            "session.fenced", session_id=self.session_id, reason="fenced", error=_safe_str(err)
        )
        # Its claim is released as on any stop: a store ignores the release of a
        # claim that another writer holds now (the token is not theirs).
        self._stop()

    @call(AT_ONCE)
    def h_committed(self) -> None:
        if self.ledger.done and not self._absorb():
            return
        parked = self.parked
        while parked and not (self.inflight and TRAITS.get(parked[0][0], 0) & SEES_COMMITS):
            handler, args, fut = parked.popleft()
            self._run(handler, args, fut, TRAITS.get(handler, 0))

    # -- reads -----------------------------------------------------------------------------

    def h_subscribe(self, sub: Subscription, from_seq: int) -> Subscription:
        feeds = self.feeds
        if feeds is None:
            feeds = self.feeds = Feeds()
        feeds.add(sub, self.log.since(from_seq))
        return sub

    def h_unsubscribe(self, sub: Subscription) -> None:
        if self.feeds is not None and not self.feeds.remove(sub):
            self.feeds = None

    @call(SEES_COMMITS | THROUGH_TURN | REMOTE, turn_reads=LOG_READS)
    def h_read(self, name: str, *args: Any) -> Any:
        return getattr(self.log, name)(*args)

    @call(SEES_COMMITS | THROUGH_TURN | REMOTE)
    def h_log(self) -> Log:
        return self.log._view()

    @call(SEES_COMMITS | REMOTE)
    def h_applied(self, call_id: str) -> tuple[int, ...] | None:
        """The seqs the forwarded call ``call_id`` appended, as the store recorded them in
        the transaction of its events, or ``None`` if it appended nothing. Read by the
        session's holder: its claim fences every earlier holder, so the answer stands."""
        if self.store is None:
            return None  # no store, no forwarded calls
        read = getattr(self.store, "applied_call", None)
        if read is None:
            raise StoreError(
                f"{type(self.store).__name__} records no forwarded calls, so whether one was "
                "applied cannot be told from its id: read the session (since(seq)) instead",
                session_id=self.session_id,
            )
        found = read(self.session_id, call_id)
        return None if found is None else tuple(range(found[0], found[1] + 1))

    @call(THROUGH_TURN)
    def h_ping(self) -> None:
        return None

    @call(SEES_COMMITS)
    def h_flush(self) -> None:
        """Answered once every append made before it is committed (a barrier)."""
        return None

    # -- hand-off --------------------------------------------------------------------------

    def busy(self) -> str | None:
        """Why this session cannot be handed to another process now (``None``: it is
        idle: nothing in flight, nothing waiting, no compaction being written)."""
        if self._loading:
            return "recovering"
        if self.inflight or self.ledger.ops:
            return "a commit is in flight"
        if self.parked:
            return "calls are waiting"
        if self.compactions is not None and self.compactions.running:
            return "a compaction is being written"
        if self.turns is not None:
            return "a turn is open"
        return None

    @call(AT_ONCE)
    def h_stop(self) -> None:
        """Its registry stops it (a close, a passivation, a move): stop now, as Pykka's
        ``ActorRef.stop`` would, the calls queued before this one run first. Told, not
        asked: the registry waits for ``actor_stopped`` and then for ``released``, so a
        stop makes no future (Pykka's makes two, each a ``queue.Queue`` with its three
        ``Condition`` objects: most of what closing 10,000 sessions cost)."""
        self._stop()

    def h_handoff(self) -> bool:
        """Another process asked for this session: if it is idle, stop now (normally:
        no restart), letting go of the claim; ``False`` if it is busy (ask again later).

        A call already queued behind this one makes it busy too, so a caller's
        call is not refused for a hand-off; one that lands in the instant of the
        stop is answered with `SessionStopped` (not applied). A handle's next call
        reopens the session through its registry, which may ask for it back."""
        if self.busy() is not None or not self.actor_inbox.empty():
            return False
        logger.info("session.handed_over", session_id=self.session_id, reason="asked")
        self.cell.follow = True  # it lives on in the process that asked
        self._stop()
        return True

    # -- compaction ------------------------------------------------------------------------
    #
    # Planned here, summarised elsewhere (`_summarise`: on the caller's event loop, or in
    # a thread of its own) and sent back as ``h_compact_summary``; the batch commits like
    # any append, and ``h_compact_done`` answers the call once it is applied. A
    # compaction id in the log already is never applied again.

    @call(ANSWERS | SEES_COMMITS | HELD_BY_TURN | THROUGH_TURN)
    def h_compact(self, fut: SessionFuture[Any] | None, req: _Compaction) -> Any:
        try:
            return self._compact(fut, req)
        finally:
            if req.slot is not None:  # no summary asked of it (a no-op once it was)
                req.slot.release()

    def _compactions(self) -> Compactions:
        c = self.compactions
        if c is None:
            c = self.compactions = Compactions()
        return c

    def _compact(self, fut: SessionFuture[Any] | None, req: _Compaction) -> Any:
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:
            return known
        c = req.compactor
        # Inside an open turn it replaces only what the turn wrote (`Compactor.plan`):
        # a snapshot keeps the turn's start, and a rollback of the turn undoes it.
        table = self.turns
        start = None if table is None or table.open is None else table.open.start_seq
        plan = c.plan(self.log.surface(), self.log.count(), force=req.force, turn_start=start)
        if plan.empty:
            return CompactionResult(self.log._view(), plan.before, plan.before, budget=c.budget)
        if telemetry.sink is not None:  # timed from its first plan (retries included)
            self._compactions().timed(req.cid, req.context)
        if not plan.needs_summary:
            return self._commit_compaction(fut, req, plan, None)
        running = self._compactions()
        running.begin(req.cid, fut, plan.count)
        self._turn_summarising(req, 1)
        try:
            self._summarise(req, plan, fut)
        except BaseException:
            running.landed(req.cid)
            self._turn_summarising(req, -1)
            raise
        return _DEFER

    def _turn_summarising(self, req: _Compaction, delta: int) -> None:
        """The summary of ``req``, made through a turn, is being written (``delta`` 1) or
        came back (-1): that turn's lease does not run out meanwhile (its holder waits for
        the summary, which a slow model may take longer than the lease to write)."""
        if req.turn_id is not None and self.turns is not None:
            self.turns.summarising(req.turn_id, scheduling.monotonic(), delta)

    def _summarise(self, req: _Compaction, plan: Plan, fut: SessionFuture[Any] | None) -> None:
        """Have the summary written off this actor, then sent back to it.

        A coroutine summariser runs on the caller's event loop when the call came
        from one, else (like a plain callable) in a thread of its own.
        """
        ref = self.actor_ref
        if self.compactions is not None:
            self.compactions.mark(req.cid, 1)

        def deliver(summary: Any, exc: BaseException | None) -> None:
            try:
                ref.tell((SessionActor.h_compact_summary, (req, plan, summary, exc), fut))
            except pykka.ActorDeadError:
                if fut is not None:  # the session stopped while the summary was written
                    fut._fail(SessionStopped(self.session_id, "the session stopped"))

        slot = req.slot
        if slot is not None and slot.submit(req.compactor, plan.summary_input, deliver):
            return
        loop = req.loop
        if loop is not None and _is_async(req.compactor.summarise) and not loop.is_closed():
            coro = run_summariser(req.compactor, plan.summary_input)  # only makes the coroutine
            try:
                done = asyncio.run_coroutine_threadsafe(coro, loop)
            except RuntimeError:  # the loop closed meanwhile
                coro.close()
            else:

                def landed(cf: Any) -> None:
                    try:
                        deliver(cf.result(), None)
                    except BaseException as exc:
                        deliver(None, exc)

                done.add_done_callback(landed)
                return

        def work() -> None:
            try:
                out = run_summariser(req.compactor, plan.summary_input)
                if inspect.isawaitable(out):
                    out = _run_awaitable(out)
            except BaseException as exc:
                deliver(None, exc)
            else:
                deliver(out, None)

        name = f"nous-summarise-{self.session_id}"
        scheduling.spawn(work, name)  # a thread (a task, in a simulation)

    @call(ANSWERS | SEES_COMMITS)
    def h_compact_summary(
        self,
        fut: SessionFuture[Any] | None,
        req: _Compaction,
        plan: Plan,
        summary: Any,
        exc: BaseException | None,
    ) -> Any:
        c = self._compactions()
        c.landed(req.cid)
        self._turn_summarising(req, -1)
        if c.mark(req.cid, 2) and exc is not None:  # not recorded: not reported
            c.report(self.session_id, req.cid, report=False)
        if exc is not None:
            if isinstance(exc, CompactionError):
                raise exc
            raise CompactionError(
                f"the summariser failed: {type(exc).__name__}: {_safe_str(exc)}; log unchanged"
            ) from exc
        return self._commit_compaction(fut, req, plan, summary)

    def _commit_compaction(
        self, fut: SessionFuture[Any] | None, req: _Compaction, plan: Plan, summary: Any
    ) -> Any:
        self._check_writable()
        if req.turn_id is not None:  # made through a turn: that turn must still be open
            table = self._turns_now(scheduling.monotonic())
            if table is None or table.open is None or table.open.req.turn_id != req.turn_id:
                raise not_open(self.session_id, self.log, req.turn_id, self.inflight)
        known = self._known_compaction(req)
        if known is not None:  # applied already: at most once
            return known
        c = self.compactions  # (none made here: a session that never compacted keeps none)
        clash = plan.overlaps(
            self.log.since(plan.count) if c is None else c.appended_since(self.log, plan.count)
        )
        if clash is not None:
            if req.attempt < MAX_COMPACTION_RETRIES:
                logger.info(
                    "session.compaction_retried",
                    session_id=self.session_id,
                    compaction_id=req.cid,
                    reason="overlapping_replace",
                    seq=clash.seq,
                )
                return self.h_compact(fut, dataclasses.replace(req, attempt=req.attempt + 1))
            raise CompactionError(
                f"a replace appended while the summary was written (seq {clash.seq}) overlaps "
                f"the compaction's range, {req.attempt + 1} times; compact again later"
            )
        try:
            specs, result = req.compactor.events(plan, summary, self.next_seq, req.cid)
        except CompactionError:  # refused (no str, or larger): not recorded, not reported
            if self.compactions is not None:
                self.compactions.report(self.session_id, req.cid, report=False)
            raise
        absorbed = (
            []
            if result.summarised is None
            else self._compactions().absorbed(self.log, result.summarised)
        )
        if absorbed:  # the record keeps the ids of the records its summary shadows
            etype, data = specs[-1]
            specs[-1] = (etype, {**data, "absorbed": absorbed})
        t = _utcnow() if req.time is None else req.time
        events = tuple(
            new_event(self.next_seq + k, etype, data, t) for k, (etype, data) in enumerate(specs)
        )
        self._submit(events, None, None)  # answered once applied, not once committed
        if self.inflight:
            self._park().append((SessionActor.h_compact_done, (result, req.compactor), fut))
            return _DEFER
        return self.h_compact_done(result, req.compactor)

    @call(SEES_COMMITS)
    def h_compact_done(self, result: CompactionResult, compactor: Compactor) -> CompactionResult:
        record = self.log.since(result.record_seq or 0)[:1]
        if not record or record[0].seq != result.record_seq:
            raise self.failed or StoreError(
                "the compaction was not stored", session_id=self.session_id
            )
        if compactor.snapshot:  # runs next, before any later call
            self._park().appendleft((SessionActor.h_snapshot, (), None))
            self.actor_ref.tell((SessionActor.h_committed, (), None))
        out = dataclasses.replace(result, log=self.log._view())
        log_compacted(out, session_id=self.session_id)
        if self.compactions is not None:
            self.compactions.report(self.session_id, result.compaction_id)
        return out

    def _known_compaction(self, req: _Compaction) -> CompactionResult | None:
        """The result of compaction ``req.cid`` if it is in the log already (only an id
        the caller chose can be: a fresh one is looked up nowhere)."""
        if not req.explicit:
            return None
        return self._compactions().known(self.log, req.cid)

    # -- turns -----------------------------------------------------------------------------
    #
    # The turn table (`TurnTable`) keeps the open turn and the calls waiting for it; these
    # calls are what a turn's holder (`nous_actor.sessions.turn_handle.Turn`) sends.

    @call(ANSWERS | REMOTE)
    def h_turn_open(self, fut: SessionFuture[Any] | None, req: TurnRequest) -> Any:
        """Open turn ``req`` (resolves to its ``turn_start`` event once committed), or
        apply its policy to the open one (``reject``: `TurnBusy`; ``enqueue``: wait,
        first come first served, until its ``wait``; ``interrupt``/``rollback``: end
        the open turn and take over)."""
        self._check_writable()
        now = scheduling.monotonic()
        table = self._turns_now(now)
        if table is None:
            table = TurnTable(self)
            self._keep_turns(table)
        return table.arrive(req, fut, now)

    @call(ANSWERS | REMOTE)
    def h_turn_call(
        self, fut: SessionFuture[Any] | None, turn_id: str, name: str, args: tuple[Any, ...]
    ) -> Any:
        """A call made through turn ``turn_id``: run it if that turn is open (renewing
        its lease), else fail with `TurnInterrupted`."""
        now = scheduling.monotonic()
        table = self._turns_now(now)
        if table is None or table.open is None or table.open.req.turn_id != turn_id:
            raise not_open(self.session_id, self.log, turn_id, self.inflight)
        handler = getattr(SessionActor, name, None) if isinstance(name, str) else None
        traits = TRAITS.get(handler, 0) if handler is not None else 0
        reads = TURN_READS.get(handler) if handler is not None else None
        if (
            handler is None
            or not traits & THROUGH_TURN
            or (reads is not None and (not args or args[0] not in reads))
        ):
            raise ValueError(f"a turn runs no call {name!r}")
        table.renew(turn_id, now)
        return handler(self, fut, *args) if traits & ANSWERS else handler(self, *args)

    @call(ANSWERS | SEES_COMMITS | REMOTE)
    def h_turn_read(
        self, fut: SessionFuture[Any] | None, turn_id: str, name: str, args: tuple[Any, ...]
    ) -> Any:
        """`h_turn_call` for a call that sees every append made before it (a read, a
        compaction, a fork, a snapshot): it waits for their commits first."""
        return self.h_turn_call(fut, turn_id, name, args)

    @call(ANSWERS | REMOTE)
    def h_turn_end(
        self, fut: SessionFuture[Any] | None, turn_id: str, how: str, error: str | None
    ) -> Any:
        """Close turn ``turn_id`` (resolves to its ``turn_end`` event), or stop waiting
        for it (resolves to ``None``)."""
        now = scheduling.monotonic()
        table = self._turns_now(now)
        if table is not None:
            result = table.end(turn_id, how, error, fut, now)
            if result is not _NOT_HERE:
                return result
        raise not_open(self.session_id, self.log, turn_id, self.inflight)

    def h_turn_gone(self, turn_id: str) -> None:
        """The process that opened turn ``turn_id`` through forwarded calls is gone (its
        connection here closed): end the turn as a gone holder's (`TurnTable.gone`)."""
        now = scheduling.monotonic()
        table = self._turns_now(now)
        if table is not None:
            table.gone(turn_id, now)

    def h_turn_tick(self) -> None:
        """The alarm: a lease or a waiter's bound may have run out."""
        if self.turns is not None:
            self.turns.tick(scheduling.monotonic())

    @call(ANSWERS)
    def _h_grant(self, fut: SessionFuture[Any] | None, req: TurnRequest) -> Any:
        table = self.turns
        assert table is not None
        return table.grant(req, scheduling.monotonic(), (), fut)

    def _turns_now(self, now: float) -> TurnTable | None:
        """The turn table, after ending the open turn if its lease ran out."""
        table = self.turns
        if table is not None and table.expire(now):
            table = self.turns
        return table

    def _turn_holds(
        self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any] | None
    ) -> bool:
        """Whether this write through the plain handle waits for the open turn (then
        the table keeps it, and runs it when the turn ends)."""
        table = self.turns
        if table is None or table.open is None:
            return False
        now = scheduling.monotonic()
        table = self._turns_now(now)
        return table is not None and table.hold(handler, args, fut, now)

    def _resume(self, waiter: _Waiter) -> None:
        """The turn it waited for ended: run a held write, or grant a queued turn."""
        if waiter.req is None:
            assert waiter.handler is not None
            self._run(waiter.handler, waiter.args, waiter.fut, TRAITS.get(waiter.handler, 0))
        else:
            self._run(SessionActor._h_grant, (waiter.req,), waiter.fut, ANSWERS)

    def _keep_turns(self, table: TurnTable | None) -> None:
        """Keep ``table`` (``None``: no turn open or waited for), and show in the cell
        whether there is one: the registry's passivation reads it (a session in a
        turn is not idle)."""
        self.turns = table
        self.cell.in_turn = table is not None

    # -- stopping: every waiting call answered, then the claim let go ------------------------

    def _actor_loop_teardown(self) -> None:
        # Also for calls that land after the session stopped: each is answered.
        self._drain(SessionStopped(self.session_id, "the session stopped before this call"))
        super()._actor_loop_teardown()

    def on_stop(self) -> None:
        err = SessionStopped(self.session_id, "the session stopped before this call")
        self._shut(err, MOVED if self.cell.follow else None)

    def _die(self, exc: BaseException, event: str = "session.crashed", log: bool = True) -> None:
        self.crash = exc
        if self.exit_reason is None:
            self.exit_reason = exc
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
            if log:
                logger.error(
                    event,
                    session_id=self.session_id,
                    reason=type(exc).__name__,
                    error=_safe_str(exc),
                )
        except Exception:  # logging must not keep the calls from being answered
            pass
        self._shut(
            SessionStopped(
                self.session_id,
                f"the session crashed ({type(exc).__name__}) before this call; it was not applied",
            ),
            _crashed(self.session_id, exc),
        )

    def _shut(self, err: SessionStopped, feed_error: SessionStopped | None) -> None:
        """Answer everything still waiting and let go of the store (after ``actor_stopped``).

        Under a registry's route (``cell.reroute``), the calls not applied — waiting
        for a turn (queued turns, held writes), parked, then queued in the inbox, in the
        order they came — go back to the route, which delivers them where the session is
        next; otherwise they fail with ``err``."""
        table = self.turns
        waiting: list[Parked] = (
            table.take_waiting(SessionActor.h_turn_open)
            if table is not None and self.cell.reroute is not None and not self._loading
            else []
        )  # (under a route, the calls waiting for a turn go back to it before the inbox's)
        self._drain(err, waiting)
        if table is not None:
            self._keep_turns(None)
            table.stop(err)
        if self._ready is not None:  # stopped while recovering: its openers are told
            self._ready._fail(err)
        while self.parked:
            fut = self.parked.popleft()[2]
            if fut is not None:
                fut._fail(err)
        if self.compactions is not None:
            self.compactions.stop(err)
        # Keep the writer claim until the work still with the committer (appends,
        # snapshot drops) is done: a successor must not recover the store first.
        # Subscribers get every append that commits meanwhile, then their end.
        feeds, self.feeds = self.feeds, None
        idle, subs = self.ledger._shut([] if feeds is None else feeds.subs, feed_error)
        for sub in subs:
            sub._finish(feed_error)
        if idle:
            self._release_claim()

    def _store_op_done(self) -> None:
        """One submitted store operation finished (committer thread). If the session
        stopped meanwhile and this was the last, give up the claim now: before the
        caller's acknowledgement, so whoever saw it can reopen the session at once."""
        if self.ledger.finished():
            self._last_op_done()

    def _last_op_done(self) -> None:
        """The stopped session's last store operation is done: end the feeds that
        waited for it and give up the claim."""
        subs, feed_error = self.ledger.closing_feeds()
        for sub in subs:
            sub._finish(feed_error)
        self._release_claim()

    def _release_claim(self) -> None:
        """Give up the claim, then set ``released`` (a successor waits for it)."""
        store, token, self.claim_token = self.store, self.claim_token, None
        if store is None or token is None:
            self.ledger.released.set()
            return
        batch = self.cell.release_to
        if batch is not None and batch.add(self.session_id, token):
            self.ledger.released.set()  # given up with its registry's other sessions
            return
        self._release_now(store, token)

    def _release_now(self, store: Store, token: str) -> None:
        try:
            store.release(self.session_id, token)
        except Exception as exc:
            logger.warning(
                "session.release_failed",
                session_id=self.session_id,
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )
        finally:
            self.ledger.released.set()

    def _reroute(self, route: Any, first: list[Parked]) -> list[Any]:
        """Hand the calls not applied (``first``, emptied once handed, then parked, then
        queued) back to ``route`` (under its lock: a call is put under it, so it is
        queued before this or held after); the envelopes left in the inbox that are not
        such calls (the actor's own news, Pykka's asks)."""
        left: list[Any] = []
        with route.lock:
            if self.cell.reroute is not route:  # let go of meanwhile: fail them as usual
                return self._take_inbox()
            calls: list[Parked] = list(first)
            first.clear()
            if not self._loading:  # while recovering, its openers hear of the failure
                while self.parked:
                    item = self.parked.popleft()
                    if item[2] is not None and item[0] not in WHEN_STOPPED:
                        calls.append(item)
            for envelope in self._take_inbox():
                msg = envelope.message
                if (
                    type(msg) is tuple
                    and len(msg) == 3
                    and isinstance(msg[2], SessionFuture)
                    and msg[0] not in WHEN_STOPPED
                ):
                    calls.append(msg)
                else:
                    left.append(envelope)
            if calls:
                route.take_back(calls)
            route.let_go(self.actor_ref)
        return left

    def _take_inbox(self) -> list[Any]:
        inbox = self.actor_inbox
        taken = []
        while not inbox.empty():
            taken.append(inbox.get())
        return taken

    def _drain(self, err: SessionStopped, first: list[Parked] | None = None) -> None:
        """Answer every call still in the inbox (run only after ``actor_stopped`` is set);
        under a route, the calls not applied go back to it instead (`_reroute`), after
        ``first`` (calls taken from the turn table, which came before them); those not
        handed back fail with ``err``."""
        first = [] if first is None else first
        while True:
            route = self.cell.reroute
            left = self._reroute(route, first) if route is not None else self._take_inbox()
            for _, _, waiting_fut in first:  # not handed back: no route, or let go of
                if waiting_fut is not None:  # meanwhile
                    waiting_fut._fail(err)
            first = []
            if not left:
                return
            self._answer_stopped(left, err)

    def _answer_stopped(self, envelopes: list[Any], err: SessionStopped) -> None:
        for envelope in envelopes:
            msg = envelope.message
            if type(msg) is tuple and len(msg) == 3:
                hook = WHEN_STOPPED.get(msg[0])
                if hook is not None:
                    hook(self, *msg[1])
                elif isinstance(msg[2], SessionFuture):
                    msg[2]._fail(err)
            elif envelope.reply_to is not None:
                try:
                    envelope.reply_to.set_exception(
                        (pykka.ActorDeadError, pykka.ActorDeadError(str(err)), None)
                    )
                except Exception:  # already answered
                    pass


def _failed_commit(ledger: CommitLedger) -> bool:
    """Whether a failed write of the session is among the commits its actor has not
    taken yet (read without the ledger's lock: a commit recorded just after is met by
    the session's next call)."""
    done = ledger.done
    return bool(done) and any(err is not None for _, err in tuple(done))


def _past_last_seq(seq: int) -> InvalidEvent:
    """A session whose next seq is past the last a store keeps (after an ``append_at``
    of the last one) refuses further appends at the call, as `Log.append` does."""
    return InvalidEvent(
        "invalid_event",
        f"seq {seq} is past the last seq a store keeps, 2**63 - 1 ({MAX_SEQ}); "
        "this session can take no more events",
    )


# Views of the handlers' declarations, by what reads them.
_WAIT_FOR_COMMITS = handlers_with(SEES_COMMITS)
"""The calls that must see every append made before them (they wait for its commit)."""

HELD = frozenset(h.__name__ for h in handlers_with(HELD_BY_TURN))
"""The writes (by name) that, through the plain handle, wait while a turn is open."""

THROUGH = frozenset(h.__name__ for h in handlers_with(THROUGH_TURN))
"""The calls (by name) a turn may make."""
