"""`Supervisor`, `ChildSpec`, `RestartPolicy`: restart strategies, types, intensity, backoff."""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pykka

from nous_actor._log import get_logger
from nous_actor.core._frozen import safe_str
from nous_actor.core.args import check_callable, check_seconds
from nous_actor.runtime import scheduling, telemetry
from nous_actor.supervision.actor import (
    Cell,
    Clock,
    Exit,
    RestartIntensityExceeded,
    RestartType,
    Scheduler,
    Strategy,
    SupervisedActor,
    cell_of,
    start_monitored,
)

__all__ = ["Backoff", "ChildSpec", "RestartIntensity", "RestartPolicy", "Supervisor"]

logger = get_logger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff before a restart: ``min * 2**(n-1)`` capped at ``max``, ± ``jitter``.

    ``n`` is the number of restarts within the intensity window, this one included.
    """

    min: float = 0.01
    max: float = 5.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("min", "max", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Backoff {name} must be a number, got {value!r}")
        if (
            not math.isfinite(self.max)
            or not (0 <= self.min <= self.max)
            or not 0 <= self.jitter <= 1
        ):
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
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            raise TypeError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if isinstance(self.max_seconds, bool) or not isinstance(self.max_seconds, int | float):
            raise TypeError(
                f"max_seconds must be a number of seconds > 0, got {self.max_seconds!r}"
            )
        if self.max_restarts < 0 or not 0 < self.max_seconds < math.inf:
            raise ValueError(
                "max_restarts must be >= 0 and max_seconds > 0 (and finite), "
                f"got {self.max_restarts!r} and {self.max_seconds!r}"
            )
        check_callable(self.clock, "clock", "clock() -> seconds")

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
        RestartIntensity(max_restarts, max_seconds, clock)  # validates
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(
                f"backoff must be a nous_actor.Backoff or None, got {type(backoff).__name__}"
            )
        if scheduler is not None:
            check_callable(scheduler, "scheduler", "scheduler(delay, fn)")
        host = scheduling.current()
        self.max_restarts, self.max_seconds = host.restart_intensity(max_restarts, max_seconds)
        self.backoff = backoff
        if clock is time.monotonic:
            clock = host.now  # the host's (a simulation's virtual) clock
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
        if not isinstance(self.id, str) or not self.id:
            raise TypeError(f"a child's id must be a non-empty str, got {self.id!r}")
        check_callable(self.start, "a child's start", "start() -> ActorRef")
        check_seconds(self.shutdown_timeout, "shutdown_timeout")
        if self.restart not in ("permanent", "transient", "temporary"):
            raise ValueError(
                f"restart must be 'permanent', 'transient' or 'temporary', got {self.restart!r}"
            )


def _timer(delay: float, fn: Callable[[], None]) -> None:
    scheduling.call_later(delay, fn, "nous-restart")


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
        if isinstance(children, str | bytes) or not isinstance(children, Sequence):
            raise TypeError(
                f"children must be a sequence of ChildSpec, got {type(children).__name__}"
            )
        for i, child in enumerate(children):
            if not isinstance(child, ChildSpec):
                raise TypeError(f"children[{i}] must be a ChildSpec, got {type(child).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
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
        self.cells: dict[str, Cell] = {}
        """Each running child's `Cell` (its ``started`` and ``finished``), beside its ref."""
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
        cell = self.cells[spec.id] = cell_of(ref)
        if not cell.started.wait(spec.shutdown_timeout):
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
                self.cells.pop(child_id, None)
            return
        delay = self.policy.delay()
        if delay is None:
            self._escalate(child_id, reason)
            return
        self.restarts += 1
        sink = telemetry.sink
        if sink is not None:
            sink.restarted(reason.partition(":")[0])  # the crash's type: few values
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
                self.cells.pop(s.id, None)
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

    def child_cell(self, child_id: str) -> Cell | None:
        """The `Cell` of a child's current actor (its ``started`` and ``finished``),
        or ``None`` before its first start."""
        return self.cells.get(child_id)

    def restart_count(self) -> int:
        """Restarts made so far."""
        return self.restarts
