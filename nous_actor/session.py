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
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from time import monotonic
from typing import Any, Final, TypeVar

import pykka

from nous_actor._frozen import safe_str
from nous_actor._log import get_logger
from nous_actor.committer import Committer, committer_for
from nous_actor.compaction import (
    CompactionError,
    CompactionResult,
    Compactor,
    Plan,
    log_compacted,
    new_compaction_id,
    run_summariser,
)
from nous_actor.errors import (
    CallTimeout,
    ConflictError,
    NousActorError,
    SessionCrashed,
    SessionStopped,
    StoreError,
)
from nous_actor.event import (
    EVENT_TYPE_OF,
    Event,
    EventType,
    InvalidEvent,
    check_event,
    type_text,
)
from nous_actor.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.ids import check_session_id
from nous_actor.log import Log, _behind_head, _seed_data, _utcnow, as_message, new_event
from nous_actor.message import Message
from nous_actor.store.base import Store
from nous_actor.subscription import DEFAULT_BUFFER, Subscription
from nous_actor.supervision import ChildSpec, RestartType, SupervisedActor

__all__ = ["Session", "SessionActor"]

logger = get_logger(__name__)

T = TypeVar("T")
Handler = Callable[..., Any]


_DEFER: Any = object()  # a handler's result meaning "the future is answered later"

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


