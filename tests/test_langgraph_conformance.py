"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``),
run against `NousCheckpointSaver` on every store, beside LangGraph's `InMemorySaver`
as the reference.

The suite detects a saver's capabilities from the methods it overrides and runs
each capability's checks through the async API only (the sync API has tests of
its own in test_langgraph.py). Here every capability, base and extended, must be
detected and every one of its 81 checks pass, on each store.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest
from bounds import run
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.memory import InMemorySaver

from nous_actor import MemoryStore, Sessions, SQLiteStore, Store
from nous_actor.integrations.langgraph import NousCheckpointSaver

CHECKS = 81
"""The checks of langgraph-checkpoint-conformance 0.0.2: 58 base, 23 extended."""


def _validate(
    name: str, factory: Callable[[], AsyncGenerator[BaseCheckpointSaver[Any], None]]
) -> CapabilityReport:
    registered = checkpointer_test(name=name)(factory)
    return run(validate(registered))


def _counts(report: CapabilityReport) -> tuple[int, int, int]:
    results = report.results.values()
    return (
        sum(r.tests_passed for r in results),
        sum(r.tests_failed for r in results),
        sum(r.tests_skipped for r in results),
    )


def _nous(
    make_store: Callable[[], Store],
) -> Callable[[], AsyncGenerator[BaseCheckpointSaver[Any], None]]:
    async def factory() -> AsyncGenerator[BaseCheckpointSaver[Any], None]:
        store = make_store()
        async with Sessions(store, timeout=20) as sessions:
            yield NousCheckpointSaver(sessions)
        store.close()

    return factory


def _assert_all_pass(report: CapabilityReport) -> None:
    failures = [f for r in report.results.values() for f in r.failures]
    assert failures == []
    for cap in BASE_CAPABILITIES | EXTENDED_CAPABILITIES:
        result = report.results[cap.value]
        assert result.detected, f"{cap.value} not detected"
        assert result.passed, f"{cap.value}: {result.failures}"
    assert _counts(report) == (CHECKS, 0, 0)
    assert report.passed_all()


def test_conformance_on_memory_store() -> None:
    """Every check of the suite passes on a MemoryStore, every capability detected."""
    _assert_all_pass(_validate("nous-memory", _nous(MemoryStore)))


def test_conformance_on_sqlite_store(tmp_path: Path) -> None:
    """Every check of the suite passes on a SQLite file, every capability detected."""
    counter = iter(range(100))
    _assert_all_pass(
        _validate("nous-sqlite", _nous(lambda: SQLiteStore(tmp_path / f"lg{next(counter)}.db")))
    )


def test_conformance_on_postgres_store(pg_stores: Callable[..., Store]) -> None:
    """Every check of the suite passes on PostgreSQL, every capability detected."""
    _assert_all_pass(_validate("nous-postgres", _nous(pg_stores)))


def test_the_reference_saver_passes_the_base_checks_only() -> None:
    """LangGraph's InMemorySaver, the reference: the 58 base checks pass, and it implements
    none of the extended capabilities (so the suite skips them)."""

    async def factory() -> AsyncGenerator[BaseCheckpointSaver[Any], None]:
        yield InMemorySaver()

    report = _validate("in-memory", factory)
    assert report.passed_all_base()
    assert _counts(report) == (58, 0, 3)
    for cap in EXTENDED_CAPABILITIES:
        assert not report.results[cap.value].detected


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_saver_is_detected_with_every_capability(kind: str, tmp_path: Path) -> None:
    """Capability detection sees every base and extended method overridden."""
    from langgraph.checkpoint.conformance.capabilities import DetectedCapabilities

    store: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "d.db")
    with Sessions(store) as sessions:
        detected = DetectedCapabilities.from_instance(NousCheckpointSaver(sessions))
    store.close()
    assert detected.missing == frozenset()
