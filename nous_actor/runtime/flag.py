"""`Flag`: a one-way event, set once and never cleared, that costs almost nothing idle.

A `threading.Event` holds a `threading.Condition` and its lock (about 1 KB
with their dicts) from the moment it is made. An actor carries several such
signals (stopped, started, finished, released) and most are never waited for:
a `Flag` is two slots, and allocates a lock only for a thread that waits.
"""

from __future__ import annotations

import threading
from _thread import allocate_lock
from typing import Any

import msgspec

from nous_actor.runtime import forks, scheduling

__all__ = ["Flag"]

_guard = forks.lock()  # one for every flag: held only to add, remove or wake waiters


class Flag(msgspec.Struct, gc=False, eq=False):
    """A flag that is set once; `wait` blocks until then, for at most a bound.

    The part of `threading.Event`'s interface that actors use (``is_set``,
    ``set``, ``wait``), so it stands in for one (Pykka's ``actor_stopped``).

    It holds a bool and the locks of threads that wait (nothing that can refer back
    to it), so it can never be on a reference cycle: a msgspec struct the cyclic
    collector never tracks (each actor holds several; at 10,000 sessions that is
    30,000 objects fewer for every full collection to visit). Compared by identity.
    """

    _set: bool = False
    _waiters: list[Any] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter (idempotent)."""
        if self._set:
            return
        with _guard:
            self._set = True
            waiters, self._waiters = self._waiters, None
        if waiters:
            for lock in waiters:
                lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set, at most ``timeout`` seconds (``None``: no bound);
        whether it is set."""
        if self._set:
            return True
        return scheduling.current().wait(self.is_set, timeout, self._block)

    def _block(self, timeout: float | None) -> bool:
        lock = allocate_lock()
        lock.acquire()
        with _guard:
            if self._set:
                return True
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(lock)
        bound = -1 if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)
        if lock.acquire(True, bound):
            return True
        with _guard:
            if self._waiters is not None and lock in self._waiters:
                self._waiters.remove(lock)
        return self._set

    def __repr__(self) -> str:
        return f"<Flag {'set' if self._set else 'unset'}>"
