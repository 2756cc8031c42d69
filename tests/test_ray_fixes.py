"""Sessions on Ray, fixed: a bounded number of shards started within ``start_timeout``,
subscription tokens that no restarted shard can mistake, arguments of a user's int or
str subclass, subscriptions that end with their registry, and a batch that a shard can
read only in part.

On the real local cluster of tests/ray_cluster.py, with `nous_actor.MemoryStore` (one
shard per registry, or one registry's shards reached by name, so one store).
"""

from __future__ import annotations

import os
import pickle
import time
import uuid
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ray_cluster import RayScope

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")

from nous_actor import (  # noqa: E402
    ClusterError,
    MemoryStore,
    SessionCrashed,
    SessionStopped,
)
from nous_actor.cluster.ray import (  # noqa: E402
    CALL,
    FAILED,
    MAX_SHARDS,
    NOW,
    RaySession,
    RaySessions,
    _driver,
)
from nous_actor.cluster.ray._protocol import _pack_batch, _unpack  # noqa: E402
from nous_actor.store.subscription import Subscription  # noqa: E402


def _sid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _token(sub: Subscription) -> Any:
    """The shard's token of ``sub`` (held by the feed that its close stops)."""
    feed = sub._on_close.__self__  # type: ignore[union-attr]
    return feed.token


# -- 1. a bounded number of shards, started within start_timeout ----------------------------


@pytest.mark.parametrize("shards", [MAX_SHARDS + 1, 10**6, 10**100])
def test_more_shards_than_the_maximum_are_refused_before_anything_starts(shards: int) -> None:
    """No Ray is reached (no ``address`` works here), nothing is created: a ValueError
    naming the maximum."""
    with pytest.raises(
        ValueError, match=f"shards must be an int >= 1, at most {MAX_SHARDS} \\(MAX_SHARDS\\)"
    ):
        RaySessions(MemoryStore, shards=shards, address="127.0.0.1:1")


def test_the_start_timeout_bounds_the_creation_of_the_shards_too(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock runs out after the second shard is created: the third is never created,
    start-up fails with ClusterError, and the two created are killed."""
    made: list[Any] = []
    clock = {"offset": 0.0}
    real_get_or_create = RaySessions._get_or_create

    def get_or_create(self: RaySessions, *args: Any) -> tuple[Any, bool]:
        actor, new = real_get_or_create(self, *args)
        made.append(actor)
        if len(made) == 2:
            clock["offset"] = 3600.0  # an hour later: past any start_timeout
        return actor, new

    monkeypatch.setattr(RaySessions, "_get_or_create", get_or_create)
    monkeypatch.setattr(
        _driver,
        "time",
        SimpleNamespace(monotonic=lambda: time.monotonic() + clock["offset"]),
        raising=False,
    )
    with pytest.raises(ClusterError, match="within 60 s"):
        RaySessions(MemoryStore, shards=50, start_timeout=60)
    assert len(made) == 2
    for actor in made:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=60)


# -- 2. subscription tokens unique across a shard's incarnations ----------------------------


def test_a_token_of_an_earlier_incarnation_ends_its_subscription_with_session_crashed(
    ray_cluster: Any,
) -> None:
    """A restarted shard numbers its subscriptions anew, never reusing an earlier
    incarnation's token; a poll with a token the shard does not know (its subscription
    died with the shard) ends with SessionCrashed, not as a clean end, and never reads
    another session's subscription."""
    sessions = RaySessions(MemoryStore, shards=1, timeout=30)
    try:
        x = sessions.open(_sid("x"))
        sub_a = x.subscribe()
        token_a = _token(sub_a)
        pid = sessions.shard_info()[0]["pid"]
        ray.kill(sessions.shard_actor(0), no_restart=False)
        with pytest.raises(SessionCrashed):
            sub_a.get(timeout=60)
        deadline = time.monotonic() + 60
        while True:  # until the restarted shard answers
            try:
                if sessions.shard_info()[0]["pid"] != pid:
                    break
            except (SessionStopped, SessionCrashed):
                pass
            assert time.monotonic() < deadline, "the shard was not restarted within 60 s"
        y = sessions.open(_sid("y"))
        sub_b = y.subscribe()
        y.append("user_message", {"content": "for y only"}).get()
        assert _token(sub_b) != token_a
        events, ended, error = ray.get(
            sessions.shard_actor(0).poll.remote(token_a, 0.0), timeout=30
        )
        assert (events, ended) == ([], True)
        assert isinstance(error, SessionCrashed)
        assert sub_b.get(timeout=30).data["content"] == "for y only"
    finally:
        sessions.shutdown()


def test_a_call_answered_later_by_an_earlier_incarnation_fails_with_session_crashed(
    ray_cluster: Any,
) -> None:
    """The outcome of a call that the shard answers later, asked of a shard that holds
    no such call (it was restarted meanwhile): SessionCrashed, naming the session."""
    sessions = RaySessions(MemoryStore, shards=1, timeout=30)
    try:
        sid = _sid("later")
        sessions.open(sid)
        ((state, error),) = _unpack(
            ray.get(sessions.shard_actor(0).result.remote(12345, sid), timeout=30)
        )
        assert state == FAILED
        assert isinstance(error, SessionCrashed)
        assert error.session_id == sid
    finally:
        sessions.shutdown()


