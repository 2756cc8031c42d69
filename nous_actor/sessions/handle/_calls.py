"""`SessionCalls`: the call methods a handle to a session and a turn on it share.

Each method checks and freezes its input in the caller's thread, then sends
one call (`_call`, which each kind of handle, and a turn, implements) and
returns its `SessionFuture`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from nous_actor._log import get_logger
from nous_actor.core.args import check_flag, check_timeout
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
    check_held,
    type_text,
)
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log, _utcnow, message_event
from nous_actor.core.message import Message
from nous_actor.runtime import telemetry
from nous_actor.sessions.actor import (
    EventParts,
    Handler,
    SessionActor,
    _Compaction,
    summary_slot,
)
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle._checks import _check_seq
from nous_actor.store.subscription import DEFAULT_BUFFER, Subscription

logger = get_logger("nous_actor.sessions.handle")


class SessionCalls:
    """The call methods of a session: appends, compaction, forks, reads, subscriptions;
    every call returns a `SessionFuture`.

    Two kinds of object send them: a handle to the session (`SessionHandle`:
    `Session` here, ``RaySession`` on a cluster), and a turn opened on one
    (`nous_actor.Turn`), which sends each call through the turn. Each implements
    `_call` and `_register`.
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

        ``data`` is checked, frozen and encoded once into its stored JSON text here,
        in the caller's thread, before this returns: mutating the dict afterwards
        never changes what is stored, also while the append is still in flight, and
        the store writes that text as it is. The event holds the text and decodes it
        when its ``data`` is first read (a derive reads only a message's fields).
        With a store, the future resolves only once the event is durably committed.

        Raises (through the future):
            InvalidEvent: the event is refused; nothing changed, the session runs on.
            SessionStopped: the session is stopped; nothing changed.
        """
        try:
            parts = check_held(0, type, _utcnow() if time is None else time, data)
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

        Every item is checked, frozen and encoded here, before anything is sent.

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
                    batch.append(check_held(0, item[0], _utcnow() if t is None else t, item[1]))
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
            ValueError: a dict that is not an OpenAI message, or holds what JSON
                cannot carry (naming the field), as `Message.from_openai` says.
            TypeError: neither a `Message` nor a mapping.
            InvalidEvent: the event is refused (e.g. it is over the size limit).
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
            parts = check_held(0, type, _utcnow() if time is None else time, data)
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
            parts = check_held(seq, type, _utcnow() if time is None else time, data)
        except InvalidEvent as exc:
            return self._failed(exc)
        return self._call(SessionActor.h_append_at, int.__int__(seq), parts)

    def snapshot(self) -> SessionFuture[int]:
        """Drop every shadowed event but the newest managed turn event (kept so that
        whether a turn is open never changes: a restart still ends an open turn, and
        never reopens a closed one); resolves to how many were dropped."""
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
            CompactionError: nothing was appended (a summary that is not a str or
                is empty, or that would make the surface larger by the compactor's
                own estimate; a summariser that failed; an overlap that persisted).
        """
        if not isinstance(compactor, Compactor):
            raise TypeError(
                f"compact() takes a nous_actor.Compactor, got {type(compactor).__name__}"
            )
        check_flag(force, "compact(force)")
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
            context=telemetry.context(),  # the caller's, for the compaction's span
        )
        fut = self._call(SessionActor.h_compact, req)
        if slot is not None:
            fut._needs_loop = slot.loop  # a blocking get() from that loop would never end
            # Answered without a summary (refused, or the session stopped before the
            # call ran): the slot's task on the caller's loop ends too (a no-op once used).
            fut.add_done_callback(slot.release)
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
            new_id = check_session_id(new_id, "new_id")
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
            TypeError, ValueError: ``seq`` is not an int >= 0 (raised here, before
                anything is sent).
        """
        _check_seq(seq, "since(seq)")
        return self._call(SessionActor.h_read, "since", seq)

    def count(self) -> SessionFuture[int]:
        """Number of events ever appended (the next seq)."""
        return self._call(SessionActor.h_read, "count")

    def log(self) -> SessionFuture[Log]:
        """The current `Log` value (immutable; later appends do not change it)."""
        return self._call(SessionActor.h_log)

    def applied(self, call_id: str) -> SessionFuture[tuple[int, ...] | None]:
        """Whether the call that failed with `nous_actor.CallOutcomeUnknown` (``call_id``:
        its ``call_id``) was applied: the seqs of the events it appended, or ``None``
        if it appended nothing (send it again).

        Asked of the process holding the session now, once it can be reached (the
        call's holder died: another process takes the session over, after its lease
        on PostgreSQL): its claim fences the dead holder, so the answer is final.
        A call's record is kept `nous_actor.CALL_RECORD_SECONDS` after the call.

        Raises:
            TypeError: ``call_id`` is not a str (raised here, before anything is sent).
            ValueError: ``call_id`` is empty (raised here).
            StoreError: (in the future) the session's store records no forwarded calls.
        """
        if not isinstance(call_id, str):
            raise TypeError(
                f"applied(call_id) takes the call_id (a str) of a CallOutcomeUnknown, "
                f"got {type(call_id).__name__}"
            )
        if not call_id:
            raise ValueError("applied(call_id): call_id is empty; pass the error's call_id")
        return self._call(SessionActor.h_applied, call_id)

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
        bound = check_timeout(timeout, "subscribe(timeout)")
        sub = self._subscription(from_seq, buffer)
        try:
            self._register(sub, self.timeout if bound is None else bound)
        except BaseException:
            sub.close()  # a late registration must not leave a subscriber nobody reads
            raise
        return sub

    def _subscription(self, from_seq: int, buffer: int) -> Subscription:
        """The subscription `subscribe` registers with the session."""
        sid, timeout = self.session_id, self.timeout
        return Subscription(sid, from_seq=from_seq, buffer=buffer, timeout=timeout)

    def _register(self, sub: Subscription, timeout: float) -> None:
        """Have the session feed ``sub`` (catch-up from ``sub.from_seq``, then live),
        waiting at most ``timeout`` until it is registered."""
        raise NotImplementedError

    async def asubscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        """`subscribe` for asyncio code: the registration is awaited without blocking the
        loop. Use the result with ``async with`` and ``async for`` (or ``aget``). A
        caller that stops waiting (cancelled, its deadline passed) leaves no
        subscription behind: one registered after it left is closed."""
        made = asyncio.get_running_loop().run_in_executor(
            None, partial(self.subscribe, from_seq, buffer=buffer, timeout=timeout)
        )
        try:
            return await asyncio.shield(made)
        except BaseException:
            made.add_done_callback(_close_unclaimed)
            raise

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.session_id!r}>"


def _close_unclaimed(made: asyncio.Future[Subscription]) -> None:
    """(`asubscribe`, whose caller stopped waiting.) Close the subscription, if one was
    made: nobody will read it, and it would keep every event up to its buffer."""
    if not made.cancelled() and made.exception() is None:
        made.result().close()
