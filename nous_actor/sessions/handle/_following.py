"""`Following`: a registry handle's subscription, which outlives its session's stops.

A registry stops a session that went idle (passivation) or that another process
asked for (a hand-off), and the session lives on: in the store, and in whichever
process opens it next. A subscription made through the registry's handle goes on
with it: the stopped actor gives it every event it committed and then, instead of
its end, `MOVED`; the subscription then follows the session's commits through the
store (the registry's `Home.watch`) from the next seq on, wherever the session is
written from now: every event exactly once, in seq order, as before. The store
feed is made on a reader (`READERS`), never on the session's or the caller's thread.

It ends as any subscription does when it is closed, cut off as lagging, or when its
session crashed (with `SessionCrashed`), and quietly when its session is stopped
for good (`stop()`, the registry closed or gave it up), also while it follows the
store (its route ends it).
"""

from __future__ import annotations

from nous_actor.core.event import Event
from nous_actor.sessions.forwarding.route import Route
from nous_actor.sessions.recovery import READERS
from nous_actor.store.subscription import MOVED, Subscription

__all__ = ["Following"]


class Following(Subscription):
    """A `Subscription` of a registry's handle: fed by the session's actor while it runs
    here, then, once the session stopped but lives on, by a feed of the store."""

    def __init__(
        self,
        session_id: str,
        route: Route,
        *,
        from_seq: int,
        buffer: int,
        timeout: float,
    ) -> None:
        super().__init__(session_id, from_seq=from_seq, buffer=buffer, timeout=timeout)
        self._route = route
        self._next = from_seq  # the seq after the last one read
        self._moving = False  # the session stopped under it: the store's feed is coming
        self._inner: Subscription | None = None  # the store's feed, once it follows that

    # -- the session's side ------------------------------------------------------------

    def _finish(self, error: BaseException | None = None) -> None:
        if error is not MOVED:
            super()._finish(error)
            with self._cond:
                inner = self._inner
            if inner is not None:  # wakes a reader waiting on it: the feed ended
                inner.close()
            return
        with self._cond:
            if self._ended or self._moving:
                return
            self._moving = True
            # The actor holds it no more: closing it must not call (and reopen) the session.
            self._on_close = None
        READERS.submit(self._follow_store)

    @classmethod
    def of_store(
        cls, session_id: str, route: Route, *, from_seq: int, buffer: int, timeout: float
    ) -> Following:
        """One that follows the store from the start (the session is held by another
        process): made here, in the caller's thread, whose errors it raises."""
        sub = cls(session_id, route, from_seq=from_seq, buffer=buffer, timeout=timeout)
        sub._moving = True
        sub._adopt(route.home.watch(session_id, from_seq, buffer, timeout))
        return sub

    def _follow_store(self) -> None:
        """(A reader.) Go on with a feed of the store, from the first seq not delivered."""
        with self._cond:
            if self._ended:
                return
            start = self._items[-1].seq + 1 if self._items else self._next
        route = self._route
        try:
            inner = route.home.watch(self.session_id, start, self.buffer, self.timeout)
        except BaseException as exc:  # the registry closed meanwhile, or the store failed
            super()._finish(None if route.closed is not None else exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._adopt(inner)

    def _adopt(self, inner: Subscription) -> None:
        """Read on from ``inner`` (a feed of the store), until the route ends it."""
        route = self._route
        with self._cond:
            ended = self._ended
            if not ended:
                self._inner = inner
                self._cond.notify_all()
                self._wake_async()
        if ended:  # closed meanwhile
            inner.close()
        elif not route.follow(self):  # the registry closed, or the session was stopped
            self._finish(None)

    # -- the consumer's side: its own events first, then the store's feed (the base's) ----

    def _pop_locked(self) -> Event:
        ev = super()._pop_locked()
        self._next = ev.seq + 1
        return ev

    def close(self) -> None:
        super().close()  # (its inner feed too: `_finish`)
        self._route.unfollow(self)
