"""A session: one `nous_actor.Log` owned by one Pykka actor, and the handle to it.

Callers never touch the actor. They hold a `Session` handle whose
methods send a message to the actor and return a `SessionFuture`.

Guarantees, for every call on a handle:

* Calls from one thread are applied in the order they were made; calls from
  several threads are applied one at a time, each seeing the effects of all
  that were applied before it.
* Bad input fails that call's future with ``InvalidEvent`` (or, for an
  argument checked before sending, raises at the call) and changes nothing;
  the session keeps running.
* No call waits forever. A call on a stopped session fails at once with
  `nous_actor.SessionStopped`; a call queued when the session stops
  is answered with it (Pykka leaves such asks unanswered); every ``get``
  has a bound (`nous_actor.CallTimeout` after it).
* A ``BaseException`` raised while handling a call stops only this session
  (Pykka's default would stop every actor in the process); the call fails
  with `nous_actor.SessionCrashed`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, Final, TypeVar

import pykka

from nous_actor._log import get_logger
from nous_actor.core._frozen import safe_str
from nous_actor.core.compaction import (
    CompactionError,
    CompactionResult,
    Compactor,
    Plan,
    log_compacted,
    run_summariser,
)
from nous_actor.core.event import (
    Event,
    EventType,
)
from nous_actor.core.log import Log, _behind_head, _utcnow, new_event
from nous_actor.errors import (
    ConflictError,
    FencedError,
    SessionCrashed,
    SessionStopped,
    StoreError,
)
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.runtime.exit import at_exit
from nous_actor.runtime.flag import Flag
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.recovery import recover, release
from nous_actor.sessions.turns import DEFER, TurnHost, TurnTable
from nous_actor.store.base import Store
from nous_actor.store.committer import Committer, committer_for
from nous_actor.store.subscription import Subscription
from nous_actor.supervision import DispatchedSupervisedActor

__all__ = ["MAX_COMPACTION_RETRIES", "SessionActor", "SummarySlot", "summary_slot"]

logger = get_logger(__name__)

T = TypeVar("T")
Handler = Callable[..., Any]


_DEFER: Any = DEFER  # a handler's result meaning "the future is answered later"
_NONE: Any = deque(maxlen=0)  # "no parked call": shared by every session until one parks

MAX_COMPACTION_RETRIES: Final = 2
"""How often a compaction is planned again when a replace appended while its summary
was being written overlaps it, before it fails with ``CompactionError``."""

EventParts = tuple[EventType, datetime, Any, Any]
"""An event checked and frozen in the caller's thread, waiting for its seq."""


@dataclasses.dataclass(frozen=True)
class _Compaction:
    """One ``compact`` call, as it travels from the handle to the actor and back."""

    compactor: Compactor
    time: datetime | None
    force: bool
    cid: str
    explicit: bool  # the caller chose the id (so it may be in the log already)
    loop: asyncio.AbstractEventLoop | None  # the caller's loop, for a coroutine summariser
    attempt: int = 0
    slot: SummarySlot | None = None  # its place on that loop, taken at the call


_LOOP_ENDED = (
    "the event loop that was to run the coroutine summariser ended before the summary ran; "
    "log unchanged (await the compaction before the loop ends)"
)


