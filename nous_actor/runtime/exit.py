"""What happens when a program ends without closing anything.

The runtime's threads are daemon threads, so they never keep the interpreter
alive. Before it goes, the hooks registered here run once, in the order they
were registered (from `atexit`: after the program's last line, an uncaught
exception or `sys.exit`). A hook has no time bound of its own: the session
layer's waits until every append whose call had returned is committed or has
failed with a store error, says so on the log once that takes longer than
`SLOW_EXIT` seconds, and gives up only on a store that stopped answering.
With nothing in flight the hooks return at once.

Nothing of the library closes a store from `atexit` itself (a `weakref.finalize`
hook would run before these, LIFO, and fail the appends still in flight): a
store's connections and files end with the process.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Final

from nous_actor._log import get_logger

__all__ = ["SLOW_EXIT", "at_exit", "run_exit_hooks"]

logger = get_logger(__name__)

SLOW_EXIT: Final = 2.0
"""Seconds after which a hook still waiting at exit says so (a warning); it goes on waiting."""

ExitHook = Callable[[], None]
"""``hook()``: run at interpreter exit; returns once its work is done or cannot be."""

_hooks: list[ExitHook] = []


def at_exit(hook: ExitHook, *, first: bool = False) -> None:
    """Run ``hook()`` when the interpreter exits (once per hook object, in the order
    registered; ``first``: before the hooks registered so far)."""
    if hook not in _hooks:
        if first:
            _hooks.insert(0, hook)
        else:
            _hooks.append(hook)


def run_exit_hooks() -> None:
    """Run every exit hook in turn (what ``atexit`` calls); one failing never keeps the
    others from running."""
    for hook in list(_hooks):
        try:
            hook()
        except BaseException as exc:  # one hook must not keep the others from running
            logger.error("runtime.exit_hook_failed", reason=type(exc).__name__, error=str(exc))


atexit.register(run_exit_hooks)
