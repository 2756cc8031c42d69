"""The wall clock that stamps events and messages made without a time: one seam.

`utcnow` is ``datetime.now(UTC)`` unless a deterministic simulation
(`nous_actor.testing.simulation`) has set a clock of its own with
`set_utcnow`, so that the times inside a simulated run come from its virtual
clock and replay exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["set_utcnow", "utcnow"]

_now: Callable[[], datetime] | None = None


def utcnow() -> datetime:
    """Now, timezone-aware (UTC): the wall clock, or the simulation's."""
    now = _now
    return datetime.now(UTC) if now is None else now()


def set_utcnow(clock: Callable[[], datetime] | None) -> Callable[[], datetime] | None:
    """Stamp times with ``clock()`` from now on (``None``: the wall clock again); returns
    the clock it replaces."""
    global _now
    old, _now = _now, clock
    return old
