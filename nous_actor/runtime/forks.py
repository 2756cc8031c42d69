"""A forked process and the objects it inherited: they stay its parent's.

A process that forks (a web server's master starting its workers after importing
the app, ``gunicorn --preload``; Celery's prefork pool; ``multiprocessing`` with the
``fork`` start method) gives its child a copy of every object, but not of its
threads. A registry, a session handle or a store made before the fork would, in
the child, wait on threads that are not there (a call waited out its whole bound;
the exit waited 30 s for commits no thread would make), and a session's claim
and connections are the parent's: a child that used them would write as its
parent. So an object made before a fork refuses to work in the child, at once,
saying to make it again there (`refusal`); what the child makes itself works.

`generation` counts the forks between this process and the one that imported the
library; an object notes it when made (`born`) and compares it where it starts
work (`forked_since`), which costs one comparison.
"""

from __future__ import annotations

import os
from _thread import LockType, allocate_lock
from collections.abc import Callable
from typing import Final

__all__ = ["after_fork", "born", "forked_since", "lock", "refusal"]

generation = 0
"""How many forks separate this process from the one that imported the library."""

_pids: Final[list[int]] = [os.getpid()]
"""The process id of each generation: the parent a refusal names."""


_resets: Final[list[Callable[[], None]]] = []
"""What each module that keeps shared state runs in a forked child (`after_fork`)."""


def after_fork(reset: Callable[[], None]) -> None:
    """Run ``reset()`` in every child forked from now on, once `generation` counts the
    fork: a module forgets there the shared state its parent made (thread pools, tables
    of connections and sockets, and the locks guarding them, which a parent's thread may
    have held as it forked), so that what the child makes starts afresh."""
    _resets.append(reset)


_locks: Final[list[LockType]] = []
"""The module-level locks made by `lock`."""


def lock() -> LockType:
    """A new lock for state a module shares between threads (made at import), freed in
    every forked child: a thread of the parent may have held it as the process forked,
    and that thread is not in the child to let it go (its first use there would wait for
    ever). Freed in place: a module that imported the lock by name holds the same one."""
    made = allocate_lock()
    _locks.append(made)
    return made


def _forked() -> None:  # (in the child, right after the fork)
    global generation
    generation += 1
    _pids.append(os.getpid())
    for held in _locks:  # (the child has one thread yet: the one that forked)
        if held.locked():
            held.release()
    for reset in _resets:
        reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def born() -> int:
    """The generation of an object made now (what `forked_since` is given)."""
    return generation


def forked_since(made: int) -> bool:
    """Whether this process forked from the one where an object of generation ``made``
    was made (it then belongs to that process)."""
    return made != generation


def refusal(what: str, made: int) -> str:
    """Why ``what``, made in generation ``made``, refuses to work here, and what to do."""
    return (
        f"{what} was made in process {_pids[made]}, and this process ({os.getpid()}) was "
        "forked from it afterwards: it cannot be used here (its threads stayed in that "
        "process, and its claims and connections are that process's). Make the Sessions "
        "and its store in each process after the fork: with gunicorn, in a post_fork hook "
        "or without --preload; with multiprocessing, the 'spawn' start method"
    )
