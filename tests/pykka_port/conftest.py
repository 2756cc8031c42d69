# Ported from Pykka 4.5.0 (https://github.com/jodal/pykka),
# file tests/conftest.py.
# Pykka is copyright 2010-2026 Stein Magnus Jodal and contributors, licensed
# under the Apache License, Version 2.0 (see LICENSE in this folder, or
# http://www.apache.org/licenses/LICENSE-2.0). Modified here to run on
# nous_actor.runtime.DispatchedActor; every change is listed in README.md.

"""Pykka's test fixtures, with runtimes of `DispatchedActor` instead of `ThreadingActor`.

Two runtimes: ``dispatched-shared`` (the process-wide `default_dispatcher`) and
``dispatched-1thread`` (a `Dispatcher` of one thread of its own). The repo's
tests/conftest.py (and the top-level conftest.py) still apply here: their autouse
fixture stops every actor after each test, as ``_stop_all`` below does.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    cast,
)

import pytest
from pykka import ActorRegistry, ThreadingFuture

from nous_actor.runtime import DispatchedActor, Dispatcher, default_dispatcher
from pykka_port.log_handler import PykkaTestLogHandler
from pykka_port.types import Events, Runtime

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pykka import Actor, Future


# A dispatcher of one thread, for the whole session: every actor of the
# "dispatched-1thread" runtime shares it.
ONE_THREAD = Dispatcher(1, name="pykka-port-1thread")


class OneThreadDispatchedActor(DispatchedActor):
    """A bare `DispatchedActor` on the one-thread dispatcher."""

    dispatcher = ONE_THREAD


RUNTIMES = {
    "dispatched-shared": pytest.param(
        Runtime(
            name="dispatched-shared",
            actor_class=DispatchedActor,
            event_class=threading.Event,
            future_class=ThreadingFuture,
            sleep_func=time.sleep,
            dispatcher=default_dispatcher(),
        ),
        id="dispatched-shared",
    ),
    "dispatched-1thread": pytest.param(
        Runtime(
            name="dispatched-1thread",
            actor_class=OneThreadDispatchedActor,
            event_class=threading.Event,
            future_class=ThreadingFuture,
            sleep_func=time.sleep,
            dispatcher=ONE_THREAD,
        ),
        id="dispatched-1thread",
    ),
}

# Every test here gets this timeout unless it sets its own (pyproject's is 120 s).
TIMEOUT = 30

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the items of the whole session: only ours get the timeout.
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT))


@pytest.fixture(scope="session", params=RUNTIMES.values())
def runtime(request: pytest.FixtureRequest) -> Runtime:
    return cast("Runtime", request.param)


@pytest.fixture
def _stop_all() -> Iterator[None]:  # pyright: ignore[reportUnusedFunction]
    yield
    ActorRegistry.stop_all()


@pytest.fixture
def log_handler() -> Iterator[logging.Handler]:
    log_handler = PykkaTestLogHandler()

    root_logger = logging.getLogger()
    root_logger.addHandler(log_handler)
    # pytest sets the root logger level to WARNING. We reset it to NOTSET
    # so that all log messages reaches our log handler.
    root_level = root_logger.level
    root_logger.setLevel(logging.NOTSET)
    # Port: the repo's top-level conftest.py sets the "pykka" logger to
    # CRITICAL; let its messages through for the test, then restore both.
    pykka_logger = logging.getLogger("pykka")
    pykka_level = pykka_logger.level
    pykka_logger.setLevel(logging.NOTSET)

    yield log_handler

    pykka_logger.setLevel(pykka_level)
    root_logger.setLevel(root_level)
    root_logger.removeHandler(log_handler)
    log_handler.close()


@pytest.fixture
def events(runtime: Runtime) -> Events:
    return Events(
        on_start_was_called=runtime.event_class(),
        on_stop_was_called=runtime.event_class(),
        on_failure_was_called=runtime.event_class(),
        greetings_was_received=runtime.event_class(),
        actor_registered_before_on_start_was_called=runtime.event_class(),
    )


@pytest.fixture(scope="module")
def early_failing_actor_class(runtime: Runtime) -> type[Actor]:
    class EarlyFailingActor(runtime.actor_class):  # type: ignore[name-defined]
        def __init__(self, events: Events) -> None:
            super().__init__()
            self.events = events

        def on_start(self) -> None:
            try:
                raise RuntimeError("on_start failure")
            finally:
                self.events.on_start_was_called.set()

    return EarlyFailingActor


@pytest.fixture(scope="module")
def late_failing_actor_class(runtime: Runtime) -> type[Actor]:
    class LateFailingActor(runtime.actor_class):  # type: ignore[name-defined]
        def __init__(self, events: Events) -> None:
            super().__init__()
            self.events = events

        def on_start(self) -> None:
            self.stop()

        def on_stop(self) -> None:
            try:
                raise RuntimeError("on_stop failure")
            finally:
                self.events.on_stop_was_called.set()

    return LateFailingActor


@pytest.fixture(scope="module")
def failing_on_failure_actor_class(runtime: Runtime) -> type[Actor]:
    class FailingOnFailureActor(runtime.actor_class):  # type: ignore[name-defined]
        def __init__(self, events: Events) -> None:
            super().__init__()
            self.events = events

        def on_receive(self, message: Any) -> Any:
            if message.get("command") == "raise exception":
                raise Exception("on_receive failure")
            return super().on_receive(message)

        def on_failure(self, *args: Any) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
            try:
                raise RuntimeError("on_failure failure")
            finally:
                self.events.on_failure_was_called.set()

    return FailingOnFailureActor


@pytest.fixture
def future(runtime: Runtime) -> Future[Any]:
    return runtime.future_class()


@pytest.fixture
def futures(runtime: Runtime) -> list[Future[Any]]:
    return [runtime.future_class() for _ in range(3)]
