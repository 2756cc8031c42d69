"""Errors of the runtime layers (the core's own are InvalidEvent and CodecError)."""

from __future__ import annotations

import functools
from datetime import datetime

import pykka

__all__ = [
    "CallOutcomeUnknown",
    "CallTimeout",
    "ClusterError",
    "ConflictError",
    "FencedError",
    "NousActorError",
    "SessionCrashed",
    "SessionError",
    "SessionStopped",
    "StoreError",
    "SubscriptionLagged",
    "TooManySessions",
    "TurnBusy",
    "TurnInterrupted",
]


class NousActorError(Exception):
    """Base class of the errors raised by the runtime (sessions, supervision, stores)."""


class SessionError(NousActorError):
    """Something went wrong with one session; ``session_id`` names it."""

    def __init__(self, session_id: str, message: str) -> None:
        super().__init__(f"session {session_id!r}: {message}")
        self.session_id = session_id
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.session_id, self.message))


class SessionStopped(SessionError):
    """The session is stopped (or stopped before it handled the call).

    A call that fails with this was not applied. Open the session again (a
    supervised handle does so by itself) and retry.
    """


class SessionCrashed(SessionStopped):
    """The session died while handling this call; whether the call was applied is unknown
    unless the session has a store, in which case the store is the truth."""


class CallOutcomeUnknown(SessionCrashed):
    """A call sent to the process that holds the session got no answer: that process
    died (or its connection broke) after taking the call, so the call may or may not
    have been applied. (A call that only reads is never answered so: it is sent again
    where the session is next.)

    The one ambiguous case of a forwarded call, and a checkable one: the holder records
    ``call_id`` with what the call appended, in the same transaction. Once the session
    is reachable again, ``session.applied(err.call_id)`` answers with the seqs the call
    appended, or ``None`` if it appended nothing (then send it again). The record is
    kept for `nous_actor.CALL_RECORD_SECONDS` after the call.
    """

    def __init__(self, session_id: str, message: str, call_id: str) -> None:
        super().__init__(session_id, message)
        self.call_id = call_id

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.session_id, self.message, self.call_id))


class CallTimeout(SessionError, TimeoutError, pykka.Timeout):
    """No answer within the call's time bound. The call may still be applied later.

    Also a ``TimeoutError`` and a ``pykka.Timeout``, so either ``except`` catches it.
    """


class SubscriptionLagged(SessionError):
    """A subscriber fell more than its buffer behind and was cut off.

    Every event before ``next_seq`` was delivered; resume with
    ``session.since(next_seq)`` or ``session.subscribe(from_seq=next_seq)``.
    """

    def __init__(self, session_id: str, next_seq: int, message: str | None = None) -> None:
        super().__init__(
            session_id,
            message
            or f"subscriber fell behind its buffer at seq {next_seq}; "
            f"resume with since({next_seq}) or subscribe(from_seq={next_seq})",
        )
        self.next_seq = next_seq

    def __reduce__(self) -> tuple[object, ...]:
        return (SubscriptionLagged, (self.session_id, self.next_seq))


class StoreError(NousActorError):
    """A durable store failed; ``session_id`` (if one) and ``cause`` say which and why.

    An append that fails with this was not acknowledged: it is wholly in the
    store or wholly absent, and the session refuses further appends until it
    is restarted from the store.
    """

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        prefix = f"session {session_id!r}: " if session_id is not None else ""
        super().__init__(prefix + message)
        self.session_id = session_id
        self._message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (functools.partial(type(self), session_id=self.session_id), (self._message,))


class ConflictError(StoreError):
    """A second writer for one session: a seq already stored, or a live writer elsewhere.

    The database refuses the write (``PRIMARY KEY (session_id, seq)``), so two
    writers never fork a session silently. Reopen the session to continue
    from what the store holds.

    Where the store knows who holds the session (a shared store such as
    ``PostgresStore``), ``holder`` names it (e.g. ``"host-a pid 4242"``, or the
    name its store was given) and ``lease_until`` says when its lease runs out
    unless renewed (a timezone-aware ``datetime``), so a caller can route the
    session's work there; both are ``None`` when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        holder: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.holder = holder
        self.lease_until = lease_until

    def __reduce__(self) -> tuple[object, ...]:
        make = functools.partial(
            type(self),
            session_id=self.session_id,
            holder=self.holder,
            lease_until=self.lease_until,
        )
        return (make, (self._message,))


class FencedError(ConflictError):
    """A writer lost its claim on a session: another writer took it over, or its lease lapsed.

    Raised (or returned by ``Store.write``) for a write made under a claim
    that is no longer current: the store checked the claim's epoch inside
    the write's own transaction and **stored nothing** of it. Every later
    write under that claim is refused the same way. ``holder`` and
    ``lease_until`` name the current holder when there is one. Stop the
    session here; its new writer has (or will) reload it from the store.
    """


class TurnBusy(ConflictError):
    """A turn is open on the session, and this call could not wait for it.

    Raised by ``session.turn(policy="reject")`` at once, by an ``enqueue`` turn
    that waited its bound out, and by a write through the plain handle that
    waited its bound for the open turn to end. Nothing was applied. ``holder``
    names the open turn's owner, ``turn_id`` the turn, ``lease_until`` when its
    lease runs out unless renewed (``None`` when unknown). Try again later, or
    write through the turn (``with session.turn(...) as turn: turn.append(...)``).
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        holder: str | None = None,
        lease_until: datetime | None = None,
        turn_id: str | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, holder=holder, lease_until=lease_until)
        self.turn_id = turn_id

    def __reduce__(self) -> tuple[object, ...]:
        make = functools.partial(
            type(self),
            session_id=self.session_id,
            holder=self.holder,
            lease_until=self.lease_until,
            turn_id=self.turn_id,
        )
        return (make, (self._message,))


class TurnInterrupted(SessionError):
    """The turn this call was made through is no longer open: nothing was applied.

    Another turn interrupted it (policy ``interrupt`` or ``rollback``), its
    lease ran out, or the session restarted while it was open. ``turn_id``
    names the turn and ``how`` says how it ended (``"interrupted"``,
    ``"rolled_back"``, ``"expired"``, ...; ``None`` when unknown). The events it
    wrote stay in the log (a rollback hides them from the surface behind one
    short system note). Open a new turn to go on.
    """

    def __init__(
        self, session_id: str, message: str, *, turn_id: str | None = None, how: str | None = None
    ) -> None:
        super().__init__(session_id, message)
        self.turn_id = turn_id
        self.how = how

    def __reduce__(self) -> tuple[object, ...]:
        make = functools.partial(type(self), turn_id=self.turn_id, how=self.how)
        return (make, (self.session_id, self.message))


class TooManySessions(NousActorError):
    """A registry is at its ``max_sessions`` cap and cannot open one more session.

    Close or passivate sessions (``idle_timeout=``), or raise ``max_sessions``.
    """


class ClusterError(NousActorError):
    """The cluster that hosts sessions cannot be used: it cannot be reached, or the
    actors that host the sessions did not start.

    The message says what was tried and what to check (the address, whether the
    cluster runs, whether the library is installed where its workers run).
    """
