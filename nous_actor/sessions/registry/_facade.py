"""`Sessions`: the registry users hold, and how it opens sessions.

Opening a session asks the registry's actor (`RegistryActor`) to start or
find it; when another process holds it, `open` and `aopen` can ask that
process to hand it over (`nous_actor.sessions.handoff`). The registry's own
life (its actor, closing, passivation) is `RegistryLife`.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

import pykka

from nous_actor.core.args import check_flag, check_seconds
from nous_actor.core.ids import check_session_id
from nous_actor.errors import ConflictError, SessionStopped
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import Session, _off_loop, check_placement
from nous_actor.sessions.handoff import HandOver, acquire
from nous_actor.sessions.reader import SessionReader
from nous_actor.sessions.registry._actor import RegistryActor
from nous_actor.sessions.registry._base import (
    DEFAULT_BACKOFF,
    GiveUp,
    _not_running,
    check_capacity,
)
from nous_actor.sessions.registry._life import RegistryLife
from nous_actor.sessions.turns import DEFAULT_DANGLING_TURNS, DanglingTurns, check_dangling_turns
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.supervision import (
    Backoff,
    Clock,
    RestartPolicy,
    Scheduler,
    _timer,
)


class Sessions(RegistryLife):
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
        dangling_turns: what a session does, when it starts, with the half run of
            a turn whose holder is gone (the process that ran it died, or its
            lease ran out): ``"close_tool_calls"`` (the default) keeps the half
            run and answers each tool call it left without a result with a
            ``tool_result`` saying it was interrupted (a provider refuses a
            request holding a call without its result); ``"rollback"`` hides the
            half run behind one system note (one replace, history kept, as the
            ``rollback`` policy does); ``"keep"`` leaves it as it is. A turn whose
            holder still runs (the session's actor crashed, this process did
            not) just ends as interrupted, and its holder may go on in a new turn.

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
        dangling_turns: DanglingTurns = DEFAULT_DANGLING_TURNS,
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
        check_dangling_turns(dangling_turns)
        if clock is time.monotonic:
            clock = scheduling.current().now  # the host's (a simulation's virtual) clock
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
        self.dangling_turns: DanglingTurns = dangling_turns
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
            scheduling.current().service(
                self._reap, "nous-passivator", idle_timeout / 2, self._reap_tick
            )

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
        session_id = check_session_id(session_id)
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
        ref, ready = self._ask(("open", session_id, telemetry.context()), session_id)
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
        session_id = check_session_id(session_id)
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        return SessionReader(session_id, self.store, timeout=self.timeout)

    async def aopen(self, session_id: str, *, wait: float | None = None) -> Session:
        """`open` for asyncio code: the start (and recovery from the store) is awaited
        without blocking the loop, and without a thread per call: many sessions
        opened at once recover concurrently. A wait for a hand-off runs off the
        loop. Raises as `open` does."""
        session_id = check_session_id(session_id)
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

    async def __aenter__(self) -> Sessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sessions store={self.store!r}>"

    # -- internals ---------------------------------------------------------------------------

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
        ref, ready = self._ask(("resolve", session_id, telemetry.context()), session_id)
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
