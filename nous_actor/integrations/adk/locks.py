"""`_NamedLocks`: a service's locks by name, each made when first asked for and let go
when nobody holds or waits for it (a lock per state written, held while a write outside
a run's turn is checked for staleness and stored)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class _NamedLocks:
    """Locks by name; only the ones held or waited for exist."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # name -> (lock, users)

    @contextlib.asynccontextmanager
    async def hold(self, names: list[str]) -> AsyncIterator[None]:
        """Hold the locks named ``names``, taken in that order (so two holders that name
        them in one order never wait for each other in a loop)."""
        counted: list[str] = []
        acquired: list[asyncio.Lock] = []
        try:
            for name in names:
                lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
                self._locks[name] = (lock, users + 1)
                counted.append(name)
                await lock.acquire()
                acquired.append(lock)
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for name in counted:
                lock, users = self._locks[name]
                if users == 1:
                    del self._locks[name]
                else:
                    self._locks[name] = (lock, users - 1)
