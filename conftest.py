"""Test-session setup shared by tests/, the doctests in nous_actor/ and the docs examples.

A library never configures logging; its tests do: structlog goes to the
standard logging module here (pytest captures it), so doctest output and
test output stay clean, while structlog.testing.capture_logs still works.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pykka
import pytest
import structlog
from hypothesis import HealthCheck, settings

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


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    """Every test leaves no actor running, whatever it did."""
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=10)
