"""Crashing a session with calls queued behind the crash (a test helper; see bounds.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bounds import BOUND

from nous_actor.sessions.actor import SessionActor

T = TypeVar("T")


def crash_behind(handle: Any, send: Callable[[], T], crash: BaseException) -> tuple[Any, T]:
    """Crash ``handle``'s session (``crash`` raised in a handler) once ``send()`` has
    queued its calls behind the crashing call, which waits for them: (the crashing
    call's future, what ``send`` returned)."""
    entered, release = threading.Event(), threading.Event()

    def block_then_crash(actor: SessionActor) -> None:
        entered.set()
        release.wait(BOUND)
        raise crash

    crashing = handle._call(block_then_crash)
    assert entered.wait(BOUND)
    try:
        sent = send()
    finally:
        release.set()
    return crashing, sent
