"""`Sweep`: a table keyed by session id that lets go of its stale entries as it grows;
`WeakValues`: such a table of values it holds weakly.

A long-running process meets ever new sessions; a table that keeps an entry per
session it met (a previous actor's claim, a handle, a session handed over) must
drop the entries that no longer matter, without a scan per insertion. `Sweep`
scans when the table has doubled since its last scan (amortized O(1) an entry).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

__all__ = ["Sweep", "WeakValues"]

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


def _dead(key: object, ref: weakref.ref[Any]) -> bool:
    return ref() is None


class WeakValues(Generic[K, V]):
    """Values by key, held weakly: `weakref.WeakValueDictionary`'s reads at a plain
    dict's cost. A value is held by a plain weak reference (no callback, nor a
    ``KeyedRef`` made in Python, per value); an entry whose value is gone reads as
    absent, and is dropped by a `Sweep` once the table has doubled.

    Reads need no lock (a dict's ``get`` is atomic); writers serialise among themselves.
    """

    __slots__ = ("_refs", "_sweep")

    def __init__(self, least: int = 1024) -> None:
        self._refs: dict[K, weakref.ref[V]] = {}
        self._sweep: Sweep[K, weakref.ref[V]] = Sweep(_dead, least)

    def get(self, key: K) -> V | None:
        ref = self._refs.get(key)
        return None if ref is None else ref()

    def __getitem__(self, key: K) -> V:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._refs[key] = weakref.ref(value)
        self._sweep.after(self._refs)

    def values(self) -> list[V]:
        """The values still alive, at one moment."""
        return [v for ref in list(self._refs.values()) if (v := ref()) is not None]

    def __iter__(self) -> Iterator[K]:
        return iter([k for k, ref in list(self._refs.items()) if ref() is not None])

    def __len__(self) -> int:
        return sum(1 for ref in list(self._refs.values()) if ref() is not None)
