"""Supervision, OTP style, on top of Pykka (which has none).

* `SupervisedActor`: a Pykka actor that reports its exit (normal, or a
  crash with its reason) to the supervisor that started it, and contains a
  ``BaseException`` (Pykka's default would stop every actor in the process).
* `Supervisor`: child specs, strategies ``one_for_one`` /
  ``one_for_all`` / ``rest_for_one``, restart types ``permanent`` /
  ``transient`` / ``temporary``, a sliding-window restart intensity with
  optional exponential backoff, escalation to the parent supervisor beyond
  it, and shutdown in reverse start order with a timeout per child.

What counts as a crash: an exception in a tell or in ``on_start``, a
``BaseException`` in any handler, and (for sessions) a store failure after
which memory and disk may disagree. Every restart, backoff, escalation and
shutdown timeout is a structlog event with the child id and the reason.

Where the library reaches into Pykka's private names (Pykka has no public
hook for these; each is exercised by the suite, which CI runs against the
newest Pykka 4.x that pip resolves for ``pykka>=4,<5``):

* `SupervisedActor._actor_loop`: report the exit to the monitor and set
  ``finished`` after Pykka's last look at the inbox, however the actor ended.
* `SupervisedActor._actor_loop_setup`: a ``BaseException`` from ``on_start``
  stops only this actor (Pykka lets it through and stops every actor).
* `SupervisedActor._handle_receive`: contain a ``BaseException`` in any
  handler to this actor.
* `SupervisedActor._handle_failure`: record the exception that crashed a tell
  as the exit reason (``on_failure`` is the user's to override).
* `SessionActor._handle_receive`: dispatch the session's own calls before
  Pykka's chain of ``isinstance`` checks (the hot path).
* `SessionActor._create_actor_inbox`: a C ``SimpleQueue`` instead of a
  ``queue.Queue`` (a Python-level lock per put and get).

Pykka's name ``_stop`` must not be shadowed by a subclass (it is how
``ActorRef.stop`` reaches the actor).
"""

from __future__ import annotations

import contextvars
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pykka

from nous_actor._frozen import safe_str, short_repr
from nous_actor._log import get_logger
from nous_actor.errors import NousActorError

__all__ = [
    "ActorCrashed",
    "Backoff",
    "ChildSpec",
    "Exit",
    "RestartIntensity",
    "RestartIntensityExceeded",
    "RestartPolicy",
    "SupervisedActor",
    "Supervisor",
]

logger = get_logger(__name__)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartType = Literal["permanent", "transient", "temporary"]
Clock = Callable[[], float]
Scheduler = Callable[[float, Callable[[], None]], None]


class ActorCrashed(NousActorError):
    """The actor crashed while handling this call (a ``BaseException``); it is stopped."""


class RestartIntensityExceeded(NousActorError):
    """More than ``max_restarts`` restarts within ``max_seconds``: the supervisor gave up."""


@dataclass(frozen=True)
class Exit:
    """How an actor ended: ``reason`` is ``None`` for a normal stop, else what crashed it."""

    urn: str
    reason: BaseException | None

    @property
    def normal(self) -> bool:
        return self.reason is None


Monitor = Callable[[Exit], None]
_next_monitor: contextvars.ContextVar[Monitor | None] = contextvars.ContextVar(
    "nous_actor_next_monitor", default=None
)


def start_monitored(
    start: Callable[[], pykka.ActorRef[Any]], monitor: Monitor
) -> pykka.ActorRef[Any]:
    """Call ``start()``; the first `SupervisedActor` it creates reports its exit to
    ``monitor``. Registered before the actor's thread runs, so no exit is missed."""
    token = _next_monitor.set(monitor)
    try:
        return start()
    finally:
        _next_monitor.reset(token)


