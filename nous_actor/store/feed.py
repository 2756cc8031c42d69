"""The feed that a reading thread fills, and the checks of a watch's arguments.

`FollowedWatch` is the `Subscription` every watch of a store that is read by
a thread of ours hands out (the SQLite follower's, `PostgresStore`'s, and the
fallback of `nous_actor.store.shared`, which names it for users); `_fill`
reads into one what it may take now.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from nous_actor.core.event import Event
from nous_actor.store.subscription import Subscription

DEFAULT_WATCH_BUFFER: Final = 1000


def _check_from_seq(from_seq: object) -> int:
    if not isinstance(from_seq, int) or isinstance(from_seq, bool):
        raise TypeError(f"from_seq must be an int >= 0, got {type(from_seq).__name__}")
    if from_seq < 0:
        raise ValueError(f"from_seq must be an int >= 0, got {from_seq}")
    return from_seq


def _check_buffer(buffer: object) -> int:
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"buffer must be an int >= 1, got {buffer!r}")
    return buffer


# -- a feed that a reading thread fills ------------------------------------------------------


class FollowedWatch(Subscription):
    """A feed of one session's committed events, filled by a thread that reads the store.

    A `nous_actor.Subscription` (``get(timeout)``, ``get_nowait()``, ``for ev in
    watch``, ``async for``, ``close()``). At most ``buffer`` events are held in
    memory; the rest wait in the store, so the feed is never cut off as
    lagging. It ends when closed, or when its store closes (then with
    `StoreError`).
    """

    def __init__(
        self,
        session_id: str,
        from_seq: int,
        buffer: int,
        timeout: float,
        on_close: Callable[[Subscription], None] | None,
        poke: Callable[[], None],
    ) -> None:
        super().__init__(
            session_id, from_seq=from_seq, buffer=buffer, timeout=timeout, on_close=on_close
        )
        self._poke = poke
        self.next_fetch = from_seq  # the reader's: the next seq to read from the store
        self.starved = False  # the buffer was full while rows were waiting

    def deliver(self, events: Sequence[Event], full: bool = False) -> bool:
        """Reader thread: add read events (``full``: they filled the room it had, so more
        may be waiting in the store: it is marked starved, and the consumer pokes the
        reader once it has taken half); ``False`` once the feed has ended."""
        with self._cond:
            if self._ended:
                return False
            if full:
                self.starved = True
            self._items.extend(events)
            self._cond.notify_all()
            self._wake_async()
        return True

    def room(self) -> int:
        """Reader thread: how many events may be read ahead now (0: full, marked starved)."""
        with self._cond:
            if self._ended:
                return 0
            room = self.buffer - len(self._items)
            if room <= 0:
                self.starved = True
            return room

    @property
    def ended(self) -> bool:
        return self._ended

    def _pop_locked(self) -> Event:
        ev = super()._pop_locked()
        if self.starved and len(self._items) <= self.buffer // 2:
            self.starved = False
            self._poke()
        return ev

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return (
            f"<{type(self).__name__} session={self.session_id!r} {state} "
            f"next={self.next_fetch} pending={len(self._items)}>"
        )


def _fill(w: FollowedWatch, read: Callable[[str, int, int], list[Event]]) -> bool:
    """Read what ``w`` may take now; ``True`` if more may be waiting."""
    room = w.room()
    if room <= 0:
        return False
    events = read(w.session_id, w.next_fetch, room)
    full = len(events) >= room
    if events:
        w.next_fetch = events[-1].seq + 1
        w.deliver(events, full)
    return full


_W = TypeVar("_W")


def prune_freed(gone: list[str], watches: dict[str, list[weakref.ref[_W]]]) -> bool:
    """Drop from ``watches`` (each session's watches, held weakly) the entries of those
    the collector freed: ``gone`` holds their sessions' ids, appended by the weak
    references' callbacks without a lock (call this under the lock that guards
    ``watches``). Whether a session's last watch went."""
    emptied = False
    while gone:
        sid = gone.pop()
        ws = watches.get(sid)
        if ws is None:
            continue
        kept = [ref for ref in ws if ref() is not None]
        if kept:
            watches[sid] = kept
        else:
            del watches[sid]
            emptied = True
    return emptied
