"""Where the runtime starts threads, arms timers, reads the clock and blocks: one seam.

Everything the runtime would run on a thread of its own (the store's
committer, the recovery readers, summarisers, the passivator, restart timers)
and every place it waits goes through here. By default that is plain
threading and ``time.monotonic``, at the cost of one module-global lookup.

A deterministic simulation (`nous_actor.testing.simulation`) installs a `Host`
instead: then actors, threads and timers become tasks that the host runs one
step at a time on one thread, in an order it chooses, on a virtual clock; a
wait runs other tasks until what it waits for is done (or its virtual bound
passes). The layers above check `host` only where they start something or
wait, never on the hot path of a call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Host", "call_later", "host", "install", "monotonic", "spawn", "uninstall"]


class Host(Protocol):
    """What a simulation offers the runtime (see `nous_actor.testing.simulation`)."""

    dispatcher: Any
    """The dispatcher every dispatched actor runs on while the host is installed."""

    def now(self) -> float:
        """The virtual clock, in seconds (stands for `time.monotonic`)."""

    def spawn(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` as a task of its own (stands for a thread)."""

    def call_later(
        self, delay: float, fn: Callable[[], None], name: str, daemon: bool = False
    ) -> None:
        """Run ``fn`` once the virtual clock has advanced ``delay`` seconds (a ``daemon``
        timer, one that re-arms itself forever, never keeps a run going by itself)."""

    def wait(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Run other tasks until ``done()`` (``True``) or ``timeout`` virtual seconds
        passed with nothing left to run before it (``False``)."""

    def adopt(self, actor: Any) -> None:
        """Run a thread-per-actor Pykka actor (a supervisor, a registry) as a task."""

    def future(self) -> Any:
        """A Pykka future whose ``get`` waits by `wait`."""

    def committer_queue(self, committer: Any) -> Any:
        """The queue of a store's committer: its batches become tasks."""


host: Host | None = None
"""The installed simulation, or ``None`` (real threads and real time)."""

_install_lock = threading.Lock()


def install(new: Host) -> None:
    """Make ``new`` the host of everything the runtime starts from now on.

    Raises:
        RuntimeError: another host is installed (simulations do not nest).
    """
    global host
    with _install_lock:
        if host is not None:
            raise RuntimeError("a simulation is running already; simulations do not nest")
        host = new


def uninstall(old: Host) -> None:
    """Remove ``old`` (a no-op if it is not the installed host)."""
    global host
    with _install_lock:
        if host is old:
            host = None


def monotonic() -> float:
    """`time.monotonic`, or the simulation's virtual clock."""
    h = host
    return time.monotonic() if h is None else h.now()


def spawn(fn: Callable[[], None], name: str) -> None:
    """Run ``fn`` on a daemon thread of its own (a task of the simulation, in one)."""
    h = host
    if h is None:
        threading.Thread(target=fn, name=name, daemon=True).start()
    else:
        h.spawn(fn, name)


def call_later(
    delay: float, fn: Callable[[], None], name: str = "nous-timer", *, daemon: bool = False
) -> None:
    """Run ``fn`` after ``delay`` seconds, on a daemon timer thread (virtual seconds, on
    a task, in a simulation; ``daemon``: a timer that re-arms itself forever, which
    alone does not keep a simulated run going)."""
    h = host
    if h is None:
        t = threading.Timer(delay, fn)
        t.name = name
        t.daemon = True
        t.start()
    else:
        h.call_later(delay, fn, name, daemon)