class SummarySlot:
    """A coroutine summariser's place on the caller's event loop, taken at the call.

    A task on that loop waits for the summary's input from the session. If the
    loop ends first (``asyncio.run`` returning cancels its tasks; a closed loop
    refuses new work), the compaction fails at once with `CompactionError`
    instead of waiting out its bound for a summary that can never run.
    """

    __slots__ = ("_job", "_lock", "_lost", "_pending", "_used", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._lost = False  # the task ended without work: the loop is ending
        self._used = False  # work was submitted (or released)
        self._pending: Any = None  # submitted, not yet handed to the task
        self._job: asyncio.Future[Any] = loop.create_future()
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            job = await self._job
        except asyncio.CancelledError:  # the loop ends before the work reached the task
            with self._lock:
                self._lost = True
                job, self._pending = self._pending, None
            if job is None and self._job.done() and not self._job.cancelled():
                job = self._job.result()  # handed over, but the task never resumed
            if job is not None:
                job[2](None, CompactionError(_LOOP_ENDED))
            return
        if job is None:  # no summary needed
            return
        compactor, summary_input, deliver = job
        try:
            summary = await run_summariser(compactor, summary_input)
        except asyncio.CancelledError:  # the loop ends while the summary is written
            deliver(None, CompactionError(_LOOP_ENDED))
        except BaseException as exc:
            deliver(None, exc)
        else:
            deliver(summary, None)

    def submit(self, compactor: Compactor, summary_input: Any, deliver: Deliver) -> bool:
        """Have the summary written on the loop (any thread); ``False`` if this slot was
        used already. If the loop ended, or ends before the task took the work,
        ``deliver`` is told so at once."""
        job = (compactor, summary_input, deliver)
        with self._lock:
            if self._used:
                return False
            self._used = True
            lost = self._lost
            if not lost:
                self._pending = job
        if lost:
            deliver(None, CompactionError(_LOOP_ENDED))
            return True
        try:
            self.loop.call_soon_threadsafe(self._hand_over)
        except RuntimeError:  # the loop is closed
            with self._lock:
                job, self._pending = self._pending, None
            if job is not None:
                deliver(None, CompactionError(_LOOP_ENDED))
        return True

    def _hand_over(self) -> None:
        with self._lock:
            job, self._pending = self._pending, None
        if job is None:  # the task ended meanwhile and answered it
            return
        if self._job.done():
            job[2](None, CompactionError(_LOOP_ENDED))
        else:
            self._job.set_result(job)

    def release(self) -> None:
        """No summary is needed: let the task end (any thread)."""
        with self._lock:
            if self._used:
                return
            self._used = True
        try:
            self.loop.call_soon_threadsafe(_set_if_pending, self._job)
        except RuntimeError:
            pass


def _set_if_pending(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


def summary_slot(compactor: Compactor) -> SummarySlot | None:
    """A `SummarySlot` on the running event loop if ``compactor`` summarises with a
    coroutine function and this is called from a loop, else ``None``."""
    if not _is_async(compactor.summarise):
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return SummarySlot(loop)


Deliver = Callable[[Any, "BaseException | None"], None]


class _Envelope:
    """What Pykka's actor loop reads from the inbox (``message``, ``reply_to``); our calls
    carry their own future, so ``reply_to`` is always ``None``."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.reply_to = None


class SessionActor(TurnHost, DispatchedSupervisedActor):
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
    """

    # Slots: an idle session stays small (an instance dict of 40 keys is not shared).
    __slots__ = (
        "_closing_subs",
        "_compacting",
        "_compaction_ids",
        "_compaction_times",
        "_done",
        "_done_lock",
        "_feed_error",
        "_fut",
        "_loading",
        "_ready",
        "_shutting",
        "_store_ops",
        "_wake_sent",
        "_want_wake",
        "claim_token",
        "committer",
        "crash",
        "crash_on_store_failure",
        "failed",
        "inflight",
        "log",
        "next_seq",
        "parked",
        "released",
        "session_id",
        "store",
        "subscribers",
        "turns",
    )

    def __init__(
        self,
        session_id: str,
        log: Log | None = None,
        store: Store | None = None,
        ready: SessionFuture[None] | None = None,
        *,
        crash_on_store_failure: bool = False,
        dispatcher: Dispatcher | None = None,
        pinned: bool = False,
    ) -> None:
        super().__init__()
        telemetry.probe()
        if dispatcher is not None:
            self._use_dispatcher = dispatcher
        self._pin = pinned
        self.crash_on_store_failure = crash_on_store_failure
        self.session_id = session_id
        self.log = Log() if log is None else log
        self.store = store
        self.committer: Committer | None = None
        self.claim_token: str | None = None
        self.next_seq = self.log.count()
        self.inflight: deque[Event] = _NONE  # submitted to the store, not yet applied
        # Calls waiting for earlier commits (or the recovered log); made when first
        # needed (most sessions never park a call: an idle session stays small).
        self.parked: deque[tuple[Handler, tuple[Any, ...], SessionFuture[Any] | None]] = _NONE
        self.failed: StoreError | None = None
        self.subscribers: list[Subscription] = []
        self.turns: TurnTable | None = None  # made by the first turn (see TurnHost)
        self.crash: BaseException | None = None
        self._ready = ready
        self._fut: SessionFuture[Any] | None = None
        # Commits land here (committer thread) and are applied by the actor when it
        # next runs. The committer wakes the actor only when something waits for
        # them (a parked read, a subscriber) or a write failed: one wake per batch.
        self._done: list[tuple[tuple[Event, ...], StoreError | None]] = []
        self._done_lock = threading.Lock()
        self._want_wake = False
        self._wake_sent = False
        self._store_ops = 0  # submitted to the committer and not yet done
        self._shutting = False
        self._feed_error: SessionStopped | None = None  # how the feeds end, once stopped
        self._compacting: dict[str, SessionFuture[Any] | None] = {}  # summary being written
        self._compaction_ids: dict[str, int] | None = None  # id -> record seq, built on use
        # id -> [start, summariser start, summariser end] (time_ns), while telemetry is on
        self._compaction_times: dict[str, list[int]] | None = None
        self._loading = False  # the store is being read: calls wait in ``parked``
        # Subscribers of a stopped session that still wait for its appends in flight.
        self._closing_subs: list[Subscription] = []  # (a fresh list only when stopping)
        # Set once this session has let go of the store (its last append in flight
        # landed): a successor waits for it before it claims the session.
        self.released = Flag()
        setattr(self.actor_ref, "released", self.released)  # noqa: B010

    def on_start(self) -> None:
        if self.store is None:
            self._adopted(self.log)
            return
        # Claim and read the store off the dispatcher; the log arrives as h_adopt.
        self._loading = True
        with self._done_lock:
            self._store_ops += 1  # a stop meanwhile keeps the claim until this is back
        inbox = self.actor_inbox
        recover(
            self.store,
            self.session_id,
            lambda result: inbox.put(_Envelope((SessionActor.h_adopt, result, None))),
        )

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
            sink.recovered(self.session_id, outcome, retained, end - int(took * 1e9), end)
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
        # Fold once (messages are projected on the first read) so that every
        # later append keeps the surface current.
        log._folded()
        self.log = log
        self.next_seq = log.count()
        self._end_orphan_turn()
        ready, self._ready = self._ready, None  # answered: not kept by an idle session
        if ready is not None:
            ready._resolve(None)

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

    def _actor_loop_teardown(self) -> None:
        # Also for calls that land after the session stopped: each is answered.
        self._drain(SessionStopped(self.session_id, "the session stopped before this call"))
        super()._actor_loop_teardown()

    def _handle_receive(self, message: Any) -> Any:
        # Our calls first, before Pykka's chain of isinstance checks.
        if type(message) is tuple and len(message) == 3:
            try:
                return self.on_receive(message)
            except BaseException as exc:  # never let anything reach Pykka's handling
                if not self.actor_stopped.is_set():
                    self._die(exc)
                return None
        return super()._handle_receive(message)

    def on_receive(self, message: Any) -> Any:
        if type(message) is not tuple or len(message) != 3:
            return super().on_receive(message)
        handler, args, fut = message
        if self._done and not self._absorb():  # died of a store failure
            if fut is not None:
                fut._fail(SessionStopped(self.session_id, "the session crashed before this call"))
            return None
        # Calls run in arrival order. One that must see every earlier append
        # (a read, snapshot, compact, fork) waits for their commits, and every
        # call after it waits behind it.
        if handler is SessionActor.h_adopt:
            self._run(handler, args, fut)
        elif handler is not SessionActor.h_committed and (
            self.parked or self._loading or (self.inflight and handler in _WAIT_FOR_COMMITS)
        ):
            self._park().append((handler, args, fut))
        else:
            self._run(handler, args, fut)
        if bool(self.parked or self.subscribers) is not self._want_wake:
            self._sync_wake()
        return None

    def _park(self) -> deque[tuple[Handler, tuple[Any, ...], SessionFuture[Any] | None]]:
        parked = self.parked
        if parked is _NONE:
            parked = self.parked = deque()
        return parked

    def _sync_wake(self) -> None:
        """Tell the committer whether to wake this actor on commit (someone waits)."""
        want = bool(self.parked or self.subscribers)
        with self._done_lock:
            self._want_wake = want
            send = want and bool(self._done) and not self._wake_sent
            if send:
                self._wake_sent = True
        if send:
            self.actor_ref.tell((SessionActor.h_committed, (), None))

    def _run(
        self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any] | None
    ) -> None:
        if self.turns is not None and self._turn_holds(handler, args, fut):
            return  # a write waiting for the open turn: run when it ends
        self._fut = fut
        try:
            result = handler(self, *args)
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

    def on_stop(self) -> None:
        self._shut(SessionStopped(self.session_id, "the session stopped before this call"), None)

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
        """Answer everything still waiting and let go of the store (after ``actor_stopped``)."""
        self._drain(err)
        self._turns_shut(err)
        if self._ready is not None:  # stopped while recovering: its openers are told
            self._ready._fail(err)
        while self.parked:
            fut = self.parked.popleft()[2]
            if fut is not None:
                fut._fail(err)
        for fut in self._compacting.values():
            if fut is not None:
                fut._fail(err)
        self._compacting.clear()
        # Keep the writer claim until the work still with the committer (appends,
        # snapshot drops) is done: a successor must not recover the store first.
        # Subscribers get every append that commits meanwhile, then their end.
        subs, self.subscribers = self.subscribers, []
        with self._done_lock:
            self._shutting = True
            self._feed_error = feed_error
            idle = self._store_ops == 0
            done, self._done = self._done, []
            for events, failed in done:
                if failed is None:
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
            if not idle:
                self._closing_subs = subs
                subs = []
        for sub in subs:
            sub._finish(feed_error)
        if idle:
            self._release_claim()

    def _store_op_done(self) -> None:
        """One submitted store operation finished (committer thread). If the session
        stopped meanwhile and this was the last, give up the claim now: before the
        caller's acknowledgement, so whoever saw it can reopen the session at once."""
        with self._done_lock:
            self._store_ops -= 1
            last = self._shutting and self._store_ops == 0
        if last:
            self._last_op_done()

    def _last_op_done(self) -> None:
        """The stopped session's last store operation is done: end the feeds that
        waited for it and give up the claim."""
        with self._done_lock:
            subs, self._closing_subs = self._closing_subs, []
        for sub in subs:
            sub._finish(self._feed_error)
        self._release_claim()

    def _release_claim(self) -> None:
        """Give up the claim, then set ``released`` (a successor waits for it)."""
        store, token, self.claim_token = self.store, self.claim_token, None
        if store is None or token is None:
            self.released.set()
        else:
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
            self.released.set()

    def _drain(self, err: SessionStopped) -> None:
        """Answer every call still in the inbox (run only after ``actor_stopped`` is set)."""
        inbox = self.actor_inbox
        while not inbox.empty():
            envelope = inbox.get()
            msg = envelope.message
            if type(msg) is tuple and len(msg) == 3 and msg[0] is SessionActor.h_adopt:
                # The store was read for a session that stopped meanwhile: let go of it.
                token = msg[1][0]
                if token is not None and self.store is not None:
                    release(self.store, self.session_id, token)
                self._loading = False
                self._store_op_done()
            elif type(msg) is tuple and len(msg) == 3 and isinstance(msg[2], SessionFuture):
                msg[2]._fail(err)
            elif envelope.reply_to is not None:
                try:
                    envelope.reply_to.set_exception(
                        (pykka.ActorDeadError, pykka.ActorDeadError(str(err)), None)
                    )
                except Exception:  # already answered
                    pass

    # -- writes ----------------------------------------------------------------------------

    def _submit(self, events: tuple[Event, ...], result: Any) -> Any:
        """Commit ``events`` (one atomic batch) and answer the current call with ``result``."""
        self.next_seq = events[-1].seq + 1
        sink = telemetry.sink
        if sink is not None:
            sink.appended(len(events))
        committer = self.committer
        if committer is None:
            for ev in events:
                self._apply(ev)
            return result
        inflight = self.inflight
        if inflight is _NONE:
            inflight = self.inflight = deque()
        inflight.extend(events)
        with self._done_lock:
            self._store_ops += 1
        committer.submit(
            self.session_id, events, partial(self._on_commit, events, self._fut, result)
        )
        return _DEFER

    def _on_commit(
        self,
        events: tuple[Event, ...],
        fut: SessionFuture[Any] | None,
        result: Any,
        err: StoreError | None,
    ) -> None:
        # In the committer's thread. Order matters:
        # 1. record the commit for the actor, which applies it when it next runs;
        # 2. if the session stopped meanwhile and this was its last append in
        #    flight, give up the writer claim *before* acknowledging, so that
        #    whoever saw the acknowledgement can reopen the session at once;
        # 3. acknowledge; 4. wake the actor only if something waits for the
        #    commit (a parked read, a subscriber) or the write failed.
        with self._done_lock:
            self._store_ops -= 1
            last = self._shutting and self._store_ops == 0
            if self._shutting:  # stopped: nobody applies it; its feeds still get it
                wake = False
                if err is None and self._closing_subs:
                    subs = self._closing_subs
                    for ev in events:
                        subs = [s for s in subs if s._push(ev)]
                    self._closing_subs = subs
            else:
                self._done.append((events, err))
                wake = (self._want_wake or err is not None) and not self._wake_sent
                if wake:
                    self._wake_sent = True
        try:
            if last:
                self._last_op_done()
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
        if self.subscribers:
            self.subscribers = [s for s in self.subscribers if s._push(ev)]
        if ev.type is EventType.STEP_END and self._compaction_ids is not None:
            cid = _compaction_id_of(ev)
            if cid is not None:
                self._compaction_ids[cid] = ev.seq

    def _absorb(self) -> bool:
        """Apply the commits that landed; ``False`` if a failed one stopped the session."""
        with self._done_lock:
            done, self._done = self._done, []
            self._wake_sent = False
        for events, err in done:
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

    def h_committed(self) -> None:
        if self._done and not self._absorb():
            return
        parked = self.parked
        while parked and not (self.inflight and parked[0][0] in _WAIT_FOR_COMMITS):
            handler, args, fut = parked.popleft()
            self._run(handler, args, fut)

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise StoreError(
                f"refuses appends after a store failure ({self.failed}); "
                "restart the session to reload it from the store",
                session_id=self.session_id,
            )

    def h_append(self, parts: EventParts) -> Any:
        """Append an event the caller's thread already checked and froze."""
        self._check_writable()
        ev = Event._trusted(self.next_seq, *parts)
        return self._submit((ev,), ev)

    def h_append_many(self, batch: tuple[EventParts, ...]) -> Any:
        """Append several checked events under consecutive seqs, as one atomic commit."""
        self._check_writable()
        if not batch:
            return []
        first = self.next_seq
        events = tuple(Event._trusted(first + k, *parts) for k, parts in enumerate(batch))
        return self._submit(events, list(events))

    def h_append_at(self, seq: int, parts: EventParts) -> Any:
        self._check_writable()
        if seq < self.next_seq:
            raise _behind_head(seq, self.next_seq)
        ev = Event._trusted(seq, *parts)
        return self._submit((ev,), ev)

    def h_snapshot(self) -> Any:
        before = self.log.events()
        self.log = self.log.snapshot()
        kept = {ev.seq for ev in self.log.events()}
        dropped = [ev.seq for ev in before if ev.seq not in kept]
        if self.committer is None or not dropped:
            return len(dropped)
        fut = self._fut

        def done(err: StoreError | None) -> None:
            self._store_op_done()
            if fut is not None:
                if err is None:
                    fut._resolve(len(dropped))
                else:
                    fut._fail(err)

        with self._done_lock:
            self._store_ops += 1
        self.committer.submit_drop(self.session_id, dropped, done)
        return _DEFER

    # -- compaction: planned here, summarised elsewhere, committed here ---------------------

    def h_compact(self, req: _Compaction) -> Any:
        try:
            return self._compact(req)
        finally:
            if req.slot is not None:  # no summary asked of it (a no-op once it was)
                req.slot.release()

    def _compact(self, req: _Compaction) -> Any:
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:
            return known
        c = req.compactor
        plan = c.plan(self.log.surface(), self.log.count(), force=req.force)
        if plan.empty:
            return CompactionResult(self.log._view(), plan.before, plan.before, budget=c.budget)
        if telemetry.sink is not None:  # timed from its first plan (retries included)
            times = self._compaction_times
            if times is None:
                times = self._compaction_times = {}
            times.setdefault(req.cid, [time.time_ns(), 0, 0])
        if not plan.needs_summary:
            return self._commit_compaction(req, plan, None)
        fut = self._fut
        self._compacting[req.cid] = fut
        try:
            self._summarise(req, plan, fut)
        except BaseException:
            self._compacting.pop(req.cid, None)
            raise
        return _DEFER

    def _summarise(self, req: _Compaction, plan: Plan, fut: SessionFuture[Any] | None) -> None:
        """Have the summary written off this actor, then sent back to it.

        A coroutine summariser runs on the caller's event loop when the call came
        from one, else (like a plain callable) in a thread of its own.
        """
        ref = self.actor_ref
        times = self._compaction_times
        if times is not None and req.cid in times:
            times[req.cid][1] = time.time_ns()

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

    def h_compact_summary(
        self, req: _Compaction, plan: Plan, summary: Any, exc: BaseException | None
    ) -> Any:
        self._compacting.pop(req.cid, None)
        times = self._compaction_times
        if times is not None and req.cid in times:
            times[req.cid][2] = time.time_ns()
            if exc is not None:  # not recorded: not reported
                self._report_compaction(req.cid, report=False)
        if exc is not None:
            if isinstance(exc, CompactionError):
                raise exc
            raise CompactionError(
                f"the summariser failed: {type(exc).__name__}: {_safe_str(exc)}; log unchanged"
            ) from exc
        return self._commit_compaction(req, plan, summary)

    def _commit_compaction(self, req: _Compaction, plan: Plan, summary: Any) -> Any:
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:  # applied already: at most once
            return known
        clash = plan.overlaps(self.log.since(plan.count))
        if clash is not None:
            if req.attempt < MAX_COMPACTION_RETRIES:
                logger.info(
                    "session.compaction_retried",
                    session_id=self.session_id,
                    compaction_id=req.cid,
                    reason="overlapping_replace",
                    seq=clash.seq,
                )
                return self.h_compact(dataclasses.replace(req, attempt=req.attempt + 1))
            raise CompactionError(
                f"a replace appended while the summary was written (seq {clash.seq}) overlaps "
                f"the compaction's range, {req.attempt + 1} times; compact again later"
            )
        specs, result = req.compactor.events(plan, summary, self.next_seq, req.cid)
        t = _utcnow() if req.time is None else req.time
        events = tuple(
            new_event(self.next_seq + k, etype, data, t) for k, (etype, data) in enumerate(specs)
        )
        fut, self._fut = self._fut, None  # answered once applied, not once committed
        self._submit(events, None)
        if self.inflight:
            self._park().append((SessionActor.h_compact_done, (result, req.compactor), fut))
            return _DEFER
        return self.h_compact_done(result, req.compactor)

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
        self._report_compaction(result.compaction_id)
        return out

    def _report_compaction(self, cid: str | None, *, report: bool = True) -> None:
        times = self._compaction_times
        if times is None or cid is None:
            return
        started = times.pop(cid, None)
        if not times:
            self._compaction_times = None
        sink = telemetry.sink
        if started is None or sink is None or not report:
            return
        start, summary_start, summary_end = started
        summary = (summary_start, summary_end) if summary_end else None
        sink.compacted(self.session_id, start, time.time_ns(), summary)

    def _known_compaction(self, req: _Compaction) -> CompactionResult | None:
        """The result of compaction ``req.cid`` if it is in the log already (only an id
        the caller chose can be: a fresh one is looked up nowhere)."""
        if not req.explicit:
            return None
        cid = req.cid
        ids = self._compaction_ids
        if ids is None:  # first use: index the compaction records in the log
            ids = {}
            for ev in self.log.events():
                if ev.type is EventType.STEP_END:
                    found = _compaction_id_of(ev)
                    if found is not None:
                        ids[found] = ev.seq
            self._compaction_ids = ids
        seq = ids.get(cid)
        if seq is None:
            return None
        rec = self.log.since(seq)[:1]
        data: Any = rec[0].data if rec and rec[0].seq == seq else {}
        summarised = data.get("summarised")
        return CompactionResult(
            self.log._view(),
            data.get("estimate_before", 0),
            data.get("estimate_after", 0),
            tuple(data.get("pruned") or ()),
            tuple(summarised) if summarised else None,
            data.get("summary_seq"),
            seq,
            cid,
            data.get("budget"),
        )

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

    # -- reads -----------------------------------------------------------------------------

    def h_subscribe(self, sub: Subscription, from_seq: int) -> Subscription:
        sub._catch_up(self.log.since(from_seq))
        self.subscribers.append(sub)
        return sub

    def h_unsubscribe(self, sub: Subscription) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)

    def h_read(self, name: str, *args: Any) -> Any:
        return getattr(self.log, name)(*args)

    def h_log(self) -> Log:
        return self.log._view()

    def h_ping(self) -> None:
        return None

    def h_flush(self) -> None:
        """Answered once every append made before it is committed (a barrier)."""
        return None

    def busy(self) -> str | None:
        """Why this session cannot be handed to another process now (``None``: it is
        idle: nothing in flight, nothing waiting, no compaction being written)."""
        if self._loading:
            return "recovering"
        if self.inflight or self._store_ops:
            return "a commit is in flight"
        if self.parked:
            return "calls are waiting"
        if self._compacting:
            return "a compaction is being written"
        if self.turns is not None:
            return "a turn is open"
        return None

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
        self._stop()
        return True


