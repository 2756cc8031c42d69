"""`Sweep`: a table keyed by session id that lets go of its stale entries as it grows.

A long-running process meets ever new sessions; a table that keeps an entry per
session it met (a previous actor's claim, a handle, a session handed over) must
drop the entries that no longer matter, without a scan per insertion. `Sweep`
scans when the table has doubled since its last scan (amortized O(1) an entry).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Generic, TypeVar

__all__ = ["Sweep"]

K = TypeVar("K")
V = TypeVar("V")


class Sweep(Generic[K, V]):
    """When to sweep one table, and the sweep: `after` is called after an entry went in.

    ``stale(key, value)`` says which entries to drop; the table may be changed by
    other threads meanwhile (the items are taken in one step, and dropped with
    ``pop``), as long as ``stale`` reads only the entry it is given."""

    __slots__ = ("_least", "_mark", "_stale")

    def __init__(self, stale: Callable[[K, V], bool], least: int) -> None:
        self._stale = stale
        self._least = least
        self._mark = least

    def after(self, table: MutableMapping[K, V]) -> None:
        """An entry went into ``table``: sweep it if it has doubled since the last sweep."""
        if len(table) < self._mark:
            return
        stale = self._stale
        for key, value in list(table.items()):
            if stale(key, value):
                table.pop(key, None)
        self._mark = max(self._least, 2 * len(table))
