"""`Passivation`: when each session of a registry was last used, which of them are idle,
and the passivator that has the idle ones stopped every ``idle_timeout / 2``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Mapping
from typing import Any

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import SessionStopped
from nous_actor.runtime import scheduling
from nous_actor.sessions.actor import _safe_str, session_cell
from nous_actor.supervision import Clock

logger = get_logger("nous_actor.sessions.registry")


def _nothing_held(session_id: str) -> bool:
    """(`Passivation`'s ``held`` by default.) No call is held for any session."""
    return False


class Passivation:
    """A registry's idle sessions: the time of each session's last use (a handle's call,
    or the moment it became ready), the choice of the idle ones, and the passivator.

    The passivator (a thread, or a simulation's timer) calls ``passivate``, the
    registry's `Sessions.passivate_idle`, every ``idle_timeout / 2`` seconds until
    `stop`; without an ``idle_timeout`` nothing is ever idle and nothing runs.

    ``held(session_id)`` says whether calls of the session wait, held by its route
    while it moves (reopens, say): such a session is not idle, whatever its clock says.
    """

    def __init__(
        self,
        idle_timeout: float | None,
        clock: Clock,
        held: Callable[[str], bool] = _nothing_held,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.held = held
        # session id -> when it was last used; written by the handles' threads and the
        # registry's actor, read by the actor and the hand-over thread (one dict
        # operation each).
        self._last_used: dict[str, float] = {}
        self._stop = threading.Event()
        self._passivate: Callable[[], object] | None = None

    # -- use ---------------------------------------------------------------------------------

    def touch(self, session_id: str, at: float | None = None) -> None:
        """``session_id`` is used now (a call through a handle, its start), or was at
        ``at`` (the clock's time when its recovery ended, told later: a use noted since
        is kept)."""
        if at is None:
            self._last_used[session_id] = self.clock()
        elif at > self._last_used.get(session_id, at - 1):
            self._last_used[session_id] = at

    def forget(self, session_id: str) -> None:
        """``session_id`` stopped here: it is not idle here any more (a registry that opens
        millions of sessions over its life keeps the times of the live ones only)."""
        self._last_used.pop(session_id, None)

    def idle_for(self, session_id: str) -> float | None:
        """Seconds since ``session_id`` was last used (``None``: never, here)."""
        last = self._last_used.get(session_id)
        return None if last is None else self.clock() - last

    def idle(
        self,
        now: float,
        live: Mapping[str, pykka.ActorRef[Any]],
        recovering: Container[str] = (),
    ) -> list[str]:
        """The sessions of ``live`` idle for ``idle_timeout`` or longer at ``now``.

        A session is never idle while it recovers (its actor's urn is in
        ``recovering``: its openers, and the calls parked in it, wait for it) or while
        calls held by its route wait for it (a reopen under way): stopped then, its
        openers and those calls would be refused, where a passivated session's next
        call must reopen it. (Calls queued in the inbox of a session that runs are no
        such wait: a passivation hands them back to the route, which delivers them
        where the session goes.) Its idle time counts from its last call, or from when
        it became ready (the registry touches it then), never from its start.
        """
        idle_timeout = self.idle_timeout
        if idle_timeout is None:
            return []
        last_used = self._last_used
        held = self.held
        return [
            sid
            for sid, ref in live.items()
            if now - last_used.get(sid, now) >= idle_timeout
            and ref.actor_urn not in recovering
            and ref.is_alive()
            # A turn held open (its run waits on a model) is not idle: its lease,
            # not the idle timeout, says when its holder has gone.
            and not session_cell(ref).in_turn
            and not held(sid)
        ]

    # -- the passivator ------------------------------------------------------------------------

    def start(self, passivate: Callable[[], object]) -> None:
        """Run the passivator (with an ``idle_timeout``): ``passivate`` every
        ``idle_timeout / 2`` seconds until `stop`."""
        if self.idle_timeout is None:
            return
        self._passivate = passivate
        scheduling.current().service(
            self._run, "nous-passivator", self.idle_timeout / 2, self._tick
        )

    def stop(self) -> None:
        """End the passivator (it looks no more)."""
        self._stop.set()

    def _run(self) -> None:
        assert self.idle_timeout is not None
        while not self._stop.wait(self.idle_timeout / 2):
            self._once()

    def _once(self) -> None:
        assert self._passivate is not None
        try:
            self._passivate()
        except SessionStopped:
            pass  # restarting, or closed (then the reaping ends)
        except Exception as exc:  # keep reaping
            logger.error(
                "session.passivation_failed",
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )

    def _tick(self) -> bool:
        """One look of the passivator where it is a timer (a simulation's); whether to
        look again."""
        if self._stop.is_set():
            return False
        self._once()
        return True
