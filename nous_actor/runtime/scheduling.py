"""Where the runtime starts threads, arms timers, reads the clock and blocks: one seam.

Everything the runtime would run on a thread of its own (the store's
committer, the recovery readers, summarisers, the passivator, restart timers)
and every place it waits goes through the installed `Host`, `current()`. By
default that is `RealHost`: plain threads, ``time.monotonic`` and the waits the
caller hands it, each method as cheap as the thread or the wait it stands for.

A deterministic simulation (`nous_actor.testing.simulation`) installs a host
of its own for the length of a test: then actors, threads and timers become
tasks it runs one at a time, in an order it chooses, on a virtual clock, and a
wait suspends the simulated thread that waits. The runtime calls the host; it
never asks which host is installed.

A thread keeps the host that started it: `current` answers, on a thread the real
host started (a committer, a hand-over or passivation service, a timer, a spawned
function, a pool's task), the real host, whatever host is installed since. A real
thread that outlives the test that started it (a registry never closed) thus goes
on with real waits and the real clock while a later test's simulation runs,
instead of asking that simulation to suspend a thread it does not run.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Protocol

import pykka

from nous_actor.runtime import forks

__all__ = [
    "REAL",
    "Host",
    "RealHost",
    "call_later",
    "current",
    "install",
    "other_host",
    "monotonic",
    "spawn",
    "uninstall",
]

Block = Callable[[float | None], bool]
"""How a real thread waits: ``block(timeout)`` (seconds, ``None``: no bound) blocks on the
waiter's own lock or condition and says whether what it waited for is done."""


class Host(Protocol):
    """Threads, timers, the clock, waits, futures and queues: what the runtime asks of
    the machine it runs on (`RealHost`, or a simulation's host)."""

    def now(self) -> float:
        """The clock, in seconds (``time.monotonic``, or a virtual clock)."""

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` on a daemon thread of its own."""

    def call_later(
        self, delay: float, fn: Callable[[], None], name: str, daemon: bool = False
    ) -> None:
        """Run ``fn`` on a thread of its own once ``delay`` seconds passed (``daemon``: a
        timer that re-arms itself forever, which alone keeps no simulated run going)."""

    def call_at(self, when: float, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` (short, never blocking) once `now` reaches ``when``; the real host
        runs every such alarm on one shared thread."""

    def service(
        self, run: Callable[[], None], name: str, every: float, tick: Callable[[], bool]
    ) -> Any:
        """Start a service that lives as long as its owner: ``run`` on a daemon thread (what
        is returned), or, where no thread may wait forever (a simulation), ``tick`` on a
        daemon timer every ``every`` seconds while it returns ``True``."""

    def wait(self, done: Callable[[], bool], timeout: float | None, block: Block) -> bool:
        """Wait until ``done()``, at most ``timeout`` seconds: the real host calls
        ``block(timeout)``; a simulation suspends the simulated thread meanwhile. Whether
        it is done."""

    def future(self) -> pykka.Future[Any]:
        """A Pykka future for an actor's answer (its ``get`` waits through this host)."""

    def restart_intensity(self, max_restarts: int, max_seconds: float) -> tuple[int, float]:
        """The restart intensity a supervisor or registry asked for ``(max_restarts,
        max_seconds)`` gets (a simulation, whose steps take no time, may allow more)."""

    def condition(self) -> threading.Condition:
        """A condition variable for a wake-up another thread waits for (a simulation may
        switch threads right after it is notified)."""

    def dispatcher(self, own: Callable[[], Any]) -> Any:
        """The dispatcher an actor runs on: ``own()`` (its pinned or chosen one), or the
        host's."""

    def actor_inbox(self) -> Any:
        """The inbox of a thread-per-actor Pykka actor (its ``_create_actor_inbox``, made
        before the actor is): a ``queue.SimpleQueue`` (Pykka's loop uses ``put``, a
        blocking ``get`` and ``empty``), or one a simulation binds to the actor's task
        when it starts."""

    def start_actor(self, actor: Any, start: Callable[[], None]) -> None:
        """Start a thread-per-actor Pykka actor (``start``: Pykka's own start)."""

    def submit(
        self, put: Callable[[Callable[[], None]], None], fn: Callable[[], None], name: str
    ) -> None:
        """Run ``fn`` on a pool's thread: ``put(fn)`` hands it to the pool (``name``)."""

    def committer_queue(self, committer: Any) -> Any:
        """The queue of a store's committer, with its writer started (``committer._run``
        on a thread of its own)."""


class _Started(threading.local):
    """The host that started the calling thread (``None``: no host did; then the
    installed one answers)."""

    host: Host | None = None


_started = _Started()


