"""The logs a `NousSessionService` reads: `_Logs`, a handle per session and the cached
folds of their logs (least recently used first out), each caught up with its log when
read. A handle sends its calls to wherever the session is (this process, or the worker
process that holds it) and holds them while the session moves or restarts; of a session
another process holds, only the events appended since the last read cross (`_Mirror`)."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Final, TypeVar

from nous_actor.core.event import Event
from nous_actor.integrations.adk.folds import _Readable, _StateView, _View
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions

CACHE_SIZE: Final = 1024
"""How many sessions' decoded views a service keeps (least recently used first out)."""

F = TypeVar("F", _View, _StateView)


class _Mirror:
    """What this process has read of the log of a session another process holds: its
    events so far and its next seq, grown by the events appended since each read (a
    read of the whole `Log` would carry the whole history across at every call)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.seqs: list[int] = []
        self.next = 0

    def count(self) -> int:
        return self.next

    def since(self, seq: int) -> list[Event]:
        return self.events[bisect.bisect_left(self.seqs, seq) :]

    def grow(self, count: int, events: list[Event]) -> None:
        """Add ``events`` (read after ``count``, the next seq then) past those known."""
        for ev in events:
            if ev.seq >= self.next:
                self.events.append(ev)
                self.seqs.append(ev.seq)
                self.next = ev.seq + 1
        self.next = max(self.next, count)


class _Logs:
    """The sessions of ``sessions`` a service uses: a handle per session (at most
    ``4 * CACHE_SIZE``) and the folds of their logs (at most `CACHE_SIZE` of each kind),
    the least recently used let go first.

    A fold only grows: reading one catches it up with its log, so a fold is never
    behind what this process committed before the read began.
    """

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self._handles: OrderedDict[str, Session] = OrderedDict()
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._states: OrderedDict[str, _StateView] = OrderedDict()
        self._mirrors: dict[str, _Mirror] = {}  # of the sessions with a handle here
        self.fetched = 0  # events read from other processes (for tests and the benchmark)

    async def handle(self, key: str) -> Session:
        """The handle of session ``key`` (opened when first asked for)."""
        handle = self._handles.get(key)
        if handle is None:
            handle = await self.sessions.aopen(key)
            self._handles[key] = handle
            if len(self._handles) > 4 * CACHE_SIZE:
                gone, _ = self._handles.popitem(last=False)
                self._mirrors.pop(gone, None)
        else:
            self._handles.move_to_end(key)
        return handle

    async def stored(self, key: str) -> bool:
        """Whether the store holds events of session ``key`` (read from the store, without
        opening the session: a lookup of an id never created opens nothing)."""
        return await self.sessions.read(key).count() > 0

    def folded(self, key: str) -> bool:
        """Whether the ADK session ``key``'s log is folded here already."""
        return key in self._views

    async def log(self, key: str) -> _Readable:
        """The log of session ``key`` as it is now: the session's own `Log` when it runs
        here, else what was read of it, grown by the events appended since."""
        handle = await self.handle(key)
        ref = handle._ref
        if ref is not None and ref.is_alive():  # here: its log value, nothing copied
            self._mirrors.pop(key, None)
            return await handle.log()
        mirror = self._mirrors.get(key)
        if mirror is None:
            mirror = self._mirrors[key] = _Mirror()
        # Both asked at once, the count first: the events read are all those up to it.
        count, events = handle.count(), handle.since(mirror.count())
        got = await count
        new = await events
        self.fetched += len(new)
        mirror.grow(got, new)
        return mirror

    async def view(self, key: str) -> _View:
        """The ADK session ``key`` as folded from its log, caught up."""
        return await self._fold(self._views, key, _View)

    async def state(self, key: str) -> _StateView:
        """The app or user state, or user's directory, in session ``key``, caught up."""
        return await self._fold(self._states, key, _StateView, _checkpointed(key))

    def state_folded(self, key: str) -> _StateView | None:
        """The fold of session ``key`` (app or user state, or a user's directory) kept
        here, as last caught up (not read again), or ``None``."""
        return self._states.get(key)

    async def _fold(
        self, cache: OrderedDict[str, F], key: str, new: type[F], checkpointed: bool = False
    ) -> F:
        """The fold of session ``key`` kept in ``cache`` (a ``new`` one if it has none, the
        least recently used one let go past `CACHE_SIZE`; ``checkpointed``: an app's or
        user's state, folded from its latest checkpoint), caught up with the log."""
        view = cache.get(key)
        if view is None:
            view = cache[key] = new()
            if isinstance(view, _StateView):
                view.checkpointed = checkpointed
            if len(cache) > CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        view.catch_up(await self.log(key))
        return view


def _checkpointed(key: str) -> bool:
    """Whether session ``key`` is an app's or a user's state (whose writers checkpoint it),
    not a user's directory."""
    return key.startswith(("adk/a/", "adk/u/"))
