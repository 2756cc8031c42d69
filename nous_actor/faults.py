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

from typing import Any

from nous_actor.future import SessionFuture
from nous_actor.session import Session

__all__ = ["InjectedCrash", "crash"]


class InjectedCrash(BaseException):
    """The ``BaseException`` :func:`crash` raises inside a session (not an ``Exception``,
    so it is the worst kind: Pykka alone would stop every actor in the process)."""


def crash(session: Session, exc: BaseException | None = None) -> SessionFuture[Any]:
    """Make ``session`` crash while handling this call, by raising ``exc`` in its actor.

    The call's future fails with :class:`~nous_actor.SessionCrashed`; calls queued
    behind it fail with :class:`~nous_actor.SessionStopped`. A supervised
    session is then restarted from its store.
    """
    error = InjectedCrash("injected crash") if exc is None else exc

    def boom(actor: object) -> None:
        raise error

    return session._call(boom)
