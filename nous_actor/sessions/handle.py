"""The handle to a session: what callers hold, whose every call returns a future.

The handle never touches the actor's state: it checks and freezes a call's
input in the caller's thread, puts one message in the actor's inbox and
returns a `SessionFuture`. See `nous_actor.sessions.actor` for what the
actor guarantees.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

from nous_actor._log import get_logger
from nous_actor.core.compaction import (
    CompactionResult,
    Compactor,
    new_compaction_id,
)
from nous_actor.core.event import (
    Event,
    EventType,
    InvalidEvent,
    check_event,
    type_text,
)
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log, _utcnow, message_event
from nous_actor.core.message import Message
from nous_actor.errors import (
    CallTimeout,
    NousActorError,
    SessionStopped,
)
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.sessions.actor import (
    EventParts,
    Handler,
    SessionActor,
    _Compaction,
    _Envelope,
    summary_slot,
)
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.turns import DEFAULT_LEASE, Policy
from nous_actor.store.base import Store
from nous_actor.store.subscription import DEFAULT_BUFFER, Subscription
from nous_actor.supervision import ChildSpec, RestartType

if TYPE_CHECKING:
    from nous_actor.sessions.turn_handle import Turn

__all__ = ["Session", "SessionHandle"]

logger = get_logger(__name__)

T = TypeVar("T")


async def _off_loop(fn: Callable[[], T]) -> T:
    """Run a blocking call of the library in the loop's default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _check_seq(seq: object, what: str) -> None:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"{what} takes an int seq, got {type(seq).__name__}")
    if seq < 0:
        raise ValueError(f"{what} takes a seq >= 0, got {seq}")


def check_placement(dispatcher: object, pinned: object) -> None:
    """Raise ``TypeError`` unless ``dispatcher`` is ``None`` or a `Dispatcher` and
    ``pinned`` a bool (and not both: a pinned session has a thread of its own)."""
    if dispatcher is not None and not isinstance(dispatcher, Dispatcher):
        raise TypeError(
            f"dispatcher must be a nous_actor.Dispatcher or None, got {type(dispatcher).__name__}"
        )
    if not isinstance(pinned, bool):
        raise TypeError(f"pinned must be True or False, got {pinned!r}")
    if pinned and dispatcher is not None:
        raise ValueError(
            "pass dispatcher= or pinned=True, not both (a pinned session has a thread of its own)"
        )


def _check_handle_args(session_id: object, timeout: object) -> None:
    check_session_id(session_id)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


