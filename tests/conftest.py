"""Fixtures for tests/ (the shared setup is in the top-level conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND

# The PostgreSQL server and its helpers (see tests/postgres_server.py).
from postgres_server import pg_server, pg_stores, pg_workers, schema  # noqa: F401

# The Ray cluster and its helpers (see tests/ray_cluster.py).
from ray_cluster import ray_cluster, ray_scope  # noqa: F401

from nous_actor import MemoryStore, Session, Sessions, SQLiteStore, Store
from nous_actor.sessions.actor import SessionActor


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pinned",
        action="store_true",
        help="run every session that would go on the shared dispatcher on a thread of its "
        "own instead (pinned=True), to run the session suite on both placements",
    )


@pytest.fixture(autouse=True, scope="session")
def _pinned_sessions(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``--pinned``, a session started without a dispatcher of its own is pinned."""
    if not request.config.getoption("--pinned"):
        yield
        return
    start = SessionActor.__dict__.get("start")
    original = SessionActor.start.__func__  # type: ignore[attr-defined]

    def pinned_start(cls: type[SessionActor], *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dispatcher") is None:
            kwargs["pinned"] = True
        return original(cls, *args, **kwargs)

    SessionActor.start = classmethod(pinned_start)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        if start is None:
            del SessionActor.start
        else:
            SessionActor.start = start  # type: ignore[method-assign]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty `MemoryStore`, then an `SQLiteStore` on a temporary file, closed after
    the test (a module that needs other stores defines its own ``store``)."""
    s: Store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")
    yield s
    s.close()


@pytest.fixture
def sessions(store: Store) -> Iterator[Sessions]:
    """A registry on ``store`` (calls bounded at 20 s), closed after the test."""
    registry = Sessions(store, timeout=20)
    yield registry
    registry.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def each_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store of each kind, empty, closed after the test (PostgreSQL: a schema of its
    own on the test server; skipped without one)."""
    s: Store
    if request.param == "postgres":
        s = request.getfixturevalue("pg_stores")()  # closed with its schema
        yield s
        return
    s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    yield s
    s.close()


@pytest.fixture
def chat_id() -> str:
    """The id of the `chat` fixture's session; a test file whose tests name another id
    overrides this fixture."""
    return "chat-42"


@pytest.fixture
def chat(chat_id: str) -> Iterator[Session]:
    """A session with no store (its id: `chat_id`), stopped after the test."""
    s = Session.start(chat_id, timeout=BOUND)
    yield s
    s.stop()
