"""`SessionActor`: the session's parts combined, and the loop that runs its calls.

The actor's loop is here: a call runs at once, or parks behind the commits
it must see (``_WAIT_FOR_COMMITS``); whatever a call raises is contained
(`_run`, `_die`). The calls themselves are in the parts it inherits: the turn
table (`TurnHost`), the store-facing side (`StoreSide`), compaction
(`Compacting`), the writes (`Writes`) and the reads (`Reads`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Final

import pykka

from nous_actor._log import get_logger
from nous_actor.core.event import Event
from nous_actor.core.log import Log
from nous_actor.errors import ConflictError, SessionStopped, StoreError
from nous_actor.runtime import telemetry
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.runtime.exit import SLOW_EXIT, at_exit
from nous_actor.runtime.flag import Flag
from nous_actor.sessions.actor._base import (
    _DEFER,
    _NONE,
    Handler,
    _crashed,
    _Envelope,
    _safe_str,
)
from nous_actor.sessions.actor._compaction import Compacting
from nous_actor.sessions.actor._reads import Reads
from nous_actor.sessions.actor._store import _WAIT_FOR_COMMITS, StoreSide
from nous_actor.sessions.actor._writes import Writes
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.recovery import recover
from nous_actor.sessions.turns import DEFAULT_DANGLING_TURNS, TurnHost, TurnTable
from nous_actor.store.base import Store
from nous_actor.store.committer import Committer
from nous_actor.store.subscription import Subscription

logger = get_logger("nous_actor.sessions.actor")


class SessionActor(TurnHost, StoreSide, Compacting, Writes, Reads):
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
        "_trace_links",
        "_wake_sent",
        "_want_wake",
        "claim_token",
        "committer",
        "crash",
        "crash_on_store_failure",
        "dangling_turns",
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
        trace_links: list[object] | None = None,
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
        # The trace contexts of the callers waiting for the recovery (telemetry); more
        # may join (from the registry's thread) until the store is read.
        self._trace_links = trace_links
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
        # id -> [start, summariser start, summariser end] (time_ns) and the caller's
        # trace context, while telemetry is on
        self._compaction_times: dict[str, list[Any]] | None = None
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


def _flush_at_exit() -> None:
    """Every append whose call had returned is committed, or has failed with a store
    error, before the process goes (the session layer's exit hook).

    Each live session with a store is sent two calls: one that counts its appends not
    yet committed (it runs once every call before it has been given its seq), then a
    barrier (``h_flush``, answered once they are all committed). There is no bound on
    the wait: it says so on the log after `SLOW_EXIT` s and goes on while the stores
    answer. It gives up only when no store has answered anything (no batch written,
    no barrier answered) for `EXIT_STALL` s plus the longest ``timeout`` of the stores
    waited for (a store that retries within its ``timeout`` fails its writes before
    that). Appends that failed, or that were still waiting when it gave up, are
    counted at error level (``session.exit_lost``).
    """
    waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]] = []
    for ref in pykka.ActorRegistry.get_by_class(SessionActor):
        actor = ref.actor_inbox._actor  # type: ignore[attr-defined]
        if not isinstance(actor, SessionActor) or (actor.committer is None and not actor._loading):
            continue  # no store: nothing to make durable
        counted: SessionFuture[Any] = SessionFuture(actor.session_id)
        flushed: SessionFuture[Any] = SessionFuture(actor.session_id)
        try:
            ref.actor_inbox.put(_Envelope((_uncommitted, (), counted)))  # type: ignore[arg-type]
            ref.actor_inbox.put(_Envelope((SessionActor.h_flush, (), flushed)))  # type: ignore[arg-type]
        except Exception:
            continue
        waits.append((actor, counted, flushed))
    if not waits:
        return
    answered = threading.Event()
    for _, _, flushed in waits:
        flushed.add_done_callback(answered.set)
    patience = EXIT_STALL + max(_timeout_of(actor.store) for actor, _, _ in waits)
    start = last = time.monotonic()
    seen = _answers(waits)
    warned = gave_up = False
    try:
        while True:
            answered.clear()
            left = sum(1 for w in waits if not _settled(*w))
            if not left:
                break
            now = time.monotonic()
            now_seen = _answers(waits)
            if now_seen != seen:
                seen, last = now_seen, now
            elif now - last >= patience:
                gave_up = True
                break
            if not warned and now - start >= SLOW_EXIT:
                warned = True
                logger.warning(
                    "session.exit_waiting",
                    sessions=left,
                    seconds=round(now - start, 3),
                    reason="commits in flight at exit",
                )
            answered.wait(EXIT_POLL if warned else min(EXIT_POLL, start + SLOW_EXIT - now))
    except KeyboardInterrupt:  # interrupted while waiting: count what is lost, then go
        gave_up = True
    _report_lost(
        waits, "store unreachable" if gave_up else "store error", time.monotonic() - start
    )


def _uncommitted(actor: SessionActor) -> tuple[int, int]:
    """(events not yet known committed, events applied): run by the actor at exit."""
    return len(actor.inflight), actor.log.count()


def _settled(
    actor: SessionActor, counted: SessionFuture[Any], flushed: SessionFuture[Any]
) -> bool:
    """Whether nothing more of the session's appends will be committed: its barrier was
    answered, or the store's committer failed the session (it then fails every later
    append of it without writing, though the actor may not have heard yet: a crashed
    session letting go of its claim on an unreachable server waits for it)."""
    if flushed.done():
        return True
    committer = actor.committer
    return committer is not None and actor.session_id in getattr(committer, "_failed", ())


def _committed_since(actor: SessionActor, applied: int) -> int:
    """Events of the session committed since it had ``applied`` events applied (those
    the actor has applied, and those it has been told of and not applied yet)."""
    with actor._done_lock:
        told = sum(len(events) for events, err in actor._done if err is None)
        return actor.log.count() - applied + told


def _timeout_of(store: object) -> float:
    """A store's own bound on a call (``timeout``), or 0 if it has none."""
    timeout = getattr(store, "timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return min(float(timeout), EXIT_STALL_MAX)
    return 0.0


def _answers(waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]]) -> int:
    """How much the stores have answered so far: batches written, barriers answered."""
    committers = {id(a.committer): a.committer for a, _, _ in waits if a.committer is not None}
    return sum(c.commits for c in committers.values()) + sum(f.done() for _, _, f in waits)


def _report_lost(
    waits: list[tuple[SessionActor, SessionFuture[Any], SessionFuture[Any]]],
    reason: str,
    seconds: float,
) -> None:
    """Log, at error level, how many appends whose call had returned are not stored."""
    lost = sessions = unknown = 0
    for actor, counted, flushed in waits:
        if flushed.done() and not flushed.failed():
            continue
        sessions += 1
        if not counted.done() or counted.failed():
            unknown += 1  # stopped before it could count
            continue
        inflight, applied = counted.get(timeout=0)
        lost += max(0, inflight - _committed_since(actor, applied))
    if sessions:
        logger.error(
            "session.exit_lost",
            lost=lost,
            sessions=sessions,
            uncounted=unknown,
            seconds=round(seconds, 3),
            reason=reason,
        )


EXIT_STALL: Final = 30.0
"""Seconds without any answer from the stores after which the exit gives up (added to
the longest ``timeout`` of the stores it waits for)."""

EXIT_STALL_MAX: Final = 3600.0
"""The longest store ``timeout`` counted in the exit's patience."""

EXIT_POLL: Final = 0.5
"""Seconds between two looks at the stores' progress while the exit waits."""

at_exit(_flush_at_exit)