class SessionHandle:
    """What every handle to a session offers; every call returns a `SessionFuture`.

    `Session` is the handle to a session in this process. A handle to a
    session hosted elsewhere (e.g. ``nous_actor.cluster.ray.RaySession``) has
    the same methods, the same checks in the caller's thread and the same typed
    errors, so code written against this class runs on either.
    """

    __slots__ = ("session_id", "timeout")

    session_id: str
    timeout: float

    # -- plumbing ------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> SessionFuture[Any]:
        fut: SessionFuture[Any] = SessionFuture(self.session_id, self.timeout)
        fut._fail(exc)
        return fut

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        """Send one checked call (a `SessionActor` handler and its arguments)."""
        raise NotImplementedError

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
            etype, data, time = message_event(message)
        except (TypeError, ValueError) as exc:
            return self._failed(exc)
        return self.append(etype, data, time)

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
        slot = summary_slot(compactor)
        req = _Compaction(
            compactor,
            time,
            force,
            compaction_id or new_compaction_id(),
            explicit,
            None if slot is None else slot.loop,
            slot=slot,
        )
        fut = self._call(SessionActor.h_compact, req)
        if slot is not None:
            fut._needs_loop = slot.loop  # a blocking get() from that loop would never end
        return fut

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

    def turn(
        self,
        policy: Policy = "enqueue",
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        note: str | None = None,
    ) -> Turn:
        """A turn on this session: use it as ``with`` (or ``async with``) and write through it.

        Entering opens it (nothing is sent before). A turn is a run that writes
        the session while no other run does: while it is open, writes through
        the plain handle wait for it to end (at most their bound less a
        quarter of it, or less 1 s if that is shorter; then
        `nous_actor.TurnBusy`); reads never wait. It is recorded
        by ``turn_start``/``turn_end`` events (turn id, owner, policy, and how
        it ended).

        ``policy`` says what this turn does when another is open: ``reject``
        (`nous_actor.TurnBusy` at once, naming the open turn's owner),
        ``enqueue`` (wait, first come first served, at most ``timeout``
        seconds, default the handle's bound, then ``TurnBusy``),
        ``interrupt`` (the open turn ends as interrupted; its holder's next
        call through it fails with `nous_actor.TurnInterrupted`; its events
        stay) or ``rollback`` (as ``interrupt``, and one replace hides the
        interrupted turn's events behind a system note ``note``, by default
        `nous_actor.sessions.turns.DEFAULT_ROLLBACK_NOTE`).

        The turn holds a lease of ``lease`` seconds, renewed by every call
        through it: if its holder goes silent that long, it ends as expired.
        A restart of the session ends an open turn as interrupted.

        ``owner`` names the holder (default: host, process id, thread, task).

        Raises:
            ValueError, TypeError: bad arguments (raised here; nothing is sent).
        """
        from nous_actor.sessions.turn_handle import Turn  # it builds on this class

        return Turn(self, policy, owner=owner, lease=lease, timeout=timeout, note=note)

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
            CallTimeout: not registered in time.
        """
        _check_seq(from_seq, "subscribe(from_seq)")
        sub = Subscription(self.session_id, from_seq=from_seq, buffer=buffer, timeout=self.timeout)
        try:
            self._register(sub, self.timeout if timeout is None else timeout)
        except BaseException:
            sub.close()  # a late registration must not leave a subscriber nobody reads
            raise
        return sub

    def _register(self, sub: Subscription, timeout: float) -> None:
        """Have the session feed ``sub`` (catch-up from ``sub.from_seq``, then live),
        waiting at most ``timeout`` until it is registered."""
        raise NotImplementedError

    async def asubscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        """`subscribe` for asyncio code: the registration is awaited without blocking the
        loop. Use the result with ``async with`` and ``async for`` (or ``aget``)."""
        return await _off_loop(partial(self.subscribe, from_seq, buffer=buffer, timeout=timeout))

    # -- life ----------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """Whether the session this handle talks to is running now."""
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session after the calls already queued; waits at most ``timeout``.

        Raises:
            CallTimeout: not stopped within ``timeout``.
        """
        raise NotImplementedError

    async def astop(self, timeout: float | None = None) -> None:
        """`stop` for asyncio code: awaited without blocking the loop."""
        await _off_loop(partial(self.stop, timeout))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.session_id!r}>"


class Session(SessionHandle):
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

    __slots__ = ("_ref", "_resolve", "_touch")

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
        dispatcher: Dispatcher | None = None,
        pinned: bool = False,
    ) -> Session:
        """Start a standalone session and return its handle once it is running.

        Without a store the session holds ``log`` (or an empty log) in memory.
        With a ``store`` it claims the session as its one writer, recovers
        every stored event (seqs, times, snapshot gaps as stored), and from
        then on acknowledges an append only after the store committed it.

        A standalone session is not restarted: once stopped, its calls fail with
        `nous_actor.SessionStopped`.

        The session runs on ``dispatcher`` (default: the process's shared
        `nous_actor.Dispatcher`), or with ``pinned=True`` on a thread of its own.

        Raises:
            ValueError, TypeError: bad arguments (nothing is started).
            ConflictError: another live writer holds the session in ``store``.
            StoreError: the store failed while recovering the session.
        """
        _check_handle_args(session_id, timeout)
        check_placement(dispatcher, pinned)
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
        ref = SessionActor.start(
            session_id, log, store, ready, dispatcher=dispatcher, pinned=pinned
        )
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
        # Pykka's stop race (the actor stopped between the check above and the put)
        # is closed by the dispatcher: a put after the stop runs the actor's
        # teardown, which answers the call with SessionStopped.
        ref.actor_inbox.put(_Envelope((handler, args, fut)))  # type: ignore[arg-type]
        return fut

    def _register(self, sub: Subscription, timeout: float) -> None:
        sub._on_close = self._unsubscribe
        self._call(SessionActor.h_subscribe, sub, sub.from_seq).get(timeout=timeout)

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
