"""The asyncio API on uvloop's event loop, which uvicorn runs where uvloop is installed
(``uvicorn[standard]``): every test of `test_asyncio_api`, collected again here and run
with uvloop's loop (asyncio's own calls that the library makes from other threads,
``call_soon_threadsafe`` and the like, are uvloop's there)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

uvloop = pytest.importorskip("uvloop")

from test_asyncio_api import *  # noqa: E402, F403  (collected again: run under uvloop)


@pytest.fixture(autouse=True)
def _uvloop_loops() -> Iterator[None]:
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(previous)


def test_the_tests_here_run_on_uvloop() -> None:
    """(What the fixture does: ``asyncio.run`` makes uvloop's loops here.)"""

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert asyncio.run(kind()).startswith("uvloop")
