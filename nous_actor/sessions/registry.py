"""The session registry: a dynamic supervisor of sessions, and the one object users hold.

One object to the user::

    with Sessions(SQLiteStore("agents.db")) as sessions:
        chat = sessions.open("chat-42")
        chat.append("user_message", {"content": "hi"}).get()

* ``open(id)`` starts the session (recovering it from the store) or finds it.
* A crashed session is restarted from the store, within a per-session
  restart intensity and with backoff; its handles keep working: calls in
  flight at the crash fail with a clear error, later calls reach the new actor.
* Beyond a session's intensity the registry gives that session up (logged)
  or, when it runs under a parent `Supervisor`, escalates: it crashes with
  `RestartIntensityExceeded`, stopping its sessions, and the parent's
  strategy decides what restarts (``on_give_up=``).
* ``max_sessions`` caps the live sessions; ``idle_timeout`` passivates idle
  ones (stops them; the next call reopens them from the store).
* ``close()`` (or leaving the ``with`` block) stops every session.

Behind the object is an actor (OTP's ``DynamicSupervisor``), `RegistryActor`:
it starts, watches and restarts the sessions with the same `RestartPolicy`
as `Supervisor`, and can itself be a child of one (`Sessions.child_spec`).

Every restart, recovery, give-up, stop and passivation is a structlog event
with ``session_id`` and ``reason`` (and ``restart_count`` where it counts);
docs/supervision.md lists every event the library logs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import pykka

from nous_actor._log import get_logger
from nous_actor.core.args import check_flag, check_seconds
from nous_actor.core.ids import check_session_id
from nous_actor.errors import ConflictError, SessionStopped, TooManySessions
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.sessions.actor import SessionActor, _safe_str
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import Session, _off_loop, check_placement
from nous_actor.sessions.handoff import HandOver, acquire
from nous_actor.sessions.reader import SessionReader
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.supervision import (
    HANDLED_LATER,
    Backoff,
    ChildSpec,
    Clock,
    Exit,
    RestartIntensityExceeded,
    RestartPolicy,
    RestartType,
    Scheduler,
    SupervisedActor,
    _timer,
    start_monitored,
)

__all__ = ["DEFAULT_BACKOFF", "RegistryActor", "Sessions"]

DEFAULT_BACKOFF = Backoff(0.005, 1.0, 0.1)
"""5 ms before the first restart, doubling up to 1 s, ±10 %."""

GiveUp = Literal["escalate", "log"]

logger = get_logger(__name__)


def check_capacity(max_sessions: Any, idle_timeout: Any) -> None:
    """Raise ``ValueError`` unless ``max_sessions`` is an int >= 1 and ``idle_timeout``
    is ``None`` or a finite number of seconds > 0 (a registry's capacity settings)."""
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    if idle_timeout is not None:
        try:
            check_seconds(idle_timeout, "idle_timeout")
        except (TypeError, ValueError):
            raise ValueError(
                f"idle_timeout must be None or > 0 seconds, got {idle_timeout!r}"
            ) from None


class Sessions:
    """A registry of supervised sessions on one store (a context manager).

    Args:
        store: where sessions persist (default: a new `MemoryStore`,
            which survives restarts but not the process).
        max_sessions: how many sessions may be live at once.
        idle_timeout: stop sessions not called for this many seconds (checked
            every ``idle_timeout / 2`` s, or by `passivate_idle`).
        max_restarts, max_seconds: each session's restart intensity.
        on_give_up: beyond a session's intensity, ``"log"`` gives that session
            up (``session.gave_up``; its handles fail with `SessionStopped`
            until ``open()`` is called again) and ``"escalate"`` crashes the
            registry with `RestartIntensityExceeded`, so that its parent
            `Supervisor` acts. Default: escalate when the registry runs under
            a parent (`child_spec`), else log.
        backoff: the wait before a restart (``None``: at once).
        timeout: the handles' default bound on every wait.
        clock, scheduler: injectable for tests.
        dispatcher: where the sessions run (default: the process's shared
            `nous_actor.Dispatcher`; the number of threads never grows with the
            number of sessions).
        start: start the registry now, on its own (the default). With
            ``start=False`` it starts when a parent `Supervisor` starts the
            `child_spec`, and again each time the parent restarts it.
        handoff_wait: how long `open` (and a handle reopening a session) waits
            by default for another process that holds the session to hand it
            over (``None``, the default: not at all, `ConflictError` at once).
            See `open`.

    Whatever ``handoff_wait`` says, a registry hands over the sessions other
    processes ask for (``open(id, wait=...)`` there) as soon as each is idle,
    on a store that carries hand-off requests (`SQLiteStore`, `PostgresStore`,
    `MemoryStore`).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        max_sessions: int = 10_000,
        idle_timeout: float | None = None,
        max_restarts: int = 5,
        max_seconds: float = 30.0,
        on_give_up: GiveUp | None = None,
        backoff: Backoff | None = DEFAULT_BACKOFF,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Clock = time.monotonic,
        scheduler: Scheduler = _timer,
        start: bool = True,
        dispatcher: Dispatcher | None = None,
        handoff_wait: float | None = None,
    ) -> None:
        if store is not None and not isinstance(store, Store):
            raise TypeError(
                f"store must be a nous_actor store (MemoryStore, SQLiteStore(path), "
                f"PostgresStore(dsn) or your own Store), got {type(store).__name__}"
                + (": pass SQLiteStore(path) for a file" if isinstance(store, str) else "")
            )
        check_capacity(max_sessions, idle_timeout)
        check_placement(dispatcher, False)
        if on_give_up not in (None, "escalate", "log"):
            raise ValueError(f"on_give_up must be 'escalate', 'log' or None, got {on_give_up!r}")
        RestartPolicy(max_restarts, max_seconds, backoff, clock, scheduler)  # validates
        check_seconds(timeout, "timeout")
        check_flag(start, "start")
        if handoff_wait is not None:
            handoff_wait = check_seconds(handoff_wait, "handoff_wait", low_open=False)
        if clock is time.monotonic and scheduling.host is not None:
            clock = scheduling.host.now  # a simulation's virtual clock
        self.store: Store = MemoryStore() if store is None else store
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.on_give_up = on_give_up
        self.backoff = backoff
        self.timeout = timeout
        self.clock = clock
        self.scheduler = scheduler
        self.dispatcher = dispatcher
        self.handoff_wait = handoff_wait
        self._handover = HandOver(self)
        self._ref: pykka.ActorRef[RegistryActor] | None = None
        self._ref_changed = threading.Condition()
        self._supervised = not start
        self._spec_made = False
        self._closed = False
        self._last_used: dict[str, float] = {}
        self._reaper_stop = threading.Event()
        if start:
            self._start_actor()
        if idle_timeout is not None:
            if scheduling.host is None:
                t = threading.Thread(target=self._reap, name="nous-passivator", daemon=True)
                t.start()
            else:  # a simulation: a timer on its virtual clock, armed again each time
                self._reap_later()

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

    def _current(self, session_id: str) -> pykka.ActorRef[RegistryActor]:
        """The registry actor. Under a parent that has not started it yet, its first
        start is waited for, at most the handles' bound (a stopped one is not: the
        call fails at once, and one made after the parent restarted it reaches it)."""
        host = scheduling.host
        if host is not None and self._supervised and self._ref is None:  # a simulation
            host.wait(lambda: self._closed or self._ref is not None, self.timeout)
        with self._ref_changed:
            if self._supervised and self._ref is None:
                self._ref_changed.wait_for(
                    lambda: self._closed or self._ref is not None, timeout=self.timeout
                )
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

    # -- the user's side -------------------------------------------------------------------

    def open(self, session_id: str, *, wait: float | None = None) -> Session:
        """Start or find ``session_id`` and return a handle that survives its restarts.

        Opening a session the registry gave up on tries it again (a fresh
        restart intensity).

        **Hand-off.** When another live process holds the session (a web
        worker that served its previous request), ``wait`` seconds (default:
        the registry's ``handoff_wait``; ``None`` or 0: not at all) asks that
        process for it: the holder hands it over as soon as it is idle (nothing
        in flight, no call waiting) by passivating it and releasing its
        claim, and this registry then takes it and recovers it from the
        store. Nothing acknowledged is lost, however often a session moves;
        the store's claim (on PostgreSQL its lease and fencing) decides who
        writes. Without ``wait``, `ConflictError` at once, as before.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id (see
                `nous_actor.core.ids`), or ``wait`` is not a number of seconds >= 0.
            TooManySessions: ``max_sessions`` sessions are live.
            ConflictError: another live writer holds the session in the store (and
                kept it for ``wait`` seconds); ``holder`` names it where the store knows.
            StoreError: the store failed while recovering the session.
            SessionStopped: the registry is closed (or not running).
        """
        check_session_id(session_id)
        wait = self._wait(wait)
        if not wait:
            return self._open_now(session_id)
        return acquire(self, session_id, wait, partial(self._open_now, session_id))

    def _wait(self, wait: object) -> float:
        """``wait`` (or the registry's default) as seconds to wait for a hand-off."""
        if wait is None:
            return self.handoff_wait or 0.0
        return check_seconds(wait, "wait", low_open=False)

    def _open_now(self, session_id: str) -> Session:
        ref, ready = self._ask(("open", session_id), session_id)
        if ready is not None:  # recovering: wait here, not in the registry
            ready.get()
        self._handover.start()
        return self._handle(session_id, ref)

    def read(self, session_id: str) -> SessionReader:
        """A read-only view of ``session_id`` that never takes the session: what it
        reads is the committed history in the store, from any process, whoever
        holds the session (this registry, another process, or nobody).

        Its methods are the handle's reads (``derive_messages``, ``events``,
        ``since``, ``as_of``, ``log``, ``subscribe``...), each returning a
        future; see `nous_actor.SessionReader`.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id.
            SessionStopped: the registry is closed.
        """
        check_session_id(session_id)
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        return SessionReader(session_id, self.store, timeout=self.timeout)

    async def aopen(self, session_id: str, *, wait: float | None = None) -> Session:
        """`open` for asyncio code: the start (and recovery from the store) is awaited
        without blocking the loop, and without a thread per call: many sessions
        opened at once recover concurrently. A wait for a hand-off runs off the
        loop. Raises as `open` does."""
        check_session_id(session_id)
        wait = self._wait(wait)
        try:
            return await self._aopen_now(session_id)
        except ConflictError as exc:
            if not wait:
                raise
            refused = exc
        return await _off_loop(
            partial(acquire, self, session_id, wait, partial(self._open_now, session_id), refused)
        )

    async def _aopen_now(self, session_id: str) -> Session:
        answer: SessionFuture[Any] = SessionFuture(session_id, self.timeout)
        ref = self._current(session_id)
        try:
            ref.tell(("reply", answer, "open", session_id))
        except pykka.ActorDeadError:
            raise _not_running(session_id) from None
        ref, ready = await answer
        if ready is not None:
            await ready
        self._handover.start()
        return self._handle(session_id, ref)

    def _handle(self, session_id: str, ref: pykka.ActorRef[SessionActor] | None = None) -> Session:
        """A handle of ``session_id``; given the actor just opened, its first call goes
        straight there (no lookup through the registry)."""
        handle = Session(
            session_id,
            partial(self._resolve, session_id),
            timeout=self.timeout,
            touch=partial(self._touch, session_id),
        )
        handle._ref = ref
        return handle

    async def aclose(self, timeout: float = 10.0) -> None:
        """`close` for asyncio code: awaited without blocking the loop."""
        await _off_loop(partial(self.close, timeout))

    async def __aenter__(self) -> Sessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

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

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sessions store={self.store!r}>"

    # -- internals ---------------------------------------------------------------------------

    def _touch(self, session_id: str) -> None:
        self._last_used[session_id] = self.clock()

    def _resolve(self, session_id: str) -> pykka.ActorRef[Any]:
        try:
            return self._resolve_now(session_id)
        except ConflictError as exc:
            if not self.handoff_wait:
                raise
            refused = exc
        # Handed to another process meanwhile: ask for it back, as open() would.
        return acquire(
            self, session_id, self.handoff_wait, partial(self._resolve_now, session_id), refused
        )

    def _resolve_now(self, session_id: str) -> pykka.ActorRef[Any]:
        ref, ready = self._ask(("resolve", session_id), session_id)
        if ready is not None:  # (re)starting: its calls would wait for the log anyway
            ready.get()
        return ref  # type: ignore[no-any-return]

    def _live_ref(self, session_id: str, timeout: float) -> pykka.ActorRef[Any] | None:
        """The running actor of ``session_id`` in this registry, or ``None`` (also when
        the registry does not answer within ``timeout``)."""
        registry = self._ref
        if self._closed or registry is None:
            return None
        try:
            found = registry.ask(("live_ref", session_id), timeout=timeout)
        except (pykka.ActorDeadError, pykka.Timeout):
            return None
        return found if isinstance(found, pykka.ActorRef) else None

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

    def _reap_later(self) -> None:
        assert self.idle_timeout is not None

        def tick() -> None:
            if not self._reaper_stop.is_set():
                self._reap_once()
                self._reap_later()

        scheduling.call_later(self.idle_timeout / 2, tick, "nous-passivator", daemon=True)


Started = tuple[pykka.ActorRef[Any], "SessionFuture[None] | None"]
"""A session's actor, and the future of its recovery while it still recovers."""


def _tell_started(registry: pykka.ActorRef[Any], session_id: str, urn: str) -> None:
    try:
        registry.tell(("started", session_id, urn))
    except pykka.ActorDeadError:
        pass


class RegistryActor(SupervisedActor):
    """The actor behind a `Sessions` registry: a dynamic supervisor of sessions.

    Every decision about a session (start, find, restart, give up, stop)
    is made in this actor's thread, one at a time. Exits of sessions reach it
    as messages from their monitors; restarts after a backoff as messages
    from the scheduler. When it stops, or crashes, its sessions stop first.
    """

    def __init__(self, facade: Sessions) -> None:
        super().__init__()
        self.facade = facade
        self.policy = RestartPolicy(
            facade.max_restarts, facade.max_seconds, facade.backoff, facade.clock, facade.scheduler
        )
        on_give_up = facade.on_give_up
        if on_give_up is None:
            on_give_up = "escalate" if self._monitor is not None else "log"
        self.on_give_up: GiveUp = on_give_up
        self.live: dict[str, pykka.ActorRef[Any]] = {}
        self.restarts: dict[str, int] = {}
        self.gave_up: dict[str, str] = {}
        self.expected: set[str] = set()  # urns of sessions stopped on purpose
        self.previous: dict[str, pykka.ActorRef[Any]] = {}  # the last actor of each id
        # Sessions recovering from the store, by urn: (id, ready). Opens wait for
        # ``ready`` themselves, never in this actor: many sessions recover at once.
        self.starting: dict[str, tuple[str, SessionFuture[None]]] = {}
        self.closed = False

    # -- life --------------------------------------------------------------------------------

    def on_stop(self) -> None:
        self._stop_all("registry closed", self.facade.timeout)

    def _cleanup(self) -> None:
        # However the registry ended (a crash skips on_stop), no session outlives it.
        if self.live:
            self._stop_all("registry stopped", self.facade.timeout)

    def _stop_all(self, why: str, timeout: float) -> None:
        self.closed = True
        for sid in reversed(list(self.live)):
            self._stop_session(sid, why, timeout)

    # -- messages ------------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if type(message) is not tuple or not message or type(message[0]) is not str:
            return super().on_receive(message)
        kind, *args = message
        handler: Callable[..., Any] | None = getattr(self, f"m_{kind}", None)
        if handler is None:
            return super().on_receive(message)
        return handler(*args)

    def m_reply(self, answer: SessionFuture[Any], kind: str, *args: Any) -> None:
        """Run message ``kind`` and answer ``answer`` (which asyncio can await)."""
        try:
            answer._resolve(getattr(self, f"m_{kind}")(*args))
        except Exception as exc:
            answer._fail(exc)

    def m_open(self, session_id: str) -> Started:
        if self.gave_up.pop(session_id, None) is not None:
            self.policy.forget(session_id)  # a fresh chance, asked for by name
        return self.m_resolve(session_id)

    def m_started(self, session_id: str, urn: str) -> None:
        """A session's recovery finished (its ``ready`` is answered)."""
        entry = self.starting.pop(urn, None)
        if entry is None or self.closed:
            return
        if entry[1].failed():
            self._failed_start(session_id, urn)

    def _failed_start(self, session_id: str, urn: str) -> None:
        """The actor ``urn`` of ``session_id`` failed to start: it is not live, and its
        exit is not a crash (the failure went to whoever started it)."""
        ref = self.live.get(session_id)
        if ref is not None and ref.actor_urn == urn:
            del self.live[session_id]
            self.previous[session_id] = ref
        self.expected.add(urn)

    def m_resolve(self, session_id: str) -> Started:
        if self.closed:
            raise SessionStopped(session_id, "the registry is closed")
        reason = self.gave_up.get(session_id)
        if reason is not None:
            raise SessionStopped(
                session_id,
                f"gave up after {self.restarts.get(session_id, 0)} restarts ({reason}); "
                "open() it again to retry",
            )
        ref = self.live.get(session_id)
        if ref is not None and ref.is_alive():
            entry = self.starting.get(ref.actor_urn)
            return ref, None if entry is None else entry[1]
        return self._start_session(session_id)

    def m_live_ref(self, session_id: str) -> pykka.ActorRef[Any] | None:
        ref = self.live.get(session_id)
        if ref is None or not ref.is_alive():
            return None
        entry = self.starting.get(ref.actor_urn)
        if entry is not None and not entry[1].done():
            return None  # still recovering: nothing to hand over yet
        return ref

    def m_live(self) -> list[str]:
        return sorted(sid for sid, ref in self.live.items() if ref.is_alive())

    def m_restart_count(self, session_id: str) -> int:
        return self.restarts.get(session_id, 0)

    def m_passivate(self, now: float) -> list[str]:
        idle_timeout = self.facade.idle_timeout
        if idle_timeout is None:
            return []
        last_used = self.facade._last_used
        idle = [
            sid
            for sid, ref in self.live.items()
            if now - last_used.get(sid, now) >= idle_timeout and ref.is_alive()
        ]
        for sid in idle:
            self._stop_session(sid, "idle")
        return idle

    def m_close(self, timeout: float) -> None:
        self._stop_all("registry closed", timeout)

    def m_exit(self, session_id: str, exit: Exit) -> None:
        try:
            self._exited(session_id, exit)
        finally:
            if exit.finished is not None:  # handled: now the session counts as finished
                exit.finished.set()

    def _actor_loop_teardown(self) -> None:
        # Exits that will never be handled: their sessions are finished all the same.
        inbox = self.actor_inbox
        kept = []
        while not inbox.empty():
            envelope = inbox.get()
            msg = envelope.message
            if type(msg) is tuple and msg and msg[0] == "exit" and msg[2].finished is not None:
                msg[2].finished.set()
            elif type(msg) is tuple and msg and msg[0] == "reply":  # an aopen's: never run
                msg[1]._fail(_not_running(msg[3] if len(msg) > 3 else "?"))
                continue
            kept.append(envelope)
        for envelope in kept:
            inbox.put(envelope)
        super()._actor_loop_teardown()

    def _exited(self, session_id: str, exit: Exit) -> None:
        if exit.urn in self.expected:
            self.expected.discard(exit.urn)
            return  # stopped on purpose
        if not exit.normal and self.starting.pop(exit.urn, None) is not None:
            # It died recovering (e.g. another process holds it), and this exit came
            # before the news of its failed start: its openers are told, it is no crash.
            self._failed_start(session_id, exit.urn)
            self.expected.discard(exit.urn)
            return
        ref = self.live.get(session_id)
        current = ref is not None and ref.actor_urn == exit.urn
        if current:
            assert ref is not None
            del self.live[session_id]
            self.previous[session_id] = ref
        if exit.normal or self.closed:
            return
        assert exit.reason is not None
        reason = f"{type(exit.reason).__name__}: {_safe_str(exit.reason)}"
        if current:
            self._crashed(session_id, reason)
            return
        # A caller reopened the session before this exit was handled: still a
        # crash, counted and logged, but nothing to restart.
        self._count_crash(session_id, reason, reopened_by_caller=True)

    def m_restart(self, session_id: str, reason: str) -> None:
        """Start ``session_id`` again after the crash ``reason`` (logged with the recovery)."""
        if self.closed or session_id in self.gave_up:
            return
        ref = self.live.get(session_id)
        if ref is not None and ref.is_alive():
            return  # a caller reopened it meanwhile
        # A restart (rare) waits for its recovery here, on the registry's own thread
        # (the reading is done by the reader pool): its outcome decides what is next.
        try:
            ref, ready = self._start_session(session_id, restarted=True)
        except Exception as exc:  # e.g. the previous actor still holds the store
            self._crashed(session_id, f"restart failed: {type(exc).__name__}: {_safe_str(exc)}")
            return
        try:
            assert ready is not None
            ready.get()
        except Exception as exc:  # e.g. the store failed on load: a crash too
            self._failed_start(session_id, ref.actor_urn)
            self._crashed(session_id, f"restart failed: {type(exc).__name__}: {_safe_str(exc)}")
            return
        logger.info(
            "session.recovered_after_crash",
            session_id=session_id,
            reason=reason,
            restart_count=self.restarts.get(session_id, 0),
        )
        sink = telemetry.sink
        if sink is not None:
            sink.restarted(reason.partition(":")[0])  # the crash's type: few values

    # -- the work ------------------------------------------------------------------------------

    def _start_session(self, session_id: str, restarted: bool = False) -> Started:
        """Start ``session_id``'s actor; it recovers from the store off this actor, and
        the caller waits for the ``ready`` returned (`m_started` sees how an open ended;
        a restart is waited for by `m_restart`)."""
        facade = self.facade
        # len(live) is an upper bound (stopped sessions whose exit is not handled yet
        # are still in it): they are counted exactly only near the limit.
        if session_id not in self.live and len(self.live) >= facade.max_sessions:
            live = sum(1 for r in self.live.values() if r.is_alive())
            if live >= facade.max_sessions:
                raise TooManySessions(
                    f"cannot open session {session_id!r}: {live} sessions are live "
                    f"(max_sessions={facade.max_sessions}); close or passivate some "
                    "(idle_timeout=), or raise max_sessions"
                )
        previous = self.previous.pop(session_id, None)
        dead = self.live.get(session_id)
        if dead is not None and not dead.is_alive():  # stopped; its exit not yet handled
            previous = dead
        if previous is not None:  # its appends still in flight must land first
            released: threading.Event | None = getattr(previous, "released", None)
            if released is not None and not released.wait(facade.timeout):
                self.previous[session_id] = previous
                raise SessionStopped(
                    session_id,
                    f"its previous actor still holds the store after {facade.timeout:g} s "
                    "(a commit is stuck); try again later",
                )
        ready: SessionFuture[None] = SessionFuture(session_id, facade.timeout)
        me = self.actor_ref

        def monitor(exit: Exit) -> Any:  # the exiting session's last act; never blocks
            # The registry sets the session's ``finished`` once it handled the exit:
            # whoever saw the session end sees the registry's answer to it.
            try:
                me.tell(("exit", session_id, exit))
            except pykka.ActorDeadError:
                return None  # nobody to answer: finished now
            return HANDLED_LATER

        ref = start_monitored(
            lambda: SessionActor.start(
                session_id,
                None,
                facade.store,
                ready,
                crash_on_store_failure=True,
                dispatcher=facade.dispatcher,
            ),
            monitor,
        )
        self.live[session_id] = ref
        facade._last_used[session_id] = facade.clock()
        if restarted:
            return ref, ready
        urn = ref.actor_urn
        self.starting[urn] = (session_id, ready)
        ready.add_done_callback(partial(_tell_started, me, session_id, urn))
        return ref, ready

    def _stop_session(self, session_id: str, why: str, timeout: float | None = None) -> None:
        ref = self.live.pop(session_id, None)
        if ref is None:
            return
        self.expected.add(ref.actor_urn)
        self.previous[session_id] = ref
        bound = self.facade.timeout if timeout is None else timeout
        try:
            ref.stop(block=True, timeout=bound)
        except pykka.Timeout:
            logger.error(
                "session.shutdown_timeout",
                session_id=session_id,
                reason=f"did not stop in time ({why}); abandoned",
            )
        else:
            released = getattr(ref, "released", None)
            if released is not None:  # its claim is given up (off its thread) before this returns
                released.wait(bound)
        logger.info(
            "session.passivated" if why == "idle" else "session.stopped",
            session_id=session_id,
            reason=why,
        )

    def _count_crash(
        self, session_id: str, reason: str, *, reopened_by_caller: bool = False
    ) -> float | None:
        """Count a crash against the session's intensity and log the restart; the wait
        before it, or ``None`` when the session was given up (or the registry escalated)."""
        delay = self.policy.delay(session_id)
        if delay is None:
            self._give_up(session_id, reason)
            return None
        count = self.restarts[session_id] = self.restarts.get(session_id, 0) + 1
        logger.warning(
            "session.restart",
            session_id=session_id,
            reason=reason,
            restart_count=count,
            delay=round(delay, 6),
            reopened_by_caller=reopened_by_caller,
        )
        return delay

    def _crashed(self, session_id: str, reason: str) -> None:
        """Count a crash against the session's intensity; restart it, or give up."""
        delay = self._count_crash(session_id, reason)
        if delay is None:
            return
        if delay > 0:
            me, home = self.actor_ref, threading.get_ident()

            def fire() -> None:
                # Done when this returns (a test's scheduler relies on it): in this
                # actor's thread directly, from any other by an ask.
                if threading.get_ident() == home and scheduling.host is None:
                    self.m_restart(session_id, reason)
                    return
                try:
                    if scheduling.host is not None:  # a simulation's timer task: no wait
                        me.tell(("restart", session_id, reason))
                    else:
                        me.ask(("restart", session_id, reason), timeout=self.facade.timeout)
                except (pykka.ActorDeadError, pykka.Timeout):
                    pass

            self.policy.later(delay, fire)
        else:
            self.m_restart(session_id, reason)

    def _give_up(self, session_id: str, reason: str) -> None:
        self.gave_up[session_id] = reason
        count = self.restarts.get(session_id, 0)
        if self.on_give_up == "escalate":
            logger.error(
                "session.escalated",
                session_id=session_id,
                reason=reason,
                restart_count=count,
            )
            self._stop_all("registry escalated", self.facade.timeout)
            self._crash(
                RestartIntensityExceeded(
                    f"session {session_id!r} crashed more than {self.policy.max_restarts} times "
                    f"in {self.policy.max_seconds:g} s (last: {reason}); the registry escalates"
                )
            )
            return
        logger.error("session.gave_up", session_id=session_id, reason=reason, restart_count=count)
        self._stop_session(session_id, "gave up")


def _not_running(session_id: str) -> SessionStopped:
    return SessionStopped(
        session_id,
        "the registry is not running (its supervisor restarts it, or it was stopped); try again",
    )