class _Envelope:
    """What Pykka's actor loop reads from the inbox (``message``, ``reply_to``); our calls
    carry their own future, so ``reply_to`` is always ``None``."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.reply_to = None


class SessionActor(SupervisedActor):
    """The actor that owns one session's log. Use it through `Session`.

    Every message is ``(handler, args, future)``: the actor runs
    ``handler(self, *args)`` and answers ``future`` itself, so nothing it
    raises ever reaches Pykka's failure handling.

    With a store, an append is validated and given its seq at once, handed to
    the store's committer, and acknowledged (its future resolved) only once it
    is committed. Reads and snapshots wait until every append made before
    them is committed, so a caller always reads its own acknowledged writes
    and never an event the store does not hold.
    """

    @staticmethod
    def _create_actor_inbox() -> Any:
        # Pykka's inbox is a queue.Queue (a Python-level lock and condition per
        # put/get); SimpleQueue has the same put/get/empty in C, which matters
        # when many callers pipeline appends into one session.
        return queue.SimpleQueue()

    def __init__(
        self,
        session_id: str,
        log: Log | None = None,
        store: Store | None = None,
        ready: SessionFuture[None] | None = None,
        *,
        crash_on_store_failure: bool = False,
    ) -> None:
        super().__init__()
        self.crash_on_store_failure = crash_on_store_failure
        self.session_id = session_id
        self.log = Log() if log is None else log
        self.store = store
        self.committer: Committer | None = None
        self.claim_token: str | None = None
        self.next_seq = self.log.count()
        self.inflight: deque[Event] = deque()  # submitted to the store, not yet applied
        self.parked: deque[tuple[Handler, tuple[Any, ...], SessionFuture[Any] | None]] = deque()
        self.failed: StoreError | None = None
        self.subscribers: list[Subscription] = []
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
        self._compacting: dict[str, SessionFuture[Any] | None] = {}  # summary being written
        self._compaction_ids: dict[str, int] | None = None  # id -> record seq, built on use
        # Set once this session has let go of the store (its last append in flight
        # landed): a successor waits for it before it claims the session.
        self.released = threading.Event()
        setattr(self.actor_ref, "released", self.released)  # noqa: B010

    def on_start(self) -> None:
        try:
            if self.store is not None:
                self.claim_token = self.store.claim(self.session_id)
                self.committer = committer_for(self.store)
                self.committer.reset(self.session_id)
                log = Log.restore(self.store.load(self.session_id))
                self.log = log
                if log.count():
                    logger.info(
                        "session.recovered",
                        session_id=self.session_id,
                        reason="loaded_from_store",
                        events=len(log.events()),
                        count=log.count(),
                    )
            # Fold once (messages are projected on the first read) so that every
            # later append keeps the surface current.
            self.log._folded()
            self.next_seq = self.log.count()
        except BaseException as exc:
            self._die(exc, "session.start_failed")
            if self._ready is not None:
                self._ready._fail(exc)
            return
        if self._ready is not None:
            self._ready._resolve(None)

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
        if handler is not SessionActor.h_committed and (
            self.parked or (self.inflight and handler in _WAIT_FOR_COMMITS)
        ):
            self.parked.append((handler, args, fut))
        else:
            self._run(handler, args, fut)
        if bool(self.parked or self.subscribers) is not self._want_wake:
            self._sync_wake()
        return None

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
        self._fut = fut
        try:
            result = handler(self, *args)
        except Exception as exc:
            if fut is not None:
                fut._fail(exc)
        except BaseException as exc:  # contain it: only this session stops
            if fut is not None:  # first: this call crashed it (it did not miss it)
                fut._fail(_crashed(self.session_id, exc))
            self._die(exc)
        else:
            if fut is not None and result is not _DEFER:
                fut._resolve(result)

    def on_stop(self) -> None:
        self._shut(SessionStopped(self.session_id, "the session stopped before this call"), None)

    def _die(self, exc: BaseException, event: str = "session.crashed") -> None:
        self.crash = exc
        if self.exit_reason is None:
            self.exit_reason = exc
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
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
        while self.parked:
            fut = self.parked.popleft()[2]
            if fut is not None:
                fut._fail(err)
        for fut in self._compacting.values():
            if fut is not None:
                fut._fail(err)
        self._compacting.clear()
        for sub in self.subscribers:
            sub._finish(feed_error)
        self.subscribers.clear()
        # Keep the writer claim until the work still with the committer (appends,
        # snapshot drops) is done: a successor must not recover the store first.
        with self._done_lock:
            self._shutting = True
            idle = self._store_ops == 0
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
            self._release_claim()

    def _release_claim(self) -> None:
        try:
            if self.store is not None and self.claim_token is not None:
                token, self.claim_token = self.claim_token, None
                try:
                    self.store.release(self.session_id, token)
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
            if type(msg) is tuple and len(msg) == 3 and isinstance(msg[2], SessionFuture):
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
        committer = self.committer
        if committer is None:
            for ev in events:
                self._apply(ev)
            return result
        self.inflight.extend(events)
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
            self._done.append((events, err))
            self._store_ops -= 1
            last = self._shutting and self._store_ops == 0
            wake = (self._want_wake or err is not None) and not self._wake_sent
            if wake:
                self._wake_sent = True
        try:
            if last:
                self._release_claim()
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
                if self.crash_on_store_failure:  # a supervisor restarts it from the store
                    self._die(err)
                    return False
        return True

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
        self._check_writable()
        known = self._known_compaction(req)
        if known is not None:
            return known
        c = req.compactor
        plan = c.plan(self.log.surface(), self.log.count(), force=req.force)
        if plan.empty:
            return CompactionResult(self.log._view(), plan.before, plan.before, budget=c.budget)
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

        def deliver(summary: Any, exc: BaseException | None) -> None:
            try:
                ref.tell((SessionActor.h_compact_summary, (req, plan, summary, exc), fut))
            except pykka.ActorDeadError:
                if fut is not None:  # the session stopped while the summary was written
                    fut._fail(SessionStopped(self.session_id, "the session stopped"))

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
        threading.Thread(target=work, name=name, daemon=True).start()

    def h_compact_summary(
        self, req: _Compaction, plan: Plan, summary: Any, exc: BaseException | None
    ) -> Any:
        self._compacting.pop(req.cid, None)
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
            self.parked.append((SessionActor.h_compact_done, (result, req.compactor), fut))
            return _DEFER
        return self.h_compact_done(result, req.compactor)

    def h_compact_done(self, result: CompactionResult, compactor: Compactor) -> CompactionResult:
        record = self.log.since(result.record_seq or 0)[:1]
        if not record or record[0].seq != result.record_seq:
            raise self.failed or StoreError(
                "the compaction was not stored", session_id=self.session_id
            )
        if compactor.snapshot:  # runs next, before any later call
            self.parked.appendleft((SessionActor.h_snapshot, (), None))
            self.actor_ref.tell((SessionActor.h_committed, (), None))
        out = dataclasses.replace(result, log=self.log._view())
        log_compacted(out, session_id=self.session_id)
        return out

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
    }
)


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


async def _off_loop(fn: Callable[[], T]) -> T:
    """Run a blocking call of the library in the loop's default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _run_awaitable(aw: Any) -> Any:
    async def wait() -> Any:
        return await aw

    return asyncio.run(wait())


_safe_str = safe_str


def _crashed(session_id: str, exc: BaseException) -> SessionCrashed:
    err = SessionCrashed(session_id, f"crashed with {type(exc).__name__}: {_safe_str(exc)}")
    err.__cause__ = exc
    return err


