"""A `Sessions` registry's life: its actor started (on its own or under a parent
`Supervisor`), asked, closed; and its idle sessions passivated.

`RegistryLife` is the lower half of `Sessions`; the facade's constructor sets
the attributes declared here.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import SessionStopped
from nous_actor.runtime import scheduling
from nous_actor.sessions.actor import _safe_str
from nous_actor.sessions.handle import _off_loop
from nous_actor.sessions.registry._actor import RegistryActor
from nous_actor.sessions.registry._base import _not_running
from nous_actor.supervision import ChildSpec, Clock, RestartType

if TYPE_CHECKING:
    from nous_actor.sessions.handoff import HandOver

logger = get_logger("nous_actor.sessions.registry")


class RegistryLife:
    """The registry's actor and its passivation, under `Sessions` (a base class of it)."""

    if TYPE_CHECKING:
        timeout: float
        clock: Clock
        idle_timeout: float | None
        _handover: HandOver
        _ref: pykka.ActorRef[RegistryActor] | None
        _ref_changed: threading.Condition
        _supervised: bool
        _spec_made: bool
        _closed: bool
        _last_used: dict[str, float]
        _reaper_stop: threading.Event

    # -- supervision -----------------------------------------------------------------------

    def child_spec(
        self,
        id: str = "sessions",
        *,
        restart: RestartType = "permanent",
        shutdown_timeout: float = 10.0,
    ) -> ChildSpec:
        """A `ChildSpec` that runs this registry under a parent `Supervisor`.

        Each start (the first, and every restart by the parent) starts a fresh
        registry actor; handles opened before keep working: their next call
        reopens the session from the store.

        Raises:
            ValueError: the registry was made with ``start=True`` (it already runs
                on its own), or a spec was already made for it.
        """
        if not self._supervised:
            raise ValueError(
                "this registry already runs on its own; make it with "
                "Sessions(store, start=False) to put it under a Supervisor"
            )
        if self._spec_made:
            raise ValueError("child_spec() was called already: a registry has one parent")
        self._spec_made = True
        return ChildSpec(id, self._start_actor, restart, shutdown_timeout)

    def _start_actor(self) -> pykka.ActorRef[RegistryActor]:
        ref: pykka.ActorRef[RegistryActor] = RegistryActor.start(self)
        with self._ref_changed:
            self._ref = ref
            self._ref_changed.notify_all()
        return ref

    def _started(self) -> bool:
        return self._closed or self._ref is not None

    def _wait_started(self, timeout: float | None) -> bool:
        with self._ref_changed:
            return self._ref_changed.wait_for(self._started, timeout=timeout)

    def _current(self, session_id: str) -> pykka.ActorRef[RegistryActor]:
        """The registry actor. Under a parent that has not started it yet, its first
        start is waited for, at most the handles' bound (a stopped one is not: the
        call fails at once, and one made after the parent restarted it reaches it)."""
        if self._supervised and self._ref is None:
            scheduling.current().wait(self._started, self.timeout, self._wait_started)
        with self._ref_changed:
            ref = self._ref
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        if ref is None:
            raise SessionStopped(
                session_id,
                f"its supervisor has not started the registry within {self.timeout:g} s",
            )
        return ref

    def _ask(self, message: tuple[Any, ...], session_id: str = "?") -> Any:
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        ref = self._current(session_id)
        try:
            return ref.ask(message, timeout=self.timeout)
        except pykka.ActorDeadError:
            raise _not_running(session_id) from None
        except pykka.Timeout:
            raise SessionStopped(
                session_id, f"the registry did not answer within {self.timeout:g} s"
            ) from None

    # -- asking and closing ------------------------------------------------------------------

    async def aclose(self, timeout: float = 10.0) -> None:
        """`close` for asyncio code: awaited without blocking the loop."""
        await _off_loop(partial(self.close, timeout))

    def live(self) -> list[str]:
        """Ids of the sessions running now, sorted."""
        if self._closed or self._ref is None or not self._ref.is_alive():
            return []
        return self._ask(("live",))  # type: ignore[no-any-return]

    def restart_count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash."""
        return self._ask(("restart_count", session_id), session_id)  # type: ignore[no-any-return]

    def passivate_idle(self, now: float | None = None) -> list[str]:
        """Stop the sessions idle for ``idle_timeout`` or longer; returns their ids."""
        if self.idle_timeout is None:
            return []
        return self._ask(("passivate", self.clock() if now is None else now))  # type: ignore[no-any-return]

    def close(self, timeout: float = 10.0) -> None:
        """Stop every session (most recently opened first), each within ``timeout``.

        A registry running on its own stops too. One under a parent stays up,
        refusing every call (the parent stops it with the rest of its tree).
        """
        if self._closed:
            return
        self._reaper_stop.set()
        self._handover.stop()
        ref = self._ref
        if ref is not None and ref.is_alive():
            try:
                n = len(self.live())
                # Each session gets its own bound; the whole wait is bounded by them.
                ref.ask(("close", timeout), timeout=self.timeout + timeout * (n + 1))
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
            if not self._supervised:
                ref.stop(block=True, timeout=self.timeout)
        self._closed = True

    # -- idle sessions -----------------------------------------------------------------------

    def _touch(self, session_id: str) -> None:
        self._last_used[session_id] = self.clock()

    def _reap(self) -> None:
        assert self.idle_timeout is not None
        while not self._reaper_stop.wait(self.idle_timeout / 2):
            self._reap_once()

    def _reap_once(self) -> None:
        try:
            self.passivate_idle()
        except SessionStopped:
            pass  # restarting, or closed (then the reaping ends)
        except Exception as exc:  # keep reaping
            logger.error(
                "session.passivation_failed",
                reason=type(exc).__name__,
                error=_safe_str(exc),
            )

    def _reap_tick(self) -> bool:
        """One look of the passivator where it is a timer (a simulation's); whether to
        look again."""
        if self._reaper_stop.is_set():
            return False
        self._reap_once()
        return True
