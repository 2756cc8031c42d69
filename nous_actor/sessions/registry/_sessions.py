"""`Sessions`: the registry users hold: its actor started (on its own or under a parent
`Supervisor`), asked and closed, and how it opens sessions.

Opening a session asks the registry's actor (`RegistryActor`) to start or
find it; when another process holds it, `open` and `aopen` return a handle
whose calls go there (each session's `Route`, in
`nous_actor.sessions.forwarding`), or, asked to wait, ask that process to hand
it over (`nous_actor.sessions.handoff.acquire`). Three collaborators own the
rest of its state: its `Passivation` (when each session was last used; the
passivator), its `HandOver` (the thread that hands its sessions to the
processes asking for them) and its routes, with the store's `Endpoint` where
other processes call the sessions it holds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from functools import partial
from multiprocessing import AuthenticationError
from typing import Any, Final, TypeVar

import pykka

from nous_actor._log import get_logger
from nous_actor.core.args import check_bound, check_flag, check_seconds
from nous_actor.core.ids import check_session_id
from nous_actor.errors import ConflictError, SessionStopped
from nous_actor.runtime import forks, scheduling, telemetry
from nous_actor.runtime.dispatcher import Dispatcher
from nous_actor.runtime.tables import WeakValues
from nous_actor.sessions.forwarding import (
    ENDING,
    LOCAL,
    REGISTRY_CLOSED,
    Endpoint,
    Link,
    Route,
    endpoint_for,
    let_go,
    link_to,
    local_endpoint,
    socket_path,
)
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import Session, _off_loop, check_placement
from nous_actor.sessions.handoff import HandOver, acquire
from nous_actor.sessions.reader import SessionReader
from nous_actor.sessions.registry._passivation import Passivation
from nous_actor.sessions.registry._settings import (
    DEFAULT_BACKOFF,
    GiveUp,
    Settings,
    _not_running,
    check_capacity,
)
from nous_actor.sessions.registry._supervisor import RegistryActor
from nous_actor.sessions.turns import (
    DEFAULT_DANGLING_TURNS,
    DanglingTurns,
    check_dangling_turns,
    let_turns_end,
    stop_draining,
)
from nous_actor.store import shared
from nous_actor.store.base import Store, is_store
from nous_actor.store.memory import MemoryStore
from nous_actor.store.subscription import Subscription
from nous_actor.supervision import (
    Backoff,
    ChildSpec,
    Clock,
    RestartPolicy,
    RestartType,
    Scheduler,
    _timer,
)

logger = get_logger("nous_actor.sessions")

T = TypeVar("T")

_LOOK_AGAIN: Final = 0.02
"""Seconds between two looks for a session whose holder is letting go of it."""

GIVEN_WAIT: Final = 1.0
"""Seconds a registry that just handed a session over waits for the asker to take it
before its own next call may claim it back."""

_CONNECT_BOUND: Final = 5.0
"""Seconds a connection to a holder's endpoint may take, at most."""

