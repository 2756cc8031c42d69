"""Sending a call again when its session stopped before applying it, for both adapters.

A registry restarts a stopped session on the next call, so a call that a
session *refused* (a `SessionStopped` that is not a `SessionCrashed`: the
session stopped before it applied the call) is safe to send again; a crash
(the call may have been applied) is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from nous_actor.errors import SessionCrashed, SessionStopped

__all__ = ["refused", "resend"]

H = TypeVar("H")
T = TypeVar("T")


def refused(exc: BaseException) -> bool:
    """Whether the call was refused before it was applied (so sending it again is safe)."""
    return isinstance(exc, SessionStopped) and not isinstance(exc, SessionCrashed)


async def resend(
    live: Callable[[], Awaitable[H]], call: Callable[[H], Awaitable[T]], attempts: int
) -> T:
    """``await call(await live())``, made again (with a fresh ``live()``) while the
    session refused it, at most ``attempts`` times in all.

    Raises:
        SessionStopped: the last attempt was refused, or the session crashed.
        Exception: whatever ``live`` raises, at once (it is not made again).
    """
    for attempt in range(attempts):
        handle = await live()
        try:
            return await call(handle)
        except SessionStopped as exc:
            if not refused(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