def _check_seq(seq: object, what: str) -> None:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"{what} takes an int seq, got {type(seq).__name__}")
    if seq < 0:
        raise ValueError(f"{what} takes a seq >= 0, got {seq}")


def _check_handle_args(session_id: object, timeout: object) -> None:
    check_session_id(session_id)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


class Session:
    """The handle to one session; every method returns a `SessionFuture`.

    Get a handle with `Session.start` (a standalone session) or from a
    supervisor's registry (which restarts sessions and re-resolves handles).

    >>> chat = Session.start("chat-42")
    >>> chat.append("user_message", {"content": "hi"}).get().seq
    0
    >>> [m.content for m in chat.derive_messages().get()]
    ['hi']
    >>> chat.stop()

    Args:
        session_id: the session's id.
        resolve: returns the live actor of the session (called again when the
            actor it returned last has stopped, so a restarted session is found).
        timeout: the default bound, in seconds, of every wait on a result.
    """

    __slots__ = ("_ref", "_resolve", "_touch", "session_id", "timeout")

    def __init__(
        self,
        session_id: str,
        resolve: Callable[[], pykka.ActorRef[SessionActor]],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        touch: Callable[[], None] | None = None,
    ) -> None:
        _check_handle_args(session_id, timeout)
        self.session_id = session_id
        self.timeout = float(timeout)
        self._resolve = resolve
        self._touch = touch
        self._ref: pykka.ActorRef[SessionActor] | None = None

    @classmethod
    def start(
        cls,
        session_id: str,
        log: Log | None = None,
        *,
        store: Store | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Session:
        """Start a standalone session and return its handle once it is running.

        Without a store the session holds ``log`` (or an empty log) in memory.
        With a ``store`` it claims the session as its one writer, recovers
        every stored event (seqs, times, snapshot gaps as stored), and from
        then on acknowledges an append only after the store committed it.

        A standalone session is not restarted: once stopped, its calls fail with
        `nous_actor.SessionStopped`.

        Raises:
            ValueError, TypeError: bad arguments (nothing is started).
            ConflictError: another live writer holds the session in ``store``.
            StoreError: the store failed while recovering the session.
        """
        _check_handle_args(session_id, timeout)
        if log is not None and not isinstance(log, Log):
            raise TypeError(f"log must be a nous_actor.Log, got {type(log).__name__}")
        if store is not None:
            if log is not None:
                raise ValueError(
                    "pass either log= or store=: a session on a store recovers its log from it"
                )
            if not isinstance(store, Store):
                raise TypeError(
                    f"store must implement nous_actor.store.Store, got {type(store).__name__}"
                )
        ready: SessionFuture[None] = SessionFuture(session_id, timeout)
        ref = SessionActor.start(session_id, log, store, ready)
        try:
            ready.get()
        except BaseException:
            ref.stop(block=False)
            raise
        return cls(session_id, lambda: ref, timeout=timeout)

    @classmethod
    def child(
        cls,
        session_id: str,
        *,
        store: Store,
        child_id: str | None = None,
        restart: RestartType = "permanent",
        shutdown_timeout: float = 5.0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> tuple[Session, ChildSpec]:
        """A session to run under a `Supervisor` of your own: its handle and its spec.

        Put the `ChildSpec` in the supervisor's children. Every start of it (the
        first and each restart) starts a `SessionActor` that claims the session
        and recovers it from ``store``; a store failure after which memory and
        disk may disagree crashes it, so that the supervisor restarts it from
        the store. The handle reaches whichever actor is current: a call made
        while the session is down fails with `SessionStopped`, later calls
        reach the restarted session.

        Raises:
            ValueError, TypeError: bad arguments.
        """
        _check_handle_args(session_id, timeout)
        if not isinstance(store, Store):
            raise TypeError(
                f"store must implement nous_actor.store.Store, got {type(store).__name__}"
            )
        current: list[pykka.ActorRef[SessionActor] | None] = [None]
        started = threading.Event()

        def start() -> pykka.ActorRef[SessionActor]:
            ref = SessionActor.start(session_id, None, store, None, crash_on_store_failure=True)
            current[0] = ref
            started.set()
            return ref

        def resolve() -> pykka.ActorRef[SessionActor]:
            # The first start is waited for (bounded); a stopped actor is returned as
            # it is (the call fails with SessionStopped; a later one finds the next).
            started.wait(timeout)
            ref = current[0]
            if ref is None:
                raise SessionStopped(
                    session_id, f"its supervisor has not started it within {timeout:g} s"
                )
            return ref

        spec = ChildSpec(child_id or session_id, start, restart, shutdown_timeout)
        return cls(session_id, resolve, timeout=timeout), spec

    # -- plumbing ------------------------------------------------------------------------

    def _actor(self) -> pykka.ActorRef[SessionActor] | None:
        ref = self._ref
        if ref is None or ref.actor_stopped.is_set():
            ref = self._resolve()
            self._ref = ref
        return ref

    def _failed(self, exc: BaseException) -> SessionFuture[Any]:
        fut: SessionFuture[Any] = SessionFuture(self.session_id, self.timeout)
        fut._fail(exc)
        return fut

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        fut: SessionFuture[Any] = SessionFuture(self.session_id, self.timeout)
        if self._touch is not None:
            self._touch()
        try:
            ref = self._actor()
        except NousActorError as exc:  # the registry could not (re)open it
            fut._fail(exc)
            return fut
        if ref is None:
            fut._fail(SessionStopped(self.session_id, "the session is stopped"))
            return fut
        stopped = ref.actor_stopped
        if stopped.is_set():
            fut._fail(SessionStopped(self.session_id, "the session is stopped"))
            return fut
        ref.actor_inbox.put(_Envelope((handler, args, fut)))  # type: ignore[arg-type]
        # Pykka's stop race: the actor may have stopped between the liveness
        # check and the put, after its last look at the inbox. If it is dead
        # now, nobody will answer: answer ourselves (a no-op if it did answer).
        if stopped.is_set():
            fut._fail(SessionStopped(self.session_id, "the session stopped before this call"))
        return fut

    # -- writes --------------------------------------------------------------------------

    def append(
        self, type: EventType | str, data: Any = None, time: datetime | None = None
    ) -> SessionFuture[Event]:
        """Append one event; the future resolves to it, with its seq.

        ``data`` is checked and deeply frozen here, in the caller's thread, before
        this returns: mutating the dict afterwards never changes what is stored,
        also while the append is still in flight. With a store, the future
        resolves only once the event is durably committed.

        Raises (through the future):
            InvalidEvent: the event is refused; nothing changed, the session runs on.
            SessionStopped: the session is stopped; nothing changed.
        """
        try:
            parts = check_event(0, type, _utcnow() if time is None else time, data)
        except InvalidEvent as exc:
            return self._failed(exc)
        return self._call(SessionActor.h_append, parts)

    def append_many(
        self, events: Iterable[tuple[EventType | str, Any] | tuple[EventType | str, Any, datetime]]
    ) -> SessionFuture[list[Event]]:
        """Append ``(type, data)`` or ``(type, data, time)`` items under consecutive seqs,
        as one batch: with a store, they commit in one transaction (all stored or
        none), and no other call's events come between them. The future resolves
        to the events, in order, once they are committed.

        Every item is checked and frozen here, before anything is sent.

        Raises (through the future):
            InvalidEvent: an item is refused (the message names its index); nothing
                was appended.
            TypeError: an item is not such a tuple; nothing was appended.
        """
        batch: list[EventParts] = []
        try:
            for i, item in enumerate(events):
                if not isinstance(item, tuple) or len(item) not in (2, 3):
                    raise TypeError(
                        f"append_many takes (type, data) or (type, data, time) tuples; "
                        f"item {i} is {type(item).__name__}"
                    )
                t = item[2] if len(item) == 3 else None
                try:
                    batch.append(check_event(0, item[0], _utcnow() if t is None else t, item[1]))
                except InvalidEvent as exc:
                    raise InvalidEvent(exc.reason, f"item {i}: {exc}") from None
        except (TypeError, InvalidEvent) as exc:
            return self._failed(exc)
        return self._call(SessionActor.h_append_many, tuple(batch))

    def append_message(self, message: Message | Mapping[str, Any]) -> SessionFuture[Event]:
        """Append a `Message`, or an OpenAI chat-completions message dict, as one surface
        event whose type follows the role (see `Log.append_message`); the future
        resolves to the event.

        Raises (through the future):
            ValueError: a dict that is not an OpenAI message (naming the field).
            TypeError: neither a `Message` nor a mapping.
            InvalidEvent: the message holds what JSON cannot carry.
        """
        try:
            m = as_message(message)
        except (TypeError, ValueError) as exc:
            return self._failed(exc)
        return self.append(EVENT_TYPE_OF[m.role], _seed_data(m), m.created_at)

    def append_or_log(
        self, type: EventType | str, data: Any = None, time: datetime | None = None
    ) -> SessionFuture[Event | None]:
        """Like `append`, but a refused event resolves to ``None``.

        The drop is a structlog warning ``log.event_dropped`` with ``session_id``,
        ``type`` and ``reason``; it is never silent. Never raises for bad input.
        """
        try:
            parts = check_event(0, type, _utcnow() if time is None else time, data)
        except InvalidEvent as exc:
            logger.warning(
                "log.event_dropped",
                session_id=self.session_id,
                type=type_text(type),
                reason=exc.reason,
                error=str(exc),
            )
            fut: SessionFuture[Event | None] = SessionFuture(self.session_id, self.timeout)
            fut._resolve(None)
            return fut
        return self._call(SessionActor.h_append, parts)

    def append_at(
        self, seq: int, type: EventType | str, data: Any = None, time: datetime | None = None
    ) -> SessionFuture[Event]:
        """Restore an event under its persisted ``seq`` (see `Log.append_at`).

        Raises (through the future):
            InvalidEvent: the event is refused (``seq_behind_head`` if ``seq`` is
                below the session's next seq).
        """
        try:
            parts = check_event(seq, type, _utcnow() if time is None else time, data)
        except InvalidEvent as exc:
            return self._failed(exc)
        return self._call(SessionActor.h_append_at, int.__int__(seq), parts)

    def snapshot(self) -> SessionFuture[int]:
        """Drop every shadowed event; resolves to how many were dropped."""
        return self._call(SessionActor.h_snapshot)

    def compact(
        self,
        compactor: Compactor,
        *,
        time: datetime | None = None,
        force: bool = False,
        compaction_id: str | None = None,
    ) -> SessionFuture[CompactionResult]:
        """Run ``compactor`` on the session's log (see `nous_actor.Compactor`).

        The session plans the compaction on its log as it stands after every
        earlier call, then the summary is written **off the session's actor**: a
        plain summariser in a thread of its own, a coroutine summariser on the
        event loop this was called from (or a thread of its own outside a loop).
        Meanwhile the session answers its other calls. Then the prunes, the
        summary and the record commit as one atomic batch — valid whatever was
        appended meanwhile, since a replace never shadows later events — unless
        a replace appended meanwhile overlaps its range: then it is planned
        again (at most ``MAX_COMPACTION_RETRIES`` times), never applied over it.
        The future resolves to the `nous_actor.CompactionResult` once the
        batch is committed and applied. With ``compactor.snapshot`` the session
        snapshots right after.

        ``compaction_id`` (default: a fresh one) is recorded with the compaction;
        a compaction whose id is already in the log is not applied again: the
        future resolves to what that one did (so a retried call applies once).

        Raises (through the future):
            CompactionError: nothing was appended (an empty summary, a summariser
                that failed, an overlap that persisted).
        """
        if not isinstance(compactor, Compactor):
            raise TypeError(
                f"compact() takes a nous_actor.Compactor, got {type(compactor).__name__}"
            )
        explicit = compaction_id is not None
        if explicit and (not isinstance(compaction_id, str) or not compaction_id.strip()):
            raise ValueError(f"compaction_id must be a non-empty str, got {compaction_id!r}")
        if time is not None:
            try:
                check_event(0, "step_end", time, None)
            except InvalidEvent as exc:
                return self._failed(exc)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return self._call(
            SessionActor.h_compact,
            _Compaction(
                compactor, time, force, compaction_id or new_compaction_id(), explicit, loop
            ),
        )

    def fork(self, through_seq: int, new_id: str | None = None) -> SessionFuture[Log]:
        """The prefix through ``through_seq`` as a new log, seqs preserved.

        With a store and ``new_id``, the prefix is also written to the store as
        session ``new_id``, followed by a ``request_header`` event recording
        ``{"forked_from": {"session_id", "through_seq"}}``; open it like any
        session. The parent is never changed.

        Raises (through the future):
            ValueError: the boundary is negative, past the head, or inside an open turn.
            ConflictError: ``new_id`` already has events.
        """
        if new_id is not None:
            check_session_id(new_id, "new_id")
        return self._call(SessionActor.h_fork, through_seq, new_id)

    def as_of(self, seq: int) -> SessionFuture[Log]:
        """The log as it was right after event ``seq`` (see `Log.as_of`)."""
        return self._call(SessionActor.h_read, "as_of", seq)

    # -- reads ---------------------------------------------------------------------------

    def derive_messages(self) -> SessionFuture[list[Message]]:
        """The model-visible messages (a fresh list, the caller's)."""
        return self._call(SessionActor.h_read, "derive_messages")

    def derive_indexed(self) -> SessionFuture[list[tuple[int, Message]]]:
        """``(seq, message)`` pairs of the surface."""
        return self._call(SessionActor.h_read, "derive_indexed")

    def surface(self) -> SessionFuture[list[Event]]:
        """The surface events, in position order."""
        return self._call(SessionActor.h_read, "surface")

    def events(self) -> SessionFuture[list[Event]]:
        """Every retained event, oldest first."""
        return self._call(SessionActor.h_read, "events")

    def since(self, seq: int) -> SessionFuture[list[Event]]:
        """Retained events with ``seq >= seq``.

        Raises:
            TypeError: ``seq`` is not an int (raised here, before anything is sent).
        """
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise TypeError(f"since(seq) takes an int, got {type(seq).__name__}")
        return self._call(SessionActor.h_read, "since", seq)

    def count(self) -> SessionFuture[int]:
        """Number of events ever appended (the next seq)."""
        return self._call(SessionActor.h_read, "count")

    def log(self) -> SessionFuture[Log]:
        """The current `Log` value (immutable; later appends do not change it)."""
        return self._call(SessionActor.h_log)

    def subscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        """Subscribe to every event with ``seq >= from_seq``: catch-up, then live.

        Waits (at most ``timeout``, default the handle's bound) until the session
        has registered the subscriber. See `Subscription`.

        Raises:
            TypeError, ValueError: ``from_seq`` or ``buffer`` is not valid.
            SessionStopped: the session is stopped.
        """
        _check_seq(from_seq, "subscribe(from_seq)")
        sub = Subscription(
            self.session_id,
            from_seq=from_seq,
            buffer=buffer,
            on_close=self._unsubscribe,
            timeout=self.timeout,
        )
        try:
            return self._call(SessionActor.h_subscribe, sub, from_seq).get(timeout=timeout)  # type: ignore[no-any-return]
        except BaseException:
            sub.close()  # a late registration must not leave a subscriber nobody reads
            raise

    async def asubscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        """`subscribe` for asyncio code: the registration is awaited without blocking the
        loop. Use the result with ``async with`` and ``async for`` (or ``aget``)."""
        return await _off_loop(partial(self.subscribe, from_seq, buffer=buffer, timeout=timeout))

    def _unsubscribe(self, sub: Subscription) -> None:
        self._call(SessionActor.h_unsubscribe, sub)

    # -- life ----------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """Whether the session's actor this handle talks to is running now.

        For a standalone session, ``False`` is final. A registry's handle may
        report ``False`` for a passivated or crashed session: its next call
        reopens it.
        """
        ref = self._ref
        if ref is None:
            ref = self._ref = self._resolve()
        return ref.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session after the calls already queued; waits at most ``timeout``.

        Returns once the actor has stopped and, with a store, its appends and
        snapshot drops still in flight are done and its writer claim is released
        (so the session can be started again at once). Calls made after this
        fail with `nous_actor.SessionStopped`.

        Raises:
            CallTimeout: not stopped within ``timeout``.
        """
        ref = self._ref or self._actor()
        bound = self.timeout if timeout is None else timeout
        if ref is None:
            return
        ref.stop(block=False)
        # Wait for the actor's thread to finish, not for the reply to the stop
        # request: Pykka leaves a request unanswered if it lands after the
        # actor's last look at its inbox.
        deadline = monotonic() + bound
        finished: threading.Event = getattr(ref, "finished")  # noqa: B009
        released: threading.Event = getattr(ref, "released")  # noqa: B009
        for done, what in ((finished, "a long call is running"), (released, "a commit is slow")):
            if not done.wait(min(max(deadline - monotonic(), 0), threading.TIMEOUT_MAX)):
                raise CallTimeout(self.session_id, f"did not stop within {bound:g} s ({what})")

    async def astop(self, timeout: float | None = None) -> None:
        """`stop` for asyncio code: awaited without blocking the loop."""
        await _off_loop(partial(self.stop, timeout))

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r}>"