LINKED_KEPT: Final = 1024
"""Routes to sessions held by other processes that a registry keeps after their last
handle is gone (the most recently located): the next open of one needs no lookup."""


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
        if store is not None and not is_store(store):
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
        # The telemetry sink is set up here, once per process, not by the first session
        # started: importing OpenTelemetry takes ~12 ms, which the first request a web
        # worker served would pay (and every open behind it in the registry's queue).
        telemetry.probe()
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
        self._settings = Settings(
            self.store,
            max_sessions,
            max_restarts,
            max_seconds,
            # Unless told: escalate under a parent (one that child_spec() is for), else log.
            on_give_up or ("log" if start else "escalate"),
            backoff,
            timeout,
            clock,
            scheduler,
            dispatcher,
            dangling_turns,
        )
        self._passivation = Passivation(idle_timeout, clock, self._held)
        self._handover = HandOver(
            self.store,
            timeout=timeout,
            holds_any=self._holds_any,
            live_ref=self._live_ref,
            idle_for=self._passivation.idle_for,
        )
        # Each session's route (here, or to the process that holds it), and this
        # process's endpoint for the store (made with the registry on a store other
        # processes share, else with the first route). Routes are kept weakly: a
        # route lives while something sends through it (a handle, a move under way, a
        # call in flight over its link) or its session's actor here runs (the actor's
        # cell refers to it); a process that opens millions of sessions over its life
        # keeps only those. Routes are made under ``_routes_lock`` (one per session).
        self._routes: WeakValues[str, Route] = WeakValues()
        self._routes_lock = threading.Lock()
        # The last `LINKED_KEPT` routes that found their session in another process,
        # kept alive: a web worker opens a handle per request, and a route forgotten
        # between two requests would look its holder up in the store again (a handle
        # per request on a session held here needs nothing: its actor keeps its route).
        self._linked: dict[str, Route] = {}
        self._unreached = threading.local()  # ``why``: the last holder `_reach` failed to reach
        self._home = _Home(self)
        self._endpoint: Endpoint | None = None
        # The registry's actor: set at each start (by a parent, at each of its restarts).
        self._ref: pykka.ActorRef[RegistryActor] | None = None
        self._ref_changed = threading.Condition()
        self._supervised = not start
        self._spec_made = False
        self._closed = False
        self._born = forks.born()  # a forked child refuses it (`_here`)
        self._host = scheduling.current()  # a simulation begun since refuses it (`_here`)
        if start:
            self._start_actor()
        self._passivation.start(self.passivate_idle)
        if shared.forwards_between_processes(self.store):
            # A store that other processes share: this process's endpoint is made now,
            # not by the first open, which a web worker's first requests would all wait
            # for (its secret read, its socket and thread made, its address told).
            # What fails here is met again, and raised, by the first open.
            with contextlib.suppress(Exception):
                self._join_endpoint()

    # -- the user's side -------------------------------------------------------------------

    def open(self, session_id: str, *, wait: float | None = None) -> Session:
        """Start or find ``session_id`` and return a handle that survives its restarts.

        Opening a session the registry gave up on tries it again (a fresh
        restart intensity).

        **A session another process holds** (a web worker that served its
        previous request) is not refused: the handle's calls go to that process
        and come back, with the same futures, errors and order, turns included
        (on one host, through a Unix socket the holder advertises with its
        claim; another registry of this process on the same store is called
        directly). The session stays where it is; it moves only when its holder
        goes away (exits, closes, passivates it, dies), and the calls made
        meanwhile are held and delivered in order, exactly once, where it goes.
        A call whose holder died before answering fails with `SessionCrashed`
        (it may or may not have been applied: the store is the truth).

        **Moving it here** on purpose: ``wait`` seconds (default: the registry's
        ``handoff_wait``; ``None`` or 0: not at all) asks the holder for it; the
        holder hands it over as soon as it is idle (nothing in flight, no call
        waiting) by passivating it and releasing its claim, and this registry
        then takes it and recovers it from the store. Nothing acknowledged is
        lost, however often a session moves; the store's claim (on PostgreSQL
        its lease and fencing) decides who writes.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id (see
                `nous_actor.core.ids`), or ``wait`` is not a number of seconds >= 0.
            TooManySessions: ``max_sessions`` sessions are live.
            ConflictError: the holder cannot be called from here (it advertised no
                address: a process of an older release, a standalone session, or one
                on another host; ``holder`` names it where the store knows), or it
                kept the session for ``wait`` seconds when asked for it.
            StoreError: the store failed while recovering the session.
            SessionStopped: the registry is closed (or not running), or this process
                was forked from the one that made it (make one after the fork).
        """
        session_id = check_session_id(session_id)
        wait = self._wait(wait)
        route = self._route(session_id)
        if wait:
            found: pykka.ActorRef[Any] | Link = self._acquire(
                session_id, wait, partial(self._open_ref, session_id)
            )
        else:
            known = self._known(route)
            if known is not None:
                return known
            found = self._locate(session_id, opening=True)
        return self._settled(session_id, route, found)

    def _known(self, route: Route) -> Session | None:
        """A handle on ``route`` when it already knows where its session is (its actor
        here runs, or a link to its holder is open): an open needs no lookup then (if
        the holder let go meanwhile, the first call finds where the session went)."""
        target = route.target()
        if target is None:
            return None
        if isinstance(target, pykka.ActorRef):
            if not target.is_alive():
                return None
        elif target.closed:
            return None
        self._handover.start()
        return self._handle(route.session_id, route)

    def _wait(self, wait: object) -> float:
        """``wait`` (or the registry's default) as seconds to wait for a hand-off."""
        if wait is None:
            return self.handoff_wait or 0.0
        return check_seconds(wait, "wait", low_open=False)

    def _open_ref(self, session_id: str) -> pykka.ActorRef[Any]:
        """Start or find ``session_id`` here (a fresh chance if it was given up on)."""
        ref, ready = self._ask(("open", session_id, telemetry.context()), session_id)
        if ready is not None:  # recovering: wait here, not in the registry
            ready.get()
        self._handover.start()
        return ref  # type: ignore[no-any-return]

    # -- where a session is --------------------------------------------------------------------

    def _route(self, session_id: str) -> Route:
        """The route of ``session_id`` in this registry (made on first use)."""
        self._here(session_id)
        route = self._routes.get(session_id)
        if route is None:
            if self._closed:
                raise SessionStopped(session_id, "the registry is closed")
            if self._endpoint is None and not self._closed:
                self._join_endpoint()
            with self._routes_lock:
                route = self._routes.get(session_id)
                if route is None:
                    route = self._routes[session_id] = Route(session_id, self._home, self.timeout)
        return route

    def _here(self, session_id: str) -> None:
        """`SessionStopped` if this process forked from the one that made the registry:
        its sessions, threads and claims are that process's (`nous_actor.runtime.forks`)."""
        if forks.forked_since(self._born):
            raise SessionStopped(session_id, forks.refusal("this Sessions registry", self._born))
        if self._host is not scheduling.current():
            raise scheduling.other_host("this Sessions registry", self._host)

    def _join_endpoint(self) -> None:
        """Make (or find) this process's endpoint for the store, and join it."""
        with self._ref_changed:
            if self._endpoint is None and not self._closed:
                self._endpoint = endpoint_for(self.store)
                if self._endpoint is not None:
                    self._endpoint.join(self)
                    self._handover.told = True  # its claims say where askers tell it

    def _settled(
        self, session_id: str, route: Route, found: pykka.ActorRef[Any] | Link
    ) -> Session:
        route.settle(found)
        if not isinstance(found, pykka.ActorRef):
            with self._routes_lock:
                linked = self._linked
                linked.pop(session_id, None)
                linked[session_id] = route
                if len(linked) > LINKED_KEPT:
                    del linked[next(iter(linked))]
        return self._handle(session_id, route)

    def _locate(
        self, session_id: str, opening: bool = False, refused: ConflictError | None = None
    ) -> pykka.ActorRef[Any] | Link:
        """Where ``session_id`` is now: its actor here (started, and recovered from the
        store, if no live process holds it), or a link to the process that holds it.
        With ``handoff_wait``, a session held elsewhere is asked for instead (moved here).

        Raises:
            ConflictError: its holder cannot be called from here (it advertised no
                address: an older release, or another host), or it kept changing hands
                for the handles' bound.
            SessionStopped, StoreError, TooManySessions: as `open`.
        """
        host = scheduling.current()
        deadline = host.now() + self.timeout
        open_here = partial(self._open_ref if opening else self._resolve_now, session_id)
        last = refused
        if last is None and not self.handoff_wait:
            # Held by a live process that says where it answers: call it there, without
            # starting an actor here just to have its claim refused.
            link = self._holder_link(session_id)
            if link is not None:
                return link
        if last is None and not self.handoff_wait and self._handover.given_away(session_id):
            # Handed to a process that asked for it: call it there once it took it,
            # rather than claim it back at once.
            link = self._await_taker(session_id, min(deadline, host.now() + GIVEN_WAIT))
            if link is not None:
                return link
        while True:
            if last is None:
                try:
                    return open_here()
                except ConflictError as exc:
                    last = exc
            if self.handoff_wait:
                return self._acquire(session_id, self.handoff_wait, open_here, last)
            self._unreached.why = ""  # (why its live holder could not be reached, if so)
            reached = self._reach(session_id, shared.holder_address(self.store, session_id))
            if isinstance(reached, str):
                if not reached:
                    raise last  # its holder cannot be called from here: the refusal stands
                raise ConflictError(
                    reached,
                    session_id=session_id,
                    holder=last.holder,
                    lease_until=last.lease_until,
                ) from last
            if reached is not None:
                return reached
            if host.now() >= deadline:
                why = self._unreached.why
                if why:
                    raise ConflictError(
                        why,
                        session_id=session_id,
                        holder=last.holder,
                        lease_until=last.lease_until,
                    ) from last
                raise last
            # Let go meanwhile, or its holder is ending: look again shortly.
            shared.wait_changed(self.store, shared.wait_changed(self.store, -1, 0.0), _LOOK_AGAIN)
            last = None

    def _holder_link(self, session_id: str) -> Link | None:
        """A link to the live holder of ``session_id`` when the store names one that is
        not this registry's endpoint (``None`` otherwise: try to open it here)."""
        found = shared.holder_address(self.store, session_id)
        if found is None or found[1] is None:
            return None
        mine = self._endpoint
        if mine is not None and found[1] == mine.address:
            return None  # held in this process (by this registry, perhaps): ask it
        reached = self._reach(session_id, found)
        return None if isinstance(reached, str) else reached

    def _await_taker(self, session_id: str, until: float) -> Link | None:
        """A link to the process that takes ``session_id`` (asked for it) before
        ``until``; ``None`` if none did."""
        host = scheduling.current()
        version = shared.wait_changed(self.store, -1, 0.0)
        while True:
            found = shared.holder_address(self.store, session_id)
            if found is not None and found[1] is not None:
                reached = self._reach(session_id, found)
                if isinstance(reached, str):
                    return None
                if reached is not None:
                    return reached
            left = until - host.now()
            if left <= 0:
                return None
            version = shared.wait_changed(self.store, version, min(left, _LOOK_AGAIN * 5))

    def _reach(self, session_id: str, found: tuple[str, str | None] | None) -> Link | str | None:
        """A link to the live process that holds ``session_id`` (``found``: the store's
        holder and address of it). ``None`` if none holds it now, or its holder cannot
        be reached yet (it is ending: try to open again; if it did not answer at its
        address, what to tell the caller is left in ``_unreached.why``, for this
        thread). A string if its holder cannot be called from here: why (empty: the
        claim's refusal says enough — the store cannot tell holders, or the holder
        advertised no address, or no key)."""
        if found is None:
            return None if shared.tells_holders(self.store) else ""
        holder, address = found
        if address is None:
            return ""
        if address == ENDING:
            return None  # its registry is closing: the claim is let go shortly
        mine = self._endpoint
        if mine is not None and address == mine.address and mine.route_here(session_id) is None:
            return None  # ours, but no registry here runs it: it is being let go
        local = local_endpoint(address)
        if local is not None:
            return local.link()
        if address.startswith(LOCAL):
            return ""  # a holder that could not listen (its log says why): refused
        if socket_path(address) is None:
            return (
                f"is held by {holder}, which answers at {address}: not a process of this "
                "host; use RaySessions across hosts, or open(id, wait=...) to move it here"
            )
        key = shared.forwarding_key(self.store)
        if key is None:
            return ""
        try:
            return link_to(address, key, min(self.timeout, _CONNECT_BOUND))
        except (OSError, AuthenticationError, EOFError) as exc:
            # It ended (or is ending): its claim goes with it. Else it lives on and
            # cannot be called: say so, if the claim is still refused at the bound.
            self._unreached.why = (
                f"is held by {holder}, which could not be reached at its address "
                f"{address} ({type(exc).__name__}: {exc}); nothing was done; if that "
                "process is ending, try again; if it lives on (its socket file was "
                "removed: it listens again within a minute), open(id, wait=...) to "
                "have it handed over here, or stop the session in that process"
            )
            return None

    def read(self, session_id: str) -> SessionReader:
        """A read-only view of ``session_id`` that never takes the session: what it
        reads is the committed history in the store, from any process, whoever
        holds the session (this registry, another process, or nobody).

        Its methods are the handle's reads (``derive_messages``, ``events``,
        ``since``, ``as_of``, ``log``, ``subscribe``...), each returning a
        future; see `nous_actor.SessionReader`.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id.
            SessionStopped: the registry is closed, or this process was forked from
                the one that made it.
        """
        session_id = check_session_id(session_id)
        self._here(session_id)
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
        route = self._route(session_id)
        if not wait:
            known = self._known(route)
            if known is not None:
                return known
        found: pykka.ActorRef[Any] | Link
        # The actor, once recovered: the registry answers when the recovery is done, so
        # the caller wakes once (awaited here, not in a coroutine of its own: one object
        # fewer per open in flight for the collector).
        answer: SessionFuture[Any] = SessionFuture(session_id, self.timeout)
        try:
            self._current(session_id).tell(("open_ready", answer, session_id))
        except pykka.ActorDeadError:
            raise _not_running(session_id) from None
        try:
            found = await answer
            self._handover.start()
        except ConflictError as exc:
            if wait:
                found = await _off_loop(
                    partial(
                        self._acquire, session_id, wait, partial(self._open_ref, session_id), exc
                    )
                )
            else:
                found = await _off_loop(partial(self._locate, session_id, True, exc))
        return self._settled(session_id, route, found)

    def _handle(self, session_id: str, route: Route) -> Session:
        """A handle of ``session_id``: its calls go through the session's ``route``."""
        return Session(session_id, None, timeout=self.timeout, route=route)

    def live(self) -> list[str]:
        """Ids of the sessions running now, sorted."""
        if self._closed or self._ref is None or not self._ref.is_alive():
            return []
        return self._ask(("live",))  # type: ignore[no-any-return]

    def _holds_any(self) -> bool:
        """Whether a session runs here now (the hand-over rests while none does): one
        look at the first live entry, where `live` sorts them all."""
        if self._closed or self._ref is None or not self._ref.is_alive():
            return False
        return self._ask(("holds_any",))  # type: ignore[no-any-return]

    def restart_count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash.

        Raises:
            TypeError, ValueError: ``session_id`` is not a valid session id.
        """
        session_id = check_session_id(session_id)
        return self._ask(("restart_count", session_id), session_id)  # type: ignore[no-any-return]

    def passivate_idle(self, now: float | None = None) -> list[str]:
        """Stop the sessions idle for ``idle_timeout`` or longer; returns their ids.

        Raises:
            TypeError: ``now`` is not ``None`` or a number (the registry's clock's time).
        """
        if now is not None and (isinstance(now, bool) or not isinstance(now, int | float)):
            raise TypeError(
                f"passivate_idle(now) takes None or the registry clock's time (a number), "
                f"got {type(now).__name__}"
            )
        if self.idle_timeout is None:
            return []
        return self._ask(("passivate", self.clock() if now is None else now))  # type: ignore[no-any-return]

    def close(self, timeout: float = 10.0) -> None:
        """Stop every session, all within ``timeout``: each is asked at once (they stop
        side by side, each after the calls already queued to it), then waited for.
        Their writer claims are given up together once they stopped (one store
        transaction on SQLite), before this returns: another process may open any
        of them at once.

        Turns that other processes run through this one on its sessions (a web
        worker recycled under other workers' agent runs) are let end first: the
        close waits for them, up to half of ``timeout``, taking their calls and every
        other call as usual meanwhile, except that no turn opens on these sessions
        (a turn that asks waits, and opens where the session is next once it
        stopped). A turn still open then ends as the session stops (its holder's
        next call fails with `TurnInterrupted`, reason ``restart``).

        A registry running on its own stops too. One under a parent stays up,
        refusing every call (the parent stops it with the rest of its tree).

        Raises:
            TypeError, ValueError: ``timeout`` is not a number of seconds (NaN is
                refused), checked before anything is stopped.
        """
        timeout = max(check_bound(timeout, "close(timeout)"), 0.0)
        if self._closed:
            return
        if forks.forked_since(self._born):
            # A copy in a forked child: its sessions, threads, socket and claims are the
            # parent's, which goes on using them. Nothing to stop here.
            self._closed = True
            return
        self._passivation.stop()
        self._handover.stop()
        began = time.monotonic()
        held = self._let_turns_end(began + timeout / 2, began + timeout + self.timeout)
        timeout = max(timeout - (time.monotonic() - began), timeout / 2)
        for route in self._routes.values():
            route.close(REGISTRY_CLOSED)
        with self._routes_lock:
            self._linked.clear()
        endpoint, self._endpoint = self._endpoint, None
        # The endpoint's claims say ENDING while they are let go: a caller elsewhere
        # waits for them, rather than take them for a holder it cannot call.
        ended = endpoint is not None and endpoint.leave(self)
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
        if ended:
            let_go(self.store)
        stop_draining(held)
        self._closed = True

    def _let_turns_end(self, until: float, stopped: float) -> list[str]:
        """(Closing.) Let the turns other processes run on the sessions held here end
        first, waiting until ``until`` at most (a web worker recycled under other
        workers' agent runs); meanwhile every call is taken as usual, except that no
        turn opens on these sessions until they stopped (by ``stopped`` at the latest):
        those that ask wait, and follow the session. The ids of the sessions held back
        (`stop_draining`). (`time.monotonic` times.)"""
        endpoint = self._endpoint
        if endpoint is None:
            return []
        with self._routes_lock:
            held = list(self._routes)
        mine = frozenset(held)
        if not endpoint.peer_turns(mine):
            return []  # (no other process opened a turn here: nothing to wait for)
        let_turns_end(held, partial(endpoint.peer_turns, mine), until, stopped)
        return held

    async def aclose(self, timeout: float = 10.0) -> None:
        """`close` for asyncio code: awaited without blocking the loop."""
        timeout = max(check_bound(timeout, "aclose(timeout)"), 0.0)
        await _off_loop(partial(self.close, timeout))

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

    # -- its actor -------------------------------------------------------------------------

    def _start_actor(self) -> pykka.ActorRef[RegistryActor]:
        ref: pykka.ActorRef[RegistryActor] = RegistryActor.start(self._settings, self._passivation)
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
        self._here(session_id)
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

    # -- opening sessions --------------------------------------------------------------------

    def _resolve(self, session_id: str) -> pykka.ActorRef[Any]:
        try:
            return self._resolve_now(session_id)
        except ConflictError as exc:
            if not self.handoff_wait:
                raise
            refused = exc
        # Handed to another process meanwhile: ask for it back, as open() would.
        return self._acquire(
            session_id, self.handoff_wait, partial(self._resolve_now, session_id), refused
        )

    def _acquire(
        self,
        session_id: str,
        wait: float,
        open_now: Callable[[], T],
        refused: ConflictError | None = None,
    ) -> T:
        """`acquire` ``session_id`` from its holder (see there), this registry's hand-over
        meanwhile leaving it alone (`HandOver.taking`)."""
        with self._handover.taking(session_id):
            return acquire(self.store, session_id, wait, open_now, refused, self._tell_holder)

    def _tell_holder(self, session_id: str) -> None:
        """Tell the live holder of ``session_id`` that this process asked for it (best
        effort: a holder not told looks at the requests on its own, less often)."""
        try:
            found = shared.holder_address(self.store, session_id)
            reached = None if found is None else self._reach(session_id, found)
            if reached is not None and not isinstance(reached, str):
                reached.tell_asked(session_id)
        except Exception as exc:
            logger.debug("registry.holder_not_told", session_id=session_id, error=str(exc))

    def _resolve_now(self, session_id: str) -> pykka.ActorRef[Any]:
        ref, ready = self._ask(("resolve", session_id, telemetry.context()), session_id)
        if ready is not None:  # (re)starting: its calls would wait for the log anyway
            ready.get()
        return ref  # type: ignore[no-any-return]

    def _held(self, session_id: str) -> bool:
        """Whether calls of ``session_id`` wait, held by its route here while it moves (a
        reopen under way): its passivation waits for them. (Asked by the registry's
        actor: one table look-up and one attribute read, without the route's lock.)"""
        route = self._routes.get(session_id)
        return route is not None and route.held is not None

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


class _Home:
    """What a registry's routes and handles ask of it, by session id (`Home`): one object
    per registry, where each route and handle held bound methods of their own (seven
    objects per open session for the cyclic GC to visit)."""

    __slots__ = ("_sessions",)

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def locate(self, session_id: str) -> pykka.ActorRef[Any] | Link:
        return self._sessions._locate(session_id)

    def resolve(self, session_id: str) -> pykka.ActorRef[Any]:
        return self._sessions._resolve(session_id)

    def touch(self, session_id: str) -> None:
        self._sessions._passivation.touch(session_id)

    def watch(self, session_id: str, from_seq: int, buffer: int, timeout: float) -> Subscription:
        store = self._sessions.store
        return shared.watch(store, session_id, from_seq, buffer=buffer, timeout=timeout)