# Calls that must see every append made before them (they wait for its commit).
_WAIT_FOR_COMMITS: Final = frozenset(
    {
        SessionActor.h_read,
        SessionActor.h_log,
        SessionActor.h_snapshot,
        SessionActor.h_compact,
        SessionActor.h_compact_summary,
        SessionActor.h_compact_done,
        SessionActor.h_fork,
        SessionActor.h_flush,
        SessionActor.h_turn_read,
    }
)


def _flush_at_exit(deadline: float) -> None:
    """Every append whose call had returned is committed before the process goes."""
    futures: list[SessionFuture[Any]] = []
    for ref in pykka.ActorRegistry.get_by_class(SessionActor):
        actor = ref.actor_inbox._actor  # type: ignore[attr-defined]
        if not isinstance(actor, SessionActor) or (actor.committer is None and not actor._loading):
            continue  # no store: nothing to make durable
        fut: SessionFuture[Any] = SessionFuture(actor.session_id, FLUSH_TIMEOUT)
        try:
            ref.actor_inbox.put(_Envelope((SessionActor.h_flush, (), fut)))  # type: ignore[arg-type]
        except Exception:
            continue
        futures.append(fut)
    for fut in futures:
        try:
            fut.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            continue


FLUSH_TIMEOUT: Final = 2.0
at_exit(_flush_at_exit)


def _compaction_id_of(ev: Event) -> str | None:
    data = ev.data
    if data.get("step") != "compaction":
        return None
    cid = data.get("compaction_id")
    return cid if isinstance(cid, str) else None


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def _run_awaitable(aw: Any) -> Any:
    async def wait() -> Any:
        return await aw

    return asyncio.run(wait())


_safe_str = safe_str


def _crashed(session_id: str, exc: BaseException) -> SessionCrashed:
    err = SessionCrashed(session_id, f"crashed with {type(exc).__name__}: {_safe_str(exc)}")
    err.__cause__ = exc
    return err
