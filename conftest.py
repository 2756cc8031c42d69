"""Test-session setup shared by tests/, the doctests in nous_actor/ and the docs examples.

A library never configures logging; its tests do: structlog goes to the
standard logging module here (pytest captures it), so doctest output and
test output stay clean, while structlog.testing.capture_logs still works.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterator

import pykka
import pytest
import structlog
from hypothesis import HealthCheck, settings

from nous_actor.runtime import scheduling

structlog.configure(
    processors=[
        structlog.stdlib.add_log_level,
        structlog.processors.KeyValueRenderer(key_order=["event"]),
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=False,
)
logging.getLogger("pykka").setLevel(logging.CRITICAL)

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=2000, deadline=None)
_default_profile = "ci" if os.environ.get("CI") else "dev"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default_profile))


STOP_BOUND = 10.0
"""Seconds the actors a test left running get, all together, to stop after it."""


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    """Every test leaves no actor running, whatever it did.

    An actor that does not stop within `STOP_BOUND` (one a failed simulation left on a
    virtual thread nobody runs, say) fails this test and is unregistered, so that the
    tests after it neither wait for it nor fail for it.
    """
    yield
    host = scheduling.current()
    if host is not scheduling.REAL:
        scheduling.uninstall(host)
        pytest.fail(f"the test left {host!r} installed as the runtime's host")
    deadline = time.monotonic() + STOP_BOUND
    left = pykka.ActorRegistry.get_all()
    while left and time.monotonic() < deadline:
        for ref in left:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.stop(block=False)
        for ref in left:
            if ref.actor_stopped.wait(max(deadline - time.monotonic(), 0)):
                pykka.ActorRegistry.unregister(ref)  # (a no-op once it unregistered itself)
        left = pykka.ActorRegistry.get_all()  # and any a supervisor started meanwhile
    if left:
        for ref in left:
            pykka.ActorRegistry.unregister(ref)
        pytest.fail(f"{len(left)} actor(s) did not stop within {STOP_BOUND:g} s: {left[:5]}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module is imported now, and with them every framework the tests load
    (Ray, ADK, the Agents SDK, LangGraph, ...: a few hundred thousand objects that live
    as long as the run). They are moved out of the cyclic collector's sight
    (``gc.freeze``): the collections the tests make, and the automatic ones, no longer
    scan them again and again (a test that collects twice a round took 15 s in the
    suite, 2.5 s alone). What the tests make is collected as before."""
    gc.collect()
    gc.freeze()