# -- 3. a user's int or str subclass as an argument ------------------------------------------


class _MyInt(int):
    """A subclass of int that the shards cannot import (it lives in a test module)."""


class _MyStr(str):
    """A subclass of str that the shards cannot import."""


class _Unknown:
    """A value that the shards cannot import."""


@pytest.fixture
def one_shard(ray_cluster: Any) -> Any:
    sessions = RaySessions(MemoryStore, shards=1, timeout=30)
    try:
        yield sessions
    finally:
        sessions.shutdown()


@pytest.mark.parametrize(
    "call",
    ["applied(MyStr)", "since(MyInt)", "as_of(MyInt)", "fork(MyInt)", "fork(new_id=MyStr)"],
)
def test_a_subclass_of_int_or_str_as_an_argument_works_as_the_int_or_str(
    one_shard: RaySessions, call: str
) -> None:
    """The handle sends the argument as the exact int or str: the call gets the answer
    the plain value gets, and the calls of the same batch (another session's) too."""
    h = one_shard.open(_sid("h"))
    other = one_shard.open(_sid("other"))
    h.append("user_message", {"content": "a"}).get()
    h.append("user_message", {"content": "b"}).get()
    make, plain = {
        "applied(MyStr)": (lambda: h.applied(_MyStr("cid")), lambda: h.applied("cid")),
        "since(MyInt)": (lambda: h.since(_MyInt(1)), lambda: h.since(1)),
        "as_of(MyInt)": (lambda: h.as_of(_MyInt(1)), lambda: h.as_of(1)),
        "fork(MyInt)": (lambda: h.fork(_MyInt(1)), lambda: h.fork(1)),
        "fork(new_id=MyStr)": (
            lambda: h.fork(1, _MyStr(_sid("f"))),
            lambda: h.fork(1, _sid("g")),
        ),
    }[call]
    read = other.count()  # in flight: the three calls below go together, after it
    first = other.append("user_message", {"content": "o1"})
    bad = make()
    second = other.append("user_message", {"content": "o2"})
    read.get()
    assert [first.get().seq, second.get().seq] == [0, 1]
    got = bad.get()
    want = plain().get()
    if call.startswith("fork"):
        assert [(e.seq, e.type) for e in got.events()] == [(e.seq, e.type) for e in want.events()]
    else:
        assert got == want
    assert other.count().get() == 2


def test_a_call_the_shard_cannot_read_fails_alone_not_its_batch(one_shard: RaySessions) -> None:
    """A batch with a call whose argument the shard cannot load (a class it cannot
    import): that call fails, saying why; the batch's other calls are applied."""
    sid = _sid("mixed")
    one_shard.open(sid)
    ops = [
        (CALL, sid, "h_read", ("count",)),
        (CALL, sid, "h_read", ("count", _Unknown())),
        (CALL, sid, "h_read", ("count",)),
    ]
    blob = _pack_batch(uuid.uuid4().hex, 0, True, ops)
    outcomes = _unpack(ray.get(one_shard.shard_actor(0).run.remote(blob), timeout=30))
    assert outcomes[0] == (NOW, 0)
    assert outcomes[2] == (NOW, 0)
    state, error = outcomes[1]
    assert state == FAILED
    assert "_Unknown" in str(error)


def test_a_handle_normalises_nothing_but_int_and_str_subclasses(one_shard: RaySessions) -> None:
    """Plain values, bools and None travel as they are (pickled the same)."""
    h = one_shard.open(_sid("plain"))
    assert isinstance(h, RaySession)
    args = (True, None, 1, "x", _MyInt(2), _MyStr("y"))
    got = _driver_args(args)
    assert got == (True, None, 1, "x", 2, "y")
    assert [type(a) for a in got] == [bool, type(None), int, str, int, str]
    assert pickle.dumps(got[4]) == pickle.dumps(2)


def _driver_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    from nous_actor.cluster.ray._session import _exact

    return _exact(args)


# -- 4. close() ends the registry's subscriptions -------------------------------------------


def test_close_ends_the_subscriptions_of_its_registry(ray_scope: RayScope) -> None:
    """On detached shards that keep serving, a closed registry's subscription ends (as a
    local registry's close ends them: `SessionStopped` once the pending events are read)
    and delivers nothing appended afterwards through another registry."""
    name = ray_scope.name("close-subs")
    args: dict[str, Any] = {
        "shards": 1,
        "name": name,
        "namespace": ray_scope.namespace,
        "detached": True,
        "timeout": 30,
    }
    first = RaySessions(MemoryStore, **args)
    second = RaySessions(MemoryStore, **args)
    try:
        x = first.open(_sid("x"))
        x.append("user_message", {"content": "before"}).get()
        sub = x.subscribe()
        assert sub.get(timeout=30).data["content"] == "before"
        first.close()
        second.open(x.session_id).append("user_message", {"content": "after"}).get()
        with pytest.raises(SessionStopped, match="has ended"):
            sub.get(timeout=30)
        events, ended, _ = ray.get(second.shard_actor(0).poll.remote(_token(sub), 0.0), timeout=30)
        assert (events, ended) == ([], True)  # the shard dropped its subscriber
    finally:
        second.shutdown()
