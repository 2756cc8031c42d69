"""A session: one :class:`~nous_actor.Log` owned by one Pykka actor, and the handle to it.

Callers never touch the actor. They hold a :class:`Session` handle whose
methods send a message to the actor and return a :class:`SessionFuture`.

Guarantees, for every call on a handle:

* Calls from one thread are applied in the order they were made; calls from
  several threads are applied one at a time, each seeing the effects of all
  that were applied before it.
* Bad input fails that call's future with ``InvalidEvent`` (or, for an
  argument checked before sending, raises at the call) and changes nothing;
  the session keeps running.
* No call waits forever. A call on a stopped session fails at once with
  :class:`~nous_actor.SessionStopped`; a call queued when the session stops
  is answered with it (Pykka leaves such asks unanswered); every ``get``
  has a bound (:class:`~nous_actor.CallTimeout` after it).
* A ``BaseException`` raised while handling a call stops only this session
  (Pykka's default would stop every actor in the process); the call fails
  with :class:`~nous_actor.SessionCrashed`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime
from functools import partial
from time import monotonic
from typing import Any, Final, TypeVar

import pykka
import structlog

from nous_actor._frozen import short_repr
from nous_actor.committer import Committer, committer_for
from nous_actor.compaction import CompactionResult, Compactor
from nous_actor.errors import (
    CallTimeout,
    ConflictError,
    NousActorError,
    SessionCrashed,
    SessionStopped,
    StoreError,
)
from nous_actor.event import Event, EventType, InvalidEvent
from nous_actor.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.log import Log, _behind_head, new_event
from nous_actor.message import Message
from nous_actor.store.base import Store
from nous_actor.subscription import DEFAULT_BUFFER, Subscription
from nous_actor.supervision import SupervisedActor

__all__ = ["Session", "SessionActor"]

logger = structlog.get_logger(__name__)

T = TypeVar("T")
Handler = Callable[..., Any]


_DEFER: Any = object()  # a handler's result meaning "the future is answered later"


class _Envelope:
    """What Pykka's actor loop reads from the inbox (``message``, ``reply_to``); our calls
    carry their own future, so ``reply_to`` is always ``None``."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.reply_to = None


