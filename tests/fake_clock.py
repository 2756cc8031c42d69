"""A clock a test moves by hand (``clock.now = ...``), for the ``clock=`` of registries
and supervisors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now
