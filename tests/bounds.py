"""The bounds, in seconds, of the tests' waits: every wait in tests/ has one.

A bound is how long a test waits before it fails, never a time it expects: a
correct run ends far within it, so a loaded machine does not fail a test. A test
file imports the bound it waits with; one whose waits are slower imports a
larger one under its own name (``from bounds import SLOW_BOUND as BOUND``).

Helpers that test files import live in modules named for what they hold (this
one, postgres_server.py, ray_cluster.py, cli_process.py); fixtures live in
conftest.py. (A test file does not import conftest.py: pytest loads it under a
name of its own choosing.)
"""

from __future__ import annotations

from typing import Final

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