class SupervisedActor(pykka.ThreadingActor):
    """A Pykka actor a `Supervisor` can watch.

    Its exit (a normal stop, or a crash: an exception in a tell or in
    ``on_start``, a ``BaseException`` anywhere) is reported to the monitor
    given by `start_monitored`. A ``BaseException`` stops only this actor.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._monitor = _next_monitor.get()
        _next_monitor.set(None)  # only the first actor created by start() is the child
        self.exit_reason: BaseException | None = None
        # Set when the actor's thread is done (after Pykka's last look at the inbox):
        # the one signal that an actor has really stopped. Reachable from its ref.
        self.finished = threading.Event()
        setattr(self.actor_ref, "finished", self.finished)  # noqa: B010
        # Set once on_start has returned (or failed): a supervisor starts its
        # children one after the other, each done starting before the next.
        self.started = threading.Event()
        setattr(self.actor_ref, "started", self.started)  # noqa: B010

    def _actor_loop_setup(self) -> None:
        try:
            super()._actor_loop_setup()  # Pykka catches an Exception from on_start
        except BaseException as exc:  # ... but not a BaseException: a crash too
            self._crash(exc)
        finally:
            self.started.set()

    def _handle_receive(self, message: Any) -> Any:
        try:
            return super()._handle_receive(message)
        except Exception:
            raise
        except BaseException as exc:  # contain it: stop only this actor
            self._crash(exc)
            # An ask gets this instead of an answer (Pykka would send None).
            raise ActorCrashed(
                f"{self} crashed with {type(exc).__name__} in an ask and stopped"
            ) from exc

    def _cleanup(self) -> None:
        """Hook run in the actor's thread when it has stopped, however it stopped."""

    def _handle_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        if self.exit_reason is None and exc_value is not None:
            self.exit_reason = exc_value
        super()._handle_failure(exc_type, exc_value, tb)

    def _crash(self, exc: BaseException) -> None:
        """Stop this actor now, as crashed by ``exc`` (call from the actor's thread)."""
        if self.exit_reason is None:
            self.exit_reason = exc
        pykka.ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()

    def _actor_loop(self) -> None:
        try:
            super()._actor_loop()
        finally:
            try:
                self._cleanup()
                monitor, self._monitor = self._monitor, None
                if monitor is not None:
                    try:
                        monitor(Exit(self.actor_urn, self.exit_reason))
                    except Exception as exc:  # a broken monitor must not hide the exit
                        logger.error(
                            "actor.monitor_failed",
                            urn=self.actor_urn,
                            reason=type(exc).__name__,
                            error=short_repr(exc),
                        )
            finally:
                self.finished.set()  # the very last thing: the exit has been reported


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff before a restart: ``min * 2**(n-1)`` capped at ``max``, ± ``jitter``.

    ``n`` is the number of restarts within the intensity window, this one included.
    """

    min: float = 0.01
    max: float = 5.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (0 <= self.min <= self.max) or not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff needs 0 <= min <= max and 0 <= jitter <= 1, got {self!r}")

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        base = min(self.max, self.min * (2 ** max(0, n - 1)))
        if self.jitter and base:
            r = (rng or random).uniform(-self.jitter, self.jitter)
            base = max(0.0, base * (1 + r))
        return float(base)


@dataclass
class RestartIntensity:
    """A sliding window of restart times: allow at most ``max_restarts`` in ``max_seconds``."""

    max_restarts: int = 3
    max_seconds: float = 5.0
    clock: Clock = time.monotonic
    times: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.max_seconds <= 0:
            raise ValueError("max_restarts must be >= 0 and max_seconds > 0")

    def allow(self) -> bool:
        """Record a restart; ``False`` if it exceeds the intensity (then it is not recorded)."""
        now = self.clock()
        while self.times and now - self.times[0] > self.max_seconds:
            self.times.popleft()
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        return True

    @property
    def recent(self) -> int:
        """Restarts in the current window."""
        now = self.clock()
        return sum(1 for t in self.times if now - t <= self.max_seconds)


class RestartPolicy:
    """When to restart, and after how long: the one restart machinery of the tree.

    Both `Supervisor` (one window for all its children, as in OTP) and the
    session registry (a window per session) decide restarts with it: each
    restart of ``key`` is recorded in a sliding window of ``max_seconds``;
    beyond ``max_restarts`` in it, `delay` answers ``None`` (give up or
    escalate); else the backoff to wait, and `later` runs the restart then.
    """

    def __init__(
        self,
        max_restarts: int,
        max_seconds: float,
        backoff: Backoff | None = None,
        clock: Clock = time.monotonic,
        scheduler: Scheduler | None = None,
    ) -> None:
        RestartIntensity(max_restarts, max_seconds)  # validates
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self.backoff = backoff
        self.clock = clock
        self.scheduler: Scheduler = _timer if scheduler is None else scheduler
        self._windows: dict[object, RestartIntensity] = {}

    def window(self, key: object = None) -> RestartIntensity:
        """The restart window of ``key`` (made on first use)."""
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = RestartIntensity(
                self.max_restarts, self.max_seconds, self.clock
            )
        return w

    def delay(self, key: object = None) -> float | None:
        """Record a restart of ``key``: the wait before it, or ``None`` beyond the intensity
        (then nothing is recorded)."""
        w = self.window(key)
        if not w.allow():
            return None
        return self.backoff.delay(w.recent) if self.backoff else 0.0

    def forget(self, key: object = None) -> None:
        """Start ``key``'s window afresh."""
        self._windows.pop(key, None)

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay`` seconds (at once, in this thread, for 0)."""
        if delay > 0:
            self.scheduler(delay, fn)
        else:
            fn()


@dataclass(frozen=True)
class ChildSpec:
    """How to start and restart one child.

    ``start`` must start a `SupervisedActor` (a session actor, a
    `Supervisor`, or your own subclass) and return its ref.
    """

    id: str
    start: Callable[[], pykka.ActorRef[Any]]
    restart: RestartType = "permanent"
    shutdown_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.restart not in ("permanent", "transient", "temporary"):
            raise ValueError(
                f"restart must be 'permanent', 'transient' or 'temporary', got {self.restart!r}"
            )


def _timer(delay: float, fn: Callable[[], None]) -> None:
    t = threading.Timer(delay, fn)
    t.daemon = True
    t.start()


class Supervisor(SupervisedActor):
    """A supervisor: starts its children in order and keeps them running.

    >>> from nous_actor.supervision import ChildSpec, Supervisor
    >>> sup = Supervisor.start([], strategy="one_for_one")
    >>> sup.proxy().which_children().get(timeout=5)
    []
    >>> sup.stop()
    True

    Args:
        children: the child specs, started in this order (stopped in reverse).
        strategy: which children restart when one exits abnormally (or, for
            ``permanent`` children, at all): ``one_for_one`` (just it),
            ``one_for_all`` (all), ``rest_for_one`` (it and those started after).
        max_restarts, max_seconds: the restart intensity. One restart more
            within the window and the supervisor stops every child and exits
            with `RestartIntensityExceeded`, which its parent sees as a
            crash (escalation); a top-level supervisor logs it and stays down.
        backoff: wait this long before each restart (``None``: restart at once).
        clock, scheduler: injectable for tests (``scheduler(delay, fn)`` runs
            ``fn`` after ``delay`` seconds).
    """

    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        max_seconds: float = 5.0,
        backoff: Backoff | None = None,
        clock: Clock = time.monotonic,
        scheduler: Scheduler = _timer,
        name: str = "supervisor",
    ) -> None:
        super().__init__()
        if strategy not in ("one_for_one", "one_for_all", "rest_for_one"):
            raise ValueError(
                f"strategy must be 'one_for_one', 'one_for_all' or 'rest_for_one', "
                f"got {strategy!r}"
            )
        ids = [c.id for c in children]
        if len(set(ids)) != len(ids):
            raise ValueError(f"child ids must be unique, got {ids}")
        self.name = name
        self.specs = list(children)
        self.strategy = strategy
        self.policy = RestartPolicy(max_restarts, max_seconds, backoff, clock, scheduler)
        self.refs: dict[str, pykka.ActorRef[Any] | None] = {}
        self.restarts = 0
        self._stopping = False
        self._expected_exits: set[str] = set()

    # -- life ----------------------------------------------------------------------------

    def on_start(self) -> None:
        try:
            for spec in self.specs:
                self._start_child(spec)
        except BaseException:
            self._stopping = True
            self._stop_children(self.specs)  # do not leak the ones already started
            raise

    def on_stop(self) -> None:
        self._stopping = True
        self._stop_children(self.specs)

    def _cleanup(self) -> None:
        # However the supervisor ended (a crash skips on_stop), no child outlives it.
        if any(ref is not None for ref in self.refs.values()):
            self._stopping = True
            self._stop_children(self.specs)

    def _start_child(self, spec: ChildSpec) -> None:
        me = self.actor_ref

        def monitor(exit: Exit) -> None:
            try:
                me.tell(("child_exit", spec.id, exit))
            except pykka.ActorDeadError:
                pass

        ref = self.refs[spec.id] = start_monitored(spec.start, monitor)
        started: threading.Event | None = getattr(ref, "started", None)
        if started is not None and not started.wait(spec.shutdown_timeout):
            logger.warning(
                "supervisor.slow_start",
                supervisor=self.name,
                child=spec.id,
                reason=f"on_start still running after {spec.shutdown_timeout:g} s",
            )
        logger.debug("supervisor.child_started", supervisor=self.name, child=spec.id)

    def _stop_children(self, specs: Sequence[ChildSpec]) -> None:
        for spec in reversed(specs):
            ref = self.refs.get(spec.id)
            if ref is None:
                continue
            self._expected_exits.add(ref.actor_urn)
            try:
                ref.stop(block=True, timeout=spec.shutdown_timeout)
            except pykka.Timeout:
                logger.error(
                    "supervisor.shutdown_timeout",
                    supervisor=self.name,
                    child=spec.id,
                    reason=f"did not stop within {spec.shutdown_timeout:g} s; abandoned",
                )
            self.refs[spec.id] = None

    # -- messages ------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, tuple) and message and message[0] == "child_exit":
            self._child_exit(message[1], message[2])
            return None
        if isinstance(message, tuple) and message and message[0] == "restart":
            self._restart(message[1])
            return None
        return super().on_receive(message)

    def _spec(self, child_id: str) -> ChildSpec | None:
        return next((s for s in self.specs if s.id == child_id), None)

    def _child_exit(self, child_id: str, exit: Exit) -> None:
        if exit.urn in self._expected_exits:
            self._expected_exits.discard(exit.urn)
            return
        spec = self._spec(child_id)
        ref = self.refs.get(child_id)
        if self._stopping or spec is None or ref is None or ref.actor_urn != exit.urn:
            return
        self.refs[child_id] = None
        reason = (
            "normal"
            if exit.reason is None
            else f"{type(exit.reason).__name__}: {safe_str(exit.reason)}"
        )
        if spec.restart == "temporary" or (spec.restart == "transient" and exit.normal):
            logger.info(
                "supervisor.child_exited", supervisor=self.name, child=child_id, reason=reason
            )
            if spec.restart == "temporary":
                self.specs.remove(spec)
                self.refs.pop(child_id, None)
            return
        delay = self.policy.delay()
        if delay is None:
            self._escalate(child_id, reason)
            return
        self.restarts += 1
        logger.warning(
            "supervisor.restart",
            supervisor=self.name,
            child=child_id,
            reason=reason,
            restart_count=self.restarts,
            strategy=self.strategy,
            delay=round(delay, 6),
        )
        if delay > 0:
            me = self.actor_ref

            def fire() -> None:
                try:
                    me.tell(("restart", child_id))
                except pykka.ActorDeadError:
                    pass

            self.policy.later(delay, fire)
        else:
            self._restart(child_id)

    def _restart(self, child_id: str) -> None:
        spec = self._spec(child_id)
        if spec is None or self._stopping:
            return
        i = self.specs.index(spec)
        if self.strategy == "one_for_one":
            group = [spec]
        elif self.strategy == "one_for_all":
            group = list(self.specs)
        else:
            group = self.specs[i:]
        others = [s for s in group if s is not spec]
        self._stop_children(others)
        for s in others:  # a temporary child is never restarted, not even with its group
            if s.restart == "temporary":
                self.specs.remove(s)
                self.refs.pop(s.id, None)
                group.remove(s)
        for s in group:
            if self.refs.get(s.id) is None:
                try:
                    self._start_child(s)
                except Exception as exc:
                    self._escalate(s.id, f"restart failed: {type(exc).__name__}: {exc}")
                    return

    def _escalate(self, child_id: str, reason: str) -> None:
        err = RestartIntensityExceeded(
            f"supervisor {self.name!r}: more than {self.policy.max_restarts} restarts in "
            f"{self.policy.max_seconds:g} s (last: child {child_id!r}, {reason})"
        )
        logger.error(
            "supervisor.escalate",
            supervisor=self.name,
            child=child_id,
            reason=reason,
            restart_count=self.restarts,
        )
        self._stopping = True
        self._stop_children(self.specs)
        self._crash(err)

    # -- queries (through a proxy) -------------------------------------------------------

    def which_children(self) -> list[tuple[str, bool]]:
        """``(child id, running)`` for each child, in start order."""
        return [
            (s.id, (ref := self.refs.get(s.id)) is not None and ref.is_alive()) for s in self.specs
        ]

    def child_ref(self, child_id: str) -> pykka.ActorRef[Any] | None:
        """The current ref of a child (changes when it restarts), or ``None``."""
        return self.refs.get(child_id)

    def restart_count(self) -> int:
        """Restarts made so far."""
        return self.restarts
