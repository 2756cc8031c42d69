"""`RegistryActor`: the actor behind a `Sessions` registry, a dynamic supervisor of sessions.

It starts, finds, restarts, gives up and stops the sessions, one decision at
a time, in its own thread; `Sessions` only asks it. It holds the registry's
`Settings`, its `Passivation` (when each session was last used) and its
`Restarts` (each session's restart count and intensity, and who was given up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterator
from typing import Any

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import ConflictError, SessionStopped, TooManySessions
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime.flag import Flag
from nous_actor.runtime.tables import Sweep
from nous_actor.sessions.actor import Releases, SessionActor, _safe_str, session_cell
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.registry._passivation import Passivation
from nous_actor.sessions.registry._settings import Settings, _not_running
from nous_actor.supervision import (
    HANDLED_LATER,
    Clock,
    Exit,
    RestartIntensityExceeded,
    RestartPolicy,
    SupervisedActor,
    start_monitored,
)

logger = get_logger("nous_actor.sessions.registry")

_PREVIOUS_SWEEP = 64
"""The least size at which a registry sweeps released claims out of its table of
sessions' previous actors (`RegistryActor._remember_released`)."""

_RESTARTS_SWEEP = 1024
"""The least size at which a registry sweeps the restarts of sessions that no longer run,
once out of their restart window, out of its tables (`Restarts`)."""


Started = tuple[pykka.ActorRef[Any], "SessionFuture[Any] | None"]
"""A session's actor, and the future of its recovery while it still recovers (its value:
the actor's ref)."""


class _Started:
    """Recoveries that finished, by (session id, urn), for the registry to take: one
    message per burst rather than one per session (10,000 sessions opened at once
    recover in batches, and each batch's news comes in one message)."""

    __slots__ = ("_clock", "_done", "_lock", "_registry")

    def __init__(self, registry: pykka.ActorRef[Any], clock: Clock) -> None:
        self._registry = registry
        self._clock = clock
        self._lock = threading.Lock()
        self._done: list[tuple[str, str, float]] = []

    def add(self, session_id: str, urn: str) -> None:
        """``urn``'s ready is answered (called in the thread that answered it): noted
        with the registry clock's time now, when the session became ready (the registry
        takes the news later; its idle time counts from this moment, not from then)."""
        at = self._clock()
        with self._lock:
            first = not self._done
            self._done.append((session_id, urn, at))
        if first:
            try:
                self._registry.tell(("started",))
            except pykka.ActorDeadError:
                pass

    def take(self) -> list[tuple[str, str, float]]:
        with self._lock:
            done, self._done = self._done, []
        return done


def _released(session_id: str, released: Flag) -> bool:
    """Whether a previous actor's claim is given up (its entry may go)."""
    return released.is_set()


class _Starting:
    """A session recovering from the store: its ``ready``, the callback of that
    ``ready`` (its news goes to `_Started`), and the trace contexts of the callers
    waiting for it, which its actor links from the recovery's span (it iterates over
    them once the store is read; more may join until then). One object for the cyclic
    collector per session opening, where a ``partial`` of a bound method was three and
    the entry a tuple and a list beside it."""

    __slots__ = ("links", "ready", "session_id", "started", "urn")

    def __init__(
        self, started: _Started, session_id: str, ready: SessionFuture[Any], context: object
    ) -> None:
        self.started = started
        self.session_id = session_id
        self.urn = ""  # set once its actor is started
        self.ready = ready
        self.links: list[object] | None = None if context is None else [context]

    def join(self, context: object) -> None:
        """Another caller (with trace ``context``) waits for this recovery too."""
        if self.links is None:
            self.links = [context]
        else:
            self.links.append(context)

    def __iter__(self) -> Iterator[object]:
        links = self.links
        return iter(() if links is None else links)

    def __call__(self) -> None:
        self.started.add(self.session_id, self.urn)


class _ExitTo:
    """Where the sessions' exits go: to the registry, as a message naming the session
    (``Exit.key``): a session's last act, which never blocks. The registry sets the
    session's ``finished`` once it handled the exit: whoever saw the session end sees
    the registry's answer to it. (One per registry, where each session had one.)"""

    __slots__ = ("registry",)

    def __init__(self, registry: pykka.ActorRef[Any]) -> None:
        self.registry = registry

    def __call__(self, exit: Exit) -> Any:
        try:
            self.registry.tell(("exit", exit.key, exit))
        except pykka.ActorDeadError:
            return None  # nobody to answer: finished now
        return HANDLED_LATER