class SessionActor(SupervisedActor):
    """The actor that owns one session's log. Use it through :class:`Session`.

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
        self._done: list[tuple[tuple[Event, ...], StoreError | None]] = []
        self._done_lock = threading.Lock()
        self._store_ops = 0  # submitted to the committer and not yet done
        self._shutting = False
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
                log = Log()
                for ev in self.store.load(self.session_id):
                    log = log.append_event(ev)
                self.log = log
                if log.count():
                    logger.info(
                        "session.recovered",
                        session_id=self.session_id,
                        events=len(log.events()),
                        count=log.count(),
                    )
            # Fold once so that every later append keeps the surface current.
            self.log = self.log.materialize()[1]
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
        # Calls run in arrival order. One that must see every earlier append
        # (a read, snapshot, compact, fork) waits for their commits, and every
        # call after it waits behind it.
        if handler is not SessionActor.h_committed and (
            self.parked or (self.inflight and handler in _WAIT_FOR_COMMITS)
        ):
            self.parked.append((handler, args, fut))
            return None
        self._run(handler, args, fut)
        return None

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
                        "session.release_failed", session_id=self.session_id, error=str(exc)
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
        # 1. record the commit for the actor (commits landing together reach it
        #    as one message);
        # 2. if the session stopped meanwhile and this was its last append in
        #    flight, give up the writer claim *before* acknowledging, so that
        #    whoever saw the acknowledgement can reopen the session at once;
        # 3. acknowledge; 4. wake the actor (reads park until it has applied).
        with self._done_lock:
            self._done.append((events, err))
            wake = len(self._done) == 1
        try:
            self._store_op_done()
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

    def h_committed(self) -> None:
        with self._done_lock:
            done, self._done = self._done, []
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

    def h_append(self, etype: Any, data: Any, time: Any) -> Any:
        self._check_writable()
        ev = new_event(self.next_seq, etype, data, time)
        return self._submit((ev,), ev)

    def h_append_at(self, seq: Any, etype: Any, data: Any, time: Any) -> Any:
        self._check_writable()
        ev = new_event(seq, etype, data, time)
        if seq < self.next_seq:
            raise _behind_head(seq, self.next_seq)
        return self._submit((ev,), ev)

    def h_append_or_log(self, etype: Any, data: Any, time: Any) -> Any:
        self._check_writable()
        try:
            ev = new_event(self.next_seq, etype, data, time)
        except InvalidEvent as exc:
            logger.warning(
                "log.event_dropped",
                session_id=self.session_id,
                type=str(etype) if isinstance(etype, str) else short_repr(etype),
                reason=exc.reason,
                error=str(exc),
            )
            return None
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

    def h_compact(self, compactor: Compactor, time: datetime | None, force: bool) -> Any:
        self._check_writable()
        result = dataclasses.replace(compactor, snapshot=False).compact(
            self.log, time=time, force=force
        )
        if not result.changed:
            return result
        events = tuple(result.log.since(self.log.count()))
        answer = self._submit(events, result)
        if compactor.snapshot:  # after the compaction commits (a snapshot waits for it)
            self.actor_ref.tell((SessionActor.h_snapshot, (), None))
        return answer

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
        return self.log

    def h_ping(self) -> None:
        return None


# Calls that must see every append made before them (they wait for its commit).
_WAIT_FOR_COMMITS: Final = frozenset(
    {
        SessionActor.h_read,
        SessionActor.h_log,
        SessionActor.h_snapshot,
        SessionActor.h_compact,
        SessionActor.h_fork,
    }
)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} with a broken __str__>"


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
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"session_id must be a non-empty str, got {session_id!r}")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


class Session:
    """The handle to one session; every method returns a :class:`SessionFuture`.

    Get a handle with :meth:`Session.start` (a standalone session) or from a
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
        :class:`~nous_actor.SessionStopped`.

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

    # -- plumbing ------------------------------------------------------------------------

    def _actor(self) -> pykka.ActorRef[SessionActor] | None:
        ref = self._ref
        if ref is None or ref.actor_stopped.is_set():
            ref = self._resolve()
            self._ref = ref
        return ref

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

        Raises (through the future):
            InvalidEvent: the event is refused; nothing changed, the session runs on.
            SessionStopped: the session is stopped; nothing changed.
        """
        return self._call(SessionActor.h_append, type, data, time)

    def append_or_log(
        self, type: EventType | str, data: Any = None, time: datetime | None = None
    ) -> SessionFuture[Event | None]:
        """Like :meth:`append`, but a refused event resolves to ``None``.

        The drop is a structlog warning ``log.event_dropped`` with ``session_id``,
        ``type`` and ``reason``; it is never silent.
        """
        return self._call(SessionActor.h_append_or_log, type, data, time)

    def append_at(
        self, seq: int, type: EventType | str, data: Any = None, time: datetime | None = None
    ) -> SessionFuture[Event]:
        """Restore an event under its persisted ``seq`` (see :meth:`Log.append_at`)."""
        return self._call(SessionActor.h_append_at, seq, type, data, time)

    def snapshot(self) -> SessionFuture[int]:
        """Drop every shadowed event; resolves to how many were dropped."""
        return self._call(SessionActor.h_snapshot)

    def compact(
        self, compactor: Compactor, *, time: datetime | None = None, force: bool = False
    ) -> SessionFuture[CompactionResult]:
        """Run ``compactor`` on the session's log (see :class:`~nous_actor.Compactor`).

        Its events (prunes, the summary, the record) commit as one atomic batch;
        the future resolves to the :class:`~nous_actor.CompactionResult` after
        that. With ``compactor.snapshot`` the session snapshots right after.

        Raises (through the future):
            CompactionError: nothing was appended (e.g. an empty summary).
        """
        return self._call(SessionActor.h_compact, compactor, time, force)

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
        if new_id is not None and (not isinstance(new_id, str) or not new_id):
            raise ValueError(f"new_id must be a non-empty str, got {new_id!r}")
        return self._call(SessionActor.h_fork, through_seq, new_id)

    def as_of(self, seq: int) -> SessionFuture[Log]:
        """The log as it was right after event ``seq`` (see :meth:`Log.as_of`)."""
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
        """The current :class:`Log` value (immutable; later appends do not change it)."""
        return self._call(SessionActor.h_log)

    def subscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        """Subscribe to every event with ``seq >= from_seq``: catch-up, then live.

        Waits (at most ``timeout``, default the handle's bound) until the session
        has registered the subscriber. See :class:`Subscription`.

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
        fail with :class:`~nous_actor.SessionStopped`.

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

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r}>"
