"""The bounds, in seconds, of the tests' waits (every wait in tests/ has one), and the
helpers that wait within one.

A bound is how long a test waits before it fails, never a time it expects: a
correct run ends far within it, so a loaded machine does not fail a test. A test
file imports the bound it waits with; one whose waits are slower imports a
larger one, named for what it bounds, as its BOUND
(``from bounds import SLOW_BOUND as BOUND``).

Helpers that test files import live in modules named for what they hold (this
one, postgres_server.py, ray_cluster.py, cli_process.py, crashes.py, spies.py); fixtures live in
conftest.py. (A test file does not import conftest.py: pytest imports it itself,
and the top-level conftest.py has the same module name.)
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

T = TypeVar("T")

BOUND: Final = 10.0
"""A call on an actor, a thread or a store in this process."""

SLOW_BOUND: Final = 20.0
"""A wait behind slower work: a child process, a hundred sessions, a supervision tree's
restarts, an event loop's wake-ups."""

RUN_BOUND: Final = 60.0
"""An agent framework's run (ADK, OpenAI Agents) on an event loop of its own."""

INTERPRETER_BOUND: Final = 60.0
"""A fresh Python interpreter that imports the package."""

EXTRAS_BOUND: Final = 120.0
"""A fresh Python interpreter that imports the optional extras (Ray, the bench suite)."""


def run(coro: Awaitable[T], bound: float = RUN_BOUND) -> T:
    """Run a coroutine on a fresh event loop; fail if it takes longer than ``bound``."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, bound)

    return asyncio.run(bounded())


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail, naming ``what``, after ``timeout`` seconds
    (for a state in another process, which no event of this one announces)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def end_child(proc: subprocess.Popen[str], bound: float = BOUND) -> None:
    """Kill ``proc`` if it still runs, wait for it (within ``bound``) and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(bound)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
