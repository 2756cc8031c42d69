"""Fault injection for demos and tests of code built on nous_actor: real faults, no mocks.

>>> from nous_actor import Session, SessionCrashed
>>> s = Session.start("victim")
>>> try:
...     crash(s).get()
... except SessionCrashed:
...     print("crashed")
crashed
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nous_actor.errors import SessionStopped
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session

__all__ = ["InjectedCrash", "crash", "crash_amid"]

T = TypeVar("T")


class InjectedCrash(BaseException):
    """The ``BaseException`` `crash` raises inside a session (not an ``Exception``,
    so it is the worst kind: Pykka alone would stop every actor in the process)."""


def crash(session: Session, exc: BaseException | None = None) -> SessionFuture[Any]:
    """Make ``session`` crash while handling this call, by raising ``exc`` in its actor.

    The call's future fails with `nous_actor.SessionCrashed`; calls queued
    behind it fail with `nous_actor.SessionStopped`. A supervised
    session is then restarted from its store.
    """
    error = InjectedCrash("injected crash") if exc is None else exc

    def boom(actor: object) -> None:
        raise error

    return session._call(boom)


def crash_amid(
    session: Session,
    calls: Sequence[Callable[[Session], SessionFuture[T]]],
    at: int,
    exc: BaseException | None = None,
) -> tuple[list[SessionFuture[T]], SessionFuture[Any]]:
    """Pipeline ``calls`` to ``session`` with a `crash` sent before ``calls[at]``.

    Nothing waits in between, so the calls before the crash are still queued
    or committing when the session dies. All go to the actor the session has
    now, never to a successor: the calls before the crash are applied (with a
    store, each is acknowledged once committed, although the session died
    meanwhile); every call from ``at`` on fails with
    `nous_actor.SessionStopped` and was not applied, so retrying them
    in order keeps their order.

    Returns the calls' futures, in order, and the crash's.

    Raises:
        ValueError: ``at`` is not in ``0..len(calls)``.
        SessionStopped: the session is stopped (and cannot be reopened).
    """
    if not 0 <= at <= len(calls):
        raise ValueError(f"at must be in 0..{len(calls)}, got {at}")
    ref = session._actor()
    if ref is None:
        raise SessionStopped(session.session_id, "the session is stopped")
    pinned = Session(session.session_id, lambda: ref, timeout=session.timeout)
    futures = [call(pinned) for call in calls[:at]]
    crashed = crash(pinned, exc)
    futures += [call(pinned) for call in calls[at:]]
    return futures, crashed
