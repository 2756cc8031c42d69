"""Every argument of the runtime's public constructors is checked when it is made.

``Sessions``, ``Session.start``, ``Supervisor``, ``ChildSpec``, ``Backoff`` and
``Dispatcher``: a wrong type is a ``TypeError``, a value out of range a
``ValueError``, each saying what to pass, and nothing is started (no thread,
no actor) by a refused call.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pykka
import pytest

from nous_actor import Backoff, ChildSpec, Dispatcher, Session, Sessions, Supervisor


def _nothing_started(before: set[int]) -> None:
    assert pykka.ActorRegistry.get_all() == []
    started = {t.ident for t in threading.enumerate()} - before
    names = [t.name for t in threading.enumerate() if t.ident in started]
    assert not [n for n in names if n.startswith("nous-") or "Actor" in n], names


SESSIONS_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"store": "x.db"}, TypeError, r"pass SQLiteStore\(path\) for a file"),
    ({"store": 3}, TypeError, "store must be a nous_actor store"),
    ({"timeout": -1}, ValueError, "timeout must be a finite number of seconds > 0"),
    ({"timeout": 0}, ValueError, "timeout must be a finite number of seconds > 0"),
    ({"timeout": math.inf}, ValueError, "timeout must be a finite number"),
    ({"timeout": "5"}, TypeError, "timeout must be a number of seconds"),
    ({"max_sessions": 0}, ValueError, "max_sessions must be an int >= 1"),
    ({"idle_timeout": -1}, ValueError, "idle_timeout must be"),
    ({"idle_timeout": "5"}, ValueError, "idle_timeout must be None or > 0 seconds"),
    ({"max_restarts": -1}, ValueError, "max_restarts must be >= 0 and max_seconds > 0"),
    ({"max_restarts": 2.5}, TypeError, "max_restarts must be an int"),
    ({"max_seconds": 0}, ValueError, "max_restarts must be >= 0 and max_seconds > 0"),
    ({"on_give_up": "retry"}, ValueError, "on_give_up must be 'escalate', 'log' or None"),
    ({"backoff": 0.1}, TypeError, "backoff must be a nous_actor.Backoff or None"),
    ({"clock": 5}, TypeError, "clock must be callable"),
    ({"scheduler": "now"}, TypeError, "scheduler must be callable"),
    ({"start": "yes"}, TypeError, "start must be True or False"),
    ({"dispatcher": 2}, TypeError, "dispatcher must be a nous_actor.Dispatcher or None"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), SESSIONS_BAD)
def test_sessions_refuses_a_bad_argument_and_starts_nothing(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Sessions(...) with one bad argument: a typed error saying what to pass; no actor."""
    before = {t.ident for t in threading.enumerate()}
    store = kwargs.pop("store", None)
    with pytest.raises(error, match=match):
        Sessions(store, **kwargs)
    _nothing_started(before)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"timeout": -1}, ValueError, "timeout must be a finite number of seconds > 0"),
        ({"store": "x.db"}, TypeError, "store must implement nous_actor.store.Store"),
        ({"log": [1]}, TypeError, "log must be a nous_actor.Log"),
        ({"pinned": 1}, TypeError, "pinned must be True or False"),
        ({"dispatcher": "d"}, TypeError, "dispatcher must be a nous_actor.Dispatcher"),
        ({"pinned": True, "dispatcher": Dispatcher(1)}, ValueError, "not both"),
    ],
)
def test_session_start_refuses_a_bad_argument_and_starts_nothing(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Session.start with one bad argument: a typed error; no actor is started."""
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(error, match=match):
        Session.start("chat", **kwargs)
    _nothing_started(before)


def _child() -> pykka.ActorRef[Any]:
    raise AssertionError("never started")


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("not specs",), {}, TypeError, "children must be a sequence of ChildSpec"),
        (([1],), {}, TypeError, r"children\[0\] must be a ChildSpec"),
        (([],), {"strategy": "all"}, ValueError, "strategy must be"),
        (([],), {"max_restarts": -1}, ValueError, "max_restarts must be >= 0"),
        (([],), {"max_seconds": -1.0}, ValueError, "max_seconds > 0"),
        (([],), {"backoff": 1}, TypeError, "backoff must be a nous_actor.Backoff"),
        (([],), {"clock": None}, TypeError, "clock must be callable"),
        (([],), {"scheduler": 1}, TypeError, "scheduler must be callable"),
        (([],), {"name": 5}, TypeError, "name must be a str"),
    ],
)
def test_supervisor_refuses_a_bad_argument_and_starts_nothing(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Supervisor.start with one bad argument: a typed error; nothing is started."""
    with pytest.raises(error, match=match):
        Supervisor.start(*args, **kwargs)
    assert pykka.ActorRegistry.get_all() == []


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ChildSpec("", _child), TypeError, "a child's id must be a non-empty str"),
        (lambda: ChildSpec("a", "start"), TypeError, "a child's start must be callable"),
        (lambda: ChildSpec("a", _child, "sometimes"), ValueError, "restart must be"),
        (lambda: ChildSpec("a", _child, shutdown_timeout=0), ValueError, "shutdown_timeout"),
        (lambda: Backoff(-1.0), ValueError, "Backoff needs 0 <= min <= max"),
        (lambda: Backoff(0.1, "1"), TypeError, "Backoff max must be a number"),
        (lambda: Backoff(0.1, 1.0, 2.0), ValueError, "0 <= jitter <= 1"),
        (lambda: Backoff(0.1, 1.0, "0.1"), TypeError, "Backoff jitter must be a number"),
        (lambda: Dispatcher(0), ValueError, "threads must be an int >= 1"),
        (lambda: Dispatcher(2, throughput=0), ValueError, "throughput must be an int >= 1"),
        (lambda: Dispatcher(2, name=3), TypeError, "name must be a str"),
    ],
)
def test_specs_backoffs_and_dispatchers_check_their_arguments(
    make: Any, error: type[Exception], match: str
) -> None:
    """The small value types of the tree refuse what they cannot use, saying what to pass."""
    with pytest.raises(error, match=match):
        make()


def test_a_good_registry_still_starts() -> None:
    """The checks accept the edges: the smallest bound, no restarts, a dispatcher of one."""
    with Sessions(
        timeout=0.5, max_restarts=0, max_sessions=1, dispatcher=Dispatcher(1), idle_timeout=0.5
    ) as sessions:
        assert sessions.open("a").append("user_message", {"content": "x"}).get().seq == 0


def test_a_store_is_recognised_as_the_protocol_says_and_its_class_once() -> None:
    """`is_store` answers as ``isinstance(obj, Store)``: a class with every method of the
    protocol is remembered (its next instance is not looked at method by method); one
    that lacks a method is not, so an instance that carries the method itself passes
    alone and its siblings do not."""
    from nous_actor import MemoryStore
    from nous_actor.store import Store, base

    class Partial:
        def load(self, session_id: str) -> list[Any]:
            return []

    def noop(*args: Any) -> None:
        return None

    full = MemoryStore()
    try:
        assert base.is_store(full)
        assert MemoryStore in base._STORE_CLASSES
        lacking, fixed = Partial(), Partial()
        for name in base._STORE_METHODS - {"load"}:
            setattr(fixed, name, noop)
        assert isinstance(fixed, Store)
        assert base.is_store(fixed)
        assert Partial not in base._STORE_CLASSES
        assert not base.is_store(lacking)
        assert not isinstance(lacking, Store)
        assert not base.is_store("x.db")
        assert not base.is_store(None)
    finally:
        full.close()
