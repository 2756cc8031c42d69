"""What happens when a program ends without closing anything.

The runtime's threads are daemon threads, so they never keep the interpreter
alive. Before it goes, the hooks registered here run once (from `atexit`, also
after an uncaught exception), sharing one bound of `FLUSH_BOUND` seconds: the
session layer uses it so that every append whose call had returned is
committed before the process ends.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from typing import Final

from nous_actor._log import get_logger

__all__ = ["FLUSH_BOUND", "at_exit", "run_exit_hooks"]

logger = get_logger(__name__)

FLUSH_BOUND: Final = 2.0
"""Seconds that every exit hook together may take."""

ExitHook = Callable[[float], None]
"""``hook(deadline)``: finish by ``deadline`` (a `time.monotonic` value)."""

_hooks: list[ExitHook] = []


def at_exit(hook: ExitHook) -> None:
    """Run ``hook(deadline)`` when the interpreter exits (once per hook object)."""
    if hook not in _hooks:
        _hooks.append(hook)


def run_exit_hooks(bound: float = FLUSH_BOUND) -> None:
    """Run every exit hook within ``bound`` seconds in all (what ``atexit`` calls)."""
    deadline = time.monotonic() + bound
    for hook in list(_hooks):
        try:
            hook(deadline)
        except BaseException as exc:  # one hook must not keep the others from running
            logger.error("runtime.exit_hook_failed", reason=type(exc).__name__, error=str(exc))


atexit.register(run_exit_hooks)