def _keeping(host: Host, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, run as the body of a thread ``host`` starts: the thread keeps ``host``."""

    def body() -> None:
        _started.host = host
        fn()

    return body


def _run_keeping(host: Host, fn: Callable[[], None]) -> None:
    """Run ``fn`` (a task of a pool's thread, which others started) with ``host`` as the
    thread's host meanwhile."""
    started = _started
    before = started.host
    started.host = host
    try:
        fn()
    finally:
        started.host = before


class RealHost:
    """Threads and ``time.monotonic``: the host installed unless a simulation runs.

    Every thread it starts keeps it as its host (see the module docs)."""

    now: Final = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self._alarms_lock = threading.Condition(threading.Lock())
        self._alarms: list[tuple[float, int, Callable[[], None]]] = []
        self._alarm_order = itertools.count()
        self._alarm_thread: threading.Thread | None = None

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        threading.Thread(target=_keeping(self, fn), name=name, daemon=True).start()

    def call_later(
        self, delay: float, fn: Callable[[], None], name: str, daemon: bool = False
    ) -> None:
        t = threading.Timer(delay, _keeping(self, fn))
        t.name = name
        t.daemon = True
        t.start()

    def call_at(self, when: float, fn: Callable[[], None], name: str) -> None:
        with self._alarms_lock:
            heapq.heappush(self._alarms, (when, next(self._alarm_order), fn))
            if self._alarm_thread is None:
                self._alarm_thread = threading.Thread(
                    target=_keeping(self, self._ring), name=name, daemon=True
                )
                self._alarm_thread.start()
            elif self._alarms[0][0] == when:
                self._alarms_lock.notify()

    def _ring(self) -> None:
        cond = self._alarms_lock
        while True:
            due: list[Callable[[], None]] = []
            with cond:
                while not due:
                    now = time.monotonic()
                    heap = self._alarms
                    while heap and heap[0][0] <= now:
                        due.append(heapq.heappop(heap)[2])
                    if not due:  # idle: wake at the next alarm (or now and then)
                        cond.wait(min(heap[0][0] - now, 60.0) if heap else 60.0)
            for fn in due:
                fn()

    def service(
        self, run: Callable[[], None], name: str, every: float, tick: Callable[[], bool]
    ) -> threading.Thread:
        t = threading.Thread(target=_keeping(self, run), name=name, daemon=True)
        t.start()
        return t

    def wait(self, done: Callable[[], bool], timeout: float | None, block: Block) -> bool:
        return block(timeout)

    def future(self) -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def restart_intensity(self, max_restarts: int, max_seconds: float) -> tuple[int, float]:
        return max_restarts, max_seconds

    def condition(self) -> threading.Condition:
        return threading.Condition()

    def dispatcher(self, own: Callable[[], Any]) -> Any:
        return own()

    def actor_inbox(self) -> queue.SimpleQueue[Any]:
        # What Pykka's loop uses of its queue (put, a blocking get, empty), in C: a put
        # takes no Python lock and notifies no Condition.
        return queue.SimpleQueue()

    def start_actor(self, actor: Any, start: Callable[[], None]) -> None:
        start()

    def submit(
        self, put: Callable[[Callable[[], None]], None], fn: Callable[[], None], name: str
    ) -> None:
        put(partial(_run_keeping, self, fn))

    def committer_queue(self, committer: Any) -> Any:
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        committer._queue = q
        t = committer._thread = threading.Thread(
            target=_keeping(self, committer._run), name="nous-committer", daemon=True
        )
        t.start()
        return q


REAL: Final = RealHost()
"""The real host (threads, ``time.monotonic``)."""

_host: Host = REAL
_install_lock = forks.lock()

epoch = 0
"""Grows each time a host is installed or uninstalled: an object that noted it when made
compares it first (an int) and asks `current` only when it changed."""


def other_host(what: str, made: Host) -> Exception:
    """The error for using, under the installed host, ``what``, made under host ``made``
    (its actors run, or ran, where that host put them: a session started before a
    simulation runs on the real dispatcher, one started inside it on the simulation's,
    which ended with it): the installed host's own (``foreign``) if it has one."""
    host = _host
    foreign = getattr(host, "foreign", None)
    if callable(foreign):
        return foreign(what)  # type: ignore[no-any-return]
    if host is REAL:
        return RuntimeError(
            f"{what} was made inside a simulation, which has ended (its actors ran there): "
            "make it again outside"
        )
    return RuntimeError(
        f"{what} was made before this simulation began (its actors run on real threads, "
        "which the simulation does not control): make and start it inside the simulation"
    )


def current() -> Host:
    """The calling thread's host: the one that started the thread, if a host did (see
    the module docs); else the installed one, `REAL` or a simulation's while one runs."""
    return _started.host or _host


def install(new: Host) -> None:
    """Make ``new`` the host of everything the runtime starts from now on.

    Raises:
        RuntimeError: another simulation's host is installed (simulations do not nest).
    """
    global _host, epoch
    with _install_lock:
        if _host is not REAL:
            raise RuntimeError("a simulation is running already; simulations do not nest")
        _host = new
        epoch += 1


def uninstall(old: Host) -> None:
    """Put `REAL` back in place of ``old`` (a no-op if ``old`` is not installed)."""
    global _host, epoch
    with _install_lock:
        if _host is old:
            _host = REAL
            epoch += 1


def monotonic() -> float:
    """The installed host's clock (``time.monotonic``, or a simulation's virtual clock)."""
    return (_started.host or _host).now()


def spawn(fn: Callable[[], None], name: str) -> None:
    """Run ``fn`` on a daemon thread of its own (a simulated one, in a simulation)."""
    (_started.host or _host).spawn(fn, name)


def call_later(
    delay: float, fn: Callable[[], None], name: str = "nous-timer", *, daemon: bool = False
) -> None:
    """Run ``fn`` after ``delay`` seconds, on a daemon timer thread (``daemon``: a timer
    that re-arms itself forever, which alone does not keep a simulated run going)."""
    (_started.host or _host).call_later(delay, fn, name, daemon)
