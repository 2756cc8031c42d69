"""The dynamic session supervisor and registry: open sessions by id, keep them running.

One object to the user::

    with Sessions(SQLiteStore("agents.db")) as sessions:
        chat = sessions.open("chat-42")
        chat.append("user_message", {"content": "hi"}).get()

* ``open(id)`` starts the session (recovering it from the store) or finds it.
* A crashed session is restarted from the store, within a per-session
  restart intensity and with backoff; its handles keep working: calls in
  flight at the crash fail with a clear error, later calls reach the new actor.
* ``max_sessions`` caps the live sessions; ``idle_timeout`` passivates idle
  ones (stops them; the next call reopens them from the store).
* ``close()`` (or leaving the ``with`` block) stops every session.

Every restart, recovery, give-up, stop and passivation is a structlog event
with ``session_id`` and ``reason`` (and ``restart_count`` where it counts);
docs/supervision.md lists every event the library logs.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import SessionStopped, TooManySessions
from nous_actor.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.ids import check_session_id
from nous_actor.session import Session, SessionActor, _safe_str
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.supervision import (
    Backoff,
    Clock,
    Exit,
    RestartIntensity,
    Scheduler,
    _timer,
    start_monitored,
)

__all__ = ["DEFAULT_BACKOFF", "Sessions"]

DEFAULT_BACKOFF = Backoff(0.005, 1.0, 0.1)
"""5 ms before the first restart, doubling up to 1 s, ±10 %."""

logger = get_logger(__name__)


class Sessions:
    """A registry of supervised sessions on one store (a context manager).

    Args:
        store: where sessions persist (default: a new `MemoryStore`,
            which survives restarts but not the process).
        max_sessions: how many sessions may be live at once.
        idle_timeout: stop sessions not called for this many seconds (checked
            every ``idle_timeout / 2`` s, or by `passivate_idle`).
        max_restarts, max_seconds: each session's restart intensity; beyond it
            the registry gives the session up (``session.gave_up``) and its
            handles fail with `SessionStopped` until ``open()`` is called again.
        backoff: the wait before a restart (``None``: at once).
        timeout: the handles' default bound on every wait.
        clock, scheduler: injectable for tests.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        max_sessions: int = 10_000,
        idle_timeout: float | None = None,
        max_restarts: int = 5,
        max_seconds: float = 30.0,
        backoff: Backoff | None = DEFAULT_BACKOFF,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Clock = time.monotonic,
        scheduler: Scheduler = _timer,
    ) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be None or > 0 seconds, got {idle_timeout!r}")
        RestartIntensity(max_restarts, max_seconds)  # validates
        self.store: Store = MemoryStore() if store is None else store
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.backoff = backoff
        self.timeout = timeout
        self.clock = clock
        self.scheduler = scheduler
        self._lock = threading.RLock()
        self._live: dict[str, pykka.ActorRef[Any]] = {}
        self._intensity: dict[str, RestartIntensity] = {}
        self._restarts: dict[str, int] = {}
        self._gave_up: dict[str, str] = {}
        self._last_used: dict[str, float] = {}
        self._expected: set[str] = set()  # urns of sessions stopped on purpose
        self._previous: dict[str, pykka.ActorRef[Any]] = {}  # the last actor of each id
        self._closed = False
        self._reaper_stop = threading.Event()
        if idle_timeout is not None:
            t = threading.Thread(target=self._reap, name="nous-passivator", daemon=True)
            t.start()

    # -- the user's side -----------------------------------------------------------------

    def open(self, session_id: str) -> Session:
        """Start or find ``session_id`` and return a handle that survives its restarts.

        Opening a session the registry gave up on tries it again (a fresh
        restart intensity).

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id (see `nous_actor.ids`).
            TooManySessions: ``max_sessions`` sessions are live.
            ConflictError: another live writer holds the session in the store.
            StoreError: the store failed while recovering the session.
            SessionStopped: the registry is closed.
        """
        check_session_id(session_id)
        with self._lock:
            if self._gave_up.pop(session_id, None) is not None:
                self._intensity.pop(session_id, None)  # a fresh chance, asked for by name
            self._resolve(session_id)
        return Session(
            session_id,
            partial(self._resolve, session_id),
            timeout=self.timeout,
            touch=partial(self._touch, session_id),
        )

    def live(self) -> list[str]:
        """Ids of the sessions running now, sorted."""
        with self._lock:
            return sorted(sid for sid, ref in self._live.items() if ref.is_alive())

    def restart_count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash."""
        with self._lock:
            return self._restarts.get(session_id, 0)

    def passivate_idle(self, now: float | None = None) -> list[str]:
        """Stop the sessions idle for ``idle_timeout`` or longer; returns their ids."""
        if self.idle_timeout is None:
            return []
        now = self.clock() if now is None else now
        with self._lock:
            idle = [
                sid
                for sid, ref in self._live.items()
                if now - self._last_used.get(sid, now) >= self.idle_timeout and ref.is_alive()
            ]
            for sid in idle:
                self._stop(sid, "idle")
        return idle

    def close(self, timeout: float = 10.0) -> None:
        """Stop every session (most recently opened first), each within ``timeout``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reaper_stop.set()
            for sid in reversed(list(self._live)):
                self._stop(sid, "registry closed", timeout)

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sessions live={len(self._live)} store={self.store!r}>"

    # -- internals -----------------------------------------------------------------------

    def _touch(self, session_id: str) -> None:
        self._last_used[session_id] = self.clock()

    def _resolve(self, session_id: str) -> pykka.ActorRef[Any]:
        with self._lock:
            if self._closed:
                raise SessionStopped(session_id, "the registry is closed")
            reason = self._gave_up.get(session_id)
            if reason is not None:
                raise SessionStopped(
                    session_id,
                    f"gave up after {self._restarts.get(session_id, 0)} restarts ({reason}); "
                    "open() it again to retry",
                )
            ref = self._live.get(session_id)
            if ref is not None and ref.is_alive():
                return ref
            return self._start(session_id)

    def _start(self, session_id: str) -> pykka.ActorRef[Any]:
        live = sum(1 for r in self._live.values() if r.is_alive())
        if session_id not in self._live and live >= self.max_sessions:
            raise TooManySessions(
                f"cannot open session {session_id!r}: {live} sessions are live "
                f"(max_sessions={self.max_sessions}); close or passivate some "
                "(idle_timeout=), or raise max_sessions"
            )
        previous = self._previous.pop(session_id, None)
        dead = self._live.get(session_id)
        if dead is not None and not dead.is_alive():  # stopped; its exit not yet handled
            previous = dead
        if previous is not None:  # its appends still in flight must land first
            released: threading.Event | None = getattr(previous, "released", None)
            if released is not None and not released.wait(self.timeout):
                self._previous[session_id] = previous
                raise SessionStopped(
                    session_id,
                    f"its previous actor still holds the store after {self.timeout:g} s "
                    "(a commit is stuck); try again later",
                )
        ready: SessionFuture[None] = SessionFuture(session_id, self.timeout)
        ref = start_monitored(
            lambda: SessionActor.start(
                session_id, None, self.store, ready, crash_on_store_failure=True
            ),
            partial(self._on_exit, session_id),
        )
        self._live[session_id] = ref
        self._last_used[session_id] = self.clock()
        try:
            ready.get()
        except BaseException:
            if self._live.get(session_id) is ref:
                del self._live[session_id]
            self._expected.add(ref.actor_urn)  # counted by whoever called us, not again
            self._previous[session_id] = ref
            raise
        return ref

    def _stop(self, session_id: str, why: str, timeout: float | None = None) -> None:
        ref = self._live.pop(session_id, None)
        if ref is None:
            return
        self._expected.add(ref.actor_urn)
        self._previous[session_id] = ref
        try:
            ref.stop(block=True, timeout=self.timeout if timeout is None else timeout)
        except pykka.Timeout:
            logger.error(
                "session.shutdown_timeout",
                session_id=session_id,
                reason=f"did not stop in time ({why}); abandoned",
            )
        logger.info(
            "session.passivated" if why == "idle" else "session.stopped",
            session_id=session_id,
            reason=why,
        )

    def _on_exit(self, session_id: str, exit: Exit) -> None:
        # In the exiting session's thread.
        with self._lock:
            if exit.urn in self._expected:
                self._expected.discard(exit.urn)
                return  # stopped on purpose
            ref = self._live.get(session_id)
            current = ref is not None and ref.actor_urn == exit.urn
            if current:
                assert ref is not None
                del self._live[session_id]
                self._previous[session_id] = ref
            if exit.normal or self._closed:
                return
            assert exit.reason is not None
            reason = f"{type(exit.reason).__name__}: {_safe_str(exit.reason)}"
            if not current:
                # A caller reopened the session before this exit was handled:
                # still a crash, counted and logged, but nothing to restart.
                intensity = self._intensity.setdefault(
                    session_id, RestartIntensity(self.max_restarts, self.max_seconds, self.clock)
                )
                if not intensity.allow():
                    self._gave_up[session_id] = reason
                    logger.error(
                        "session.gave_up",
                        session_id=session_id,
                        reason=reason,
                        restart_count=self._restarts.get(session_id, 0),
                    )
                    self._stop(session_id, "gave up")
                    return
                count = self._restarts[session_id] = self._restarts.get(session_id, 0) + 1
                logger.warning(
                    "session.restart",
                    session_id=session_id,
                    reason=reason,
                    restart_count=count,
                    reopened_by_caller=True,
                )
                return
        self._crashed(session_id, reason)

    def _crashed(self, session_id: str, reason: str) -> None:
        """Count a crash against the session's intensity; restart it or give it up."""
        with self._lock:
            intensity = self._intensity.setdefault(
                session_id, RestartIntensity(self.max_restarts, self.max_seconds, self.clock)
            )
            if not intensity.allow():
                self._gave_up[session_id] = reason
                logger.error(
                    "session.gave_up",
                    session_id=session_id,
                    reason=reason,
                    restart_count=self._restarts.get(session_id, 0),
                )
                return
            count = self._restarts[session_id] = self._restarts.get(session_id, 0) + 1
            delay = self.backoff.delay(intensity.recent) if self.backoff else 0.0
            logger.warning(
                "session.restart",
                session_id=session_id,
                reason=reason,
                restart_count=count,
                delay=round(delay, 6),
            )
        if delay > 0:
            self.scheduler(delay, partial(self._restart, session_id, reason))
        else:
            self._restart(session_id, reason)

    def _restart(self, session_id: str, reason: str) -> None:
        """Start ``session_id`` again after the crash ``reason`` (logged with the recovery)."""
        with self._lock:
            if self._closed or session_id in self._gave_up:
                return
            ref = self._live.get(session_id)
            if ref is not None and ref.is_alive():
                return  # a caller reopened it meanwhile
            try:
                self._start(session_id)
            except Exception as exc:  # e.g. the store failed on load: a crash too
                failure = f"restart failed: {type(exc).__name__}: {_safe_str(exc)}"
            else:
                logger.info(
                    "session.recovered_after_crash",
                    session_id=session_id,
                    reason=reason,
                    restart_count=self._restarts.get(session_id, 0),
                )
                return
        self._crashed(session_id, failure)

    def _reap(self) -> None:
        assert self.idle_timeout is not None
        while not self._reaper_stop.wait(self.idle_timeout / 2):
            try:
                self.passivate_idle()
            except Exception as exc:  # keep reaping
                logger.error(
                    "session.passivation_failed",
                    reason=type(exc).__name__,
                    error=_safe_str(exc),
                )
