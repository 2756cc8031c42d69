"""`Session`: the handle to a session running in this process (on its actor)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pykka

from nous_actor.core.args import check_bound, check_timeout
from nous_actor.core.log import Log
from nous_actor.errors import (
    CallTimeout,
    NousActorError,
    SessionStopped,
)
from nous_actor.runtime import forks, scheduling, telemetry
from nous_actor.runtime.dispatcher import CallEnvelope, Dispatcher
from nous_actor.sessions.actor import (
    HELD,
    Handler,
    SessionActor,
    _Compaction,
    session_cell,
)
from nous_actor.sessions.forwarding.route import LIFE, Route
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle._checks import _check_handle_args, _check_seq, check_placement
from nous_actor.sessions.handle._following import Following
from nous_actor.sessions.handle._session_handle import SessionHandle
from nous_actor.sessions.turns import DEFAULT_DANGLING_TURNS, DanglingTurns, check_dangling_turns
from nous_actor.sessions.turns._blocks import _ENTERED, held_future
from nous_actor.store.base import Store, is_store
from nous_actor.store.subscription import DEFAULT_BUFFER, Subscription
from nous_actor.supervision import ChildSpec, RestartType


class _Same:
    """A standalone session's ``resolve``: its one actor (one small object, where a
    closure is three for the cyclic GC to visit per session)."""

    __slots__ = ("ref",)

    def __init__(self, ref: pykka.ActorRef[SessionActor]) -> None:
        self.ref = ref

    def __call__(self) -> pykka.ActorRef[SessionActor]:
        return self.ref


def _subscribe_here(actor: SessionActor, sub: Subscription, from_seq: int) -> Any:
    """(Run by the session's actor.) Feed ``sub`` (`SessionActor.h_subscribe`), and answer
    the actor that feeds it: closing the subscription tells that actor alone."""
    actor.h_subscribe(sub, from_seq)
    return actor.actor_ref


class _Unsubscribe:
    """Closing a subscription of a handle (its ``on_close``): the actor that registered it
    (the answer of ``registered``, `_subscribe_here`) is told to drop it, if it still
    runs; once the registration is answered, when it is still in flight.

    Closing a feed is not a call: sent through the handle, it would reopen a session
    stopped meanwhile (a registry's route locates it again: a new actor, recovered
    from the store, that takes the writer claim back), or move it back here. An actor
    that stopped has ended its feeds already; one that stops as it is told drops the
    message unanswered (it has no future: no route takes it back to deliver elsewhere).
    """

    __slots__ = ("registered", "sub")

    def __init__(self, registered: SessionFuture[Any]) -> None:
        self.registered = registered
        self.sub: Subscription | None = None

    def __call__(self, sub: Subscription) -> None:
        self.sub = sub
        self.registered.add_done_callback(self._tell)

    def _tell(self) -> None:
        registered, sub = self.registered, self.sub
        if sub is None or registered.failed():
            return
        ref = registered.get(timeout=0)
        if not isinstance(ref, pykka.ActorRef) or ref.actor_stopped.is_set():
            return
        try:
            ref.tell((SessionActor.h_unsubscribe, (sub,), None))
        except pykka.ActorDeadError:
            pass  # stopped meanwhile: its feeds are ended


class Session(SessionHandle):
    """The handle to one session; every method returns a `SessionFuture`.

    Get a handle with `Session.start` (a standalone session) or from a
    supervisor's registry (which restarts sessions and re-resolves handles).

    >>> chat = Session.start("chat-42")
    >>> chat.append("user_message", {"content": "hi"}).get().seq
    0
    >>> [m.content for m in chat.derive_messages().get()]
    ['hi']
    >>> chat.stop()

    Args:
        session_id: the session's id.
        resolve: returns the live actor of the session (called again when the
            actor it returned last has stopped, so a restarted session is found);
            ``None`` only for a registry's handle, which asks its registry.
        timeout: the default bound, in seconds, of every wait on a result.
    """

    __slots__ = ("_born", "_epoch", "_host", "_own_ref", "_resolve", "_route")

    def __init__(
        self,
        session_id: str,
        resolve: Callable[[], pykka.ActorRef[SessionActor]] | None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        route: Route | None = None,
    ) -> None:
        self.session_id = _check_handle_args(session_id, timeout)
        self.timeout = float(timeout)
        if resolve is None and route is None:
            raise TypeError("Session needs resolve (a callable returning the session's actor)")
        self._resolve = resolve
        self._own_ref: pykka.ActorRef[SessionActor] | None = None
        # A registry's handle: its calls go through the session's route (here, or to
        # the process that holds it); the rest it asks of the route's registry (its
        # ``home``): the actor, the passivation's clock, a subscription that follows
        # the store where the session is held elsewhere.
        self._route = route
        self._born = forks.born()  # a forked child refuses it (`_call`, `_forked`)
        # A simulation refuses it if made outside (`_call`): its actor runs elsewhere.
        self._host = scheduling.current()
        self._epoch = scheduling.epoch  # (compared first: `current` is asked if it changed)

    def _forked(self) -> SessionStopped:
        """Why this handle cannot be used in a process forked from the one that made it
        (its session runs there: `nous_actor.runtime.forks`)."""
        return SessionStopped(self.session_id, forks.refusal("this session's handle", self._born))

    @classmethod
    def start(
        cls,
        session_id: str,
        log: Log | None = None,
        *,
        store: Store | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        dispatcher: Dispatcher | None = None,
        pinned: bool = False,
        dangling_turns: DanglingTurns = DEFAULT_DANGLING_TURNS,
    ) -> Session:
        """Start a standalone session and return its handle once it is running.

        Without a store the session holds ``log`` (or an empty log) in memory.
        With a ``store`` it claims the session as its one writer, recovers
        every stored event (seqs, times, snapshot gaps as stored), and from
        then on acknowledges an append only after the store committed it.

        A standalone session is not restarted: once stopped, its calls fail with
        `nous_actor.SessionStopped`.

        The session runs on ``dispatcher`` (default: the process's shared
        `nous_actor.Dispatcher`), or with ``pinned=True`` on a thread of its own.

        ``dangling_turns`` says what becomes of the half run of a turn the
        stored log leaves open whose holder is gone (see `nous_actor.Sessions`).

        Raises:
            ValueError, TypeError: bad arguments (nothing is started).
            ConflictError: another live writer holds the session in ``store``.
            StoreError: the store failed while recovering the session.
        """
        session_id = _check_handle_args(session_id, timeout)
        check_placement(dispatcher, pinned)
        check_dangling_turns(dangling_turns)
        if log is not None and not isinstance(log, Log):
            raise TypeError(f"log must be a nous_actor.Log, got {type(log).__name__}")
        if store is not None:
            if log is not None:
                raise ValueError(
                    "pass either log= or store=: a session on a store recovers its log from it"
                )
            if not is_store(store):
                raise TypeError(
                    f"store must implement nous_actor.store.Store, got {type(store).__name__}"
                )
        ready: SessionFuture[Any] = SessionFuture(session_id, timeout)
        context = None if store is None else telemetry.context()  # for its recovery's span
        ref = SessionActor.start(
            session_id,
            log,
            store,
            ready,
            dispatcher=dispatcher,
            pinned=pinned,
            trace_links=None if context is None else [context],
            dangling_turns=dangling_turns,
        )
        try:
            ready.get()
        except BaseException:
            ref.stop(block=False)
            raise
        return cls(session_id, _Same(ref), timeout=timeout)

    @classmethod
    def child(
        cls,
        session_id: str,
        *,
        store: Store,
        child_id: str | None = None,
        restart: RestartType = "permanent",
        shutdown_timeout: float = 5.0,
        timeout: float = DEFAULT_TIMEOUT,
        dangling_turns: DanglingTurns = DEFAULT_DANGLING_TURNS,
    ) -> tuple[Session, ChildSpec]:
        """A session to run under a `Supervisor` of your own: its handle and its spec.

        Put the `ChildSpec` in the supervisor's children. Every start of it (the
        first and each restart) starts a `SessionActor` that claims the session
        and recovers it from ``store``; a store failure after which memory and
        disk may disagree crashes it, so that the supervisor restarts it from
        the store (``dangling_turns`` as for `nous_actor.Sessions`). The handle
        reaches whichever actor is current: a call made
        while the session is down fails with `SessionStopped`, later calls
        reach the restarted session.

        Raises:
            ValueError, TypeError: bad arguments.
        """
        session_id = _check_handle_args(session_id, timeout)
        check_dangling_turns(dangling_turns)
        if not is_store(store):
            raise TypeError(
                f"store must implement nous_actor.store.Store, got {type(store).__name__}"
            )
        current: list[pykka.ActorRef[SessionActor] | None] = [None]
        started = threading.Event()

        def start() -> pykka.ActorRef[SessionActor]:
            ref = SessionActor.start(
                session_id,
                None,
                store,
                None,
                crash_on_store_failure=True,
                dangling_turns=dangling_turns,
            )
            current[0] = ref
            started.set()
            return ref

        def resolve() -> pykka.ActorRef[SessionActor]:
            # The first start is waited for (bounded); a stopped actor is returned as
            # it is (the call fails with SessionStopped; a later one finds the next).
            started.wait(timeout)
            ref = current[0]
            if ref is None:
                raise SessionStopped(
                    session_id, f"its supervisor has not started it within {timeout:g} s"
                )
            return ref

        spec = ChildSpec(child_id or session_id, start, restart, shutdown_timeout)
        return cls(session_id, resolve, timeout=timeout), spec

    # -- plumbing ------------------------------------------------------------------------

    @property
    def _ref(self) -> pykka.ActorRef[SessionActor] | None:
        """The session's actor this handle talks to, if it runs in this process."""
        route = self._route
        if route is not None:
            target = route.target()
            return target if isinstance(target, pykka.ActorRef) else None
        return self._own_ref

    @_ref.setter
    def _ref(self, ref: pykka.ActorRef[SessionActor] | None) -> None:
        # A registry's handle asks its route each time: keeping the actor here too
        # would keep a stopped session's actor and log alive as long as the handle.
        if self._route is None:
            self._own_ref = ref

    def _find(self) -> pykka.ActorRef[SessionActor]:
        """The session's live actor, (re)opened by its registry if need be."""
        route = self._route
        if route is not None:
            return route.home.resolve(self.session_id)
        assert self._resolve is not None  # (a handle without a route has one)
        return self._resolve()

    def _actor(self) -> pykka.ActorRef[SessionActor] | None:
        ref = self._ref
        if ref is None or ref.actor_stopped.is_set():
            ref = self._find()
            self._ref = ref
        return ref

    def _elsewhere(self) -> Exception | None:
        """Why a call through this handle cannot be made here (`_call` asks when the
        process forked, or a host was installed or uninstalled, since it was made):
        forked, or made under another host (a simulation began or ended); ``None`` when
        the host is the one it was made under again."""
        if self._born != forks.generation:  # this process forked since it was made
            return self._forked()
        if self._host is not scheduling.current():  # made under another host
            return scheduling.other_host("this session's handle", self._host)
        self._epoch = scheduling.epoch
        return None

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        fut: SessionFuture[Any] | None = None
        if self._born != forks.generation or self._epoch != scheduling.epoch:
            refused = self._elsewhere()
            if refused is not None:
                fut = SessionFuture(self.session_id, self.timeout)
                fut._fail(refused)
                return fut
        if _ENTERED.get() and getattr(handler, "__name__", "") in HELD:
            # A write from inside a turn's block: the session fails it at once if
            # that turn is the open one (it would wait for its own turn to end).
            fut = held_future(self.session_id, self.timeout)
        if fut is None:
            fut = SessionFuture(self.session_id, self.timeout)
        route = self._route
        if route is not None:
            route.home.touch(self.session_id)
            route.send(handler, args, fut)
            return fut
        ref = self._own_ref  # (`_ref` of a handle without a route)
        if ref is None or ref.actor_stopped.is_set():  # only then through `_actor`
            try:
                ref = self._actor()
            except NousActorError as exc:  # the registry could not (re)open it
                fut._fail(exc)
                return fut
            if ref is None or ref.actor_stopped.is_set():
                fut._fail(SessionStopped(self.session_id, "the session is stopped"))
                return fut
        # Pykka's stop race (the actor stopped between the check above and the put)
        # is closed by the dispatcher: a put after the stop runs the actor's
        # teardown, which answers the call with SessionStopped.
        ref.actor_inbox.put(CallEnvelope(handler, args, fut))  # type: ignore[arg-type]
        return fut

    def _compact_in_turn(self, req: _Compaction, turn_id: str) -> SessionFuture[Any]:
        # Here the session runs the compaction itself, as any call through the turn.
        # (The turn goes with it: its summary, written off the actor, is committed only
        # if that turn is still open then.)
        req = dataclasses.replace(req, turn_id=turn_id)
        return self._call(SessionActor.h_turn_call, turn_id, "h_compact", (req,))

    def _subscription(self, from_seq: int, buffer: int) -> Subscription:
        route = self._route
        if route is None:
            return super()._subscription(from_seq, buffer)
        # A registry's: it follows the session through the store once stopped here
        # (passivated, handed over), wherever the session is written next.
        return Following(
            self.session_id, route, from_seq=from_seq, buffer=buffer, timeout=self.timeout
        )

    def _register(self, sub: Subscription, timeout: float) -> None:
        # Closed before it is registered (its caller stopped waiting), it is dropped by
        # the actor that registers it, once that is done.
        registered = self._call(_subscribe_here, sub, sub.from_seq)
        sub._on_close = _Unsubscribe(registered)
        registered.get(timeout=timeout)

    def subscribe(
        self, from_seq: int = 0, *, buffer: int = DEFAULT_BUFFER, timeout: float | None = None
    ) -> Subscription:
        if forks.forked_since(self._born):
            raise self._forked()
        # Checked before the session's whereabouts decide the path: the same checks and
        # messages wherever it runs (`SessionCalls.subscribe`).
        _check_seq(from_seq, "subscribe(from_seq)")
        check_timeout(timeout, "subscribe(timeout)")
        route = self._route
        if route is not None:
            closed = route.closed
            if closed is not None:  # as every call through the route is refused
                raise SessionStopped(self.session_id, closed)
            if not route.here():
                # Held by another process: follow what it commits, through the store
                # (the same events, exactly once, in seq order). Made at once, in this
                # thread: ``timeout`` has nothing to bound; the feed's gets wait the
                # handle's bound, as a feed registered here does.
                return Following.of_store(
                    self.session_id, route, from_seq=from_seq, buffer=buffer, timeout=self.timeout
                )
        return super().subscribe(from_seq, buffer=buffer, timeout=timeout)

    subscribe.__doc__ = SessionHandle.subscribe.__doc__

    # -- life ----------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """Whether the session's actor this handle talks to is running now.

        For a standalone session, ``False`` is final. A registry's handle may
        report ``False`` for a passivated or crashed session: its next call
        reopens it.
        """
        if forks.forked_since(self._born):
            return False  # (it runs in the process this one forked from)
        route = self._route
        if route is not None:
            target = route.target()
            if target is None:
                return False  # moving
            if isinstance(target, pykka.ActorRef):
                return target.is_alive()
            try:
                return bool(self._call(LIFE["__alive__"]).get())
            except NousActorError:
                return False
        ref = self._ref
        if ref is None:
            ref = self._ref = self._find()
        return ref.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session after the calls already queued; waits at most ``timeout``.

        Returns once the actor has stopped and, with a store, its appends and
        snapshot drops still in flight are done and its writer claim is released
        (so the session can be started again at once). Calls made after this
        fail with `nous_actor.SessionStopped`.

        Raises:
            CallTimeout: not stopped within ``timeout``.
            SessionStopped: this process forked from the one that made the handle
                (the session runs there).
            TypeError, ValueError: ``timeout`` is not ``None`` or a number of seconds
                (NaN is refused), checked before the session is asked to stop.
        """
        bound = self.timeout if timeout is None else check_bound(timeout, "stop(timeout)")
        if forks.forked_since(self._born):
            raise self._forked()
        route = self._route
        if route is not None:
            target = route.target()
            if target is None or not isinstance(target, pykka.ActorRef):
                if target is not None:  # held by another process: ask it to stop it
                    self._call(LIFE["__stop__"], bound).get(timeout=bound)
                return
            route.release_actor()  # what is still queued fails, as after any stop
            ref = target
        else:
            ref = self._ref or self._actor()  # type: ignore[assignment]
        if ref is None:
            return
        ref.stop(block=False)
        # Wait for the actor's thread to finish, not for the reply to the stop
        # request: Pykka leaves a request unanswered if it lands after the
        # actor's last look at its inbox.
        deadline = scheduling.monotonic() + bound
        cell = session_cell(ref)
        finished, released = cell.finished, cell.released
        for done, what in ((finished, "a long call is running"), (released, "a commit is slow")):
            if not done.wait(
                min(max(deadline - scheduling.monotonic(), 0), threading.TIMEOUT_MAX)
            ):
                raise CallTimeout(self.session_id, f"did not stop within {bound:g} s ({what})")
