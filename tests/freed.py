"""Waiting, within a bound, for objects to be freed (`Freed`).

An actor that stopped is freed by the cyclic collector (it and its inbox refer to
each other), after the dispatcher thread that ran its last turn has let go of it:
a test that counts what a stopped session leaves waits for that, instead of
counting at once and failing on a thread that is still returning.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterable


class Freed:
    """Watches ``objects`` (without keeping them alive) until they are freed.

    Make it before the objects should go, from a list or generator the caller does
    not keep; `wait` then collects until they are all gone, within a bound."""

    def __init__(self, objects: Iterable[object]) -> None:
        self._alive: dict[int, str] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._finalizers: list[weakref.finalize] = []  # type: ignore[type-arg]
        for i, obj in enumerate(objects):
            self._alive[i] = repr(obj)
            self._finalizers.append(weakref.finalize(obj, self._freed, i))
        self.count = len(self._alive)
        if not self._alive:
            self._done.set()

    def _freed(self, key: int) -> None:
        with self._lock:
            self._alive.pop(key, None)
            if not self._alive:
                self._done.set()

    def wait(self, bound: float) -> list[str]:
        """Collect until every object is freed, at most ``bound`` seconds; the reprs of
        those still alive then (empty: all freed)."""
        deadline = time.monotonic() + bound
        while True:
            gc.collect()
            if self._done.wait(0.01) or time.monotonic() >= deadline:
                break
        for finalizer in self._finalizers:
            finalizer.detach()
        with self._lock:
            return sorted(self._alive.values())