def _ask_stop(ref: pykka.ActorRef[Any]) -> None:
    """Tell the session of ``ref`` to stop (`SessionActor.h_stop`), after the calls
    queued before; a session stopped already is left as it is. `RegistryActor._await_stop`
    waits for it."""
    try:
        ref.tell((SessionActor.h_stop, (), None))
    except pykka.ActorDeadError:
        pass


class Restarts:
    """Each session's restarts: how many there were, the restart intensity they count
    against (a `RestartPolicy`), and the sessions given up (with the last crash).

    A process meets ever new sessions, and some crash once: the restarts of a session
    that no longer runs (not in ``live``), not given up, and whose restarts have all left
    its window, are forgotten (its count with them) once the table has doubled.
    """

    def __init__(self, policy: RestartPolicy, live: Container[str] = ()) -> None:
        self.policy = policy
        self._live = live
        self._counts: dict[str, int] = {}
        self._gave_up: dict[str, str] = {}
        self._sweep: Sweep[str, int] = Sweep(self._spent, _RESTARTS_SWEEP)

    def _spent(self, session_id: str, count: int) -> bool:
        """Whether ``session_id``'s restarts may be forgotten (its window is then dropped)."""
        if session_id in self._live or session_id in self._gave_up:
            return False
        if self.policy.window(session_id).recent:
            return False
        self.policy.forget(session_id)
        return True

    def count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash."""
        return self._counts.get(session_id, 0)

    def given_up(self, session_id: str) -> str | None:
        """Why ``session_id`` was given up (its last crash), or ``None``."""
        return self._gave_up.get(session_id)

    def retry(self, session_id: str) -> None:
        """A session given up gets a fresh intensity (it is opened again by name)."""
        if self._gave_up.pop(session_id, None) is not None:
            self.policy.forget(session_id)

    def crashed(self, session_id: str, reason: str) -> float | None:
        """Count a crash of ``session_id`` against its intensity: the wait before its
        restart, or ``None`` when the intensity is exceeded (the session is given up)."""
        delay = self.policy.delay(session_id)
        if delay is None:
            self._gave_up[session_id] = reason
            return None
        self._counts[session_id] = self._counts.get(session_id, 0) + 1
        self._sweep.after(self._counts)
        return delay


class RegistryActor(SupervisedActor):
    """The actor behind a `Sessions` registry: a dynamic supervisor of sessions.

    Every decision about a session (start, find, restart, give up, stop)
    is made in this actor's thread, one at a time. Exits of sessions reach it
    as messages from their monitors; restarts after a backoff as messages
    from the scheduler. When it stops, or crashes, its sessions stop first.
    """

    def __init__(self, settings: Settings, passivation: Passivation) -> None:
        super().__init__()
        self.settings = settings
        self.passivation = passivation
        self.live: dict[str, pykka.ActorRef[Any]] = {}
        self.restarts = Restarts(
            RestartPolicy(
                settings.max_restarts,
                settings.max_seconds,
                settings.backoff,
                settings.clock,
                settings.scheduler,
            ),
            self.live,
        )
        self.expected: set[str] = set()  # urns of sessions stopped on purpose
        # The claim's ``released`` of each id's last actor, while it may not be set yet
        # (a reopen waits for it): not the actor, whose log a stopped session would keep
        # alive for the life of the process; dropped once seen set (`_forget_released`).
        self.previous: dict[str, Flag] = {}
        self._previous_sweep: Sweep[str, Flag] = Sweep(_released, _PREVIOUS_SWEEP)
        # Sessions recovering from the store, by urn. Opens wait for their ``ready``
        # themselves, never in this actor: many sessions recover at once.
        self.starting: dict[str, _Starting] = {}
        # The crash (its reason) each of them recovers from, by urn, where a caller
        # reopened the session before its restart ran: logged once it is ready.
        self.reopened_after: dict[str, str] = {}
        self.recovered = _Started(self.actor_ref, passivation.clock)  # news for `m_started`
        self.exit_to = _ExitTo(self.actor_ref)  # every session's monitor
        self.closed = False

    # -- life --------------------------------------------------------------------------------

    def on_stop(self) -> None:
        self._stop_all("registry closed", self.settings.timeout)

    def _cleanup(self) -> None:
        # However the registry ended (a crash skips on_stop), no session outlives it.
        if self.live:
            self._stop_all("registry stopped", self.settings.timeout)

    def _stop_all(self, why: str, timeout: float) -> None:
        """Stop every live session: each is asked at once, in the order they started
        (they stop side by side on the dispatcher, and each leaves Pykka's registry,
        a list in that order, near its front), then each is waited for, all within
        ``timeout`` from now. One by one, newest first, 10,000 sessions took 2.1 s.
        Their claims are given up together, in one transaction, once all stopped
        (`Releases`)."""
        self.closed = True
        stopping = []
        releases = Releases(self.settings.store)
        for sid in list(self.live):
            ref = self._let_go(sid)
            if ref is not None:
                session_cell(ref).release_to = releases
                _ask_stop(ref)
                stopping.append((sid, ref))
        host = scheduling.current()
        deadline = host.now() + timeout
        try:
            for sid, ref in stopping:
                self._await_stop(sid, ref, why, max(deadline - host.now(), 0.0))
        finally:
            releases.flush()

    # -- messages ------------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if type(message) is not tuple or not message or type(message[0]) is not str:
            return super().on_receive(message)
        kind, *args = message
        handler: Callable[..., Any] | None = getattr(self, f"m_{kind}", None)
        if handler is None:
            return super().on_receive(message)
        return handler(*args)

    def m_open(
        self, session_id: str, context: object = None, ready: SessionFuture[Any] | None = None
    ) -> Started:
        self.restarts.retry(session_id)  # a fresh chance, asked for by name
        return self.m_resolve(session_id, context, ready)

    def m_open_ready(self, answer: SessionFuture[Any], session_id: str) -> None:
        """`m_open` for a caller that awaits the recovery too: ``answer`` gets the actor
        once it is ready (or the error of its start), so the caller wakes once. An
        actor started for it answers ``answer`` itself, as its ``ready``."""
        try:
            ref, ready = self.m_open(session_id, None, answer)
        except Exception as exc:
            answer._fail(exc)
            return
        if ready is None:
            answer._resolve(ref)
        elif ready is not answer:  # it recovers for an earlier caller: wait for that
            ready._relay(answer, ref)

    def m_started(self) -> None:
        """Sessions' recoveries finished (their ``ready`` is answered): a session that
        recovered is used now (its idle time counts from here); one that a caller
        reopened during a restart's backoff is logged as recovered (`m_restart`)."""
        for session_id, urn, ready_at in self.recovered.take():
            entry = self.starting.pop(urn, None)
            crash = self.reopened_after.pop(urn, None)
            if entry is None or self.closed:
                continue
            if entry.ready.failed():
                self._failed_start(session_id, urn)
                continue
            self.passivation.touch(session_id, ready_at)
            if crash is not None:
                self._recovered(session_id, crash)

    def _failed_start(self, session_id: str, urn: str) -> None:
        """The actor ``urn`` of ``session_id`` failed to start: it is not live, and its
        exit is not a crash (the failure went to whoever started it)."""
        ref = self.live.get(session_id)
        if ref is not None and ref.actor_urn == urn:
            del self.live[session_id]
            self._remember_released(session_id, ref)
        self.expected.add(urn)

    def m_resolve(
        self, session_id: str, context: object = None, ready: SessionFuture[Any] | None = None
    ) -> Started:
        """The live actor of ``session_id`` (started if need be) and the ``ready`` of its
        recovery if that is under way; ``context``: the caller's trace context, linked
        from the recovery's span (telemetry); ``ready``: the future a start answers
        (one is made if not given)."""
        if self.closed:
            raise SessionStopped(session_id, "the registry is closed")
        reason = self.restarts.given_up(session_id)
        if reason is not None:
            raise SessionStopped(
                session_id,
                f"gave up after {self.restarts.count(session_id)} restarts ({reason}); "
                "open() it again to retry",
            )
        ref = self.live.get(session_id)
        if ref is not None and ref.is_alive():
            entry = self.starting.get(ref.actor_urn)
            if entry is None:
                return ref, None
            if context is not None:  # it waits for that recovery too
                entry.join(context)
            return ref, entry.ready
        return self._start_session(session_id, context=context, ready=ready)

    def m_live_ref(self, session_id: str) -> pykka.ActorRef[Any] | None:
        ref = self.live.get(session_id)
        if ref is None or not ref.is_alive():
            return None
        entry = self.starting.get(ref.actor_urn)
        if entry is not None and not entry.ready.done():
            return None  # still recovering: nothing to hand over yet
        return ref

    def m_live(self) -> list[str]:
        return sorted(sid for sid, ref in self.live.items() if ref.is_alive())

    def m_holds_any(self) -> bool:
        return any(ref.is_alive() for ref in self.live.values())

    def m_restart_count(self, session_id: str) -> int:
        return self.restarts.count(session_id)

    def m_passivate(self, now: float) -> list[str]:
        idle = self.passivation.idle(now, self.live, self.starting)
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
            elif type(msg) is tuple and msg and msg[0] == "open_ready":  # an aopen's: never run
                msg[1]._fail(_not_running(msg[2]))
                continue
            kept.append(envelope)
        for envelope in kept:
            inbox.put(envelope)
        super()._actor_loop_teardown()

    def _exited(self, session_id: str, exit: Exit) -> None:
        if exit.urn in self.expected:
            self.expected.discard(exit.urn)
            return  # stopped on purpose
        self.reopened_after.pop(exit.urn, None)  # (it ended before it was ready)
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
            self._remember_released(session_id, ref)
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
        if self.closed or self.restarts.given_up(session_id) is not None:
            return
        ref = self.live.get(session_id)
        if ref is not None and ref.is_alive():
            # A caller reopened it meanwhile: nothing to restart; its recovery is this
            # restart's (logged now, or once it is ready: `m_started`).
            if ref.actor_urn in self.starting:
                self.reopened_after[ref.actor_urn] = reason
            else:
                self._recovered(session_id, reason)
            return
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
        except ConflictError as exc:
            # Another process took the session while it was down: it lives there now
            # (this registry's handles call it there). Nothing to restart here.
            self._failed_start(session_id, ref.actor_urn)
            logger.info(
                "session.restart_skipped",
                session_id=session_id,
                reason="held elsewhere",
                holder=exc.holder,
            )
            return
        except Exception as exc:  # e.g. the store failed on load: a crash too
            self._failed_start(session_id, ref.actor_urn)
            self._crashed(session_id, f"restart failed: {type(exc).__name__}: {_safe_str(exc)}")
            return
        self.passivation.touch(session_id)  # its idle time counts from its recovery
        self._recovered(session_id, reason)

    def _recovered(self, session_id: str, reason: str) -> None:
        """``session_id`` runs again after the crash ``reason``, recovered from the store
        (restarted, or reopened by a caller before its restart ran)."""
        logger.info(
            "session.recovered_after_crash",
            session_id=session_id,
            reason=reason,
            restart_count=self.restarts.count(session_id),
        )

    # -- the work ------------------------------------------------------------------------------

    def _start_session(
        self,
        session_id: str,
        restarted: bool = False,
        context: object = None,
        ready: SessionFuture[Any] | None = None,
    ) -> Started:
        """Start ``session_id``'s actor; it recovers from the store off this actor, and
        the caller waits for the ``ready`` returned (`m_started` sees how an open ended;
        a restart is waited for by `m_restart`)."""
        settings = self.settings
        # len(live) is an upper bound (stopped sessions whose exit is not handled yet
        # are still in it): they are counted exactly only near the limit.
        if session_id not in self.live and len(self.live) >= settings.max_sessions:
            live = sum(1 for r in self.live.values() if r.is_alive())
            if live >= settings.max_sessions:
                raise TooManySessions(
                    f"cannot open session {session_id!r}: {live} sessions are live "
                    f"(max_sessions={settings.max_sessions}); close or passivate some "
                    "(idle_timeout=), or raise max_sessions"
                )
        released = self.previous.pop(session_id, None)
        dead = self.live.get(session_id)
        if dead is not None and not dead.is_alive():  # stopped; its exit not yet handled
            released = session_cell(dead).released
        # Its appends still in flight must land first.
        if released is not None and not released.wait(settings.timeout):
            self.previous[session_id] = released
            raise SessionStopped(
                session_id,
                f"its previous actor still holds the store after {settings.timeout:g} s "
                "(a commit is stuck); try again later",
            )
        if ready is None:
            ready = SessionFuture(session_id, settings.timeout)
        starting = None if restarted else _Starting(self.recovered, session_id, ready, context)
        ref = start_monitored(
            lambda: SessionActor.start(
                session_id,
                None,
                settings.store,
                ready,
                crash_on_store_failure=True,
                dispatcher=settings.dispatcher,
                dangling_turns=settings.dangling_turns,
                trace_links=starting,
            ),
            self.exit_to,
        )
        self.live[session_id] = ref
        self.passivation.touch(session_id)
        if starting is None:  # a restart: m_restart waits for it
            return ref, ready
        starting.urn = ref.actor_urn
        self.starting[starting.urn] = starting
        ready.add_done_callback(starting)
        return ref, ready

    def _stop_session(self, session_id: str, why: str, timeout: float | None = None) -> None:
        ref = self._let_go(session_id)
        if ref is None:
            return
        bound = self.settings.timeout if timeout is None else timeout
        # A passivated session lives on in the store: its subscribers follow it there.
        session_cell(ref).follow = why == "idle"
        _ask_stop(ref)
        self._await_stop(session_id, ref, why, bound)

    def _let_go(self, session_id: str) -> pykka.ActorRef[Any] | None:
        """Take ``session_id`` off the live table before its actor is stopped on purpose
        (its exit is expected; it is the session's previous actor); its ref, if live."""
        ref = self.live.pop(session_id, None)
        if ref is not None:
            self.expected.add(ref.actor_urn)
            self._remember_released(session_id, ref)
        return ref

    def _remember_released(self, session_id: str, ref: pykka.ActorRef[Any]) -> None:
        """``ref`` is no longer ``session_id``'s live actor: it is not idle here any more,
        and its next actor waits for its claim's release. Released ones are swept out as
        the table grows (`Sweep`)."""
        self.passivation.forget(session_id)
        self.previous[session_id] = session_cell(ref).released
        self._previous_sweep.after(self.previous)

    def _forget_released(self, session_id: str, released: Flag) -> None:
        """``session_id``'s last actor gave its claim up: nothing left to wait for."""
        if released.is_set() and self.previous.get(session_id) is released:
            del self.previous[session_id]

    def _await_stop(
        self, session_id: str, ref: pykka.ActorRef[Any], why: str, bound: float
    ) -> None:
        """Wait (at most ``bound``) for the stop asked of ``ref`` (`_ask_stop`) and its
        claim's release."""
        if not ref.actor_stopped.wait(bound):
            logger.error(
                "session.shutdown_timeout",
                session_id=session_id,
                reason=f"did not stop in time ({why}); abandoned",
            )
        else:  # its claim is given up (off its thread) before this returns
            released = session_cell(ref).released
            if released.wait(bound):
                self._forget_released(session_id, released)
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
        delay = self.restarts.crashed(session_id, reason)
        if delay is None:
            self._give_up(session_id, reason)
            return None
        count = self.restarts.count(session_id)
        # Told here, where the restart is counted, whoever then reopens the session
        # (the backoff's restart, or, more often, the caller's next call).
        sink = telemetry.sink
        if sink is not None:
            sink.restarted(reason.partition(":")[0])  # the crash's type: few values
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
                if threading.get_ident() == home:
                    self.m_restart(session_id, reason)
                    return
                try:
                    me.ask(("restart", session_id, reason), timeout=self.settings.timeout)
                except (pykka.ActorDeadError, pykka.Timeout):
                    pass

            self.restarts.policy.later(delay, fire)
        else:
            self.m_restart(session_id, reason)

    def _give_up(self, session_id: str, reason: str) -> None:
        """``session_id`` is given up (`Restarts.crashed` said so): escalate, or log."""
        count = self.restarts.count(session_id)
        if self.settings.on_give_up == "escalate":
            logger.error(
                "session.escalated",
                session_id=session_id,
                reason=reason,
                restart_count=count,
            )
            self._stop_all("registry escalated", self.settings.timeout)
            policy = self.restarts.policy
            self._crash(
                RestartIntensityExceeded(
                    f"session {session_id!r} crashed more than {policy.max_restarts} times "
                    f"in {policy.max_seconds:g} s (last: {reason}); the registry escalates"
                )
            )
            return
        logger.error("session.gave_up", session_id=session_id, reason=reason, restart_count=count)
        self._stop_session(session_id, "gave up")
