"""Shared test setup: Hypothesis profiles and actor hygiene."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pykka
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
)


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    """Every test leaves no actor running, whatever it did."""
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=10)
