"""A spy for the tests that count work: `spy` replaces a function with one that records
each call's arguments and calls it (the calls of a fold, an encoding, ...), so a test
asserts how often work was done rather than how long it took."""

from __future__ import annotations

from typing import Any

import pytest


def spy(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[tuple[Any, ...]]:
    """The positional arguments of each call of ``owner.name`` from now on (the test's
    end restores it); each call still runs the real function."""
    real = getattr(owner, name)
    calls: list[tuple[Any, ...]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls
