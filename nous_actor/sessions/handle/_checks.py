"""The checks a handle makes in the caller's thread, and running a blocking call off a loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from nous_actor.core.args import MAX_SECONDS
from nous_actor.core.ids import check_session_id
from nous_actor.runtime.dispatcher import Dispatcher

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


def _check_handle_args(session_id: object, timeout: object) -> str:
    """Check a handle's arguments; returns the session id as a plain `str`."""
    plain = check_session_id(session_id)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_SECONDS
    ):
        raise ValueError(
            "timeout must be a finite number of seconds > 0 and at most "
            f"threading.TIMEOUT_MAX (about 292 years), got {timeout!r}"
        )
    return plain
