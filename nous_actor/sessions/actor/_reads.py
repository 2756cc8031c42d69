"""The calls that read a session, and its hand-off to another process.

The reads that must see every earlier append wait for its commit (see
``_WAIT_FOR_COMMITS`` in `nous_actor.sessions.actor._store`).
"""

from __future__ import annotations

from typing import Any

from nous_actor._log import get_logger
from nous_actor.core.log import Log
from nous_actor.sessions.actor._base import SessionState
from nous_actor.store.subscription import Subscription

logger = get_logger("nous_actor.sessions.actor")


class Reads(SessionState):
    """The session's read calls, its barrier and its hand-off (a part of `SessionActor`)."""

    __slots__ = ()

    # -- reads -----------------------------------------------------------------------------

    def h_subscribe(self, sub: Subscription, from_seq: int) -> Subscription:
        sub._catch_up(self.log.since(from_seq))
        self.subscribers.append(sub)
        return sub

    def h_unsubscribe(self, sub: Subscription) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)

    def h_read(self, name: str, *args: Any) -> Any:
        return getattr(self.log, name)(*args)

    def h_log(self) -> Log:
        return self.log._view()

    def h_ping(self) -> None:
        return None

    def h_flush(self) -> None:
        """Answered once every append made before it is committed (a barrier)."""
        return None

    # -- hand-off --------------------------------------------------------------------------

    def busy(self) -> str | None:
        """Why this session cannot be handed to another process now (``None``: it is
        idle: nothing in flight, nothing waiting, no compaction being written)."""
        if self._loading:
            return "recovering"
        if self.inflight or self._store_ops:
            return "a commit is in flight"
        if self.parked:
            return "calls are waiting"
        if self._compacting:
            return "a compaction is being written"
        if self.turns is not None:
            return "a turn is open"
        return None

    def h_handoff(self) -> bool:
        """Another process asked for this session: if it is idle, stop now (normally:
        no restart), letting go of the claim; ``False`` if it is busy (ask again later).

        A call already queued behind this one makes it busy too, so a caller's
        call is not refused for a hand-off; one that lands in the instant of the
        stop is answered with `SessionStopped` (not applied). A handle's next call
        reopens the session through its registry, which may ask for it back."""
        if self.busy() is not None or not self.actor_inbox.empty():
            return False
        logger.info("session.handed_over", session_id=self.session_id, reason="asked")
        self._stop()
        return True
